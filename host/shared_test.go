package host

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func sharedOp(t *testing.T, h *Host, path string) string {
	t.Helper()
	return string(mustExchange(t, h, &Request{Path: path}, nil).Body)
}

func TestSharedDataThroughGuest(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 3, VMID: "vm"})
	if got := sharedOp(t, h, "/shared/get?key=a"); got != "value=;cas=0;status=1" {
		t.Fatalf("get missing = %q", got)
	}
	// cas ignored for a missing key
	if got := sharedOp(t, h, "/shared/set?key=a&value=one&cas=777"); got != "status=0" {
		t.Fatalf("set missing with cas = %q", got)
	}
	_, cas, _ := h.SharedData().Get("a")
	// every worker sees the same value and cas
	for i := 0; i < 6; i++ {
		if got := sharedOp(t, h, "/shared/get?key=a"); got != fmt.Sprintf("value=one;cas=%d;status=0", cas) {
			t.Fatalf("get = %q", got)
		}
	}
	if got := sharedOp(t, h, fmt.Sprintf("/shared/set?key=a&value=two&cas=%d", cas+100)); got != "status=8" {
		t.Fatalf("set wrong cas = %q, want CAS_MISMATCH (8)", got)
	}
	if got := sharedOp(t, h, fmt.Sprintf("/shared/set?key=a&value=two&cas=%d", cas)); got != "status=0" {
		t.Fatalf("set right cas = %q", got)
	}
	if got := sharedOp(t, h, "/shared/set?key=a&value=three&cas=0"); got != "status=0" {
		t.Fatalf("set cas 0 = %q", got)
	}
	if v, _, _ := h.SharedData().Get("a"); string(v) != "three" {
		t.Fatalf("host view = %q", v)
	}
	// Set from the host, read by the guest.
	h.SharedData().Set("b", []byte("from-host"), 0)
	if got := sharedOp(t, h, "/shared/get?key=b"); !strings.HasPrefix(got, "value=from-host;") {
		t.Fatalf("get b = %q", got)
	}
}

// Increments by get + CAS-set from every worker: once the key exists no increment is lost.
func TestSharedDataGuestCASAcrossWorkers(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 4})
	h.SharedData().Set("ctr", []byte("0"), 0) // created up front: see TestSharedDataMissingKeyRace
	const n = 400
	var wg sync.WaitGroup
	var mu sync.Mutex
	retried := 0
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := h.Exchange(context.Background(), &Request{Path: "/shared/incr?key=ctr"}, func(r *Request) *Response {
				if v, _ := header(r.Headers, "x-tries"); v != "1" {
					mu.Lock()
					retried++
					mu.Unlock()
				}
				return nil
			})
			if err != nil || resp.Status != 200 {
				t.Errorf("incr: %v %+v", err, resp)
			}
		}()
	}
	wg.Wait()
	v, _, _ := h.SharedData().Get("ctr")
	if string(v) != strconv.Itoa(n) {
		t.Fatalf("counter = %s, want %d", v, n)
	}
	t.Logf("%d of %d increments needed a CAS retry", retried, n)
}

// raceTwo sends two /shared/race requests to two different workers, waits until both have
// read the key, then ticks: both write with the cas they read.
func raceTwo(t *testing.T, h *Host, key string) (statuses []string) {
	t.Helper()
	ctx := testCtx(t)
	before, _ := h.Metric("kitchen_requests_total")
	res := make(chan string, 2)
	for i := 0; i < 2; i++ {
		w := h.workers[i]
		go func() {
			s := &stream{h: h, w: w, done: make(chan struct{}, 1)}
			resp, err := h.exchangeOn(ctx, s, &Request{Path: "/shared/race?key=" + key}, func(r *Request) *Response {
				v, _ := header(r.Headers, "x-race-set")
				return &Response{Body: []byte(v)}
			})
			if err != nil {
				t.Error(err)
				res <- ""
				return
			}
			res <- string(resp.Body)
		}()
	}
	waitFor(t, func() bool { m, _ := h.Metric("kitchen_requests_total"); return m.Value == before.Value+2 })
	if err := h.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	return []string{<-res, <-res}
}

func TestSharedDataCASMismatchAcrossWorkersThroughGuest(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 2, PluginConfig: []byte("tick=3600000")})
	h.SharedData().Set("k", []byte("v"), 0)
	got := raceTwo(t, h, "k")
	if !(got[0] == "0" && got[1] == "8" || got[0] == "8" && got[1] == "0") {
		t.Fatalf("set statuses = %v, want one OK (0) and one CAS_MISMATCH (8)", got)
	}
	if v, _, _ := h.SharedData().Get("k"); string(v) != "v+" {
		t.Fatalf("value = %q", v)
	}
	// Missing key: both read NOT_FOUND with cas 0, both creations succeed.
	got = raceTwo(t, h, "fresh")
	if got[0] != "0" || got[1] != "0" {
		t.Fatalf("creation race statuses = %v, want both OK", got)
	}
	if v, _, _ := h.SharedData().Get("fresh"); string(v) != "+" {
		t.Fatalf("value = %q", v)
	}
}
