package filter_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Shaping with backend "redis": the script takes the slot and answers the
// delay, the filter holds the request until then.

func redisShapeConfig(failure string, maxHeld int) string {
	return `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"leaky_bucket","limit":10,"window":"1s","burst":1,"backend":"redis",
"delay":{"max":"3s","max_held":` + fmt.Sprint(maxHeld) + `}}],
"failure_mode":"` + failure + `","redis":{"cluster":"rc","timeout_ms":50,"instances":2}}`
}

// shapedReply is a script's reply with a max delay: admitted (delay in µs)
// or, with retry > 0, denied.
func shapedReply(delayUS, retryUS int64) string {
	allowed, rem := 1, 0
	if retryUS > 0 {
		allowed = 0
	}
	return fmt.Sprintf("*8\r\n:%d\r\n:1\r\n:%d\r\n:%d\r\n:%d\r\n:1700000000000000\r\n:0\r\n:%d\r\n", allowed, rem, delayUS+100_000, retryUS, delayUS)
}

// tick delivers proxy_on_tick at t (ns after t0).
func (r *redisRig) tick(at int64) {
	r.f.Now_ = t0 + at
	r.f.effective = 1
	r.vm.OnTick(1)
}

func TestRedisShapingHoldsUntilTheSlot(t *testing.T) {
	r := startRedisRig(t, redisShapeConfig("closed", 1000))
	id, act := r.request("alice")
	if act != abi.ActionPause {
		t.Fatalf("action %v", act)
	}
	// The call carries the max delay (µs) as its tenth argument, n = 1 before it.
	q := r.f.sent[r.lastToken()]
	if !strings.HasPrefix(q, "*14\r\n$4\r\nEVAL\r\n") || !strings.HasSuffix(q, "$1\r\n1\r\n$7\r\n3000000\r\n") {
		t.Fatalf("query %q", q[len(q)-60:])
	}
	r.answer(r.lastToken(), 0, shapedReply(250_000, 0))
	if len(r.f.continued) != 0 || r.f.local[id] != nil {
		t.Fatalf("released at once: continued %v, local %+v", r.f.continued, r.f.local[id])
	}
	if r.metric(filter.RuleMetric("r1", "delayed")) != 1 || r.metric(filter.RuleMetric("r1", "held")) != 1 {
		t.Fatalf("delayed %d held %d", r.metric(filter.RuleMetric("r1", "delayed")), r.metric(filter.RuleMetric("r1", "held")))
	}
	if r.f.tickMS != 50 && r.f.tickMS > 250 {
		t.Errorf("tick period %d ms", r.f.tickMS)
	}
	r.tick(249_000_000)
	if len(r.f.continued) != 0 {
		t.Fatal("released before its slot")
	}
	r.tick(250_000_000)
	if !r.continuedOnce(id) {
		t.Fatalf("not released at its slot: %v", r.f.continued)
	}
	r.f.RespHeaders = [][2]string{{":status", "200"}}
	r.vm.OnResponseHeaders(id, 1, false)
	if got := headerOf(r.f.RespHeaders, filter.DelayHeader); got != "250" {
		t.Errorf("%s: %q, want 250 (%v)", filter.DelayHeader, got, r.f.RespHeaders)
	}
	r.end(id)
	if r.metric(filter.RuleMetric("r1", "held")) != 0 {
		t.Error("held gauge not back to 0")
	}

	// A request whose wait is too long: 429 with the script's retry after.
	id, _ = r.request("alice")
	r.answer(r.lastToken(), 0, shapedReply(0, 1_500_000))
	if lr := r.f.local[id]; lr == nil || lr.Status != 429 || headerOf(lr.Headers, "retry-after") != "2" {
		t.Fatalf("refused: %+v", lr)
	}
	r.end(id)
	if r.metric(filter.RuleMetric("r1", "delay_refused")) != 1 {
		t.Error("delay_refused not counted")
	}

	// Shaped calls are not coalesced: two requests of one key in flight
	// are two calls.
	calls := len(r.f.order)
	a, _ := r.request("bob")
	b, _ := r.request("bob")
	if len(r.f.order) != calls+2 {
		t.Fatalf("%d calls for two shaped requests of one key, want 2", len(r.f.order)-calls)
	}
	r.answer(r.f.order[calls], 0, shapedReply(0, 0))
	r.answer(r.f.order[calls+1], 0, shapedReply(100_000, 0))
	if !r.continuedOnce(a) || r.continuedOnce(b) {
		t.Fatalf("continued %v", r.f.continued)
	}
	// b's client leaves while held: nothing is sent to Redis (its slot
	// passes unused), the hold ends.
	calls = len(r.f.order)
	r.end(b)
	if len(r.f.order) != calls || r.metric(filter.RuleMetric("r1", "delay_abandoned")) != 1 || r.metric(filter.RuleMetric("r1", "held")) != 0 {
		t.Fatalf("abandoned: %d calls, abandoned %d, held %d", len(r.f.order)-calls,
			r.metric(filter.RuleMetric("r1", "delay_abandoned")), r.metric(filter.RuleMetric("r1", "held")))
	}
	r.tick(2e9)
	if r.continuedOnce(b) {
		t.Fatal("an abandoned request was released")
	}
	r.end(a)
}

// A reply whose delay is missing, negative, beyond delay.max, or on a
// denial fails the decision: failure_mode decides, and nothing is held.
func TestRedisShapingBadDelay(t *testing.T) {
	for _, failure := range []string{"closed", "open", "local"} {
		for name, reply := range map[string]string{
			"missing":         replyAdmit,
			"negative":        "*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:1700000000000000\r\n:0\r\n:-5\r\n",
			"beyond max":      shapedReply(3_000_001, 0),
			"huge":            "*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:1700000000000000\r\n:0\r\n:99999999999999999999\r\n",
			"on a denial":     "*8\r\n:0\r\n:1\r\n:0\r\n:100000\r\n:5\r\n:1700000000000000\r\n:0\r\n:5\r\n",
			"not an integer":  "*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:1700000000000000\r\n:0\r\n$1\r\n5\r\n",
			"nine  integers":  "*9\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:1700000000000000\r\n:0\r\n:5\r\n:5\r\n",
			"a lease's reply": "*7\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:1700000000000000\r\n:0\r\n",
		} {
			t.Run(failure+"/"+name, func(t *testing.T) {
				r := startRedisRig(t, redisShapeConfig(failure, 1000))
				id, _ := r.request("alice")
				r.answer(r.lastToken(), 0, reply)
				if r.metric(filter.MetricRedisFailures) != 1 {
					t.Fatalf("failures %d", r.metric(filter.MetricRedisFailures))
				}
				switch failure {
				case "closed":
					if lr := r.f.local[id]; lr == nil || lr.Status != 503 {
						t.Fatalf("closed: %+v", lr)
					}
				default: // open, or local (the fallback admits: a fresh key, no queue)
					if !r.continuedOnce(id) || r.f.local[id] != nil {
						t.Fatalf("%s: continued %v, local %+v", failure, r.f.continued, r.f.local[id])
					}
				}
				if r.metric(filter.RuleMetric("r1", "delayed")) != 0 || r.metric(filter.RuleMetric("r1", "held")) != 0 {
					t.Fatal("a failed decision was held")
				}
			})
		}
	}
}

// At max_held the rule decides as a meter: no max delay in the call, which
// is coalesced again (EVALSHA of 8 arguments).
func TestRedisShapingMaxHeld(t *testing.T) {
	r := startRedisRig(t, redisShapeConfig("closed", 2))
	for i := 0; i < 2; i++ {
		r.request("alice")
		r.answer(r.lastToken(), 0, shapedReply(int64(i+1)*100_000, 0))
	}
	if r.metric(filter.RuleMetric("r1", "held")) != 2 {
		t.Fatalf("held %d", r.metric(filter.RuleMetric("r1", "held")))
	}
	id, _ := r.request("alice")
	q := r.f.sent[r.lastToken()]
	if !strings.HasPrefix(q, "*12\r\n") {
		t.Fatalf("at max_held the call still shapes: %q", q[:20])
	}
	r.answer(r.lastToken(), 0, replyAdmit)
	if !r.continuedOnce(id) {
		t.Fatal("a meter's admission was not continued at once")
	}
	r.tick(200_000_000)
	if len(r.f.continued) != 3 {
		t.Fatalf("continued %v, want all three", r.f.continued)
	}
	// Held again below max_held: the call shapes again.
	r.request("alice")
	if q := r.f.sent[r.lastToken()]; !strings.HasPrefix(q, "*14\r\n") {
		t.Fatalf("below max_held: %q", q[:20])
	}
}

// A request another rule denies after the script admitted it into a slot
// is refunded like any admission (a refund call of the script, op 1).
func TestRedisShapingRefund(t *testing.T) {
	cfg := `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":10,"window":"1s","backend":"redis","delay":{"max":"3s"}},
{"name":"r2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1m","backend":"redis"}],
"failure_mode":"closed","redis":{"cluster":"rc","timeout_ms":50,"instances":2}}`
	r := startRedisRig(t, cfg)
	id, _ := r.request("alice")
	if len(r.f.order) != 2 {
		t.Fatalf("%d calls, want one per rule", len(r.f.order))
	}
	first, second := r.f.order[0], r.f.order[1]
	shaped := first
	if !strings.HasPrefix(r.f.sent[first], "*14\r\n") {
		shaped, second = second, first
	}
	r.answer(shaped, 0, shapedReply(400_000, 0))
	r.answer(second, 0, replyDeny)
	if lr := r.f.local[id]; lr == nil || lr.Status != 429 {
		t.Fatalf("denied: %+v", lr)
	}
	if len(r.f.order) != 3 || r.metric(filter.MetricRedisRefunds) != 1 {
		t.Fatalf("%d calls, refunds %d", len(r.f.order), r.metric(filter.MetricRedisRefunds))
	}
	if q := r.f.sent[r.lastToken()]; !strings.HasPrefix(q, "*12\r\n") || !strings.Contains(q, "$1\r\n1\r\n$16\r\n1700000000000000\r\n$1\r\n0\r\n") {
		t.Fatalf("refund %q", q[len(q)-60:])
	}
	if r.metric(filter.RuleMetric("r1", "held")) != 0 || r.metric(filter.RuleMetric("r1", "delayed")) != 0 {
		t.Fatal("a denied request was held")
	}
}
