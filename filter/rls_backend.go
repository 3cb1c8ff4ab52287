package filter

import (
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/redisrl"
)

// The rate-limit service backend (backend "rls"; both artifacts).
//
// A request that matches rules with backend "rls" is decided by the one
// orchestration (Plugin.onRequest, resume, charge); this file plugs in at
// the same four points as the Redis backend (redis_backend.go), and the
// stop-iteration rule documented there applies unchanged: a paused stream
// is resumed or answered only from root-context callbacks
// (proxy_on_grpc_receive, proxy_on_grpc_close, proxy_on_tick).
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
)

// rlsGuardMargin is added to rls.timeout_ms for the guard that fails a
// call the host never answers; the host's own timeout normally fires first.
const rlsGuardMargin = 10_000_000 // 10 ms in ns

// gRPC status codes the backend tells apart.
const grpcDeadlineExceeded = 4

type rlsMetrics struct {
	failMetrics
	calls, refunds, refundFailures uint32
}

// rlsState is a Plugin's rls backend.
type rlsState struct {
	p       *Plugin
	gh      GrpcHost
	cfg     config.RLS
	guard   int64               // ns a call may last before the guard fails it
	nrules  int                 // RLS rules (descriptors of a call at most)
	nshadow int                 // RLS rules in shadow mode (a call each)
	calls   map[uint32]*rlsCall // tokens in flight
	waits   map[uint32]*rlsWait // paused streams by context id
	nextDue int64               // earliest guard deadline (0: none)
	free    []*rlsWait
	msg     []byte // the request being encoded
	num     []byte // scratch for a refund value
	res     rlsResponse
	m       rlsMetrics
	leases  *leases // the lease pools (lease.go); nil without a rule with "lease"
}

// rlsRule is the RLS side of one rule (rule.rls).
type rlsRule struct {
	entries  []byte     // the encoded entries sluice.rule .. sluice.burst (fixed per rule)
	fallback *slotStore // failure_mode local: shared data, the limit divided by rls.instances
	lease    *leaseRule // "lease": N (lease.go); nil without
}

// rlsWait is one paused request.
type rlsWait struct {
	waitBase
	calls  []rlsCall   // [0]: the enforcing rules; then one per shadow rule
	ncalls int         // calls used
	res    []rlsResult // by rule index
	keys   [][]byte    // by rule index: the key sent (for refunds)
}

// rlsCall is one ShouldRateLimit call in flight: a decision call of w, or
// (w nil) a refund, a lease's acquire (fetch) or return (lease alone).
type rlsCall struct {
	w     *rlsWait
	rules []int // rule indices in descriptor order
	due   int64 // w nil: when the guard gives up on the reply
	lease *leaseRule
	fetch *leaseFetch
}

// rlsResult is one rule's outcome in a wait.
type rlsResult struct {
	done, failed, timeout bool
	why                   string
	d                     algorithms.Decision
	token                 bool  // the service gave a refund token
	undone                bool  // admitted in a call the service denied: it refunded that itself
	stamp, ref            int64 // stamp: for a lease rule, its grant's
}

func newRLSState(p *Plugin, cfg *config.Config, rules []*rule) (*rlsState, error) {
	gh, ok := p.host.(GrpcHost)
	if !ok {
		return nil, errors.New("backend \"rls\": the host has no gRPC calls (this module was built without proxy_grpc_call)")
	}
	if cfg.RLS == nil {
		return nil, errors.New("rls: required by rules with backend \"rls\"")
	}
	rs := &rlsState{
		p:     p,
		gh:    gh,
		cfg:   *cfg.RLS,
		guard: int64(cfg.RLS.TimeoutMS)*1_000_000 + rlsGuardMargin,
		calls: make(map[uint32]*rlsCall),
		waits: make(map[uint32]*rlsWait),
		msg:   make([]byte, 0, 1024),
		num:   make([]byte, 0, 48),
	}
	for _, r := range rules {
		if r.cfg.Backend != config.BackendRLS {
			continue
		}
		// config.ParseFor checked the scripts' bounds (config.RedisParams)
		// and built the local fallback.
		r.remote = true
		r.rls = &rlsRule{entries: appendRuleEntries(nil, r.id, r.cfg),
			fallback: newSlotStore(p.host, r.cfg.Fallback, "sluice:"+p.name+":"+r.id+":fallback:", r.cfg.MaxKeys)}
		rs.nrules++
		if r.cfg.Mode != config.ModeEnforce {
			rs.nshadow++
		}
	}
	rs.res.init(rs.nrules)
	var err error
	if rs.leases, err = newLeases(p, rs, rules, cfg.RLS.Instances, rlsLeaseKeyMax, MetricRLSLeased, MetricRLSReturned); err != nil {
		return nil, err
	}
	if rs.leases != nil {
		for _, lr := range rs.leases.rules {
			rules[lr.rule].rls.lease = lr
		}
	}
	for _, m := range []struct {
		id   *uint32
		name string
	}{
		{&rs.m.calls, MetricRLSCalls}, {&rs.m.failures, MetricRLSFailures}, {&rs.m.timeouts, MetricRLSTimeouts},
		{&rs.m.failOpen, MetricRLSFailOpen}, {&rs.m.failClosed, MetricRLSFailClosed}, {&rs.m.failLocal, MetricRLSFailLocal},
		{&rs.m.refunds, MetricRLSRefunds}, {&rs.m.refundFailures, MetricRLSRefundFailures},
	} {
		id, st := p.host.DefineMetric(abi.MetricCounter, m.name)
		if st != abi.StatusOK {
			return nil, errors.New("defining metric " + m.name + ": " + st.String())
		}
		*m.id = id
	}
	return rs, nil
}

// tickPeriod is the guard's clock: a tick about every timeout (10 ms ..
// 1 s).
func (rs *rlsState) tickPeriod() uint32 {
	return uint32(min(max(rs.cfg.TimeoutMS, 10), 1000))
}

// dispatch sends the calls for s's applying RLS rules (Plugin.onRequest
// has keyed them): one for the enforcing rules, one per shadow rule.
func (rs *rlsState) dispatch(s *stream, now int64) remoteWait {
	w := rs.newWait(s)
	c0 := &w.calls[0]
	c0.rules = c0.rules[:0]
	w.ncalls = 1
	for i, r := range rs.p.rules {
		w.applies[i], w.hashes[i] = r.applies, r.hash
		w.res[i] = rlsResult{}
		if r.rls == nil || !r.applies {
			continue
		}
		w.keys[i] = append(w.keys[i][:0], r.key...)
		if lr := r.rls.lease; lr != nil {
			rs.leases.dispatch(lr, r.hash, w.keys[i], w, i, now)
			continue
		}
		if r.cfg.Mode == config.ModeEnforce {
			c0.rules = append(c0.rules, i)
			continue
		}
		c := &w.calls[w.ncalls]
		w.ncalls++
		c.rules = append(c.rules[:0], i)
	}
	for k := 0; k < w.ncalls; k++ {
		c := &w.calls[k]
		c.w = w
		if len(c.rules) == 0 {
			continue
		}
		w.missing++
		rs.msg = rs.appendRequest(rs.msg[:0], w, c.rules, false)
		rs.send(c)
	}
	if w.missing == 0 {
		return w
	}
	w.deadline = now + rs.guard
	if rs.nextDue == 0 || w.deadline < rs.nextDue {
		rs.nextDue = w.deadline
	}
	rs.waits[w.id] = w
	s.rwait = w
	return w
}

// send sends rs.msg as call c. A refused decision call fails its rules
// (and completes its count in the wait); ok is false, with the reason,
// when the host refused the call.
func (rs *rlsState) send(c *rlsCall) (why string, ok bool) {
	token, st := rs.gh.GrpcCall(rs.cfg.Cluster, RLSService, RLSMethod, rs.msg, uint32(rs.cfg.TimeoutMS))
	if st != abi.StatusOK {
		why = "proxy_grpc_call: " + st.String()
		rs.fail(c, why, false)
		return why, false
	}
	if c.w != nil || c.lease != nil {
		rs.p.host.IncrementMetric(rs.m.calls, 1)
	}
	rs.calls[token] = c
	return "", true
}

// fail fails the rules of c; for a decision call it counts down its wait.
// A failed acquire is the lease pools' to handle (its waiters fail).
func (rs *rlsState) fail(c *rlsCall, why string, timeout bool) {
	if c.w == nil {
		if c.fetch == nil {
			rs.p.host.IncrementMetric(rs.m.refundFailures, int64(len(c.rules)))
		}
		return
	}
	for _, i := range c.rules {
		res := &c.w.res[i]
		res.done, res.failed, res.timeout, res.why = true, true, timeout, why
		rs.p.countFailure(&rs.m.failMetrics, timeout)
	}
	c.w.missing--
}

// onReceive handles proxy_on_grpc_receive: the reply of token.
func (rs *rlsState) onReceive(token uint32, size int) {
	c := rs.calls[token]
	if c == nil {
		return // a reply after the guard gave up, or not ours
	}
	delete(rs.calls, token)
	now := rs.p.host.Now()
	b, st := rs.p.host.GetBuffer(abi.BufferGrpcReceive, 0, size)
	var err error
	if st != abi.StatusOK && size > 0 {
		err = errors.New("reading the reply: " + st.String())
	} else {
		err = rs.res.decode(b, len(c.rules))
	}
	if c.lease != nil {
		rs.onLeaseReply(c, err, false, now)
		return
	}
	if c.w == nil { // a refund
		if err != nil || rs.res.overall == rlsCodeUnknown {
			rs.p.host.IncrementMetric(rs.m.refundFailures, int64(len(c.rules)))
		}
		return
	}
	if err != nil {
		rs.fail(c, "ShouldRateLimit reply: "+err.Error(), false)
	} else {
		rs.record(c)
	}
	if c.w.missing == 0 {
		rs.complete(c.w, now)
	}
	if rs.nextDue != 0 && now >= rs.nextDue {
		rs.expire(now)
	}
}

// record records the decoded reply (rs.res) of decision call c.
func (rs *rlsState) record(c *rlsCall) {
	w := c.w
	for k, i := range c.rules {
		st := &rs.res.st[k]
		res := &w.res[i]
		res.done = true
		lim := rs.p.rules[i].cfg.Burst // Decision.Limit: the capacity (Burst = Limit for the window algorithms)
		switch st.code {
		case rlsCodeOK:
			res.d = algorithms.Decision{Allowed: true, Limit: lim, Remaining: int64(st.remaining), ResetAfter: st.dur}
		case rlsCodeOverLimit:
			res.d = algorithms.Decision{Limit: lim, Remaining: int64(st.remaining), ResetAfter: st.dur, RetryAfter: st.dur}
		default:
			res.failed, res.why = true, "descriptor "+strconv.Itoa(k)+": status code "+strconv.FormatUint(st.code, 10)
			rs.p.countFailure(&rs.m.failMetrics, false)
			continue
		}
		if rs.res.overall != rlsCodeOK {
			// The service refunded every admission of this call before answering.
			res.undone = true
		} else if rf := &rs.res.refunds[k]; rf.ok {
			res.token, res.stamp, res.ref = true, rf.stamp, rf.ref
		}
	}
	w.missing--
}

// onClose handles proxy_on_grpc_close: the call of token failed.
func (rs *rlsState) onClose(token, status uint32) {
	c := rs.calls[token]
	if c == nil {
		return
	}
	delete(rs.calls, token)
	now := rs.p.host.Now()
	why := "ShouldRateLimit: gRPC status " + grpcCodeName(status)
	if c.lease != nil {
		rs.onLeaseReply(c, errors.New(why), status == grpcDeadlineExceeded, now)
		return
	}
	if c.w == nil {
		rs.p.host.IncrementMetric(rs.m.refundFailures, int64(len(c.rules)))
		return
	}
	rs.fail(c, why, status == grpcDeadlineExceeded)
	if c.w.missing == 0 {
		rs.complete(c.w, now)
	}
	if rs.nextDue != 0 && now >= rs.nextDue {
		rs.expire(now)
	}
}

// expire fails the calls of every wait past its guard deadline (cancelling
// them at the host) and gives up on refunds whose reply never came.
// Root-context callbacks only (see redis_backend.go).
func (rs *rlsState) expire(now int64) {
	rs.nextDue = 0
	for t, c := range rs.calls {
		if c.w != nil {
			continue
		}
		if c.due <= now {
			delete(rs.calls, t)
			rs.gh.GrpcCancel(t)
			if c.fetch != nil {
				rs.leases.failFetch(c.lease, c.fetch, "no reply within rls.timeout_ms", true, now, true)
			} else {
				rs.p.host.IncrementMetric(rs.m.refundFailures, int64(len(c.rules)))
			}
		} else if rs.nextDue == 0 || c.due < rs.nextDue {
			rs.nextDue = c.due
		}
	}
	for _, w := range rs.waits {
		if w.deadline > now {
			if rs.nextDue == 0 || w.deadline < rs.nextDue {
				rs.nextDue = w.deadline
			}
			continue
		}
		for t, c := range rs.calls {
			if c.w == w {
				delete(rs.calls, t)
				rs.gh.GrpcCancel(t)
				rs.fail(c, "no reply within rls.timeout_ms", true)
			}
		}
		for i := range w.res {
			if w.applies[i] && rs.p.rules[i].rls != nil && rs.p.rules[i].rls.lease != nil && !w.res[i].done {
				rs.leaseFailed(&leaseWaiter{w: w, id: w.id, i: i}, "no reply within rls.timeout_ms", true)
			}
		}
		rs.complete(w, now)
	}
}

// complete resumes or answers the stream of a wait whose calls are all in.
// Root-context callbacks only.
func (rs *rlsState) complete(w *rlsWait, now int64) {
	delete(rs.waits, w.id)
	rs.p.completeWait(rs, rs.gh, w, now)
}

// take gives RLS rule r (index i) its outcome in w: the service's decision
// in r.d, or the failure (counted by failure_mode) and the store that
// decides r on this proxy instead: the fallback under failure_mode local,
// else nil.
func (rs *rlsState) take(r *rule, rw remoteWait, i int) (*slotStore, error) {
	res := &rw.(*rlsWait).res[i]
	if !res.failed {
		r.d = res.d
		return nil, nil
	}
	by := rs.p.failover(&rs.m.failMetrics, r.rls.fallback)
	return by, errors.New("rls: " + res.why)
}

// refundAdmitted sends the refund tokens of every admission the service
// made for w, in one call (fire and forget).
func (rs *rlsState) refundAdmitted(rw remoteWait, now int64) {
	w := rw.(*rlsWait)
	var rc *rlsCall
	for i := range w.res {
		res := &w.res[i]
		if !res.done || res.failed || res.undone || !res.d.Allowed || rs.p.rules[i].rls == nil {
			continue
		}
		if lr := rs.p.rules[i].rls.lease; lr != nil {
			rs.leases.refund(lr, w.keys[i], res.stamp, w.hashes[i], now)
			continue
		}
		if !res.token {
			rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
			continue
		}
		if rc == nil {
			rc = &rlsCall{}
		}
		rc.rules = append(rc.rules, i)
	}
	if rc == nil {
		return
	}
	rs.p.host.IncrementMetric(rs.m.refunds, int64(len(rc.rules)))
	rs.msg = rs.appendRequest(rs.msg[:0], w, rc.rules, true)
	rc.due = now + rs.guard
	if rs.nextDue == 0 || rc.due < rs.nextDue {
		rs.nextDue = rc.due
	}
	rs.send(rc)
}

func (rs *rlsState) newWait(s *stream) *rlsWait {
	var w *rlsWait
	if n := len(rs.free); n > 0 {
		w = rs.free[n-1]
		rs.free = rs.free[:n-1]
	} else {
		n := len(rs.p.rules)
		w = &rlsWait{waitBase: waitBase{applies: make([]bool, n), hashes: make([]uint64, n)},
			calls: make([]rlsCall, 1+rs.nshadow), res: make([]rlsResult, n), keys: make([][]byte, n)}
		for k := range w.calls {
			w.calls[k].rules = make([]int, 0, rs.nrules)
		}
		for i, r := range rs.p.rules {
			if r.rls != nil {
				w.keys[i] = make([]byte, 0, 64)
			}
		}
	}
	w.id, w.s, w.missing, w.deadline, w.ncalls = s.id, s, 0, 0, 0
	return w
}

func (rs *rlsState) release(rw remoteWait) {
	w := rw.(*rlsWait)
	w.s = nil
	for k := range w.calls {
		w.calls[k].w = nil
	}
	if len(rs.free) < maxFreeStreams {
		rs.free = append(rs.free, w)
	}
}

// tick runs the guard (proxy_on_tick: a root-context callback).
func (rs *rlsState) tick() {
	now := rs.p.host.Now()
	rs.leases.tick(now, false)
	if rs.nextDue != 0 && now >= rs.nextDue {
		rs.expire(now)
	}
}

// leaseSend implements leaseBackend: a call with one acquire or return
// descriptor.
func (rs *rlsState) leaseSend(lr *leaseRule, f *leaseFetch, q *redisrl.LeaseRequest, now int64) (string, bool) {
	rs.msg = rs.appendLeaseRequest(rs.msg[:0], lr, q)
	c := &rlsCall{rules: []int{lr.rule}, lease: lr, fetch: f, due: now + rs.guard}
	if rs.nextDue == 0 || c.due < rs.nextDue {
		rs.nextDue = c.due
	}
	return rs.send(c)
}

// onLeaseReply handles the reply (decoded into rs.res unless err) or the
// failure of lease call c (root context).
func (rs *rlsState) onLeaseReply(c *rlsCall, err error, timeout bool, now int64) {
	if c.fetch == nil { // a return (counted in returned when sent)
		if err == nil && rs.res.st[0].code != rlsCodeOK {
			err = errors.New("a return answered " + strconv.FormatUint(rs.res.st[0].code, 10))
		}
		if err != nil {
			rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
		}
	} else {
		var res redisrl.LeaseResult
		if err == nil {
			res, err = rs.leaseResult(c.lease, c.fetch.n)
		}
		if err != nil && !timeout {
			err = errors.New("lease acquire: " + err.Error())
		}
		rs.leases.onAcquire(c.lease, c.fetch, res, err, timeout, now)
	}
	if rs.nextDue != 0 && now >= rs.nextDue {
		rs.expire(now)
	}
}

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
			return res, errors.New("a grant without " + LeaseHeader)
		}
		res.Granted, res.Allowed, res.ResetAfter, res.Stamp, res.Valid = g, true, st.dur, li.stamp, li.valid
	case rlsCodeOverLimit:
		res.Remaining, res.ResetAfter, res.RetryAfter = 0, st.dur, st.dur
	default:
		return res, errors.New("status code " + strconv.FormatUint(st.code, 10))
	}
	return res, nil
}

// leaseLive implements leaseBackend.
func (rs *rlsState) leaseLive(x *leaseWaiter) bool {
	w := x.w.(*rlsWait)
	return w.id == x.id && w.s != nil && !w.res[x.i].done
}

// leaseDecide implements leaseBackend.
func (rs *rlsState) leaseDecide(x *leaseWaiter, d algorithms.Decision, stamp int64) {
	res := &x.w.(*rlsWait).res[x.i]
	res.done, res.d, res.stamp = true, d, stamp
}

// leaseFailed implements leaseBackend.
func (rs *rlsState) leaseFailed(x *leaseWaiter, why string, timeout bool) {
	res := &x.w.(*rlsWait).res[x.i]
	res.done, res.failed, res.timeout, res.why = true, true, timeout, why
	rs.p.countFailure(&rs.m.failMetrics, timeout)
}

// leaseComplete implements leaseBackend.
func (rs *rlsState) leaseComplete(w remoteWait, now int64) { rs.complete(w.(*rlsWait), now) }

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
		p.rls.onReceive(token, size)
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
		p.rls.onClose(token, status)
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
		if p := root.configAt(i); p.rls != nil && p.rls.calls[token] != nil {
			return p
		}
	}
	return nil
}
