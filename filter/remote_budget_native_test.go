package filter_test

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Native tests of token budgets on the remote backends (cost.go, redis_backend.go,
// rls_backend.go): the reservation travels as the decision's cost, the settlement as a
// call of its own when the stream ends, against the fake Redis and RLS hosts.

const budgetRule = `{"name":"llm","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":1000,"window":"1m","burst":1000,` +
	`"cost":{"request":{"header":"x-max-tokens","default":100},"response":{"header":"x-cost"}}`

func redisBudgetConfig(failure string) string {
	return `{"rules":[` + budgetRule + `,"backend":"redis"}],"failure_mode":"` + failure + `","redis":{"cluster":"rc","timeout_ms":50,"instances":2}}`
}

// budgetRequest starts a request of user reserving maxTokens ("" for the default).
func (r *redisRig) budgetRequest(user, maxTokens string) (uint32, abi.Action) {
	r.id++
	id := r.id
	r.f.ReqHeaders = [][2]string{{":method", "POST"}, {":path", "/v1"}, {"x-user", user}}
	if maxTokens != "" {
		r.f.ReqHeaders = append(r.f.ReqHeaders, [2]string{"x-max-tokens", maxTokens})
	}
	r.f.live[id] = true
	r.f.effective = id
	r.vm.OnContextCreate(id, 1)
	r.f.inStream = id
	defer func() { r.f.inStream = 0 }()
	return id, r.vm.OnRequestHeaders(id, len(r.f.ReqHeaders), true)
}

// respond gives stream id its response headers (x-cost when cost is not "") and ends it.
func (r *redisRig) respond(id uint32, cost string) {
	r.f.RespHeaders = [][2]string{{":status", "200"}}
	if cost != "" {
		r.f.RespHeaders = append(r.f.RespHeaders, [2]string{"x-cost", cost})
	}
	r.f.effective, r.f.inStream = id, id
	r.vm.OnResponseHeaders(id, len(r.f.RespHeaders), true)
	r.f.inStream = 0
	r.end(id)
}

// redisKeyOf is the key a script call names ("sluice:{…}:tb2").
func redisKeyOf(t *testing.T, q string) string {
	t.Helper()
	i := strings.Index(q, "sluice:{")
	j := strings.Index(q[max(i, 0):], "}:tb2")
	if i < 0 || j < 0 {
		t.Fatalf("no key in %.80q", q)
	}
	return q[i : i+j+5]
}

// argsTail is the tail of a script call from its burst argument on.
func argsTail(burst, count, op string) string {
	bulk := func(s string) string { return "$" + itoa(len(s)) + "\r\n" + s + "\r\n" }
	return bulk(burst) + bulk(count) + bulk("0") + bulk(op) + bulk("0") + bulk("0")
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

func TestRedisBudgetReservesAndSettles(t *testing.T) {
	r := startRedisRig(t, redisBudgetConfig("closed"))
	// alice reserves 300; bob's request comes in before alice's reply.
	a, act := r.budgetRequest("alice", "300")
	ta := r.lastToken()
	if act != abi.ActionPause {
		t.Fatalf("action %v", act)
	}
	qa := r.f.sent[ta]
	if !strings.HasPrefix(qa, "*12\r\n") || !strings.HasSuffix(qa, argsTail("1000", "300", "0")) {
		t.Fatalf("reservation %q: want one call of cost 300", qa)
	}
	aHeaders := r.f.ReqHeaders
	b, _ := r.budgetRequest("bob", "")
	tb := r.lastToken()
	if tb == ta || !strings.HasSuffix(r.f.sent[tb], argsTail("1000", "100", "0")) {
		t.Fatalf("bob's reservation %q: want its own call, the default cost 100", r.f.sent[tb])
	}
	// The fake host has one set of request headers: each stream's are its own on a
	// real host when its reply makes it the effective context.
	bHeaders := r.f.ReqHeaders
	r.f.ReqHeaders = aHeaders
	r.answer(ta, 0, replyAdmit)
	r.f.ReqHeaders = bHeaders
	r.answer(tb, 0, replyAdmit)
	if !r.continuedOnce(a) || !r.continuedOnce(b) {
		t.Fatalf("continued %v", r.f.continued)
	}
	// alice used 120: 180 refunded on her key (op 3), not bob's.
	calls := len(r.f.order)
	r.respond(a, "120")
	if len(r.f.order) != calls+1 {
		t.Fatalf("%d calls at the end of the stream, want one settlement", len(r.f.order)-calls)
	}
	qs := r.f.sent[r.lastToken()]
	if !strings.HasSuffix(qs, argsTail("1000", "180", "3")) || redisKeyOf(t, qs) != redisKeyOf(t, qa) {
		t.Fatalf("settlement %q, want a refund of 180 on %s", qs, redisKeyOf(t, qa))
	}
	r.answer(r.lastToken(), 0, "*7\r\n:1\r\n:1000\r\n:880\r\n:7200000\r\n:0\r\n:1700000000000000\r\n:0\r\n")
	// bob used 250: 150 charged (op 2); the script refuses it: counted.
	r.respond(b, "250")
	qs = r.f.sent[r.lastToken()]
	if !strings.HasSuffix(qs, argsTail("1000", "150", "2")) || redisKeyOf(t, qs) != redisKeyOf(t, r.f.sent[tb]) {
		t.Fatalf("settlement %q, want a charge of 150 on bob's key", qs)
	}
	r.answer(r.lastToken(), 0, "-ERR sluice: settlement out of range\r\n")
	if r.metric(filter.MetricRedisSettlements) != 2 || r.metric(filter.MetricRedisSettleFailures) != 1 || r.metric(filter.MetricRedisCalls) != 2 {
		t.Errorf("settlements %d, failures %d, calls %d", r.metric(filter.MetricRedisSettlements), r.metric(filter.MetricRedisSettleFailures), r.metric(filter.MetricRedisCalls))
	}
	if r.metric(filter.RuleMetric("llm", "reserved")) != 400 || r.metric(filter.RuleMetric("llm", "settled")) != 2 ||
		r.metric(filter.RuleMetric("llm", "refunded")) != 180 || r.metric(filter.RuleMetric("llm", "excess")) != 150 {
		t.Errorf("rule metrics reserved %d settled %d refunded %d excess %d", r.metric(filter.RuleMetric("llm", "reserved")),
			r.metric(filter.RuleMetric("llm", "settled")), r.metric(filter.RuleMetric("llm", "refunded")), r.metric(filter.RuleMetric("llm", "excess")))
	}

	// A settlement answered NOSCRIPT goes again as EVAL; one unanswered is given up by
	// the guard and counted.
	r.f.Now_ += 2e9
	c, _ := r.budgetRequest("carol", "10")
	r.answer(r.lastToken(), 0, replyAdmit)
	r.respond(c, "11")
	first := r.lastToken()
	if !strings.HasPrefix(r.f.sent[first], "*12\r\n$7\r\nEVALSHA\r\n") || !strings.HasSuffix(r.f.sent[first], argsTail("1000", "1", "2")) {
		t.Fatalf("settlement %q", r.f.sent[first])
	}
	r.answer(first, 0, "-NOSCRIPT No matching script.\r\n")
	if second := r.lastToken(); second == first || !strings.HasPrefix(r.f.sent[second], "*12\r\n$4\r\nEVAL\r\n") || !strings.HasSuffix(r.f.sent[second], argsTail("1000", "1", "2")) {
		t.Fatalf("after NOSCRIPT: %.60q", r.f.sent[second])
	}
	r.f.Now_ += int64(time.Second)
	r.vm.OnTick(1)
	if r.metric(filter.MetricRedisSettleFailures) != 2 {
		t.Errorf("settlement failures %d after the guard", r.metric(filter.MetricRedisSettleFailures))
	}
	// The cost as reserved: no settlement.
	d, _ := r.budgetRequest("dave", "10")
	r.answer(r.lastToken(), 0, replyAdmit)
	calls = len(r.f.order)
	r.respond(d, "10")
	if len(r.f.order) != calls || r.metric(filter.RuleMetric("llm", "settled")) != 4 {
		t.Errorf("an exact reservation sent %d calls, settled %d", len(r.f.order)-calls, r.metric(filter.RuleMetric("llm", "settled")))
	}
}

// A rule of a fixed cost is coalesced by key with that cost; failure_mode "local" settles
// on the local fallback (no Redis call), "open" settles nothing.
func TestRedisBudgetFixedCostAndFailureModes(t *testing.T) {
	cfg := strings.Replace(redisBudgetConfig("local"), `{"header":"x-max-tokens","default":100}`, `40`, 1)
	r := startRedisRig(t, cfg)
	a, _ := r.budgetRequest("alice", "")
	ta := r.lastToken()
	r.budgetRequest("alice", "")
	r.budgetRequest("alice", "")
	if len(r.f.order) != 1 || !strings.HasSuffix(r.f.sent[ta], argsTail("1000", "40", "0")) {
		t.Fatalf("%d calls, first %q", len(r.f.order), r.f.sent[ta])
	}
	r.answer(ta, 0, replyAdmit)
	if q := r.f.sent[r.lastToken()]; !strings.HasPrefix(q, "*13\r\n") || !strings.HasSuffix(q, argsTail("1000", "40", "0")+"$1\r\n2\r\n") {
		t.Fatalf("the coalesced call %q: want two requests of cost 40", q)
	}
	r.respond(a, "30")
	if q := r.f.sent[r.lastToken()]; !strings.HasSuffix(q, argsTail("1000", "10", "3")) {
		t.Fatalf("settlement %q", q)
	}
	// Redis refuses the calls: the local fallback (limit 500, burst 500) decides and
	// settles on shared data.
	r.f.callStatus = abi.StatusInternalFailure
	for i := 0; i < 3; i++ {
		id, act := r.budgetRequest("zed", "")
		if act != abi.ActionContinue {
			t.Fatalf("fallback request %d: %v", i, act)
		}
		r.respond(id, "200") // 160 charged locally each time
	}
	if r.metric(filter.MetricRedisFailLocal) != 3 || r.metric(filter.MetricRedisSettlements) != 1 || r.metric(filter.MetricRedisSettleFailures) != 0 {
		t.Fatalf("fail_local %d settlements %d failures %d", r.metric(filter.MetricRedisFailLocal), r.metric(filter.MetricRedisSettlements), r.metric(filter.MetricRedisSettleFailures))
	}
	// 3 × 200 = 600 > 500: the fallback's key is in debt now.
	if _, act := r.budgetRequest("zed", ""); act == abi.ActionContinue {
		t.Fatal("the fallback admitted a key in debt: its settlements were not applied")
	}
}

// The rls backend: the reservation is the descriptor's hits_addend (and its refund's);
// the settlement is a call with sluice.settle.
func TestRLSBudgetReservesAndSettles(t *testing.T) {
	cfg := `{"rules":[` + budgetRule + `,"backend":"rls"},{"name":"l2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":1,"window":"1h"}],` +
		`"failure_mode":"open","rls":{"cluster":"ratelimit","domain":"edge","timeout_ms":40,"instances":10}}`
	r := startRLSRig(t, cfg)
	r.extra = [][2]string{{"x-max-tokens", "300"}}
	a, _ := r.request("alice")
	ta := r.lastToken()
	req := r.f.sent[ta]
	if d := req.GetDescriptors()[0]; d.GetHitsAddend().GetValue() != 300 || req.GetHitsAddend() != 1 {
		t.Fatalf("descriptor hits_addend %v, request %d: want 300 and 1", d.GetHitsAddend(), req.GetHitsAddend())
	}
	r.answer(ta, okReply(status(rlsv3.RateLimitResponse_OK, 700, time.Second)))
	if r.continued(a) != 1 {
		t.Fatal("not resumed")
	}
	r.f.RespHeaders = [][2]string{{":status", "200"}, {"x-cost", "120"}}
	r.f.effective = a
	r.vm.OnResponseHeaders(a, 2, true)
	r.end(a)
	st := r.f.sent[r.lastToken()]
	if got := descriptorEntries(st, 0); len(st.GetDescriptors()) != 1 || !strings.HasPrefix(got, "sluice.rule=llm ") ||
		!strings.HasSuffix(got, " sluice.key=\x02\x05alice sluice.settle=-180") || st.GetDescriptors()[0].GetHitsAddend() != nil {
		t.Fatalf("settlement %q (hits_addend %v)", got, st.GetDescriptors()[0].GetHitsAddend())
	}
	r.answer(r.lastToken(), &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{status(rlsv3.RateLimitResponse_OK, 880, time.Second)}})
	// Two requests of carl's in flight at once: the second, denied by l2 once the first
	// has spent it, gives its reservation back: the refund descriptor carries the cost.
	r.extra = [][2]string{{"x-max-tokens", "50"}}
	r.request("carl")
	t1 := r.lastToken()
	r.request("carl")
	t2 := r.lastToken()
	r.answer(t1, okReply(status(rlsv3.RateLimitResponse_OK, 950, time.Second)))
	if lr := r.answer(t2, okReply(status(rlsv3.RateLimitResponse_OK, 900, time.Second))); lr == nil || lr.Status != 429 {
		t.Fatalf("want 429 from l2: %+v", lr)
	}
	rf := r.f.sent[r.lastToken()]
	if got := descriptorEntries(rf, 0); !strings.Contains(got, "sluice.refund=") || rf.GetDescriptors()[0].GetHitsAddend().GetValue() != 50 {
		t.Fatalf("refund %q hits_addend %v", got, rf.GetDescriptors()[0].GetHitsAddend())
	}
	// A settlement the service fails is counted.
	r.extra = [][2]string{{"x-max-tokens", "5"}}
	b, _ := r.request("bob")
	r.answer(r.lastToken(), okReply(status(rlsv3.RateLimitResponse_OK, 995, time.Second)))
	r.f.RespHeaders = [][2]string{{":status", "200"}, {"x-cost", "9"}}
	r.f.effective = b
	r.vm.OnResponseHeaders(b, 2, true)
	r.end(b)
	if got := descriptorEntries(r.f.sent[r.lastToken()], 0); !strings.HasSuffix(got, "sluice.settle=4") {
		t.Fatalf("settlement %q", got)
	}
	r.close(r.lastToken(), 14)
	if r.metric(filter.MetricRLSSettlements) != 2 || r.metric(filter.MetricRLSSettleFailures) != 1 {
		t.Errorf("settlements %d failures %d", r.metric(filter.MetricRLSSettlements), r.metric(filter.MetricRLSSettleFailures))
	}
}

// A Redis-decided request with a settlement allocates nothing in the filter: the
// settlement's call and bill are pooled.
func TestRedisBudgetAllocations(t *testing.T) {
	r := startRedisRig(t, redisBudgetConfig("open"))
	r.f.ReqHeaders = [][2]string{{":method", "POST"}, {":path", "/v1"}, {"x-user", "alice"}, {"x-max-tokens", "300"}}
	resp := [][2]string{{":status", "200"}, {"x-cost", "120"}}
	r.f.RespHeaders = make([][2]string, 0, 16)
	cycle := func() {
		r.f.RespHeaders = append(r.f.RespHeaders[:0], resp...)
		r.id++
		id := r.id
		r.f.live[id] = true
		r.f.effective = id
		r.vm.OnContextCreate(id, 1)
		r.vm.OnRequestHeaders(id, 4, true)
		r.answer(r.f.next, 0, replyAdmit)
		r.f.effective = id
		r.vm.OnResponseHeaders(id, 2, true)
		r.vm.OnLog(id)
		r.vm.OnDelete(id)
		r.answer(r.f.next, 0, replyAdmit) // the settlement's reply
		delete(r.f.live, id)
		r.f.continued = r.f.continued[:0]
		clear(r.f.sent)
		r.f.order = r.f.order[:0]
	}
	for i := 0; i < 100; i++ {
		cycle()
	}
	if r.metric(filter.MetricRedisSettlements) != 100 || r.metric(filter.MetricRedisSettleFailures) != 0 {
		t.Fatalf("settlements %d failures %d", r.metric(filter.MetricRedisSettlements), r.metric(filter.MetricRedisSettleFailures))
	}
	allocs := testing.AllocsPerRun(1000, cycle)
	t.Logf("allocations per Redis-decided, settled request (filter and fake host): %.1f", allocs)
	// The fake host's own: headers added (3) and read (2), two calls recorded, two
	// replies copied; the filter allocates none (the profile says so).
	if allocs > 13 {
		t.Errorf("%.1f allocations per request", allocs)
	}
}
