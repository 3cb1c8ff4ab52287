package filter

import (
	"errors"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/redisrl"
)

// The remote-call engine: what every remote backend (redis_backend.go,
// rls_backend.go) shares. A backend is a codec (remoteCodec): it encodes a
// call and decodes its reply into per-rule decisions; the engine does the
// rest.
//
// A request that matches remote rules is decided by the one orchestration
// (Plugin.onRequest, resume, charge in plugin.go), which calls the engine at
// four points: dispatch sends the calls of the request's applying remote
// rules and pauses it, take hands each rule its decision (or its failure and
// failure_mode's fallback store), refundAdmitted undoes the remote
// admissions of a denied request, release recycles the wait.
//
//   - Waits. A paused request is a remoteWait: per rule whether it applies,
//     its key's hash, and its outcome (remoteResult) once in; missing
//     counts the outcomes still out. When the last one arrives the stream
//     is made the effective context and decided (resume): resumed
//     (proxy_continue_stream) or answered.
//   - Calls. A remoteCall is one call in flight, by the host's token: a
//     decision call carries the decisions (slots: wait and rule) it
//     answers, in order; a refund, a lease acquire or a lease return
//     carries none (fire and forget, or the lease pools' business). How a
//     rule's decisions travel is the codec's choice (route): all of a
//     request's in one call, one call each, or coalesced by (rule, key)
//     across requests: a VM keeps at most one decision call in flight per
//     (rule, key), requests that arrive meanwhile wait in the key's queue
//     and go together (up to maxBatch) in the next call, which decides them
//     in arrival order at one instant — a hot key costs a call per round
//     trip instead of one per request.
//   - Guard. A call unanswered within the backend's timeout_ms plus a
//     margin (for hosts that never answer) is given up: checked on
//     proxy_on_tick, whose period is timeout_ms clamped to 10 ms .. 1 s,
//     and after each reply. A wait past its deadline fails the rules still
//     out; a reply that arrives later is dropped (an admission it made
//     stays charged until the window passes: errs towards limiting).
//   - Failures. A rule whose decision failed (the host refused the call, a
//     failure status, a reply that does not decode or that the codec
//     settles without that decision, the guard) is decided by
//     failure_mode: "open" lets it pass, "closed" rejects the request
//     with 503 and a plain-text body, "local" decides it on this proxy's
//     shared data with its limit (and burst) divided by the backend's
//     instances (at least 1). Each outcome has a counter.
//   - Refunds. A denied request is charged to no rule: each remote rule
//     that admitted it is sent a refund (fire and forget), a lease's
//     admission goes back to its pool (lease.go).
//   - Settlements. A remote rule with cost.response whose request was
//     admitted remotely settles when the stream ends (cost.go): a call of
//     its own with delta = actual − reserved (fire and forget, like a
//     refund), counted in the backend's settlements; one refused, failed
//     or unanswered within the guard is counted in settlement_failures
//     (the reservation then stands as the cost: an excess is not charged,
//     an unused part not given back).
//
// Calls belong to the root context (as in Envoy and Higress's Envoy):
// replies arrive with the root context id, the token is mapped back to the
// paused stream, which is made the effective context before it is resumed
// or answered. A stream that ended while waiting (client gone) is not
// answered; the admissions made for it are refunded.
//
// A paused stream is resumed or answered only from root-context callbacks
// (a reply, proxy_on_tick), never from another stream's callback: in
// proxy-wasm-cpp-host proxy_send_local_response raises a VM-wide
// stop-iteration flag (WasmBase::stopNextIteration, src/exports.cc
// send_local_response) that converts the status of whichever stream
// callback is running to StopAllIterationAndWatermark (src/context.cc), so
// answering stream B from stream A's proxy_on_request_headers would stop A
// until the stream idle timeout. After a root callback the flag is cleared
// without converting any stream's status. So dispatch never runs the guard,
// and a call refused at once during dispatch fails only its own request's
// rules.

// remoteCodec is what a remote backend contributes to the engine: how its
// calls are encoded and made, and how their replies decode.
type remoteCodec interface {
	// newWait returns the codec's per-request data for a wait of n rules
	// (remoteWait.x), made once per pooled wait.
	newWait(n int) any
	// prepare records in w what the calls of remote rule r (index i) need
	// for this request and returns the key they name (the lease key when
	// lease: the rule is decided from lease pools) and how its decisions
	// travel.
	prepare(w *remoteWait, i int, r *rule, lease bool) (key []byte, rt route)
	// refundable says what becomes of the admission of rule i (not a lease
	// rule) in w when its request is denied.
	refundable(w *remoteWait, i int) refundKind
	// send encodes c and makes the call: the host's token, or why it was
	// refused.
	send(c *remoteCall, now int64) (token uint32, why string)
	// reply decodes the reply to c (size bytes in the host's reply
	// buffer): the decisions of a decision call's slots (remote.decided,
	// remote.failRule), or the outcome of the call as a whole.
	reply(c *remoteCall, size int, now int64) outcome
	// failure names the failure of c, answered by the host with status.
	failure(c *remoteCall, status uint32) (why string, timeout bool)
	// cancel gives up call token at the host (the guard).
	cancel(token uint32)
}

// route is how a remote rule's decisions travel.
type route uint8

const (
	routeShared route = iota // in one call with the request's other shared rules
	routeOwn                 // in a call of its own
	routeKey                 // coalesced with other requests' for the same (rule, key)
)

// refundKind is what becomes of an admission of a denied request.
type refundKind uint8

const (
	refundSend refundKind = iota // sent back in a refund call
	refundLost                   // cannot be sent back (counted in refund_failures)
	refundNone                   // nothing to do: the remote side undid it already
)

// callKind is what a remote call is for.
type callKind uint8

const (
	callDecide  callKind = iota // decisions of waiting requests (slots)
	callRefund                  // admissions of a denied request given back
	callAcquire                 // a lease acquire (lease, fetch, lr)
	callReturn                  // a lease return (lease, lr)
	callSettle                  // a token budget's settlement (rule, key, delta)
	callConc                    // an in-flight slot released (delta < 0) or renewed (rule, key, delta; concurrency_remote.go)
)

// outcome is what a codec made of a reply, or the failure of a call.
type outcome struct {
	why     string // not empty: the call failed as a whole (its live decisions fail with it)
	timeout bool   // the failure is a timeout
	retry   bool   // send the call again (the codec changed how it encodes it)
	lease   redisrl.LeaseResult
}

// remoteCall is one call in flight (or being sent).
type remoteCall struct {
	kind  callKind
	alt   bool // the codec's second form of the call (Redis: EVAL after NOSCRIPT)
	token uint32
	due   int64 // when the guard gives up on it
	n     int64 // a refund or return: the admissions it gives back (refund_failures when lost)
	// A decision call's decisions, in order; a slot whose wait was given
	// up by the guard has w nil. A refund's admissions.
	slots []callSlot
	q     *remoteQueue // the queue a coalesced decision call was sent for
	lease *leaseRule   // lease calls
	fetch *leaseFetch  // an acquire
	lr    *redisrl.LeaseRequest
	x     any // the codec's own data for the call (Redis: a refund's request)
	// A settlement: rule index, the key its decision's call named
	// (remoteResult.key: Redis, the Redis key; rls, the rule's key) and
	// delta = actual − reserved (not zero).
	rule  int
	key   []byte
	delta int64
	// A count's give-back on a window algorithm (count_window.go): a
	// settlement that undoes the admission named by back (delta = −cost).
	back     giveBack
	giveBack bool
	undo     redisrl.Result // Redis: the admission back names
}

// callSlot is rule i of wait w.
type callSlot struct {
	w *remoteWait
	i int
}

// remoteQueue holds the coalesced decisions of one (rule, key) on this VM:
// at most one call in flight for them; requests that arrive meanwhile wait
// in pending and go together in the next call.
type remoteQueue struct {
	hash    uint64
	rule    int
	key     []byte
	call    *remoteCall // in flight; nil: none
	pending []callSlot
}

// maxBatch bounds the requests one coalesced call decides.
const maxBatch = 128

// remoteWait is one paused request of a remote backend.
type remoteWait struct {
	id       uint32
	s        *stream
	deadline int64 // when the guard fails the outcomes still out
	missing  int   // outcomes still out
	applies  []bool
	hashes   []uint64
	res      []remoteResult // by rule index
	x        any            // the codec's per-request data (remoteCodec.newWait)
}

// remoteResult is one remote rule's outcome in a wait.
type remoteResult struct {
	done, failed bool
	why          string
	d            algorithms.Decision
	stamp        int64        // a lease rule: its grant's stamp (leases.refund)
	key          []byte       // what the rule's calls name (remoteCodec.prepare)
	call         *remoteCall  // the call in flight carrying the decision
	q            *remoteQueue // the queue the decision waits in
}

// failMetrics are a remote backend's counters of the rule decisions it
// could not make (failures; of which timeouts) and of failure_mode's
// outcomes.
type failMetrics struct{ failures, timeouts, failOpen, failClosed, failLocal uint32 }

type remoteMetrics struct {
	failMetrics
	calls, refunds, refundFailures uint32
	settlements, settleFailures    uint32
}

// remoteNames are a backend's counter names (settlements and
// settleFailures defined only when named).
type remoteNames struct {
	calls, failures, timeouts, failOpen, failClosed, failLocal, refunds, refundFailures string
	leased, returned                                                                    string
	settlements, settleFailures                                                         string
}

// counterDef is a counter to define and where its id goes.
type counterDef struct {
	id   *uint32
	name string
}

// remoteSpec is what the engine is told of its backend.
type remoteSpec struct {
	name         string // "redis", "rls": the configuration's section
	backend      config.Backend
	timeoutMS    int
	instances    int
	leaseKeyMax  int // the longest key a lease pool holds
	names        remoteNames
	extra        []counterDef // the codec's counters (defined after calls)
	refundShared bool         // a denied request's refunds go in one call (else one each)
}

// resumer is what the engine needs from the host beyond abi.Host: the
// calls that make a paused stream the effective context and resume it.
type resumer interface {
	SetEffectiveContext(id uint32) abi.Status
	ContinueStream() abi.Status
}

// remote is a Plugin's remote-call engine.
type remote struct {
	p            *Plugin
	codec        remoteCodec
	h            resumer
	name         string // the prefix of a failed rule's error
	noReply      string // the guard's reason
	timeoutMS    int
	guard        int64 // ns a call may last before the guard gives up on it
	refundShared bool
	fallback     []*slotStore // by rule index: failure_mode local's store
	lease        []*leaseRule // by rule index: the rule's lease pools; nil without "lease"
	calls        map[uint32]*remoteCall
	waits        map[uint32]*remoteWait // paused streams by context id
	queues       map[uint64]*remoteQueue
	nextDue      int64 // earliest guard deadline (0: none)
	free         []*remoteWait
	cfree        []*remoteCall
	qfree        []*remoteQueue
	done         []*remoteWait // waits whose last outcome came in, to complete
	own          []*remoteCall // dispatch's scratch
	m            remoteMetrics
	leases       *leases // nil without a rule with "lease"
	// current is the wait being resumed (complete): a settling rule's
	// bill takes the key its decision named from it (cost.go reserve).
	current *remoteWait
}

// remoteGuardMargin is added to timeout_ms for the guard that fails a call
// the host never answers; the host's own timeout normally fires first.
const remoteGuardMargin = 10_000_000 // 10 ms in ns

// newRemote returns the engine of codec for the rules of spec.backend,
// which it marks remote: their fallback stores, lease pools and the
// backend's counters.
func newRemote(p *Plugin, codec remoteCodec, h resumer, rules []*rule, spec remoteSpec) (*remote, error) {
	e := &remote{
		p:            p,
		codec:        codec,
		h:            h,
		name:         spec.name,
		noReply:      "no reply within " + spec.name + ".timeout_ms",
		timeoutMS:    spec.timeoutMS,
		guard:        int64(spec.timeoutMS)*1_000_000 + remoteGuardMargin,
		refundShared: spec.refundShared,
		fallback:     make([]*slotStore, len(rules)),
		lease:        make([]*leaseRule, len(rules)),
		calls:        make(map[uint32]*remoteCall),
		waits:        make(map[uint32]*remoteWait),
		queues:       make(map[uint64]*remoteQueue),
	}
	for i, r := range rules {
		if r.cfg.Backend != spec.backend {
			continue
		}
		// config.ParseFor checked the scripts' bounds (config.RedisParams)
		// and built the local fallback.
		r.remote = true
		e.fallback[i] = newSlotStore(p.host, r.cfg.Fallback, "sluice:"+p.name+":"+r.id+":fallback:", r.cfg.MaxKeys)
	}
	var err error
	if e.leases, err = newLeases(p, rules, spec.instances, spec.leaseKeyMax, spec.names.leased, spec.names.returned); err != nil {
		return nil, err
	}
	if e.leases != nil {
		for _, lr := range e.leases.rules {
			e.lease[lr.rule] = lr
		}
	}
	n := spec.names
	defs := append([]counterDef{{&e.m.calls, n.calls}}, spec.extra...)
	defs = append(defs, []counterDef{
		{&e.m.failures, n.failures}, {&e.m.timeouts, n.timeouts}, {&e.m.failOpen, n.failOpen},
		{&e.m.failClosed, n.failClosed}, {&e.m.failLocal, n.failLocal}, {&e.m.refunds, n.refunds},
		{&e.m.refundFailures, n.refundFailures},
	}...)
	if n.settlements != "" {
		defs = append(defs, counterDef{&e.m.settlements, n.settlements}, counterDef{&e.m.settleFailures, n.settleFailures})
	}
	for _, m := range defs {
		if err := defineMetric(p.host, abi.MetricCounter, m.name, m.id); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// tickPeriod is the guard's clock: a tick about every timeout (10 ms ..
// 1 s), so a call the host never answers is failed within timeout_ms +
// 10 ms plus one period.
func (e *remote) tickPeriod() uint32 {
	return uint32(min(max(e.timeoutMS, 10), 1000))
}

// tickHost sets the root context's tick period: both remote backends'
// hosts (RedisHost, GrpcHost) have it.
type tickHost interface {
	SetTickPeriod(ms uint32) abi.Status
}

// setTickPeriod sets the root context's tick period for the remote guards
// of p and of its scopes: the shortest any of them needs (a root context
// has one period). Without remote rules it leaves the period alone.
func (p *Plugin) setTickPeriod() {
	var period uint32
	for i := 0; i < p.configs(); i++ {
		if q := p.configAt(i); q.remote != nil && (period == 0 || q.remote.tickPeriod() < period) {
			period = q.remote.tickPeriod()
		}
		if q := p.configAt(i); q.obs != nil && q.obs.top != nil && (period == 0 || topFlushMS < period) {
			period = topFlushMS
		}
	}
	p.baseTick = period
	th, ok := p.host.(tickHost)
	if period == 0 || !ok {
		return
	}
	p.tickMS = period
	if st := th.SetTickPeriod(period); st != abi.StatusOK {
		p.host.Log(abi.LogError, "sluice: proxy_set_tick_period_milliseconds failed: "+st.String()+
			"; a remote call the host never answers holds its request until the host gives up on it")
	}
}

// due makes the guard look again at t at the latest.
func (e *remote) due(t int64) {
	if e.nextDue == 0 || t < e.nextDue {
		e.nextDue = t
	}
}

// dispatch sends the calls for s's applying remote rules (Plugin.onRequest
// has keyed and hashed them) and returns the wait that collects their
// outcomes. While outcomes are missing the wait is registered for the
// replies and the guard; a wait with none missing had every call fail at
// once (or every rule decided from its lease pool), and the caller decides
// now. It answers no stream (see the top of this file).
func (e *remote) dispatch(s *stream, now int64) *remoteWait {
	w := e.newWait(s)
	var shared *remoteCall
	own := e.own[:0]
	for i, r := range e.p.rules {
		w.applies[i], w.hashes[i] = r.applies, r.hash
		w.res[i] = remoteResult{}
		if !r.remote || !r.applies {
			continue
		}
		lr := e.lease[i]
		key, rt := e.codec.prepare(w, i, r, lr != nil)
		w.res[i].key = key
		if lr != nil {
			e.leaseDispatch(lr, r.hash, key, w, i, now)
			continue
		}
		w.missing++
		sl := callSlot{w, i}
		switch rt {
		case routeKey:
			e.enqueue(sl, key, r.hash^(uint64(i)+1)*0x9e3779b97f4a7c15, now)
		case routeShared:
			if shared == nil {
				shared = e.newCall(callDecide)
			}
			shared.slots = append(shared.slots, sl)
		default:
			c := e.newCall(callDecide)
			c.slots = append(c.slots, sl)
			own = append(own, c)
		}
	}
	if shared != nil {
		e.sendDecisions(shared, now)
	}
	for k, c := range own {
		e.sendDecisions(c, now)
		own[k] = nil
	}
	e.own = own[:0]
	if w.missing == 0 {
		return w
	}
	w.deadline = now + e.guard
	e.due(w.deadline)
	e.waits[w.id] = w
	s.rwait = w
	return w
}

// post makes call c: registered under its token with its guard. It returns
// why the host refused the call ("" when sent).
func (e *remote) post(c *remoteCall, now int64) string {
	token, why := e.codec.send(c, now)
	if why != "" {
		return why
	}
	if c.kind != callRefund && c.kind != callSettle {
		e.p.host.IncrementMetric(e.m.calls, 1)
	}
	c.token, c.due = token, now+e.guard
	e.due(c.due)
	e.calls[token] = c
	if c.kind == callDecide {
		for _, sl := range c.slots {
			if sl.w == nil {
				continue
			}
			res := &sl.w.res[sl.i]
			res.call, res.q = c, nil
			// The guard covers the host's answer to this call: a request
			// that waited in a queue gets its guard from now (the wait
			// itself is bounded by the previous call's).
			if c.q != nil && sl.w.deadline < c.due {
				sl.w.deadline = c.due
			}
		}
	}
	return ""
}

// sendDecisions sends decision call c; refused, it fails c's decisions.
func (e *remote) sendDecisions(c *remoteCall, now int64) bool {
	why := e.post(c, now)
	if why == "" {
		return true
	}
	for _, sl := range c.slots {
		if sl.w != nil {
			e.failRule(sl.w, sl.i, why, false)
		}
	}
	e.freeCall(c)
	return false
}

// enqueue sends decision sl at once if no call for its (rule, key) is in
// flight, else queues it for the next one. A hash shared with another
// (rule, key) sends sl alone.
func (e *remote) enqueue(sl callSlot, key []byte, h uint64, now int64) {
	q := e.queues[h]
	if q == nil {
		if n := len(e.qfree); n > 0 {
			q = e.qfree[n-1]
			e.qfree = e.qfree[:n-1]
		} else {
			q = &remoteQueue{}
		}
		q.hash, q.rule, q.key = h, sl.i, append(q.key[:0], key...)
		e.queues[h] = q
	} else if q.rule != sl.i || string(q.key) != string(key) {
		c := e.newCall(callDecide)
		c.slots = append(c.slots, sl)
		e.sendDecisions(c, now)
		return
	}
	sl.w.res[sl.i].q = q
	q.pending = append(q.pending, sl)
	if q.call == nil {
		e.flush(q, now)
	}
}

// flush sends q's pending decisions (up to maxBatch) in one call; with none
// left, q is recycled.
func (e *remote) flush(q *remoteQueue, now int64) {
	for len(q.pending) > 0 {
		k := min(len(q.pending), maxBatch)
		c := e.newCall(callDecide)
		c.q = q
		c.slots = append(c.slots, q.pending[:k]...)
		q.pending = q.pending[:copy(q.pending, q.pending[k:])]
		if e.sendDecisions(c, now) {
			q.call = c
			return
		}
	}
	delete(e.queues, q.hash)
	if len(e.qfree) < maxFreeStreams {
		e.qfree = append(e.qfree, q)
	}
}

// decided records decision d of slot sl (root context).
func (e *remote) decided(sl callSlot, d algorithms.Decision) {
	res := &sl.w.res[sl.i]
	res.done, res.d, res.call, res.q = true, d, nil, nil
	e.countDown(sl.w)
}

// failRule records that rule i of w could not be decided (failure_mode
// decides it; timeout: the call timed out, at the host or by the guard).
func (e *remote) failRule(w *remoteWait, i int, why string, timeout bool) {
	res := &w.res[i]
	res.done, res.failed, res.why, res.call, res.q = true, true, why, nil, nil
	e.countFailure(timeout)
	e.countDown(w)
}

// countDown counts an outcome of w in; a registered wait whose last it was
// is completed at the end of the root callback (completeDone).
func (e *remote) countDown(w *remoteWait) {
	w.missing--
	if w.missing == 0 && e.waits[w.id] == w {
		e.done = append(e.done, w)
	}
}

// countFailure counts a remote rule decision that could not be made.
func (e *remote) countFailure(timeout bool) {
	e.p.host.IncrementMetric(e.m.failures, 1)
	if timeout {
		e.p.host.IncrementMetric(e.m.timeouts, 1)
	}
}

// onReply handles the reply to token (size bytes in the host's reply
// buffer); a token not in flight (given up by the guard, or not ours) is
// dropped. Root-context callbacks only.
func (e *remote) onReply(token uint32, size int) {
	c := e.calls[token]
	if c == nil {
		return
	}
	delete(e.calls, token)
	now := e.p.host.Now()
	e.finish(c, e.codec.reply(c, size, now), now)
}

// onFailure handles the failure of the call of token, reported by the host
// with status. Root-context callbacks only.
func (e *remote) onFailure(token, status uint32) {
	c := e.calls[token]
	if c == nil {
		return
	}
	delete(e.calls, token)
	now := e.p.host.Now()
	why, timeout := e.codec.failure(c, status)
	if !timeout && e.atDeadline(c, now) {
		// Envoy ends a gRPC call at its timeout with UNAVAILABLE
		// ("upstream request timeout"), not DEADLINE_EXCEEDED: a call that
		// failed once its timeout_ms had passed is a timeout.
		why, timeout = why+" at "+e.name+".timeout_ms", true
	}
	e.finish(c, outcome{why: why, timeout: timeout}, now)
}

// atDeadline reports whether call c, failing at now, ended at its
// timeout_ms (c.due is when it was sent plus the guard): at three quarters
// of it or later. Envoy arms the call's timer from its event loop's cached
// time, which can precede the guest's reading of the clock at the call by
// the loop iteration's length: a timer fires up to that much early.
func (e *remote) atDeadline(c *remoteCall, now int64) bool {
	if e.timeoutMS <= 0 {
		return false
	}
	sent := c.due - e.guard
	return (now-sent)*4 >= int64(e.timeoutMS)*1_000_000*3
}

// finish settles call c, answered or failed, then completes the waits that
// have all their outcomes and runs the guard when due.
func (e *remote) finish(c *remoteCall, out outcome, now int64) {
	if out.retry {
		if out.why = e.post(c, now); out.why == "" {
			return
		}
	}
	e.settle(c, out, now)
	e.completeDone(now)
	if e.nextDue != 0 && now >= e.nextDue {
		e.expire(now)
	}
}

// settle hands out the outcome of call c, no longer in flight, and
// recycles it: a failure fails its live decisions (the next call of its
// queue goes out), an acquire's goes to the lease pools, a lost refund or
// return is counted. A live decision the codec left out of a reply fails
// too: the request must not wait for the guard on a call recycled here.
func (e *remote) settle(c *remoteCall, out outcome, now int64) {
	switch c.kind {
	case callDecide:
		why := out.why
		if why == "" {
			why = noDecision
		}
		for _, sl := range c.slots {
			if sl.w != nil && !sl.w.res[sl.i].done {
				e.failRule(sl.w, sl.i, why, out.timeout)
			}
		}
		if q := c.q; q != nil {
			q.call = nil
			e.flush(q, now)
		}
	case callAcquire:
		var err error
		if out.why != "" {
			err = errString(out.why)
		}
		e.onAcquire(c.lease, c.fetch, out.lease, err, out.timeout, now)
	case callSettle:
		if out.why != "" {
			e.p.host.IncrementMetric(e.m.settleFailures, 1)
		}
	default:
		if out.why != "" {
			e.p.host.IncrementMetric(e.m.refundFailures, c.n)
		}
	}
	e.freeCall(c)
}

// noDecision is why a decision fails whose call's reply the codec settled
// without handing it out (a codec's bug; Redis and RLS hand out each).
const noDecision = "the reply has no decision for this rule"

// completeDone completes the waits whose last outcome came in.
func (e *remote) completeDone(now int64) {
	for len(e.done) > 0 {
		w := e.done[len(e.done)-1]
		e.done = e.done[:len(e.done)-1]
		if e.waits[w.id] == w {
			e.complete(w, now)
		}
	}
}

// expire gives up on the calls past their guard deadline (cancelling them
// at the host) and fails the outcomes still out of every wait past its
// deadline. It answers or resumes the streams of those waits: call it only
// from root-context callbacks (tick, a reply), never from a stream's.
func (e *remote) expire(now int64) {
	e.nextDue = 0
	for t, c := range e.calls {
		if c.kind == callDecide && c.q == nil {
			continue // guarded by its wait's deadline
		}
		if c.due > now {
			e.due(c.due)
			continue
		}
		// A refund, a lease call or a coalesced call (whose requests'
		// waits are given up below; the requests queued behind it go in
		// a new call).
		delete(e.calls, t)
		e.codec.cancel(t)
		e.settle(c, outcome{why: e.noReply, timeout: true}, now)
	}
	for _, w := range e.waits {
		if w.deadline > now {
			e.due(w.deadline)
			continue
		}
		for i := range w.res {
			if w.applies[i] && e.p.rules[i].remote && !w.res[i].done {
				e.detach(w, i, now)
				e.failRule(w, i, e.noReply, true)
			}
		}
		e.complete(w, now)
	}
	e.completeDone(now)
}

// detach takes rule i of w (given up by the guard) out of its queue or
// call; a call left with no decision of a live wait is given up too (a
// coalesced call waits for its own deadline).
func (e *remote) detach(w *remoteWait, i int, now int64) {
	res := &w.res[i]
	if q := res.q; q != nil {
		for k, sl := range q.pending {
			if sl.w == w && sl.i == i {
				q.pending = append(q.pending[:k], q.pending[k+1:]...)
				break
			}
		}
	}
	c := res.call
	if c == nil {
		return
	}
	live := false
	for k := range c.slots {
		if sl := &c.slots[k]; sl.w == w && sl.i == i {
			sl.w = nil
		} else if sl.w != nil {
			live = true
		}
	}
	if !live && c.q == nil && e.calls[c.token] == c {
		delete(e.calls, c.token)
		e.codec.cancel(c.token)
		e.freeCall(c)
	}
}

// complete resumes or answers the stream of w, whose outcomes are all in,
// and recycles w. A stream that ended while waiting (it is no longer
// waiting on w, or it cannot be made the effective context) is not
// answered; the admissions made for it are refunded. Root-context
// callbacks only.
func (e *remote) complete(w *remoteWait, now int64) {
	delete(e.waits, w.id)
	s := w.s
	if s.rwait != w || e.h.SetEffectiveContext(w.id) != abi.StatusOK {
		e.refundAdmitted(w, now)
		e.release(w)
		return
	}
	s.rwait = nil
	e.current = w
	act := e.p.resume(s, w, now)
	e.current = nil
	if act == abi.ActionContinue {
		e.h.ContinueStream()
	}
	e.release(w)
}

// take gives remote rule r (index i) its outcome in w: the remote decision
// in r.d, or the failure (counted by failure_mode) and the store that
// decides r on this proxy instead: the fallback under failure_mode local,
// else nil.
func (e *remote) take(r *rule, w *remoteWait, i int) (*slotStore, error) {
	res := &w.res[i]
	if !res.failed {
		r.d = res.d
		if e.p.cfg.FailureMode == config.FailLocal {
			e.seedFallback(r, i, res.d, w.hashes[i])
		}
		return nil, nil
	}
	fb := e.fallback[i]
	if r.conc != nil {
		fb = nil // an in-flight limit has no local fallback: "local" lets it pass (concurrency_remote.go)
	}
	return e.failover(fb), errors.New(e.name + ": " + res.why)
}

// failover counts a remote rule's failed decision under failure_mode and
// returns the store that decides the rule on this proxy instead: fallback
// under failure_mode local, else nil.
func (e *remote) failover(fallback *slotStore) *slotStore {
	switch e.p.cfg.FailureMode {
	case config.FailOpen:
		e.p.host.IncrementMetric(e.m.failOpen, 1)
	case config.FailClosed:
		e.p.host.IncrementMetric(e.m.failClosed, 1)
	case config.FailLocal:
		e.p.host.IncrementMetric(e.m.failLocal, 1)
		return fallback
	}
	return nil
}

// refundAdmitted gives back every remote admission of w (fire and
// forget): a lease's to its pool, the others in refund calls (one for all,
// or one each, as the backend wants).
func (e *remote) refundAdmitted(w *remoteWait, now int64) {
	var shared *remoteCall
	for i := range w.res {
		res := &w.res[i]
		if !w.applies[i] || !e.p.rules[i].remote || !res.done || res.failed || !res.d.Allowed {
			continue
		}
		if lr := e.lease[i]; lr != nil {
			e.leaseRefund(lr, res.key, res.stamp, w.hashes[i], now)
			continue
		}
		if e.p.rules[i].conc != nil {
			e.sendConc(i, res.key, -1, now) // a slot given back (concurrency_remote.go)
			continue
		}
		switch e.codec.refundable(w, i) {
		case refundNone:
			continue
		case refundLost:
			e.p.host.IncrementMetric(e.m.refundFailures, 1)
			continue
		}
		if e.refundShared {
			if shared == nil {
				shared = e.newCall(callRefund)
			}
			shared.slots = append(shared.slots, callSlot{w, i})
			continue
		}
		c := e.newCall(callRefund)
		c.slots = append(c.slots, callSlot{w, i})
		e.sendRefund(c, now)
	}
	if shared != nil {
		e.sendRefund(shared, now)
	}
}

// sendSettle sends the settlement of rule i's key (delta = actual −
// reserved, not zero) in a call of its own, fire and forget; a call the
// host refuses is counted in settlement_failures.
func (e *remote) sendSettle(i int, key []byte, delta, now int64) {
	c := e.newCall(callSettle)
	c.rule, c.delta, c.n = i, delta, 1
	c.key = append(c.key[:0], key...)
	e.p.host.IncrementMetric(e.m.settlements, 1)
	if why := e.post(c, now); why != "" {
		e.p.host.IncrementMetric(e.m.settleFailures, 1)
		e.freeCall(c)
	}
}

// sendRefund sends refund call c.
func (e *remote) sendRefund(c *remoteCall, now int64) {
	c.n = int64(len(c.slots))
	e.p.host.IncrementMetric(e.m.refunds, c.n)
	if why := e.post(c, now); why != "" {
		e.p.host.IncrementMetric(e.m.refundFailures, c.n)
		e.freeCall(c)
	}
}

func (e *remote) newWait(s *stream) *remoteWait {
	var w *remoteWait
	if n := len(e.free); n > 0 {
		w = e.free[n-1]
		e.free = e.free[:n-1]
	} else {
		n := len(e.p.rules)
		w = &remoteWait{applies: make([]bool, n), hashes: make([]uint64, n), res: make([]remoteResult, n), x: e.codec.newWait(n)}
	}
	w.id, w.s, w.missing, w.deadline = s.id, s, 0, 0
	return w
}

// release returns w to the pool.
func (e *remote) release(w *remoteWait) {
	w.s = nil
	if len(e.free) < maxFreeStreams {
		e.free = append(e.free, w)
	}
}

func (e *remote) newCall(k callKind) *remoteCall {
	var c *remoteCall
	if n := len(e.cfree); n > 0 {
		c = e.cfree[n-1]
		e.cfree = e.cfree[:n-1]
	} else {
		c = &remoteCall{}
	}
	c.kind = k
	return c
}

// freeCall recycles c, which nothing refers to any more.
func (e *remote) freeCall(c *remoteCall) {
	clear(c.slots)
	*c = remoteCall{slots: c.slots[:0], key: c.key[:0]}
	if len(e.cfree) < maxFreeStreams {
		e.cfree = append(e.cfree, c)
	}
}

// tick runs the guard and the lease pools' expiry (proxy_on_tick: a
// root-context callback).
func (e *remote) tick() {
	now := e.p.host.Now()
	if e.leases != nil {
		e.leaseTick(now, false)
	}
	if e.nextDue != 0 && now >= e.nextDue {
		e.expire(now)
	}
}

// inFlight reports whether calls are in flight.
func (e *remote) inFlight() bool { return len(e.calls) > 0 }

// endLeases gives back every admission the lease pools hold (the root
// context ends).
func (e *remote) endLeases(now int64) {
	if e != nil && e.leases != nil {
		e.leaseTick(now, true)
	}
}
