package filter_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
)

// A VM keeps at most one decision call in flight per (rule, key): requests for the key
// that arrive meanwhile wait and go together in the next call, which decides them in
// order (the script's ARGV[9]); other keys are not held back.
func TestRedisCoalescesOneKeysRequests(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	a1, _ := r.request("alice")
	first := r.lastToken()
	if q := r.f.sent[first]; !strings.HasPrefix(q, "*12\r\n") {
		t.Fatalf("a lone request: %.20q", q)
	}
	a2, _ := r.request("alice")
	a3, _ := r.request("alice")
	if len(r.f.order) != 1 {
		t.Fatalf("%d calls while alice's is in flight, want 1", len(r.f.order))
	}
	b1, _ := r.request("bob")
	if len(r.f.order) != 2 {
		t.Fatalf("bob waited for alice's call")
	}
	r.answer(first, 0, replyAdmit)
	if !r.continuedOnce(a1) || len(r.f.order) != 3 {
		t.Fatalf("after alice's reply: continued %v, %d calls", r.f.continued, len(r.f.order))
	}
	batch := r.lastToken()
	if q := r.f.sent[batch]; !strings.HasPrefix(q, "*13\r\n$7\r\nEVALSHA\r\n") || !strings.HasSuffix(q, "$1\r\n0\r\n$1\r\n2\r\n") {
		t.Fatalf("the queued two: %q", q)
	}
	if r.f.local[a2] != nil || r.f.local[a3] != nil || r.continuedOnce(a2) {
		t.Fatal("queued requests answered before their call's reply")
	}
	// One of the two admitted: the first queued gets it, the second is denied.
	r.answer(batch, 0, "*7\r\n:1\r\n:100\r\n:0\r\n:36000000\r\n:5000000\r\n:1700000000000000\r\n:0\r\n")
	if !r.continuedOnce(a2) || r.f.local[a2] != nil {
		t.Fatalf("alice's second: continued %v, local %+v", r.f.continued, r.f.local[a2])
	}
	if lr := r.f.local[a3]; lr == nil || lr.Status != 429 || headerOf(lr.Headers, "retry-after") != "5" {
		t.Fatalf("alice's third: %+v", lr)
	}
	r.answer(r.f.order[1], 0, replyDeny)
	if lr := r.f.local[b1]; lr == nil || lr.Status != 429 {
		t.Fatalf("bob: %+v", lr)
	}
	if n := r.metric(filter.MetricRedisCalls); n != 3 || len(r.f.order) != 3 {
		t.Errorf("%d calls counted, %d made; want 3 for 4 requests", n, len(r.f.order))
	}
	// The queue is gone with its last request: alice's next request goes at once.
	r.request("alice")
	if len(r.f.order) != 4 || !strings.HasPrefix(r.f.sent[r.lastToken()], "*12\r\n") {
		t.Fatalf("alice after the queue drained: %d calls", len(r.f.order))
	}
}

// The guard gives up on a queued request like on a sent one, counting from its call
// (a queued request waits at most for the call before it, then its own: 2 × (timeout_ms
// + 10 ms)); a call in flight whose reply never comes does not hold the key's later
// requests beyond its own guard.
func TestRedisCoalescedGuard(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	a1, _ := r.request("alice")
	first := r.lastToken()
	r.f.Now_ += 30e6
	a2, _ := r.request("alice") // queued behind a1's call
	r.f.Now_ += 31e6            // past a1's guard (50 + 10 ms), not a2's
	r.f.effective = 1
	r.vm.OnTick(1)
	if lr := r.f.local[a1]; lr == nil || lr.Status != 503 {
		t.Fatalf("alice's first after its guard: %+v", lr)
	}
	if r.f.local[a2] != nil || len(r.f.order) != 2 {
		t.Fatalf("alice's second: %+v, %d calls; want it sent in a call of its own", r.f.local[a2], len(r.f.order))
	}
	second := r.lastToken()
	// Its guard counts from its call, not from its arrival: 95 ms after it
	// arrived (34 ms after its call) it still waits.
	r.f.Now_ += 34e6
	r.vm.OnTick(1)
	if r.f.local[a2] != nil {
		t.Fatalf("alice's second failed by a guard counted from its arrival: %+v", r.f.local[a2])
	}
	r.answer(first, 0, replyAdmit) // late: dropped
	if len(r.f.continued) != 0 {
		t.Fatalf("a late reply resumed %v", r.f.continued)
	}
	r.answer(second, 0, replyAdmit)
	if !r.continuedOnce(a2) {
		t.Fatalf("alice's second not resumed: %v", r.f.continued)
	}
	// A request given up while still queued leaves the queue and is never sent.
	a3, _ := r.request("alice")
	third := r.lastToken()
	r.f.Now_ += 20e6
	a4, _ := r.request("alice")
	r.f.Now_ += 41e6 // past a3's guard and the call's: a4 goes in a new call
	r.f.effective = 1
	r.vm.OnTick(1)
	if r.f.local[a3] == nil || r.f.local[a4] != nil {
		t.Fatalf("a3 %+v a4 %+v", r.f.local[a3], r.f.local[a4])
	}
	fourth := r.lastToken()
	if fourth == third {
		t.Fatal("a4 not sent after a3's call was given up")
	}
	r.f.Now_ += 61e6
	r.vm.OnTick(1)
	if lr := r.f.local[a4]; lr == nil || lr.Status != 503 {
		t.Fatalf("a4 after its guard: %+v", lr)
	}
	if n := r.metric(filter.MetricRedisTimeouts); n != 3 {
		t.Errorf("timeouts %d, want 3", n)
	}
	// Nothing left queued: a new request is sent at once.
	r.request("alice")
	if r.lastToken() == fourth {
		t.Fatal(fmt.Sprint("the key stayed held: ", r.f.order))
	}
}

// A call the host refuses fails its request at once, from the request's own callback; the
// wait it leaves behind is not completed again later, when reused by another request.
func TestRedisRefusedCallIsCompletedOnce(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	r.f.callStatus = 2 // refused
	a, _ := r.request("alice")
	if lr := r.f.local[a]; lr == nil || lr.Status != 503 {
		t.Fatalf("refused call: %+v", lr)
	}
	r.end(a)
	r.f.callStatus = 0
	b, _ := r.request("bob") // reuses alice's wait
	r.f.Now_ += 1e6
	r.f.effective = 1
	r.vm.OnTick(1)
	c, _ := r.request("carol")
	r.answer(r.lastToken(), 0, replyAdmit) // carol's reply: a root callback
	if r.f.local[b] != nil || len(r.f.continued) != 1 || !r.continuedOnce(c) {
		t.Fatalf("bob answered before his reply: %+v, continued %v", r.f.local[b], r.f.continued)
	}
	r.answer(r.f.order[0], 0, replyAdmit)
	if !r.continuedOnce(b) {
		t.Fatalf("bob: continued %v", r.f.continued)
	}
}
