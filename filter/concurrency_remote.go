package filter

import (
	"errors"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// Fleet-wide in-flight limits: a concurrency rule on backend "redis"
// (sluice-redis.wasm). Its slots live in Redis (redisrl's concurrency
// script: one hash per key, one entry per holder with a lease), so every
// proxy of the fleet counts against one limit.
//
//   - Acquire: the rule's decision is a call of its own (not coalesced) that
//     takes a slot for this holder if the live holders of every proxy leave
//     one; the request waits for it as for any remote decision (remote.go).
//   - Refund: a request admitted by the rule but refused by another gives
//     the slot back with a release call (the engine's refund).
//   - Release: the stream's end sends a release call, fire and forget; one
//     that fails or is lost (counted in the backend's refund_failures) leaves
//     the slot to the lease.
//   - Renew: the root's tick renews this holder's slots of each key every
//     ConcurrencyRenewEvery, one call per key; a proxy that dies stops
//     renewing and its slots come back ConcurrencyLeaseTTL after its last
//     renewal, on the Redis clock (reclaimed counts the slots this proxy's
//     calls dropped).
//   - A decision that fails follows failure_mode "open" or "closed"; under
//     "local" the rule lets the request pass (a local fallback would need
//     slots of its own to give back).
//   - in_flight is this proxy's requests holding slots of the rule.

// concurrencyScript is the concurrency script's index in scriptSeen and
// evalUntil (algorithms.Concurrency & 7).
const concurrencyScript = int(algorithms.Concurrency & 7)

// prepareConcurrency records rule r's acquire in d and returns its key; the
// call is the request's own.
func (rs *redisState) prepareConcurrency(d *redisDecision, r *rule) ([]byte, route) {
	d.key = redisrl.AppendConcurrencyKey(d.key[:0], r.id, unsafeString(r.key))
	d.req = redisrl.Request{Kind: algorithms.Concurrency, Key: d.key, Cost: 1}
	d.res, d.eval = redisrl.Result{}, false
	return d.key, routeOwn
}

// isConcurrency reports whether c is a call of the concurrency script.
func (rs *redisState) isConcurrency(c *remoteCall) bool {
	switch c.kind {
	case callConc:
		return true
	case callRefund:
		if c.x != nil {
			return c.x.(*redisRefund).req.Kind == algorithms.Concurrency
		}
	case callDecide:
		if c.q != nil {
			return false
		}
	default:
		return false
	}
	return len(c.slots) > 0 && rs.p.rules[c.slots[0].i].conc != nil
}

// concurrencyRequest is the script call c makes.
func (rs *redisState) concurrencyRequest(c *remoteCall) (redisrl.ConcurrencyRequest, *rule) {
	q := redisrl.ConcurrencyRequest{Holder: rs.p.conc.holder, N: 1, TTL: ConcurrencyLeaseTTL}
	var r *rule
	switch c.kind {
	case callConc:
		r = rs.p.rules[c.rule]
		q.Key, q.Op, q.N = c.key, redisrl.ConcurrencyRenew, c.delta
		if c.delta < 0 {
			q.Op, q.N = redisrl.ConcurrencyRelease, -c.delta
		}
	case callRefund:
		r = rs.p.rules[c.slots[0].i]
		q.Key, q.Op = c.x.(*redisRefund).key, redisrl.ConcurrencyRelease
	default:
		sl := c.slots[0]
		r = rs.p.rules[sl.i]
		q.Op = redisrl.ConcurrencyAcquire
		if sl.w != nil {
			q.Key = sl.w.x.(*redisWait).rules[sl.i].key
		} else {
			q.Key = c.key // given up by the guard before a resend: the key kept below
		}
	}
	q.Limit = r.cfg.Limit
	return q, r
}

// sendConcurrency encodes and makes c (EVALSHA, or EVAL when c.alt).
func (rs *redisState) sendConcurrency(c *remoteCall) (uint32, string) {
	if c.kind == callRefund && c.x == nil {
		sl := c.slots[0]
		d := &sl.w.x.(*redisWait).rules[sl.i]
		c.x = &redisRefund{key: append([]byte(nil), d.key...), req: d.req}
	}
	q, _ := rs.concurrencyRequest(c)
	if c.kind == callDecide {
		c.key = append(c.key[:0], q.Key...) // for a resend after NOSCRIPT whose wait is gone
	}
	if c.alt {
		rs.cmd = q.AppendEval(rs.cmd[:0])
	} else {
		rs.cmd = q.AppendEvalSHA(rs.cmd[:0])
	}
	token, st := rs.rh.RedisCall(rs.cfg.Cluster, rs.cmd)
	if st != abi.StatusOK {
		return 0, "proxy_redis_call: " + st.String()
	}
	return token, ""
}

// concurrencyReply reads the reply to c: an acquire's decision, or the
// outcome of a release or renewal; NOSCRIPT resends c as EVAL.
func (rs *redisState) concurrencyReply(c *remoteCall, size int, now int64) outcome {
	var res redisrl.ConcurrencyResult
	buf, st := rs.p.host.GetBuffer(abi.BufferRedisCallResponse, 0, size)
	err := error(nil)
	if st != abi.StatusOK && size > 0 {
		err = errors.New("reading the redis reply: " + st.String())
	} else if v, perr := rs.dec.Parse(buf); perr != nil {
		err = perr
	} else {
		res, err = redisrl.ParseConcurrencyReply(v)
	}
	if redisrl.IsNoScript(err) && !c.alt {
		rs.p.host.IncrementMetric(rs.noscript, 1)
		rs.evalUntil[concurrencyScript] = now + noScriptEvalPeriod
		c.alt = true
		return outcome{retry: true}
	}
	if err != nil {
		return outcome{why: err.Error()}
	}
	rs.scriptSeen[concurrencyScript] = true
	_, r := rs.concurrencyRequest(c)
	if res.Reclaimed > 0 {
		rs.p.host.IncrementMetric(r.conc.m.reclaimed, res.Reclaimed)
	}
	if c.kind != callDecide {
		return outcome{}
	}
	d := algorithms.Decision{Allowed: res.Allowed, Limit: r.cfg.Limit, Remaining: max(r.cfg.Limit-res.InFlight, 0)}
	hint := r.conc.lim.RetryAfter()
	if !d.Allowed {
		d.Remaining, d.ResetAfter, d.RetryAfter = 0, hint, hint
	} else if d.Remaining == 0 {
		d.ResetAfter = hint
	}
	for _, sl := range c.slots {
		if sl.w != nil {
			rs.e.decided(sl, d)
		}
	}
	return outcome{}
}

// acquiredRemote records the slots of remote concurrency rules that
// admitted s (their calls took them): w is the wait being resumed.
func (cs *concs) acquiredRemote(s *stream, now int64) {
	e := cs.p.remote
	if e == nil || e.current == nil {
		return
	}
	w := e.current
	for i, r := range cs.p.rules {
		if r.conc == nil || !r.remote || !r.applies || r.failed || !r.d.Allowed || !w.applies[i] || w.res[i].failed {
			continue
		}
		k := concKey{r, w.hashes[i]}
		h := cs.held[k]
		if h == nil {
			h = cs.newHeld(k)
			h.remote, h.rule, h.key = true, i, append(h.key, w.res[i].key...)
			cs.scheduleRenew(now)
		}
		h.n++
		if s.conc == nil {
			s.conc = cs.getAcqs()
		}
		s.conc.held = append(s.conc.held, h)
		cs.p.host.IncrementMetric(r.conc.m.acquired, 1)
		cs.p.host.IncrementMetric(r.conc.m.inFlight, 1)
	}
}

// releaseRemote gives one slot of h back in Redis (fire and forget).
func (cs *concs) releaseRemote(h *concHeld, now int64) {
	cs.p.remote.sendConc(h.rule, h.key, -1, now)
}

// renewRemote renews this holder's slots of h's key.
func (cs *concs) renewRemote(h *concHeld, now int64) {
	cs.p.remote.sendConc(h.rule, h.key, h.n, now)
}

// sendConc sends a release (delta < 0: −delta slots) or a renewal (delta
// slots held) of rule i's key, fire and forget; a call the host refuses
// counts in refund_failures (the lease gives the slots back).
func (e *remote) sendConc(i int, key []byte, delta, now int64) {
	c := e.newCall(callConc)
	c.rule, c.delta, c.n = i, delta, 1
	c.key = append(c.key[:0], key...)
	if why := e.post(c, now); why != "" {
		e.p.host.IncrementMetric(e.m.refundFailures, 1)
		e.freeCall(c)
	}
}

// The rls backend (sluice.wasm, `sluice serve`): an in-flight call is a ShouldRateLimit
// call of its own with one inline descriptor — the rule's entries (algorithm
// "concurrency", limit, the Retry-After hint as window_us), its key and sluice.inflight
// "<op>:<holder>:<n>:<ttl_ms>" (rlswire) — which the service runs on the concurrency
// script. The acquire is the rule's decision call; a release or renewal is a callConc.

// isConcurrency reports whether c is an in-flight call.
func (rs *rlsState) isConcurrency(c *remoteCall) bool {
	switch c.kind {
	case callConc:
		return true
	case callDecide:
		return len(c.slots) == 1 && rs.p.rules[c.slots[0].i].conc != nil
	}
	return false
}

// appendInFlightRequest appends the RateLimitRequest of in-flight call c.
func (rs *rlsState) appendInFlightRequest(b []byte, c *remoteCall) []byte {
	op, n, i := byte(redisrl.ConcurrencyAcquire), int64(1), c.rule
	key := c.key
	if c.kind == callDecide {
		sl := c.slots[0]
		i = sl.i
		if sl.w != nil {
			key = sl.w.x.(*rlsWait).keys[i]
			c.key = append(c.key[:0], key...) // for a resend whose wait is gone
		}
	} else if n = c.delta; n < 0 {
		op, n = byte(redisrl.ConcurrencyRelease), -n
	} else {
		op = byte(redisrl.ConcurrencyRenew)
	}
	b = rs.appendDomain(b)
	rs.num = rlswire.AppendInFlight(rs.num[:0], op, rs.p.conc.holder, n, int64(ConcurrencyLeaseTTL/time.Millisecond))
	b = appendDescriptor(b, rs.p.rules[i].rls.entries, key, rlswire.InFlight, rs.num, 0)
	b = append(b, 3<<3|wireVarint)
	return append(b, 1) // hits_addend
}

// inFlightReply reads the reply to in-flight call c: the acquire's decision, or whether
// a release or renewal was answered OK.
func (rs *rlsState) inFlightReply(c *remoteCall, size int) outcome {
	b, st := rs.p.host.GetBuffer(abi.BufferGrpcReceive, 0, size)
	var err error
	if st != abi.StatusOK && size > 0 {
		err = errors.New("reading the reply: " + st.String())
	} else {
		err = rs.res.decode(b, 1)
	}
	if err != nil {
		return outcome{why: "ShouldRateLimit reply: " + err.Error()}
	}
	s := &rs.res.st[0]
	if c.kind != callDecide {
		if s.code != rlsCodeOK {
			return outcome{why: "in-flight call answered " + strconv.FormatUint(s.code, 10)}
		}
		return outcome{}
	}
	sl := c.slots[0]
	if sl.w == nil {
		return outcome{}
	}
	r := rs.p.rules[sl.i]
	hint := r.conc.lim.RetryAfter()
	var d algorithms.Decision
	switch s.code {
	case rlsCodeOK:
		d = algorithms.Decision{Allowed: true, Limit: r.cfg.Limit, Remaining: int64(s.remaining)}
		if d.Remaining == 0 {
			d.ResetAfter = hint
		}
	case rlsCodeOverLimit:
		d = algorithms.Decision{Limit: r.cfg.Limit, ResetAfter: hint, RetryAfter: hint}
	default:
		rs.e.failRule(sl.w, sl.i, "in-flight descriptor: status code "+strconv.FormatUint(s.code, 10), false)
		return outcome{}
	}
	rs.e.decided(sl, d)
	return outcome{}
}
