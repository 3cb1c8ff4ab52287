package filter

import (
	"errors"
	"strconv"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// The Redis backend (sluice-redis.wasm; Higress's Redis host calls).
//
// A request that matches rules with backend "redis" is decided by the same
// orchestration as one without (Plugin.onRequest, resume, charge in
// plugin.go); this file plugs in where Redis differs: dispatch sends the
// calls, take hands each rule its reply (or its failure and failure_mode's
// fallback store), refundAdmitted undoes the admissions of a denied request.
// The steps:
//
//  1. Local rules that apply are decided first, without writing anything. If
//     an enforcing local rule denies, the request is denied at once: no Redis
//     call is made and no rule is charged.
//  2. Each applying Redis rule gets one call of its algorithm's script
//     (package redisrl), all sent at once through proxy_redis_call, and the
//     request is paused (proxy_on_request_headers returns Pause). The call is
//     EVALSHA, except EVAL (the script's source, which also caches it on the
//     node) until this VM has seen a reply of that script and for a second
//     after a NOSCRIPT: a cold or restarted node then costs no request a
//     second round trip, and once warm only the SHA-1 travels.
//  3. When every reply is in (proxy_on_redis_call_response; a NOSCRIPT reply
//     is answered by resending the call as EVAL), the local rules are decided
//     again and charged (compare-and-swap, as without Redis), and the verdict
//     is given as usual: any enforcing rule denying → the configured
//     rejection; otherwise the request resumes (proxy_continue_stream) and
//     the response gets the rate-limit headers of the most restrictive rule.
//  4. A denied request is charged to no rule: each Redis rule that admitted it
//     is sent a refund (fire and forget; redisrl documents the exact effect),
//     and local rules were never charged.
//
// Coalescing: a VM keeps at most one decision call in flight per (rule,
// key). A request for a key whose call is in flight waits, and the key's
// waiting requests go together in the next call, which decides them in
// arrival order at one instant (redisrl Request.N: as many admitted as the
// algorithm admits of that many requests one after the other) — a hot key
// costs a call per round trip instead of one per request; a request for a
// quiet key goes at once. Each request still gets its own decision, guard
// and refund.
//
// A Redis rule whose decision failed — a nonzero callback status (network
// error, timeout), an error reply other than NOSCRIPT (MOVED that outlived
// the host's redirects, CLUSTERDOWN, …), a reply of the wrong shape, a call
// the host refused, or no reply within redis.timeout_ms plus a margin (the
// guard, for hosts that never answer: checked on proxy_on_tick, whose period
// is timeout_ms clamped to 10 ms .. 1 s, and after each Redis reply) — is
// handled by failure_mode: "open" lets the rule pass, "closed" rejects
// the request with 503 and a plain-text body, "local" decides the rule on
// this proxy's shared data with its limit (and burst) divided by
// redis.instances (at least 1). Each outcome has a counter. A reply that
// arrives after the guard gave up is dropped: if it was an admission, that
// charge stays in Redis until the window passes (errs towards limiting).
//
// Redis calls belong to the root context (as in Higress's Envoy): replies
// arrive with the root context id, the token is mapped back to the paused
// stream, which is made the effective context before it is resumed or
// answered. A stream that ended while waiting (client gone) is not answered;
// the admissions made for it are refunded.
//
// A paused stream is resumed or answered only from root-context callbacks
// (proxy_on_redis_call_response, proxy_on_tick), never from another stream's
// callback: in proxy-wasm-cpp-host proxy_send_local_response raises a
// VM-wide stop-iteration flag (WasmBase::stopNextIteration, src/exports.cc
// send_local_response) that converts the status of whichever stream callback
// is running to StopAllIterationAndWatermark (src/context.cc), so answering
// stream B from stream A's proxy_on_request_headers would stop A until the
// stream idle timeout. After a root callback the flag is cleared without
// converting any stream's status.

// RedisHost is what the Redis backend needs from the host beyond abi.Host:
// Higress's Redis calls plus the calls that resume a paused stream from a
// later callback. abi.Imports implements it in the redis build.
type RedisHost interface {
	RedisInit(service, username, password string, timeoutMS uint32) abi.Status
	RedisCall(service string, query []byte) (token uint32, st abi.Status)
	SetEffectiveContext(id uint32) abi.Status
	ContinueStream() abi.Status
	SetTickPeriod(ms uint32) abi.Status
}

// hasRedisCalls reports whether h provides the Redis calls: true for the
// redis build's imports (build tag "redis") and for test hosts that implement
// RedisHost; false for sluice.wasm, which therefore refuses Redis rules.
func hasRedisCalls(h abi.Host) bool {
	_, ok := h.(RedisHost)
	return ok
}

// Redis metric names (counters).
const (
	MetricRedisCalls          = "sluice.redis.calls"           // EVALSHA/EVAL sent for decisions
	MetricRedisNoScript       = "sluice.redis.noscript"        // NOSCRIPT answered with EVAL
	MetricRedisFailures       = "sluice.redis.failures"        // decisions Redis could not make
	MetricRedisTimeouts       = "sluice.redis.timeouts"        // of which: timeout status or guard
	MetricRedisFailOpen       = "sluice.redis.fail_open"       // failures let through (failure_mode open)
	MetricRedisFailClosed     = "sluice.redis.fail_closed"     // failures rejected with 503 (closed)
	MetricRedisFailLocal      = "sluice.redis.fail_local"      // failures decided locally (local)
	MetricRedisRefunds        = "sluice.redis.refunds"         // refunds sent (denied multi-rule requests)
	MetricRedisRefundFailures = "sluice.redis.refund_failures" // refunds that did not land
)

// redisGuardMargin is added to redis.timeout_ms for the guard that fails a
// wait the host never answers; the host's own timeout normally fires first.
const redisGuardMargin = 10_000_000 // 10 ms in ns

// noScriptEvalPeriod is how long calls of an algorithm go out as EVAL after
// a NOSCRIPT reply (1 s).
const noScriptEvalPeriod = 1_000_000_000

// Minimum time between proxy_redis_init retries after a failed init.
const redisInitRetry = 1_000_000_000

type redisMetrics struct {
	failMetrics
	calls, noscript, refunds, refundFailures uint32
}

// redisState is a Plugin's Redis backend.
type redisState struct {
	// Coalescing (keyQueue): the queues by (rule, key) hash, and by the
	// token of their call in flight.
	queues map[uint64]*keyQueue
	qcalls map[uint32]*keyQueue
	qfree  []*keyQueue
	qdone  []*redisWait

	p        *Plugin
	rh       RedisHost
	cfg      config.Redis
	initOK   bool
	lastInit int64
	guard    int64                 // ns a wait may last before the guard fails it
	calls    map[uint32]*redisCall // tokens in flight
	waits    map[uint32]*redisWait // paused streams by context id
	nextDue  int64                 // earliest guard deadline (0: none)
	// Scripts go out as EVAL (the source; it also caches the script on the
	// node) until this VM has seen a reply of that algorithm's script, and
	// for noScriptEvalPeriod after a NOSCRIPT (a node restarted or failed
	// over), so a cold cluster costs a burst of requests no second round
	// trip; otherwise as EVALSHA (the SHA-1 only).
	scriptSeen [8]bool
	evalUntil  [8]int64
	free       []*redisWait
	cmd        []byte
	dec        resp.Decoder
	m          redisMetrics
	leases     *leases // the lease pools (lease.go); nil without a rule with "lease"
}

// keyQueue holds the decisions of one (rule, key) on this VM: at most one
// script call is in flight for them; requests that arrive meanwhile wait in
// pending and go together in the next call, which decides them in order
// (redisrl Request.N) — as many Redis calls as round trips, not requests,
// for a hot key. Decisions stay those of the algorithm for requests arriving
// one after the other (redisrl documents the batch's reply).
type keyQueue struct {
	hash    uint64
	rule    int
	key     []byte
	sent    []*redisCall // the call in flight's requests in order; nil: given up by the guard
	pending []*redisCall
	req     redisrl.Request
	token   uint32
	busy    bool
	eval    bool
	due     int64 // when the guard gives up on the call in flight
}

// maxBatch bounds the requests one call decides.
const maxBatch = 128

// redisRule is the Redis side of one rule (rule.redis).
type redisRule struct {
	kind     algorithms.Kind
	params   algorithms.Params
	fallback *slotStore // failure_mode local: shared data, the limit divided by redis.instances
	lease    *leaseRule // "lease": N (lease.go); nil without

	// keys builds the rule's keys (redisrl.AppendKey's bytes), once.
	keys redisrl.KeyTemplate
}

// redisWait is one paused request.
type redisWait struct {
	waitBase
	calls []redisCall // by rule index
}

// redisCall is one rule's decision in flight (or a refund when w is nil).
type redisCall struct {
	w      *redisWait
	rule   int
	req    redisrl.Request
	key    []byte
	eval   bool  // sent as EVAL (after NOSCRIPT, or while evalUntil holds)
	due    int64 // refunds: when the guard gives up on the reply
	done   bool
	failed bool
	why    string
	res    redisrl.Result
	refund redisrl.Result // what req.Refund points at, for refunds
	// Leases (lease.go): lr is the lease script's call of an acquire
	// (fetch) or a return (neither w nor fetch); leaseOf its rule's lease.
	// A decision spent from a lease has leased set and the grant's stamp.
	lr      *redisrl.LeaseRequest
	fetch   *leaseFetch
	leaseOf *leaseRule
	leased  bool
	stamp   int64
	q       *keyQueue // the queue c waits in or was sent by (coalesced decisions)
}

func newRedisState(p *Plugin, cfg *config.Config, rules []*rule) (*redisState, error) {
	rh, ok := p.host.(RedisHost)
	if !ok {
		return nil, errors.New("backend \"redis\": the host has no Redis extension")
	}
	if cfg.Redis == nil {
		return nil, errors.New("redis: required by rules with backend \"redis\"")
	}
	rs := &redisState{
		p:     p,
		rh:    rh,
		cfg:   *cfg.Redis,
		guard: int64(cfg.Redis.TimeoutMS)*1_000_000 + redisGuardMargin,
		calls: make(map[uint32]*redisCall),
		waits: make(map[uint32]*redisWait),
		cmd:   make([]byte, 0, 512),
	}
	rs.queues, rs.qcalls = make(map[uint64]*keyQueue), make(map[uint32]*keyQueue)
	for _, r := range rules {
		if r.cfg.Backend != config.BackendRedis {
			continue
		}
		// config.ParseFor (BuildRedis) checked the scripts' bounds
		// (config.RedisParams) and built the local fallback.
		lim := r.cfg.Limiter
		r.remote = true
		r.redis = &redisRule{kind: lim.Kind(), params: lim.Params(), keys: redisrl.NewKeyTemplate(lim.Kind(), r.id),
			fallback: newSlotStore(p.host, r.cfg.Fallback, "sluice:"+p.name+":"+r.id+":fallback:", r.cfg.MaxKeys)}
	}
	var err error
	if rs.leases, err = newLeases(p, rs, rules, cfg.Redis.Instances, redisrl.MaxLeaseKeyLen, MetricRedisLeased, MetricRedisReturned); err != nil {
		return nil, err
	}
	if rs.leases != nil {
		for _, lr := range rs.leases.rules {
			rules[lr.rule].redis.lease = lr
		}
	}
	for _, m := range []struct {
		id   *uint32
		name string
	}{
		{&rs.m.calls, MetricRedisCalls}, {&rs.m.noscript, MetricRedisNoScript}, {&rs.m.failures, MetricRedisFailures},
		{&rs.m.timeouts, MetricRedisTimeouts}, {&rs.m.failOpen, MetricRedisFailOpen}, {&rs.m.failClosed, MetricRedisFailClosed},
		{&rs.m.failLocal, MetricRedisFailLocal}, {&rs.m.refunds, MetricRedisRefunds}, {&rs.m.refundFailures, MetricRedisRefundFailures},
	} {
		id, st := p.host.DefineMetric(abi.MetricCounter, m.name)
		if st != abi.StatusOK {
			return nil, errors.New("defining metric " + m.name + ": " + st.String())
		}
		*m.id = id
	}
	rs.init(p.host.Now())
	// The root context's tick period (the guard's clock) is set once its
	// scopes are configured too: Plugin.setTickPeriod.
	return rs, nil
}

// tickPeriod is the guard's clock: a tick about every timeout (10 ms ..
// 1 s), so a wait the host never answers is failed within timeout_ms + 10 ms
// plus one period.
func (rs *redisState) tickPeriod() uint32 {
	return uint32(min(max(rs.cfg.TimeoutMS, 10), 1000))
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
	}
	th, ok := p.host.(tickHost)
	if period == 0 || !ok {
		return
	}
	if st := th.SetTickPeriod(period); st != abi.StatusOK {
		p.host.Log(abi.LogError, "sluice: proxy_set_tick_period_milliseconds failed: "+st.String()+
			"; a remote call the host never answers holds its request until the host gives up on it")
	}
}

// init calls proxy_redis_init; it is retried (at most once a second) while it fails.
func (rs *redisState) init(now int64) bool {
	rs.lastInit = now
	st := rs.rh.RedisInit(rs.cfg.Cluster, rs.cfg.Username, rs.cfg.Password, uint32(rs.cfg.TimeoutMS))
	rs.initOK = st == abi.StatusOK
	if !rs.initOK {
		rs.p.host.Log(abi.LogError, "sluice: proxy_redis_init("+strconv.Quote(rs.cfg.Cluster)+") failed: "+st.String()+
			" (is redis.cluster the name of a Redis service the host knows?); Redis rules follow failure_mode until it succeeds")
	}
	return rs.initOK
}

// dispatch sends one script call for each applying Redis rule of s's
// request (Plugin.onRequest has keyed and hashed them) and returns the wait
// that collects the replies, with the rules' per-request state. While calls
// are missing the wait is registered for the replies and the guard;
// a wait with none missing had every call fail at once. It answers no
// stream, so it never runs the guard: expire answers other streams, which
// only root-context callbacks may do (see above).
func (rs *redisState) dispatch(s *stream, now int64) remoteWait {
	w := rs.newWait(s)
	for i, r := range rs.p.rules {
		w.applies[i], w.hashes[i] = r.applies, r.hash
		rr := r.redis
		if rr == nil || !r.applies {
			continue
		}
		c := &w.calls[i]
		*c = redisCall{w: w, rule: i, key: c.key[:0]}
		if rr.lease != nil {
			c.key = redisrl.AppendLeaseKey(c.key, rr.kind, r.id, unsafeString(r.key))
			rs.leases.dispatch(rr.lease, r.hash, c.key, w, i, now)
			continue
		}
		c.key = rr.keys.Append(c.key, unsafeString(r.key))
		c.req = redisrl.Request{Kind: rr.kind, Params: rr.params, Key: c.key, Cost: 1}
		w.missing++
		rs.enqueue(c, r.hash^(uint64(i)+1)*0x9e3779b97f4a7c15, now)
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

// enqueue sends decision c at once if no call for its (rule, key) is in
// flight, else queues it for the next one. A hash shared with another
// (rule, key) sends c alone.
func (rs *redisState) enqueue(c *redisCall, h uint64, now int64) {
	q := rs.queues[h]
	if q == nil {
		if n := len(rs.qfree); n > 0 {
			q = rs.qfree[n-1]
			rs.qfree = rs.qfree[:n-1]
		} else {
			q = &keyQueue{key: make([]byte, 0, redisrl.MaxKeyLen)}
		}
		q.hash, q.rule, q.key = h, c.rule, append(q.key[:0], c.key...)
		rs.queues[h] = q
	} else if q.rule != c.rule || string(q.key) != string(c.key) {
		rs.send(c, now)
		return
	}
	c.q = q
	q.pending = append(q.pending, c)
	if !q.busy {
		rs.flush(q, now)
	}
}

// flush sends q's pending decisions (up to maxBatch) in one call; with none
// left, q is recycled.
func (rs *redisState) flush(q *keyQueue, now int64) {
	for len(q.pending) > 0 {
		k := min(len(q.pending), maxBatch)
		q.sent = append(q.sent[:0], q.pending[:k]...)
		q.pending = q.pending[:copy(q.pending, q.pending[k:])]
		q.eval = false // EVAL again only after a NOSCRIPT (onQueueReply) or as send does
		if rs.sendQueue(q, now) {
			return
		}
	}
	q.sent = q.sent[:0]
	delete(rs.queues, q.hash)
	if len(rs.qfree) < maxFreeStreams {
		rs.qfree = append(rs.qfree, q)
	}
}

// sendQueue sends the call of q.sent; a refused call fails them (false).
func (rs *redisState) sendQueue(q *keyQueue, now int64) bool {
	why := ""
	if !rs.initOK && (now-rs.lastInit < redisInitRetry || !rs.init(now)) {
		why = "proxy_redis_init failed"
	} else {
		q.req = q.sent[0].req
		q.req.Key, q.req.N = q.key, int64(len(q.sent))
		if k := q.req.Kind & 7; !rs.scriptSeen[k] || now < rs.evalUntil[k] {
			q.eval = true
		}
		if q.eval {
			rs.cmd = q.req.AppendEval(rs.cmd[:0])
		} else {
			rs.cmd = q.req.AppendEvalSHA(rs.cmd[:0])
		}
		token, st := rs.rh.RedisCall(rs.cfg.Cluster, rs.cmd)
		if st == abi.StatusOK {
			rs.p.host.IncrementMetric(rs.m.calls, 1)
			q.busy, q.token, q.due = true, token, now+rs.guard
			rs.qcalls[token] = q
			if rs.nextDue == 0 || q.due < rs.nextDue {
				rs.nextDue = q.due
			}
			for _, c := range q.sent {
				c.eval = q.eval
				// The guard covers the host's answer to this call: a
				// request that waited in the queue gets its guard from
				// now (the wait itself is bounded by the previous call's).
				if d := now + rs.guard; c.w.deadline < d {
					c.w.deadline = d
				}
			}
			return true
		}
		why = "proxy_redis_call: " + st.String()
	}
	for _, c := range q.sent {
		c.q = nil
		rs.fail(c, why, false)
		// A wait not yet registered is dispatch's, which completes it
		// itself (sent from a stream's callback: only its own request).
		if c.w.missing == 0 && rs.waits[c.w.id] == c.w {
			rs.qdone = append(rs.qdone, c.w)
		}
	}
	q.sent = q.sent[:0]
	return false
}

// onQueueReply hands each request of q's call its decision (or the
// call's failure), sends the next call of q's pending requests, then
// completes the waits that have all their replies.
func (rs *redisState) onQueueReply(q *keyQueue, status uint32, size int, now int64) {
	delete(rs.qcalls, q.token)
	q.busy = false
	var b redisrl.Batch
	var err error
	if status != 0 {
		err = errors.New("redis call status " + strconv.FormatUint(uint64(status), 10))
	} else {
		buf, st := rs.p.host.GetBuffer(abi.BufferRedisCallResponse, 0, size)
		if st != abi.StatusOK && size > 0 {
			err = errors.New("reading the redis reply: " + st.String())
		} else {
			b, err = redisrl.ParseBatchReplyBytes(&rs.dec, buf, q.req.N)
		}
	}
	if redisrl.IsNoScript(err) && !q.eval {
		rs.p.host.IncrementMetric(rs.m.noscript, 1)
		rs.evalUntil[q.req.Kind&7] = now + noScriptEvalPeriod
		q.eval = true
		if rs.sendQueue(q, now) {
			return
		}
	} else {
		if err == nil {
			rs.scriptSeen[q.req.Kind&7] = true
		}
		for i, c := range q.sent {
			if c == nil {
				continue // its wait was given up
			}
			c.q = nil
			if err != nil {
				rs.fail(c, err.Error(), status == 2)
			} else {
				c.done, c.res = true, b.At(int64(i), c.req.Cost)
				c.w.missing--
			}
			if c.w.missing == 0 {
				rs.qdone = append(rs.qdone, c.w)
			}
		}
		q.sent = q.sent[:0]
	}
	rs.flush(q, now)
	rs.completeQueued(now)
}

// completeQueued completes the waits whose last reply a queue handed out.
func (rs *redisState) completeQueued(now int64) {
	for len(rs.qdone) > 0 {
		w := rs.qdone[len(rs.qdone)-1]
		rs.qdone = rs.qdone[:len(rs.qdone)-1]
		if rs.waits[w.id] == w {
			rs.complete(w, now)
		}
	}
}

// unqueue removes c (given up by the guard) from its queue.
func (rs *redisState) unqueue(c *redisCall) {
	q := c.q
	c.q = nil
	for i, x := range q.sent {
		if x == c {
			q.sent[i] = nil
			return
		}
	}
	for i, x := range q.pending {
		if x == c {
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			return
		}
	}
}

// send sends c (EVALSHA, or EVAL once NOSCRIPT was seen). A refused call
// fails c (and completes its wait's count).
func (rs *redisState) send(c *redisCall, now int64) {
	if !rs.initOK && (now-rs.lastInit < redisInitRetry || !rs.init(now)) {
		rs.fail(c, "proxy_redis_init failed", false)
		return
	}
	if k := c.script(); !c.eval && (!rs.scriptSeen[k] || now < rs.evalUntil[k]) {
		c.eval = true
	}
	switch {
	case c.lr != nil && c.eval:
		rs.cmd = c.lr.AppendEval(rs.cmd[:0])
	case c.lr != nil:
		rs.cmd = c.lr.AppendEvalSHA(rs.cmd[:0])
	case c.eval:
		rs.cmd = c.req.AppendEval(rs.cmd[:0])
	default:
		rs.cmd = c.req.AppendEvalSHA(rs.cmd[:0])
	}
	token, st := rs.rh.RedisCall(rs.cfg.Cluster, rs.cmd)
	if st != abi.StatusOK {
		rs.fail(c, "proxy_redis_call: "+st.String(), false)
		return
	}
	if c.w != nil || c.lr != nil {
		rs.p.host.IncrementMetric(rs.m.calls, 1)
	}
	if c.w == nil {
		c.due = now + rs.guard
		if rs.nextDue == 0 || c.due < rs.nextDue {
			rs.nextDue = c.due
		}
	}
	rs.calls[token] = c
}

// script is the index of c's script in scriptSeen/evalUntil: the
// algorithm's Kind, 7 for the lease script.
func (c *redisCall) script() int {
	if c.lr != nil {
		return 7
	}
	return int(c.req.Kind & 7)
}

// fail marks c failed. For a decision it counts down its wait.
func (rs *redisState) fail(c *redisCall, why string, timeout bool) {
	if c.lr != nil && c.w == nil {
		// A lease call: an acquire fails its waiters (leaseAcquire), a
		// lost return counts as a refund that did not land.
		c.done, c.failed, c.why = true, true, why
		if c.fetch == nil {
			rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
		}
		return
	}
	if c.w == nil {
		rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
		return
	}
	c.done, c.failed, c.why = true, true, why
	rs.p.countFailure(&rs.m.failMetrics, timeout)
	c.w.missing--
}

// onReply handles proxy_on_redis_call_response.
func (rs *redisState) onReply(token, status uint32, size int) {
	if q := rs.qcalls[token]; q != nil {
		now := rs.p.host.Now()
		rs.onQueueReply(q, status, size, now)
		if rs.nextDue != 0 && now >= rs.nextDue {
			rs.expire(now)
		}
		return
	}
	c := rs.calls[token]
	if c == nil {
		return // a reply after the guard gave up, or not ours
	}
	delete(rs.calls, token)
	now := rs.p.host.Now()
	var res redisrl.Result
	var lres redisrl.LeaseResult
	var err error
	if status != 0 {
		err = errors.New("redis call status " + strconv.FormatUint(uint64(status), 10))
	} else {
		b, st := rs.p.host.GetBuffer(abi.BufferRedisCallResponse, 0, size)
		if st != abi.StatusOK && size > 0 {
			err = errors.New("reading the redis reply: " + st.String())
		} else {
			if c.lr != nil {
				var v resp.Value
				if v, err = rs.dec.Parse(b); err == nil {
					lres, err = redisrl.ParseLeaseReply(v, c.lr.N)
				}
			} else {
				res, err = redisrl.ParseReplyBytes(&rs.dec, b)
			}
		}
	}
	if redisrl.IsNoScript(err) && !c.eval {
		rs.p.host.IncrementMetric(rs.m.noscript, 1)
		rs.evalUntil[c.script()] = now + noScriptEvalPeriod
		c.eval = true
		rs.send(c, now) // still counted in missing unless send fails it
		if c.fetch != nil && c.failed {
			rs.leases.failFetch(c.leaseOf, c.fetch, c.why, false, now, true)
			return
		}
		if c.w != nil && c.w.missing == 0 {
			rs.complete(c.w, now)
		}
		return
	}
	if c.lr != nil {
		switch {
		case c.fetch != nil:
			if err == nil {
				rs.scriptSeen[7] = true
			}
			rs.leases.onAcquire(c.leaseOf, c.fetch, lres, err, status == 2, now)
		case err != nil: // a return that did not land
			rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
		}
		if rs.nextDue != 0 && now >= rs.nextDue {
			rs.expire(now)
		}
		return
	}
	if c.w == nil { // a refund
		if err != nil {
			rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
		}
		return
	}
	if err != nil {
		rs.fail(c, err.Error(), status == 2)
	} else {
		rs.scriptSeen[c.req.Kind&7] = true
		c.done, c.res = true, res
		c.w.missing--
	}
	if c.w.missing == 0 {
		rs.complete(c.w, now)
	}
	if rs.nextDue != 0 && now >= rs.nextDue {
		rs.expire(now)
	}
}

// expire fails the calls of every wait past its guard deadline, and gives
// up on refunds whose reply never came. It answers or resumes the streams
// of those waits: call it only from root-context callbacks (tick, Redis
// reply), never from a stream's.
func (rs *redisState) expire(now int64) {
	rs.nextDue = 0
	for t, c := range rs.calls {
		if c.w != nil {
			continue
		}
		if c.due <= now {
			delete(rs.calls, t)
			if c.fetch != nil {
				rs.leases.failFetch(c.leaseOf, c.fetch, "no reply within redis.timeout_ms", true, now, true)
			} else {
				rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
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
		for i := range w.calls {
			c := &w.calls[i]
			if c.w == w && !c.done {
				if c.q != nil {
					rs.unqueue(c)
				}
				for t, x := range rs.calls {
					if x == c {
						delete(rs.calls, t)
					}
				}
				rs.fail(c, "no reply within redis.timeout_ms", true)
			}
		}
		rs.complete(w, now)
	}
	// A queue's call unanswered past its guard (its requests' waits, all
	// older, were given up above): its reply will be dropped, and the
	// requests queued behind it go in a new call.
	for t, q := range rs.qcalls {
		if q.due > now {
			if rs.nextDue == 0 || q.due < rs.nextDue {
				rs.nextDue = q.due
			}
			continue
		}
		delete(rs.qcalls, t)
		q.busy = false
		for _, c := range q.sent {
			if c != nil { // cannot happen: its wait was older
				c.q = nil
				rs.fail(c, "no reply within redis.timeout_ms", true)
				if c.w.missing == 0 {
					rs.qdone = append(rs.qdone, c.w)
				}
			}
		}
		q.sent = q.sent[:0]
		rs.flush(q, now)
	}
	rs.completeQueued(now)
}

// complete resumes or answers the stream of a wait whose calls are all in.
// Root-context callbacks only (see expire).
func (rs *redisState) complete(w *redisWait, now int64) {
	delete(rs.waits, w.id)
	rs.p.completeWait(rs, rs.rh, w, now)
}

// take gives Redis rule r (index i) the outcome of its call in w: Redis's
// decision in r.d, or the failure (counted by failure_mode) and the store
// that decides r on this proxy instead: the fallback under failure_mode
// local, else nil.
func (rs *redisState) take(r *rule, rw remoteWait, i int) (*slotStore, error) {
	c := &rw.(*redisWait).calls[i]
	if !c.failed {
		r.d = c.res.Decision
		return nil, nil
	}
	by := rs.p.failover(&rs.m.failMetrics, r.redis.fallback)
	return by, errors.New("redis: " + c.why)
}

// refundAdmitted sends a refund for every Redis admission of w (fire and
// forget).
func (rs *redisState) refundAdmitted(rw remoteWait, now int64) {
	w := rw.(*redisWait)
	for i := range w.calls {
		c := &w.calls[i]
		if c.w != w || !c.done || c.failed || !c.res.Allowed {
			continue
		}
		if lr := rs.p.rules[i].redis.lease; lr != nil {
			rs.leases.refund(lr, c.key, c.stamp, w.hashes[i], now)
			continue
		}
		rf := &redisCall{rule: i, key: append([]byte(nil), c.key...)}
		rf.refund = c.res
		rf.req = c.req
		rf.req.Key = rf.key
		rf.req.Refund = &rf.refund
		rf.eval = c.eval // the node has the script if EVAL was needed
		rs.p.host.IncrementMetric(rs.m.refunds, 1)
		rs.send(rf, now)
	}
}

func (rs *redisState) newWait(s *stream) *redisWait {
	var w *redisWait
	if n := len(rs.free); n > 0 {
		w = rs.free[n-1]
		rs.free = rs.free[:n-1]
	} else {
		n := len(rs.p.rules)
		w = &redisWait{waitBase: waitBase{applies: make([]bool, n), hashes: make([]uint64, n)}, calls: make([]redisCall, n)}
		for i := range w.calls {
			w.calls[i].key = make([]byte, 0, redisrl.MaxLeaseKeyLen)
		}
	}
	w.id, w.s, w.missing, w.deadline = s.id, s, 0, 0
	for i := range w.calls {
		w.calls[i].w = nil
	}
	return w
}

func (rs *redisState) release(rw remoteWait) {
	w := rw.(*redisWait)
	w.s = nil
	for i := range w.calls {
		w.calls[i].w = nil
	}
	if len(rs.free) < maxFreeStreams {
		rs.free = append(rs.free, w)
	}
}

// tick runs the guard (proxy_on_tick: a root-context callback).
func (rs *redisState) tick() {
	now := rs.p.host.Now()
	rs.leases.tick(now, false)
	if rs.nextDue != 0 && now >= rs.nextDue {
		rs.expire(now)
	}
}

// leaseSend implements leaseBackend: the lease script's call, EVALSHA
// (EVAL until this VM has seen its reply, as for the algorithms' scripts).
func (rs *redisState) leaseSend(lr *leaseRule, f *leaseFetch, q *redisrl.LeaseRequest, now int64) (string, bool) {
	c := &redisCall{rule: -1, key: q.Key, lr: q, fetch: f, leaseOf: lr}
	if f != nil {
		c.rule = lr.rule
	}
	rs.send(c, now)
	return c.why, !c.failed
}

// leaseLive implements leaseBackend.
func (rs *redisState) leaseLive(x *leaseWaiter) bool {
	w := x.w.(*redisWait)
	c := &w.calls[x.i]
	return c.w == w && w.id == x.id && w.s != nil && !c.done
}

// leaseDecide implements leaseBackend.
func (rs *redisState) leaseDecide(x *leaseWaiter, d algorithms.Decision, stamp int64) {
	c := &x.w.(*redisWait).calls[x.i]
	c.done, c.leased, c.stamp = true, d.Allowed, stamp
	c.res = redisrl.Result{Decision: d}
}

// leaseFailed implements leaseBackend.
func (rs *redisState) leaseFailed(x *leaseWaiter, why string, timeout bool) {
	c := &x.w.(*redisWait).calls[x.i]
	c.done, c.failed, c.why = true, true, why
	rs.p.countFailure(&rs.m.failMetrics, timeout)
}

// leaseComplete implements leaseBackend.
func (rs *redisState) leaseComplete(w remoteWait, now int64) { rs.complete(w.(*redisWait), now) }

// OnRedisCallResponse receives proxy_on_redis_call_response (the redis
// build's export dispatches here).
func (vm *VM) OnRedisCallResponse(rootID, token, status uint32, size int) {
	root := vm.plugins[rootID]
	if root == nil {
		return
	}
	// The root context's own rules or one of its scopes made the call.
	for i := 0; i < root.configs(); i++ {
		p := root.configAt(i)
		if p.redis == nil || (p.redis.calls[token] == nil && p.redis.qcalls[token] == nil) {
			continue
		}
		defer func() {
			if r := recover(); r != nil {
				p.recovered(nil, r)
			}
		}()
		p.redis.onReply(token, status, size)
		return
	}
}
