package filter

import (
	"errors"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/redisrl"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// The rate-limit service backend (backend "rls"; both artifacts).
//
// The codec of the remote-call engine (remote.go) for the rate-limit
// service: the engine's rules apply unchanged (a paused stream is resumed
// or answered only from root-context callbacks: proxy_on_grpc_receive,
// proxy_on_grpc_close, proxy_on_tick).
//
//  1. Local rules are decided first, without writing; a local denial
//     answers at once and no call is made.
//  2. The applying RLS rules go to the service in one
//     envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit call made
//     with proxy_grpc_call (the message encoded by hand, rls_proto.go): one
//     inline descriptor per rule carrying everything the service needs to
//     decide (rule, algorithm, limit, window, burst, key), so one service
//     serves every plugin configuration. Enforcing rules share one call —
//     the service refunds every admission of a call that has a denial, so a
//     denied request is charged to none of them; each shadow rule gets a
//     call of its own, so that its denials never undo an enforcing rule's
//     admission. The request pauses.
//  3. When every reply is in, each rule takes its descriptor's status
//     (limit_remaining, duration_until_reset → the decision for the
//     headers), the local rules are decided again and charged, and the
//     verdict is given as usual.
//  4. A request denied after the service admitted it (a local rule, a
//     shadow call's partner, or the stream ended while waiting) is refunded:
//     the service returned an x-sluice-refund token per admitted descriptor,
//     and the filter sends them back in refund descriptors (fire and
//     forget).
//
// A call that fails — proxy_grpc_call refused, proxy_on_grpc_close with a
// nonzero status (UNAVAILABLE when Redis is down, PERMISSION_DENIED for a
// domain the service does not enable, DEADLINE_EXCEEDED after
// rls.timeout_ms), a reply that does not decode or does not answer every
// descriptor, or no reply within rls.timeout_ms plus a margin (the guard on
// proxy_on_tick, which also cancels the call) — fails each of its rules,
// and failure_mode decides them as for Redis: open, closed (503), or local
// (shared data, limit divided by rls.instances).
//
// A rule with "lease" (token_bucket, fixed_window) is decided from the
// lease pools (lease.go), as under the Redis backend: it is in no decision
// call; an acquire is a call of its own with one descriptor (the rule's
// entries and sluice.lease = "<n>:<instances>"), answered with the grant in
// quota.requests and the grant's stamp and validity in an x-sluice-lease
// header; a return is a call of its own too (sluice.return =
// "<n>:<stamp>"). Leases never share a call with decisions, so the
// service's all-or-nothing refund of a denied call never touches a grant,
// and a request denied after a pool admitted it gives that admission back
// to the pool.
//
// A rule with "delay" shapes on the service (rlswire): its descriptor
// carries sluice.max_delay_us (none once the rule holds delay.max_held
// requests on this VM: a meter), the service's script takes the slot on
// Redis, and an admission into a later slot comes back with an
// x-sluice-delay header, which holds the request (hold.go) from the
// reply's arrival. A delay beyond the max sent, or on a refusal, fails the
// rule (failure_mode decides). As for Redis, a held request whose client
// leaves gives nothing back (its slot passes unused); a refund goes back
// at the slot; the local fallback decides without a queue.

// A rule with "cost" reserves on the service: its descriptor carries the
// request's reservation as its own hits_addend (RateLimitDescriptor field
// 3; the request's hits_addend stays 1, so the rules sharing a call each
// have their cost), and so does its refund descriptor, which gives that
// much back. With cost.response, the stream's end settles a remote
// admission in a call of its own: one descriptor, the rule's entries and
// key and sluice.settle = "<delta>" (rlswire; sluice serve runs the
// script's settle op), fire and forget: counted in sluice.rls.settlements,
// and in sluice.rls.settlement_failures when the call is refused, fails or
// is not answered OK; the reservation then stands. Plain envoyproxy/
// ratelimit takes hits_addend but not sluice.settle (inline descriptors
// need sluice serve anyway).

// GrpcHost is what the rls backend needs from the host beyond abi.Host:
// the unary gRPC call and the calls that resume a paused stream from a
// later callback. abi.Imports implements it (except in the nogrpc test
// build).
type GrpcHost interface {
	GrpcCall(cluster, serviceName, method string, message []byte, timeoutMS uint32) (token uint32, st abi.Status)
	GrpcCancel(token uint32) abi.Status
	Done() abi.Status
	SetEffectiveContext(id uint32) abi.Status
	ContinueStream() abi.Status
	SetTickPeriod(ms uint32) abi.Status
}

// The service and method called.
const (
	RLSService = "envoy.service.ratelimit.v3.RateLimitService"
	RLSMethod  = "ShouldRateLimit"
)

// RLS metric names (counters).
const (
	MetricRLSCalls          = "sluice.rls.calls"           // ShouldRateLimit calls sent for decisions and leases (acquires, returns)
	MetricRLSFailures       = "sluice.rls.failures"        // rule decisions the service could not make
	MetricRLSTimeouts       = "sluice.rls.timeouts"        // of which: DEADLINE_EXCEEDED or the guard
	MetricRLSFailOpen       = "sluice.rls.fail_open"       // failures let through (failure_mode open)
	MetricRLSFailClosed     = "sluice.rls.fail_closed"     // failures rejected with 503 (closed)
	MetricRLSFailLocal      = "sluice.rls.fail_local"      // failures decided locally (local)
	MetricRLSRefunds        = "sluice.rls.refunds"         // refund descriptors sent
	MetricRLSRefundFailures = "sluice.rls.refund_failures" // admissions not refunded (no token, or the call failed)
	MetricRLSSettlements    = "sluice.rls.settlements"     // token-budget settlements sent (sluice.settle)
	MetricRLSSettleFailures = "sluice.rls.settlement_failures"
)

// gRPC status codes the backend tells apart.
const grpcDeadlineExceeded = 4

// rlsState is a Plugin's rls codec.
type rlsState struct {
	p     *Plugin
	e     *remote
	gh    GrpcHost
	cfg   config.RLS
	msg   []byte // the request being encoded
	num   []byte // scratch for a refund value
	rules []int  // scratch: the rule indices of the call being encoded
	res   rlsResponse
}

// rlsRule is the RLS side of one rule (rule.rls).
type rlsRule struct {
	entries []byte // the encoded entries sluice.rule .. sluice.burst (fixed per rule)
	plan    []byte // scratch: the entries under a plan (plans_remote.go)
	head    int    // the length of entries' sluice.rule and sluice.algorithm (0: not yet known)
}

// rlsWait is the RLS side of a paused request (remoteWait.x).
type rlsWait struct {
	keys  [][]byte            // by rule index: the key sent (for refunds)
	res   []rlsResult         // by rule index
	maxUS []int64             // by rule index: the max delay sent (µs; 0: none)
	cost  []int64             // by rule index: the cost reserved (the descriptor's hits_addend)
	plan  []*config.PlanEntry // by rule index: the plan sent (plans.go); nil: the rule's own
}

// rlsResult is what a rule's descriptor status said beyond the decision.
type rlsResult struct {
	token      bool  // the service gave a refund token: stamp, ref
	undone     bool  // admitted in a call the service denied: it refunded that itself
	stamp, ref int64 // the refund token
}

// newRLSState returns the rls codec of p and its engine.
func newRLSState(p *Plugin, cfg *config.Config, rules []*rule) (*rlsState, *remote, error) {
	gh, ok := p.host.(GrpcHost)
	if !ok {
		return nil, nil, errors.New("backend \"rls\": the host has no gRPC calls (this module was built without proxy_grpc_call)")
	}
	if cfg.RLS == nil {
		return nil, nil, errors.New("rls: required by rules with backend \"rls\"")
	}
	rs := &rlsState{p: p, gh: gh, cfg: *cfg.RLS, msg: make([]byte, 0, 1024), num: make([]byte, 0, 48)}
	nrules := 0
	for _, r := range rules {
		if r.cfg.Backend == config.BackendRLS {
			r.rls = &rlsRule{entries: appendRuleEntries(nil, r.id, r.cfg)}
			nrules++
		}
	}
	rs.res.init(nrules)
	rs.rules = make([]int, 0, nrules)
	e, err := newRemote(p, rs, gh, rules, remoteSpec{
		name: "rls", backend: config.BackendRLS, timeoutMS: cfg.RLS.TimeoutMS, instances: cfg.RLS.Instances,
		leaseKeyMax: rlsLeaseKeyMax, refundShared: true,
		names: remoteNames{
			calls: MetricRLSCalls, failures: MetricRLSFailures, timeouts: MetricRLSTimeouts,
			failOpen: MetricRLSFailOpen, failClosed: MetricRLSFailClosed, failLocal: MetricRLSFailLocal,
			refunds: MetricRLSRefunds, refundFailures: MetricRLSRefundFailures,
			leased: MetricRLSLeased, returned: MetricRLSReturned,
			settlements: MetricRLSSettlements, settleFailures: MetricRLSSettleFailures,
		},
	})
	if err != nil {
		return nil, nil, err
	}
	rs.e = e
	return rs, e, nil
}

func (rs *rlsState) newWait(n int) any {
	w := &rlsWait{keys: make([][]byte, n), res: make([]rlsResult, n), maxUS: make([]int64, n), cost: make([]int64, n), plan: make([]*config.PlanEntry, n)}
	for i, r := range rs.p.rules {
		if r.rls != nil {
			w.keys[i] = make([]byte, 0, 64)
		}
	}
	return w
}

// prepare implements remoteCodec: the rule's key as sent; enforcing rules
// share one call (the service refunds every admission of a call that has
// a denial, so a denied request is charged to none of them), each shadow
// rule gets a call of its own (its denials never undo an enforcing rule's
// admission).
func (rs *rlsState) prepare(w *remoteWait, i int, r *rule, _ bool) ([]byte, route) {
	x := w.x.(*rlsWait)
	x.res[i] = rlsResult{}
	x.keys[i] = append(x.keys[i][:0], r.key...)
	x.maxUS[i] = int64(r.delay.maxDelay() / time.Microsecond)
	x.cost[i] = r.units
	if x.plan[i] = r.plan; r.plan != nil {
		return x.keys[i], routeOwn // the parameters are the request's (plans_remote.go)
	}
	if r.conc != nil {
		return x.keys[i], routeOwn // an in-flight call is one descriptor (concurrency_remote.go)
	}
	if r.cfg.Mode == config.ModeEnforce {
		return x.keys[i], routeShared
	}
	return x.keys[i], routeOwn
}

// refundable implements remoteCodec: an admission the service undid needs
// nothing, one without a refund token cannot be refunded.
func (rs *rlsState) refundable(w *remoteWait, i int) refundKind {
	x := &w.x.(*rlsWait).res[i]
	switch {
	case x.undone:
		return refundNone
	case !x.token:
		return refundLost
	}
	return refundSend
}

// send implements remoteCodec: one ShouldRateLimit call.
func (rs *rlsState) send(c *remoteCall, _ int64) (uint32, string) {
	switch {
	case rs.isConcurrency(c):
		rs.msg = rs.appendInFlightRequest(rs.msg[:0], c) // concurrency_remote.go
	case c.kind == callDecide, c.kind == callRefund:
		rs.rules = rs.rules[:0]
		for _, sl := range c.slots {
			rs.rules = append(rs.rules, sl.i)
		}
		rs.msg = rs.appendRequest(rs.msg[:0], c.slots[0].w.x.(*rlsWait), rs.rules, c.kind == callRefund)
	case c.kind == callSettle && c.giveBack:
		rs.msg = rs.appendGiveBackRequest(rs.msg[:0], c) // count_window.go
	case c.kind == callSettle:
		rs.msg = rs.appendSettleRequest(rs.msg[:0], c.rule, c.key, c.delta)
	default:
		rs.msg = rs.appendLeaseRequest(rs.msg[:0], c.lease, c.lr)
	}
	token, st := rs.gh.GrpcCall(rs.cfg.Cluster, RLSService, RLSMethod, rs.msg, uint32(rs.cfg.TimeoutMS))
	if st != abi.StatusOK {
		return 0, "proxy_grpc_call: " + st.String()
	}
	return token, ""
}

// reply implements remoteCodec: proxy_on_grpc_receive's message.
func (rs *rlsState) reply(c *remoteCall, size int, _ int64) outcome {
	if rs.isConcurrency(c) {
		return rs.inFlightReply(c, size) // concurrency_remote.go
	}
	n := len(c.slots)
	if c.lr != nil || c.kind == callSettle {
		n = 1
	}
	b, st := rs.p.host.GetBuffer(abi.BufferGrpcReceive, 0, size)
	var err error
	if st != abi.StatusOK && size > 0 {
		err = errors.New("reading the reply: " + st.String())
	} else {
		err = rs.res.decode(b, n)
	}
	switch c.kind {
	case callDecide:
		if err != nil {
			return outcome{why: "ShouldRateLimit reply: " + err.Error()}
		}
		rs.record(c)
	case callAcquire:
		var res redisrl.LeaseResult
		if err == nil {
			res, err = rs.leaseResult(c.lease, c.fetch.n)
		}
		if err != nil {
			return outcome{why: "lease acquire: " + err.Error(), lease: res}
		}
		return outcome{lease: res}
	case callReturn, callSettle: // counted in returned, settlements when sent
		if err == nil && rs.res.st[0].code != rlsCodeOK {
			err = errors.New("answered " + strconv.FormatUint(rs.res.st[0].code, 10))
		}
		if err != nil {
			return outcome{why: err.Error()}
		}
	default: // a refund
		if err != nil {
			return outcome{why: err.Error()}
		}
		if rs.res.overall == rlsCodeUnknown {
			return outcome{why: "overall_code UNKNOWN"}
		}
	}
	return outcome{}
}

// record hands each rule of decision call c its descriptor's status in
// the decoded reply (rs.res).
func (rs *rlsState) record(c *remoteCall) {
	for k, sl := range c.slots {
		if sl.w == nil {
			continue
		}
		i := sl.i
		st := &rs.res.st[k]
		lim := rs.p.rules[i].cfg.Burst // Decision.Limit: the capacity (Burst = Limit for the window algorithms)
		if pl := sl.w.x.(*rlsWait).plan[i]; pl != nil {
			lim = pl.Params.Burst
		}
		x := &sl.w.x.(*rlsWait).res[i]
		var d algorithms.Decision
		if dl := &rs.res.delays[k]; dl.ok && (st.code != rlsCodeOK || dl.us > sl.w.x.(*rlsWait).maxUS[i]) {
			rs.e.failRule(sl.w, i, "descriptor "+strconv.Itoa(k)+": "+rlswire.DelayHeader+" "+strconv.FormatInt(dl.us, 10)+
				"µs beyond the max delay sent ("+strconv.FormatInt(sl.w.x.(*rlsWait).maxUS[i], 10)+"µs) or on a refusal", false)
			continue
		}
		switch st.code {
		case rlsCodeOK:
			d = algorithms.Decision{Allowed: true, Limit: lim, Remaining: int64(st.remaining), ResetAfter: st.dur,
				Delay: time.Duration(rs.res.delays[k].us) * time.Microsecond}
		case rlsCodeOverLimit:
			d = algorithms.Decision{Limit: lim, Remaining: int64(st.remaining), ResetAfter: st.dur, RetryAfter: st.dur}
		default:
			rs.e.failRule(sl.w, i, "descriptor "+strconv.Itoa(k)+": status code "+strconv.FormatUint(st.code, 10), false)
			continue
		}
		if rs.res.overall != rlsCodeOK {
			// The service refunded every admission of this call before answering.
			x.undone = true
		} else if rf := &rs.res.refunds[k]; rf.ok {
			x.token, x.stamp, x.ref = true, rf.stamp, rf.ref
		}
		rs.e.decided(sl, d)
	}
}

// failure implements remoteCodec: proxy_on_grpc_close's status.
func (rs *rlsState) failure(c *remoteCall, status uint32) (string, bool) {
	why := "ShouldRateLimit: gRPC status " + grpcCodeName(status)
	timeout := status == grpcDeadlineExceeded
	if c.kind == callAcquire && !timeout {
		why = "lease acquire: " + why
	}
	return why, timeout
}

// cancel implements remoteCodec: proxy_grpc_cancel.
func (rs *rlsState) cancel(token uint32) { rs.gh.GrpcCancel(token) }

// leaseResult reads the decoded reply of an acquire of n: OK with
// quota.requests = the grant (1..n) and the x-sluice-lease stamp and
// validity, or OVER_LIMIT (nothing granted; duration_until_reset is the
// wait).
func (rs *rlsState) leaseResult(lr *leaseRule, n int64) (redisrl.LeaseResult, error) {
	st := &rs.res.st[0]
	res := redisrl.LeaseResult{Decision: algorithms.Decision{Limit: lr.limit, Remaining: min(int64(st.remaining), lr.limit)}}
	switch st.code {
	case rlsCodeOK:
		g := int64(st.quota)
		if g < 1 || g > n {
			return res, errors.New("quota.requests " + strconv.FormatInt(g, 10) + " outside 1.." + strconv.FormatInt(n, 10))
		}
		li := &rs.res.leases[0]
		if !li.ok {
			return res, errors.New("a grant without " + rlswire.LeaseHeader)
		}
		res.Granted, res.Allowed, res.ResetAfter, res.Stamp, res.Valid = g, true, st.dur, li.stamp, li.valid
	case rlsCodeOverLimit:
		res.Remaining, res.ResetAfter, res.RetryAfter = 0, st.dur, st.dur
	default:
		return res, errors.New("status code " + strconv.FormatUint(st.code, 10))
	}
	return res, nil
}

// grpcCodeName names a gRPC status code for a log line.
func grpcCodeName(c uint32) string {
	names := [...]string{"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
		"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
		"OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
	if int(c) < len(names) {
		return strconv.FormatUint(uint64(c), 10) + " " + names[c]
	}
	return strconv.FormatUint(uint64(c), 10)
}

// OnGrpcReceive implements abi.GrpcHandler.
func (vm *VM) OnGrpcReceive(rootID, token uint32, size int) {
	if p := vm.rlsCaller(rootID, token); p != nil {
		defer func() {
			if r := recover(); r != nil {
				p.recovered(nil, r)
			}
		}()
		p.remote.onReply(token, size)
	}
	if len(vm.donePending) > 0 {
		vm.maybeDone(rootID)
	}
}

// OnGrpcClose implements abi.GrpcHandler.
func (vm *VM) OnGrpcClose(rootID, token, status uint32) {
	if p := vm.rlsCaller(rootID, token); p != nil {
		defer func() {
			if r := recover(); r != nil {
				p.recovered(nil, r)
			}
		}()
		p.remote.onFailure(token, status)
	}
	if len(vm.donePending) > 0 {
		vm.maybeDone(rootID)
	}
}

var _ abi.GrpcHandler = (*VM)(nil)

// rlsCaller returns the configuration (the root context's own or one of
// its scopes') that made the call of token; nil if none.
func (vm *VM) rlsCaller(rootID, token uint32) *Plugin {
	root := vm.plugins[rootID]
	if root == nil {
		return nil
	}
	for i := 0; i < root.configs(); i++ {
		if p := root.configAt(i); p.rls != nil && p.remote.calls[token] != nil {
			return p
		}
	}
	return nil
}
