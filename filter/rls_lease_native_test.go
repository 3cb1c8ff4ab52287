package filter_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Native tests of leases through the rls backend (lease.go's pools, the
// calls of rls_backend.go), the service answered by hand: one acquire
// serves a burst, exhaustion denies with the service's wait, pools are
// returned on expiry and at the root's end, a lease never shares a call
// with decisions (and the all-or-nothing of a denied call never touches
// it), failures follow failure_mode.

func rlsLeaseConfig(lease int, extraRules string) string {
	return `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":100,"window":"1h","backend":"rls","lease":` +
		strconv.Itoa(lease) + `}` + extraRules + `],
"failure_mode":"closed","rls":{"cluster":"ratelimit","domain":"edge","timeout_ms":40,"instances":3}}`
}

const leaseStamp = 1700000000000000

// grantReply answers an acquire with a grant of g (remaining what the
// service has left, valid how long the admissions may be spent).
func grantReply(g, remaining uint32, valid time.Duration) *rlsv3.RateLimitResponse {
	st := status(rlsv3.RateLimitResponse_OK, remaining, 50*time.Minute)
	st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: g}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-sluice-lease", Value: fmt.Sprintf("0:%d:%d", leaseStamp, valid/time.Microsecond)}}}
}

// emptyReply answers an acquire that got nothing: OVER_LIMIT with the wait.
func emptyReply(wait time.Duration) *rlsv3.RateLimitResponse {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{status(rlsv3.RateLimitResponse_OVER_LIMIT, 0, wait)}}
}

// lastEntry is the last entry of descriptor 0 of call tk ("key=value").
func (r *rlsRig) lastEntry(tk uint32) string {
	es := r.f.sent[tk].GetDescriptors()[0].GetEntries()
	return es[len(es)-1].GetKey() + "=" + es[len(es)-1].GetValue()
}

func TestRLSLeaseOneAcquireServesTheBurst(t *testing.T) {
	r := startRLSRig(t, rlsLeaseConfig(10, ""))
	var ids []uint32
	for i := 0; i < 3; i++ {
		id, act := r.request("alice")
		if act != abi.ActionPause {
			t.Fatalf("request %d: %v, want Pause for the acquire", i, act)
		}
		ids = append(ids, id)
	}
	if len(r.f.order) != 1 {
		t.Fatalf("%d calls for three waiting requests, want one acquire", len(r.f.order))
	}
	tk := r.lastToken()
	req := r.f.sent[tk]
	if d := descriptorEntries(req, 0); len(req.Descriptors) != 1 ||
		!strings.HasPrefix(d, "sluice.rule=r1 sluice.algorithm=fixed_window sluice.limit=100 sluice.window_us=3600000000 sluice.burst=0 sluice.key=") ||
		!strings.HasSuffix(d, "alice sluice.lease=10:3") {
		t.Fatalf("acquire: %v", req)
	}
	if lr := r.answer(tk, grantReply(10, 70, time.Hour)); lr != nil {
		t.Fatalf("local response %+v", lr)
	}
	for _, id := range ids {
		if r.continued(id) != 1 {
			t.Fatalf("request %d not resumed once: %v", id, r.f.continued)
		}
		r.end(id)
	}
	for i := 0; i < 7; i++ {
		id, act := r.request("alice")
		if act != abi.ActionContinue {
			t.Fatalf("spend %d: %v, want Continue from the pool", i, act)
		}
		r.end(id)
	}
	if len(r.f.order) != 1 {
		t.Fatalf("%d calls while the pool held admissions", len(r.f.order))
	}
	id, act := r.request("alice")
	if act != abi.ActionPause || len(r.f.order) != 2 || r.lastEntry(r.lastToken()) != "sluice.lease=10:3" {
		t.Fatalf("11th request: %v, %d calls", act, len(r.f.order))
	}
	r.answer(r.lastToken(), grantReply(10, 60, time.Hour))
	r.end(id)
	if r.metric(filter.MetricRLSLeased) != 20 || r.metric(filter.MetricRLSCalls) != 2 || r.metric("sluice.r1.allowed") != 11 {
		t.Fatalf("leased %d calls %d allowed %d", r.metric(filter.MetricRLSLeased), r.metric(filter.MetricRLSCalls), r.metric("sluice.r1.allowed"))
	}
}

// An acquire that gets nothing denies its waiters with the service's wait,
// and the proxy holds that denial for the wait, at most a second
// (leaseHold): the key's next requests are denied from shared data with the
// remaining wait, without a call; then the next request asks again.
func TestRLSLeaseExhausted(t *testing.T) {
	r := startRLSRig(t, rlsLeaseConfig(10, ""))
	id, _ := r.request("bob")
	lr := r.answer(r.lastToken(), emptyReply(90*time.Second))
	if lr == nil || lr.Status != 429 || headerOf(lr.Headers, "retry-after") != "90" {
		t.Fatalf("exhausted: %+v", lr)
	}
	r.end(id)
	r.f.Now_ += int64(900 * time.Millisecond)
	id, act := r.request("bob")
	if lr := r.f.Local; act != abi.ActionPause || len(r.f.order) != 1 || lr == nil || lr.Status != 429 || headerOf(lr.Headers, "retry-after") != "90" {
		t.Fatalf("within the hold: %v, %d calls, %+v", act, len(r.f.order), lr)
	}
	r.end(id)
	// Another key is not held.
	id, act = r.request("bert")
	if act != abi.ActionPause || len(r.f.order) != 2 || r.f.Local != nil {
		t.Fatalf("another key: %v, %d calls, %+v", act, len(r.f.order), r.f.Local)
	}
	r.answer(r.lastToken(), grantReply(10, 0, time.Hour))
	r.end(id)
	r.f.Now_ += int64(100 * time.Millisecond)
	if _, act := r.request("bob"); act != abi.ActionPause || len(r.f.order) != 3 || r.f.Local != nil {
		t.Fatalf("after the hold: %v, %d calls, %+v", act, len(r.f.order), r.f.Local)
	}
	// A wait shorter than the hold (a token bucket's next token) is held
	// for just that long.
	r.answer(r.lastToken(), emptyReply(30*time.Millisecond))
	r.f.Now_ += int64(20 * time.Millisecond)
	if _, act := r.request("bob"); act != abi.ActionPause || len(r.f.order) != 3 || r.f.Local == nil || headerOf(r.f.Local.Headers, "retry-after") != "1" {
		t.Fatalf("within a 30 ms hold: %v, %d calls, %+v", act, len(r.f.order), r.f.Local)
	}
	r.f.Now_ += int64(10 * time.Millisecond)
	if _, act := r.request("bob"); act != abi.ActionPause || len(r.f.order) != 4 || r.f.Local != nil {
		t.Fatalf("after a 30 ms hold: %v, %d calls, %+v", act, len(r.f.order), r.f.Local)
	}
}

// Unspent admissions go back in a call of their own (sluice.return =
// "<n>:<stamp>") after leaseIdle without a spend, and all of them when the
// root context ends.
func TestRLSLeaseReturn(t *testing.T) {
	r := startRLSRig(t, rlsLeaseConfig(10, ""))
	id, _ := r.request("carol")
	r.answer(r.lastToken(), grantReply(10, 90, time.Hour))
	r.end(id)
	r.f.Now_ += 1_100_000_000
	r.vm.OnTick(1)
	stamp := strconv.Itoa(leaseStamp)
	if len(r.f.order) != 2 || r.lastEntry(r.lastToken()) != "sluice.return=9:"+stamp {
		t.Fatalf("after a second idle: %d calls, last %v", len(r.f.order), r.f.sent[r.lastToken()])
	}
	if d := descriptorEntries(r.f.sent[r.lastToken()], 0); !strings.HasPrefix(d, "sluice.rule=r1 sluice.algorithm=fixed_window") || !strings.Contains(d, "carol sluice.return=") {
		t.Fatalf("return descriptor %q", d)
	}
	r.answer(r.lastToken(), &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{status(rlsv3.RateLimitResponse_OK, 99, time.Hour)}})
	if r.metric(filter.MetricRLSReturned) != 9 || r.metric(filter.MetricRLSCalls) != 2 || r.metric(filter.MetricRLSRefundFailures) != 0 {
		t.Fatalf("returned %d calls %d refund failures %d", r.metric(filter.MetricRLSReturned), r.metric(filter.MetricRLSCalls), r.metric(filter.MetricRLSRefundFailures))
	}
	// The next acquire asks for what the unused pool served (1).
	id, _ = r.request("carol")
	if e := r.lastEntry(r.lastToken()); e != "sluice.lease=1:3" {
		t.Fatalf("acquire after an unused pool: %s", e)
	}
	r.answer(r.lastToken(), grantReply(1, 90, time.Hour))
	r.end(id)
	id, _ = r.request("dan")
	r.answer(r.lastToken(), grantReply(10, 90, time.Hour))
	r.end(id)
	// The root ends with its return in flight: it answers false from
	// proxy_on_done (a host deletes a root's gRPC calls with it) and calls
	// proxy_done once the return has ended.
	if r.vm.OnDone(1) {
		t.Fatal("proxy_on_done answered true with a return in flight")
	}
	if e := r.lastEntry(r.lastToken()); e != "sluice.return=9:"+stamp || !strings.Contains(descriptorEntries(r.f.sent[r.lastToken()], 0), "dan sluice.return=") {
		t.Fatalf("at the end: %s", e)
	}
	if r.f.done != 0 {
		t.Fatalf("proxy_done before the return ended")
	}
	// A return the service could not make counts as a refund failure.
	r.close(r.lastToken(), 14)
	if r.metric(filter.MetricRLSRefundFailures) != 1 {
		t.Fatalf("refund failures %d", r.metric(filter.MetricRLSRefundFailures))
	}
	if r.f.done != 1 {
		t.Fatalf("proxy_done called %d times after the last return ended, want 1", r.f.done)
	}
}

// A root whose return is never answered still ends: the guard gives the
// call up on a tick, and proxy_done follows. A root with nothing in flight
// answers true at once.
func TestRLSLeaseDoneAfterGuard(t *testing.T) {
	r := startRLSRig(t, rlsLeaseConfig(10, ""))
	id, _ := r.request("erin")
	r.answer(r.lastToken(), grantReply(10, 90, time.Hour))
	r.end(id)
	if r.vm.OnDone(1) {
		t.Fatal("proxy_on_done answered true with a return in flight")
	}
	r.f.Now_ += int64(time.Second)
	r.vm.OnTick(1)
	if r.f.done != 1 {
		t.Fatalf("proxy_done called %d times after the guard gave the return up, want 1", r.f.done)
	}
	q := startRLSRig(t, rlsLeaseConfig(10, ""))
	if !q.vm.OnDone(1) || q.f.done != 0 {
		t.Fatalf("a root with nothing in flight: proxy_on_done false or proxy_done called (%d)", q.f.done)
	}
}

// A lease never shares a call with decisions. Beside a decision the
// service denied (and refunded itself), the admission taken from the
// lease goes back to the pool: no call undoes it and the pool serves ten.
// Beside an acquire that got nothing, the decision's admission is refunded
// with its token, and nothing of the lease is.
func TestRLSLeaseBesideADecision(t *testing.T) {
	other := `,{"name":"r2","key":[{"header":"x-team"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}`
	r := startRLSRig(t, rlsLeaseConfig(10, other))
	r.extra = [][2]string{{"x-team", "blue"}}
	id, act := r.request("erin")
	if act != abi.ActionPause || len(r.f.order) != 2 {
		t.Fatalf("%v, %d calls, want an acquire and a decision call", act, len(r.f.order))
	}
	acq, dec := r.f.order[0], r.f.order[1]
	if r.lastEntry(acq) != "sluice.lease=10:3" || len(r.f.sent[dec].Descriptors) != 1 || !strings.HasSuffix(r.lastEntry(dec), "blue") {
		t.Fatalf("calls: %v / %v", r.f.sent[acq], r.f.sent[dec])
	}
	r.answer(acq, grantReply(10, 90, time.Hour))
	lr := r.answer(dec, okReply(status(rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Minute)))
	if lr == nil || lr.Status != 429 {
		t.Fatalf("denied by r2: %+v", lr)
	}
	r.end(id)
	if len(r.f.order) != 2 {
		t.Fatalf("%d calls after the denial, want none (r2 refunded by the service, r1 back in the pool)", len(r.f.order))
	}
	r.extra = nil
	for i := 0; i < 10; i++ {
		id, act := r.request("erin")
		if act != abi.ActionContinue {
			t.Fatalf("spend %d: %v (the denied request's admission did not go back to the pool)", i, act)
		}
		r.end(id)
	}
	if _, act := r.request("erin"); act != abi.ActionPause {
		t.Fatalf("the pool served more than 10: %v", act)
	}

	r = startRLSRig(t, rlsLeaseConfig(10, other))
	r.extra = [][2]string{{"x-team", "blue"}}
	id, _ = r.request("fay")
	acq, dec = r.f.order[0], r.f.order[1]
	r.answer(dec, okReply(status(rlsv3.RateLimitResponse_OK, 4, time.Hour)))
	lr = r.answer(acq, emptyReply(time.Minute))
	if lr == nil || lr.Status != 429 {
		t.Fatalf("denied by r1's lease: %+v", lr)
	}
	r.end(id)
	if len(r.f.order) != 3 || len(r.f.sent[r.lastToken()].Descriptors) != 1 || r.lastEntry(r.lastToken()) != "sluice.refund=1700000000000000:40" ||
		!strings.HasPrefix(descriptorEntries(r.f.sent[r.lastToken()], 0), "sluice.rule=r2 ") {
		t.Fatalf("%d calls, last %v; want one refund of r2", len(r.f.order), r.f.sent[r.lastToken()])
	}
	if r.metric(filter.MetricRLSRefunds) != 1 || r.metric(filter.MetricRLSReturned) != 0 {
		t.Fatalf("refunds %d returned %d", r.metric(filter.MetricRLSRefunds), r.metric(filter.MetricRLSReturned))
	}
}

// An acquire that fails — a gRPC status, a grant outside 1..n, a grant
// without its x-sluice-lease, no reply (the guard, which cancels it) — is
// decided by failure_mode (closed: 503).
func TestRLSLeaseAcquireFailures(t *testing.T) {
	noHeader := grantReply(5, 90, time.Hour)
	noHeader.ResponseHeadersToAdd = nil
	cases := map[string]func(r *rlsRig, tk uint32) *filtertest.LocalResponse{
		"unavailable": func(r *rlsRig, tk uint32) *filtertest.LocalResponse { return r.close(tk, 14) },
		"grant above n": func(r *rlsRig, tk uint32) *filtertest.LocalResponse {
			return r.answer(tk, grantReply(11, 90, time.Hour))
		},
		"no lease header": func(r *rlsRig, tk uint32) *filtertest.LocalResponse { return r.answer(tk, noHeader) },
		"guard": func(r *rlsRig, tk uint32) *filtertest.LocalResponse {
			r.f.Now_ += 51_000_000
			r.f.effective = 1
			r.f.Local = nil
			r.vm.OnTick(1)
			if len(r.f.cancelled) != 1 || r.f.cancelled[0] != tk {
				r.t.Errorf("cancelled %v, want the acquire %d", r.f.cancelled, tk)
			}
			return r.f.Local
		},
	}
	for name, fail := range cases {
		t.Run(name, func(t *testing.T) {
			r := startRLSRig(t, rlsLeaseConfig(10, ""))
			_, act := r.request("gina")
			if act != abi.ActionPause {
				t.Fatalf("%v", act)
			}
			lr := fail(r, r.lastToken())
			if lr == nil || lr.Status != 503 || r.metric(filter.MetricRLSFailures) != 1 || r.metric(filter.MetricRLSFailClosed) != 1 {
				t.Fatalf("local %+v failures %d fail_closed %d\n%v", lr, r.metric(filter.MetricRLSFailures), r.metric(filter.MetricRLSFailClosed), r.f.Logs)
			}
		})
	}
}
