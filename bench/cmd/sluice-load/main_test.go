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
