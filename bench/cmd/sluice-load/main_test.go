package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunCountsAndBounds(t *testing.T) {
	var seen = make(chan string, 10000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case seen <- r.Header.Get("X-Key"):
		default:
		}
		if r.URL.Path == "/deny" {
			w.WriteHeader(429)
		}
	}))
	defer srv.Close()
	o := options{url: srv.URL + "/deny", concurrency: 4, duration: 5 * time.Second, warmup: 0, requests: 200,
		headers: http.Header{}, keys: 3, keyHeader: "X-Key"}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 4*time.Second {
		t.Errorf("-n 200 did not end the run early (%v)", time.Since(start))
	}
	// The run ends once 200 requests are measured; requests already in flight then are cut.
	if rep.Requests < 200-o.concurrency || rep.Requests > 200+o.concurrency || rep.Statuses["429"] != rep.Requests || rep.Errors != 0 {
		t.Errorf("report %+v: want ~200 requests, all 429", rep)
	}
	if !(rep.P50 > 0 && rep.P50 <= rep.P99 && rep.P99 <= rep.Max) {
		t.Errorf("percentiles out of order: %+v", rep)
	}
	srv.Close() // no handler runs after this: seen can be closed
	close(seen)
	keys := map[string]bool{}
	for k := range seen {
		keys[k] = true
	}
	if len(keys) != 3 || !keys["k0"] || !keys["k1"] || !keys["k2"] {
		t.Errorf("key header values %v, want k0 k1 k2", keys)
	}
}

func TestValidateRefusesNonLoopback(t *testing.T) {
	for _, u := range []string{"http://10.0.0.1:80/", "http://example.com/", "https://127.0.0.1/", "127.0.0.1:80"} {
		o := options{url: u, concurrency: 1, duration: time.Second, requests: 1}
		if err := o.validate(); err == nil {
			t.Errorf("%s: accepted", u)
		}
	}
	o := options{url: "http://127.0.0.1:1/", concurrency: 1, duration: time.Hour, requests: 1}
	if err := o.validate(); err == nil || !strings.Contains(err.Error(), "-d") {
		t.Errorf("an hour-long run: %v, want an error about -d", err)
	}
}

// -key-bytes pads every key to its size (keys stay distinct); -want-status turns any other
// status, and any failed request, into an error. Without a warm-up the first requests count.
func TestKeyBytesAndWantStatus(t *testing.T) {
	const size = 40 << 10
	var mu sync.Mutex
	keys := map[string]bool{}
	var first atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("X-Api-Key")
		mu.Lock()
		keys[k] = true
		mu.Unlock()
		if len(k) != size {
			w.WriteHeader(400)
		}
		if first.CompareAndSwap(false, true) {
			w.WriteHeader(503) // only the first request: counted without a warm-up
		}
	}))
	defer srv.Close()
	o := options{url: srv.URL + "/", concurrency: 1, duration: 5 * time.Second, requests: 50,
		headers: http.Header{}, keys: 3, keyHeader: "X-Api-Key", keyBytes: size, wantStatus: 200}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Errorf("%d distinct keys, want 3", len(keys))
	}
	if rep.Statuses["400"] != 0 || rep.Statuses["503"] != 1 {
		t.Errorf("statuses %v: want every key %d bytes long and the first request counted", rep.Statuses, size)
	}
	if err := rep.check(200); err == nil || !strings.Contains(err.Error(), "other than 200") {
		t.Errorf("check(200) = %v, want an error about the 503", err)
	}
	if err := rep.check(0); err != nil {
		t.Errorf("check(0) = %v, want nil", err)
	}
	rep.Statuses = map[string]int{"200": rep.Requests}
	if err := rep.check(200); err != nil {
		t.Errorf("all 200: check = %v", err)
	}
	rep.Errors, rep.FirstError = 1, "connection reset"
	if err := rep.check(200); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Errorf("a failed request: check = %v", err)
	}
	for _, bad := range []options{
		{url: srv.URL, concurrency: 1, duration: time.Second, requests: 1, keyBytes: 10},
		{url: srv.URL, concurrency: 1, duration: time.Second, requests: 1, keys: 1, keyBytes: maxKeyBytes + 1},
		{url: srv.URL, concurrency: 1, duration: time.Second, requests: 1, wantStatus: 42},
	} {
		if err := bad.validate(); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

// The open loop's timeline: request k due at k/rate; the requests due during the warm-up
// are not measured, those due in the measured interval are; the connections take the
// requests in turn, every one exactly once.
func TestTimeline(t *testing.T) {
	o := options{rate: 1000, concurrency: 4, warmup: 500 * time.Millisecond, duration: 2 * time.Second}
	tl := newTimeline(o)
	if tl.first != 500 || tl.end != 2500 {
		t.Errorf("first %d end %d, want 500 and 2500", tl.first, tl.end)
	}
	for k, want := range map[int64]time.Duration{0: 0, 1: time.Millisecond, 1500: 1500 * time.Millisecond, 2499: 2499 * time.Millisecond} {
		if got := tl.due(k); got != want {
			t.Errorf("due(%d) = %v, want %v", k, got, want)
		}
	}
	// A rate that does not divide a second: due rounds to the nanosecond, never drifts.
	odd := newTimeline(options{rate: 3, concurrency: 1, duration: time.Second})
	if odd.end != 3 || odd.due(1) != 333333333 || odd.due(2) != 666666667 || odd.due(3) != time.Second {
		t.Errorf("rate 3: end %d, due 1..3 = %v %v %v", odd.end, odd.due(1), odd.due(2), odd.due(3))
	}
	// Exactly on a boundary: due at the warm-up's end is measured, due at the end is not sent.
	if dueCount(time.Second, 1000) != 1000 || dueCount(time.Second+time.Nanosecond, 1000) != 1001 || dueCount(0, 1000) != 0 {
		t.Error("dueCount boundaries")
	}
	seen := map[int64]int{}
	for w := range o.concurrency {
		last := time.Duration(-1)
		for i := 0; ; i++ {
			k := tl.request(w, i)
			if k >= tl.end {
				break
			}
			if k%int64(o.concurrency) != int64(w) || tl.due(k) <= last {
				t.Fatalf("connection %d request %d: k %d due %v after %v", w, i, k, tl.due(k), last)
			}
			last = tl.due(k)
			seen[k]++
		}
	}
	if len(seen) != int(tl.end) {
		t.Errorf("%d requests scheduled, want %d", len(seen), tl.end)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("request %d scheduled %d times", k, n)
		}
	}
	bad := options{url: "http://127.0.0.1:1/", concurrency: 1, duration: time.Minute, requests: 1, rate: maxRate}
	if err := bad.validate(); err == nil || !strings.Contains(err.Error(), "-rate") {
		t.Errorf("%v requests: %v, want an error about -rate", maxRate*60, err)
	}
}

// An open-loop run sends exactly the requests its timeline holds: the measured ones all
// reported (none cut off at the end), the warm-up's not; latency runs from the due time.
func TestOpenLoopCounts(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	defer srv.Close()
	o := options{url: srv.URL + "/", concurrency: 3, duration: 300 * time.Millisecond, warmup: 100 * time.Millisecond,
		requests: 1, headers: http.Header{}, rate: 200, keys: 2, keyHeader: "X-Key"}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	if n.Load() != 80 || rep.Requests != 60 || rep.Statuses["200"] != 60 || rep.Rate != 200 || rep.Sent != 80 {
		t.Errorf("served %d, report %+v: want 80 sent, the 60 due after the warm-up measured", n.Load(), rep)
	}
	if !(rep.P50 > 0 && rep.P50 <= rep.P99 && rep.P99 <= rep.Max) {
		t.Errorf("percentiles out of order: %+v", rep)
	}
}
