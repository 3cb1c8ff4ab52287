package filter

import (
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
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

// GrpcHost is what the rls backend needs from the host beyond abi.Host:
// the unary gRPC call and the calls that resume a paused stream from a
// later callback. abi.Imports implements it (except in the nogrpc test
// build).
type GrpcHost interface {
	GrpcCall(cluster, serviceName, method string, message []byte, timeoutMS uint32) (token uint32, st abi.Status)
	GrpcCancel(token uint32) abi.Status
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
	MetricRLSCalls          = "sluice.rls.calls"           // ShouldRateLimit calls sent for decisions
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
	calls, failures, timeouts, refunds, refundFailures uint32
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
}

// rlsRule is the RLS side of one rule (rule.rls).
type rlsRule struct {
	entries  []byte     // the encoded entries sluice.rule .. sluice.burst (fixed per rule)
	fallback *slotStore // failure_mode local: shared data, the limit divided by rls.instances
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
// a refund (w nil).
type rlsCall struct {
	w     *rlsWait
	rules []int // rule indices in descriptor order
	due   int64 // refunds: when the guard gives up on the reply
}

// rlsResult is one rule's outcome in a wait.
type rlsResult struct {
	done, failed, timeout bool
	why                   string
	d                     algorithms.Decision
	token                 bool // the service gave a refund token
	undone                bool // admitted in a call the service denied: it refunded that itself
	stamp, ref            int64
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
// (and completes its count in the wait).
func (rs *rlsState) send(c *rlsCall) {
	token, st := rs.gh.GrpcCall(rs.cfg.Cluster, RLSService, RLSMethod, rs.msg, uint32(rs.cfg.TimeoutMS))
	if st != abi.StatusOK {
		rs.fail(c, "proxy_grpc_call: "+st.String(), false)
		return
	}
	if c.w != nil {
		rs.p.host.IncrementMetric(rs.m.calls, 1)
	}
	rs.calls[token] = c
}

// fail fails the rules of c; for a decision call it counts down its wait.
func (rs *rlsState) fail(c *rlsCall, why string, timeout bool) {
	if c.w == nil {
		rs.p.host.IncrementMetric(rs.m.refundFailures, int64(len(c.rules)))
		return
	}
	for _, i := range c.rules {
		res := &c.w.res[i]
		res.done, res.failed, res.timeout, res.why = true, true, timeout, why
		rs.p.host.IncrementMetric(rs.m.failures, 1)
		if timeout {
			rs.p.host.IncrementMetric(rs.m.timeouts, 1)
		}
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
			rs.p.host.IncrementMetric(rs.m.failures, 1)
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
	if c.w == nil {
		rs.p.host.IncrementMetric(rs.m.refundFailures, int64(len(c.rules)))
		return
	}
	rs.fail(c, "ShouldRateLimit: gRPC status "+grpcCodeName(status), status == grpcDeadlineExceeded)
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
			rs.p.host.IncrementMetric(rs.m.refundFailures, int64(len(c.rules)))
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
	if rs.nextDue != 0 && now >= rs.nextDue {
		rs.expire(now)
	}
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
		p.rls.onReceive(token, size)
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
