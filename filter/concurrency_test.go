package filter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Native tests of in-flight limits (concurrency.go) on the shaping rig:
// workers over one shared data, a clock the test moves, ticks delivered
// when their period says.

func concCfg(extra string) string {
	return `{"rules":[{"name":"c","key":[{"header":"x-user"}],"algorithm":"concurrency","limit":3` + extra + `}]}`
}

// checkInFlight fails unless the in-flight gauge of rule c is want, and,
// when want is 0, no slot of any key holds a request.
func (r *holdRig) checkInFlight(want int64) {
	r.t.Helper()
	if got := r.metric("sluice.c.in_flight"); got != want {
		r.t.Fatalf("in_flight %d, want %d", got, want)
	}
}

// Three workers, limit 3 on one key: the fourth request is refused on any
// worker with the configured hint; a request that ends frees its slot for
// the next, whichever worker; other keys are not affected; headers say the
// limit and what is free.
func TestConcurrencyAcrossWorkers(t *testing.T) {
	r := startHoldRig(t, concCfg(`,"retry_after":"5s"`), 3)
	var ids [3]uint32
	for i := 0; i < 3; i++ {
		id, act, lr := r.request(i, "a")
		if act != abi.ActionContinue || lr != nil {
			t.Fatalf("request %d: %v %+v", i, act, lr)
		}
		ids[i] = id
	}
	r.checkInFlight(3)
	for i := 0; i < 3; i++ {
		_, act, lr := r.request(i, "a")
		if act != abi.ActionPause || lr == nil || lr.Status != 429 {
			t.Fatalf("over the limit on worker %d: %v %+v", i, act, lr)
		}
		if h := localHeader(lr, "retry-after"); h != "5" {
			t.Fatalf("Retry-After %q", h)
		}
		if h := localHeader(lr, "ratelimit-policy"); h != `"c";q=3` {
			t.Fatalf("policy %q", h)
		}
	}
	bID, act, _ := r.request(2, "b")
	if act != abi.ActionContinue {
		t.Fatal("another key refused")
	}
	if got := r.respond(2, ids[2]); got["x-ratelimit-remaining"] != "0" || got["x-ratelimit-limit"] != "3" || got["ratelimit"] != `"c";r=0;t=5` {
		t.Fatalf("headers of the third admission's peer: %v", got)
	}
	r.end(2, bID)
	r.checkInFlight(2)
	id, act, _ := r.request(1, "a")
	if act != abi.ActionContinue {
		t.Fatal("a freed slot was not reused")
	}
	r.end(1, ids[1])
	r.end(0, ids[0])
	r.end(1, id)
	r.checkInFlight(0)
	if a, ref := r.metric("sluice.c.acquired"), r.metric("sluice.c.refused"); a != 5 || ref != 3 || r.metric("sluice.c.denied") != 3 {
		t.Fatalf("acquired %d refused %d", a, ref)
	}
	// Every slot is free again: three at once are admitted.
	for i := 0; i < 3; i++ {
		if _, act, _ := r.request(i, "a"); act != abi.ActionContinue {
			t.Fatalf("after every release, request %d refused", i)
		}
	}
}

// Each way a stream can end releases its slot once: proxy_on_log then
// proxy_on_done, proxy_on_done alone, proxy_on_delete alone.
func TestConcurrencyReleasedOnceWhateverTheEnd(t *testing.T) {
	r := startHoldRig(t, concCfg(``), 1)
	vm := r.w[0].vm
	ends := []func(id uint32){
		func(id uint32) { vm.OnLog(id); vm.OnDone(id); vm.OnDelete(id) },
		func(id uint32) { vm.OnDone(id); vm.OnDelete(id) },
		func(id uint32) { vm.OnDelete(id) },
		func(id uint32) { vm.OnDone(id); vm.OnDone(id); vm.OnLog(id); vm.OnDelete(id); vm.OnDelete(id) },
	}
	for k, end := range ends {
		var ids []uint32
		for i := 0; i < 3; i++ {
			id, act, _ := r.request(0, "a")
			if act != abi.ActionContinue {
				t.Fatalf("end %d: request %d refused", k, i)
			}
			ids = append(ids, id)
		}
		for _, id := range ids {
			end(id)
		}
		r.checkInFlight(0)
	}
	if vm.Streams() != 0 {
		t.Fatalf("%d streams left", vm.Streams())
	}
}

// A request admitted by the concurrency rule but refused by a rate rule
// takes no slot.
func TestConcurrencyWithRateRule(t *testing.T) {
	cfg := `{"rules":[{"name":"c","key":[{"header":"x-user"}],"algorithm":"concurrency","limit":5},
	 {"name":"rate","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":2,"window":"1m"}]}`
	r := startHoldRig(t, cfg, 2)
	for i := 0; i < 4; i++ {
		r.request(i%2, "a")
	}
	r.checkInFlight(2)
	if d := r.metric("sluice.rate.denied"); d != 2 {
		t.Fatalf("rate denied %d", d)
	}
}

// A holder that stops renewing (its VM trapped) loses its slots one lease
// after its last renewal; a live holder's slots outlast any number of
// leases.
func TestConcurrencyLeaseLapse(t *testing.T) {
	r := startHoldRig(t, concCfg(``), 3)
	r.request(0, "a")
	r.request(0, "a")
	live, _, _ := r.request(1, "a")
	r.w[0].h.tickMS = 0 // worker 0's VM is gone: no tick, no release
	r.advance(r.now + int64(filter.ConcurrencyLeaseTTL) - 1)
	if _, act, _ := r.request(2, "a"); act != abi.ActionPause {
		t.Fatal("admitted before the dead holder's lease ended")
	}
	r.advance(r.now + 1)
	id, act, _ := r.request(2, "a")
	if act != abi.ActionContinue {
		t.Fatal("the dead holder's slots were not reclaimed")
	}
	if n := r.metric("sluice.c.reclaimed"); n != 2 {
		t.Fatalf("reclaimed %d", n)
	}
	r.checkInFlight(2)
	// Worker 1's slot lives on through ten leases.
	r.advance(r.now + 10*int64(filter.ConcurrencyLeaseTTL))
	r.request(2, "a")
	if _, act, _ := r.request(2, "a"); act != abi.ActionPause {
		t.Fatal("a live holder's slot lapsed")
	}
	r.end(1, live)
	r.end(2, id)
	r.end(2, r.next-1)
	r.checkInFlight(0)
}

// With delay: a refused request waits, FIFO on its worker, for a slot
// released on any worker, at most delay.max and max_held; one that waited
// carries sluice-delay-ms; a client that goes away while queued leaves no
// trace.
func TestConcurrencyQueue(t *testing.T) {
	r := startHoldRig(t, `{"rules":[{"name":"c","key":[{"header":"x-user"}],"algorithm":"concurrency","limit":1,
	 "delay":{"max":"2s","max_held":2}}]}`, 2)
	a, _, _ := r.request(0, "a")
	b, act, lr := r.request(1, "a")
	if act != abi.ActionPause || lr != nil {
		t.Fatalf("not queued: %v %+v", act, lr)
	}
	c, _, _ := r.request(1, "a")
	if _, act, lr := r.request(1, "a"); act != abi.ActionPause || lr == nil || lr.Status != 429 {
		t.Fatal("beyond max_held: not refused at once")
	}
	r.advance(r.now + int64(500*time.Millisecond))
	if len(r.w[1].h.released) != 0 {
		t.Fatal("released while the slot is held")
	}
	r.end(0, a)
	r.advance(r.now + int64(20*time.Millisecond))
	if _, ok := r.w[1].h.released[b]; !ok || len(r.w[1].h.released) != 1 {
		t.Fatalf("first in line not released: %v", r.w[1].h.released)
	}
	got := r.respond(1, b)
	if got[filter.DelayHeader] == "" {
		t.Fatalf("no %s: %v", filter.DelayHeader, got)
	}
	r.advance(r.now + int64(20*time.Millisecond))
	if _, ok := r.w[1].h.released[c]; !ok {
		t.Fatal("second in line not released")
	}
	// c holds the slot: d waits 2 s and is refused; e goes away.
	d, _, _ := r.request(0, "a")
	e, _, _ := r.request(0, "a")
	r.end(0, e)
	r.advance(r.now + int64(2*time.Second))
	if lr := r.w[0].h.local[d]; lr == nil || lr.Status != 429 {
		t.Fatalf("not refused at delay.max: %+v", lr)
	}
	r.end(0, d)
	r.end(1, c)
	r.checkInFlight(0)
	if q, ref := r.metric("sluice.c.queued"), r.metric("sluice.c.refused"); q != 4 || ref != 2 {
		t.Fatalf("queued %d refused %d", q, ref)
	}
	var waits []uint64
	for _, w := range r.w {
		for _, v := range w.h.recorded {
			waits = append(waits, v...)
		}
	}
	if len(waits) != 2 {
		t.Fatalf("queue waits recorded: %v", waits)
	}
	if r.w[0].vm.Streams()+r.w[1].vm.Streams() != 0 {
		t.Fatal("streams left")
	}
}

// A key with requests in flight is never evicted: with max_keys 1 a second
// key fails the rule (failure_mode decides: open) instead.
func TestConcurrencyNoEviction(t *testing.T) {
	r := startHoldRig(t, concCfg(`,"max_keys":1`), 1)
	r.request(0, "a")
	if _, act, _ := r.request(0, "b"); act != abi.ActionContinue {
		t.Fatal("failure_mode open refused")
	}
	if r.metric("sluice.c.store_errors") != 1 || r.metric("sluice.c.evicted") != 0 {
		t.Fatalf("store_errors %d evicted %d", r.metric("sluice.c.store_errors"), r.metric("sluice.c.evicted"))
	}
	var logged bool
	for _, l := range r.w[0].h.Logs {
		logged = logged || strings.Contains(l.Msg, "raise max_keys")
	}
	if !logged {
		t.Fatal("not logged")
	}
}

func localHeader(lr *filtertest.LocalResponse, name string) string {
	for _, kv := range lr.Headers {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}
