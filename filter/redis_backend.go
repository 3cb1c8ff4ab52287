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

// The Redis backend (sluice-redis.wasm; Higress's Redis host calls): the
// codec of the remote-call engine (remote.go) for Redis.
//
// Each applying Redis rule's decision is one call of its algorithm's script
// (package redisrl) through proxy_redis_call, coalesced by (rule, key): a
// hot key's waiting requests go together in one call, which decides them in
// arrival order at one instant (redisrl Request.N: as many admitted as the
// algorithm admits of that many requests one after the other). The call is
// EVALSHA, except EVAL (the script's source, which also caches it on the
// node) until this VM has seen a reply of that script and for a second
// after a NOSCRIPT: a cold or restarted node then costs no request a second
// round trip, and once warm only the SHA-1 travels. A NOSCRIPT reply is
// answered by resending the call as EVAL. A refund (redisrl documents its
// exact effect) is a call of its own per admission; a lease's acquire or
// return is a call of the lease script.
//
// A rule with "delay" shapes in the script: its call carries the max delay
// (redisrl Request.MaxDelay; none once the rule holds delay.max_held
// requests on this VM, when it decides as a meter), the script takes the
// request's slot in the key's state on Redis — so every proxy's requests of
// one key queue behind each other — and the reply's delay (checked to be
// within the max delay: anything else fails the decision, and
// failure_mode decides) holds the request (hold.go), counted from the
// reply's arrival: released at most half a round trip after its slot on
// the Redis clock, never before. Such a call decides one request: it is not
// coalesced. The delays of N coalesced requests are N numbers, each queued
// behind the one before it (the bucket's residues make them uneven), which
// a one-reply batch cannot carry without the guest redoing the
// algorithm; a shaped key is throttled to its rate, so coalescing would
// save little where it matters. A held request whose client leaves gives
// nothing back: its slot passes unused (the script cannot tell whether
// its admission is still the key's latest without the state it replaced,
// and giving its cost back at the end of the queue would release two
// requests at one instant there). A refund (another rule denied the
// request) gives the cost back at the slot, as redisrl documents. The
// local fallback of failure_mode "local" decides without a queue.
//
// max_held counts the requests held: those whose shaped decision is in
// flight are not, so a VM can hold up to the number of its concurrent
// calls beyond it.
//
// A rule with "cost" reserves in the script: its call's cost is the
// request's reservation (redisrl Request.Cost; a refund gives that much
// back). Requests of a fixed cost are coalesced by (rule, key) as any
// other (one call decides N of that cost); a cost from a header or a query
// parameter varies per request, so such a rule's decisions are calls of
// their own. With cost.response, the stream's end settles a remote
// admission with a call of the script's settle op (redisrl
// Request.Settle, delta = actual − reserved: a charge into debt or a
// refund up to a full bucket), fire and forget: counted in
// sluice.redis.settlements, and in sluice.redis.settlement_failures when
// refused, failed (an error reply, out of the script's range) or
// unanswered; the reservation then stands. A request admitted by
// failure_mode "local" settles on the local fallback, one let through by
// "open" settles nothing (nothing was reserved).
//
// A decision fails on a nonzero callback status (proxywasm.RedisStatus:
// network error, timeout), an error reply other than NOSCRIPT (MOVED that
// outlived the host's redirects, CLUSTERDOWN, …), a reply of the wrong
// shape, a call the host refused, proxy_redis_init failing (retried at
// most once a second), or the engine's guard (redis.timeout_ms plus a
// margin); failure_mode decides it, the local fallback with the limit
// divided by redis.instances.

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
	MetricRedisSettlements    = "sluice.redis.settlements"     // token-budget settlements sent (cost.response)
	MetricRedisSettleFailures = "sluice.redis.settlement_failures"
)

// noScriptEvalPeriod is how long calls of an algorithm go out as EVAL after
// a NOSCRIPT reply (1 s).
const noScriptEvalPeriod = 1_000_000_000

// Minimum time between proxy_redis_init retries after a failed init.
const redisInitRetry = 1_000_000_000

// leaseScript is the index of the lease script in scriptSeen/evalUntil
// (the algorithms' scripts are at their Kind).
const leaseScript = 7

// redisState is a Plugin's Redis codec.
type redisState struct {
	p        *Plugin
	e        *remote
	rh       RedisHost
	cfg      config.Redis
	initOK   bool
	lastInit int64
	// Scripts go out as EVAL (the source; it also caches the script on the
	// node) until this VM has seen a reply of that script, and for
	// noScriptEvalPeriod after a NOSCRIPT (a node restarted or failed
	// over), so a cold cluster costs a burst of requests no second round
	// trip; otherwise as EVALSHA (the SHA-1 only).
	scriptSeen [8]bool
	evalUntil  [8]int64
	cmd        []byte
	dec        resp.Decoder
	noscript   uint32 // metric id
}

// redisRule is the Redis side of one rule (rule.redis).
type redisRule struct {
	kind   algorithms.Kind
	params algorithms.Params
	// keys builds the rule's keys (redisrl.AppendKey's bytes), once.
	keys redisrl.KeyTemplate
}

// redisWait is the Redis side of a paused request (remoteWait.x).
type redisWait struct {
	rules []redisDecision // by rule index
}

// redisDecision is one rule's script call in a request.
type redisDecision struct {
	req  redisrl.Request
	key  []byte
	res  redisrl.Result // the script's reply (what a refund undoes)
	eval bool           // answered to a call sent as EVAL
}

// redisRefund is a refund call's request (remoteCall.x): the reply it
// undoes, copied, as the wait goes back to its pool before the reply.
type redisRefund struct {
	req    redisrl.Request
	key    []byte
	refund redisrl.Result
}

// newRedisState returns the Redis codec of p and its engine.
func newRedisState(p *Plugin, cfg *config.Config, rules []*rule) (*redisState, *remote, error) {
	rh, ok := p.host.(RedisHost)
	if !ok {
		return nil, nil, errors.New("backend \"redis\": the host has no Redis extension")
	}
	if cfg.Redis == nil {
		return nil, nil, errors.New("redis: required by rules with backend \"redis\"")
	}
	rs := &redisState{p: p, rh: rh, cfg: *cfg.Redis, cmd: make([]byte, 0, 512)}
	for _, r := range rules {
		if r.cfg.Backend == config.BackendRedis {
			lim := r.cfg.Limiter
			r.redis = &redisRule{kind: lim.Kind(), params: lim.Params(), keys: redisrl.NewKeyTemplate(lim.Kind(), r.id)}
		}
	}
	e, err := newRemote(p, rs, rh, rules, remoteSpec{
		name: "redis", backend: config.BackendRedis, timeoutMS: cfg.Redis.TimeoutMS, instances: cfg.Redis.Instances,
		leaseKeyMax: redisrl.MaxLeaseKeyLen,
		names: remoteNames{
			calls: MetricRedisCalls, failures: MetricRedisFailures, timeouts: MetricRedisTimeouts,
			failOpen: MetricRedisFailOpen, failClosed: MetricRedisFailClosed, failLocal: MetricRedisFailLocal,
			refunds: MetricRedisRefunds, refundFailures: MetricRedisRefundFailures,
			leased: MetricRedisLeased, returned: MetricRedisReturned,
			settlements: MetricRedisSettlements, settleFailures: MetricRedisSettleFailures,
		},
		extra: []counterDef{{&rs.noscript, MetricRedisNoScript}},
	})
	if err != nil {
		return nil, nil, err
	}
	rs.e = e
	rs.init(p.host.Now())
	// The root context's tick period (the guard's clock) is set once its
	// scopes are configured too: Plugin.setTickPeriod.
	return rs, e, nil
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

func (rs *redisState) newWait(n int) any {
	w := &redisWait{rules: make([]redisDecision, n)}
	for i := range w.rules {
		w.rules[i].key = make([]byte, 0, redisrl.MaxLeaseKeyLen)
	}
	return w
}

// prepare implements remoteCodec: the rule's Redis key (the lease key for
// a lease rule) and its script call; decisions are coalesced by key.
func (rs *redisState) prepare(w *remoteWait, i int, r *rule, lease bool) ([]byte, route) {
	d := &w.x.(*redisWait).rules[i]
	rr := r.redis
	if r.conc != nil {
		return rs.prepareConcurrency(d, r) // concurrency_remote.go
	}
	if lease {
		d.key = redisrl.AppendLeaseKey(d.key[:0], rr.kind, r.id, unsafeString(r.key))
		return d.key, routeKey
	}
	d.key = rr.keys.Append(d.key[:0], unsafeString(r.key))
	d.req = redisrl.Request{Kind: rr.kind, Params: rr.params, Key: d.key, Cost: r.units}
	d.res, d.eval = redisrl.Result{}, false
	if r.plan != nil {
		d.req.Params = r.plan.Params // plans_remote.go: a call of its own
		return d.key, routeOwn
	}
	if md := r.delay.maxDelay(); md > 0 {
		// A shaped decision is a call of its own: the script takes one
		// slot per call (see the top of this file).
		d.req.MaxDelay = md
		return d.key, routeOwn
	}
	if fixedUnits(r) == 0 {
		return d.key, routeOwn // a cost that varies per request: not coalesced
	}
	return d.key, routeKey
}

// refundable implements remoteCodec: every admission is refunded by a
// call of its script.
func (rs *redisState) refundable(*remoteWait, int) refundKind { return refundSend }

// script is the index of c's script in scriptSeen/evalUntil.
func (rs *redisState) script(c *remoteCall) int {
	switch {
	case c.lr != nil:
		return leaseScript
	case c.kind == callRefund:
		return int(c.x.(*redisRefund).req.Kind & 7)
	case c.kind == callSettle, c.kind == callConc:
		return int(rs.p.rules[c.rule].redis.kind & 7)
	}
	return int(rs.p.rules[c.slots[0].i].redis.kind & 7)
}

// send implements remoteCodec: EVALSHA, or EVAL (c.alt) until the script
// was seen and after a NOSCRIPT.
func (rs *redisState) send(c *remoteCall, now int64) (uint32, string) {
	if c.kind == callRefund && c.x == nil {
		sl := c.slots[0]
		d := &sl.w.x.(*redisWait).rules[sl.i]
		rf := &redisRefund{key: append([]byte(nil), d.key...), req: d.req, refund: d.res}
		rf.req.Key, rf.req.Refund = rf.key, &rf.refund
		c.x = rf
		c.alt = d.eval // the node has the script if EVAL was needed
	}
	if !rs.initOK && (now-rs.lastInit < redisInitRetry || !rs.init(now)) {
		return 0, "proxy_redis_init failed"
	}
	if k := rs.script(c); !c.alt && (!rs.scriptSeen[k] || now < rs.evalUntil[k]) {
		c.alt = true
	}
	if rs.isConcurrency(c) {
		return rs.sendConcurrency(c) // concurrency_remote.go
	}
	var req *redisrl.Request
	var batch redisrl.Request
	switch {
	case c.kind == callSettle && c.giveBack:
		req = rs.giveBackRequest(c, &batch) // count_window.go
	case c.kind == callSettle:
		rr := rs.p.rules[c.rule].redis
		batch = redisrl.Request{Kind: rr.kind, Params: rr.params, Key: c.key, Settle: c.delta}
		req = &batch
	case c.lr != nil:
		if c.alt {
			rs.cmd = c.lr.AppendEval(rs.cmd[:0])
		} else {
			rs.cmd = c.lr.AppendEvalSHA(rs.cmd[:0])
		}
	case c.kind == callRefund:
		req = &c.x.(*redisRefund).req
	case c.q != nil:
		rr := rs.p.rules[c.q.rule].redis
		batch = redisrl.Request{Kind: rr.kind, Params: rr.params, Key: c.q.key, Cost: fixedUnits(rs.p.rules[c.q.rule]), N: int64(len(c.slots))}
		req = &batch
	default:
		sl := c.slots[0]
		req = &sl.w.x.(*redisWait).rules[sl.i].req
	}
	if req != nil {
		if c.alt {
			rs.cmd = req.AppendEval(rs.cmd[:0])
		} else {
			rs.cmd = req.AppendEvalSHA(rs.cmd[:0])
		}
	}
	token, st := rs.rh.RedisCall(rs.cfg.Cluster, rs.cmd)
	if st != abi.StatusOK {
		return 0, "proxy_redis_call: " + st.String()
	}
	return token, ""
}

// reply implements remoteCodec: the script's reply (a coalesced call's
// for each of its requests in order); NOSCRIPT resends the call as EVAL.
func (rs *redisState) reply(c *remoteCall, size int, now int64) outcome {
	if rs.isConcurrency(c) {
		return rs.concurrencyReply(c, size, now) // concurrency_remote.go
	}
	var res redisrl.Result
	var b redisrl.Batch
	var lres redisrl.LeaseResult
	var err error
	buf, st := rs.p.host.GetBuffer(abi.BufferRedisCallResponse, 0, size)
	if st != abi.StatusOK && size > 0 {
		err = errors.New("reading the redis reply: " + st.String())
	} else {
		switch {
		case c.lr != nil:
			var v resp.Value
			if v, err = rs.dec.Parse(buf); err == nil {
				lres, err = redisrl.ParseLeaseReply(v, c.lr.N)
			}
		case c.q != nil:
			b, err = redisrl.ParseBatchReplyBytes(&rs.dec, buf, int64(len(c.slots)))
		case c.kind == callDecide && c.slots[0].w != nil:
			// The reply to the call sent: with a delay when it shapes
			// (one within its max delay, or an error).
			res, err = redisrl.ParseReplyBytesFor(&rs.dec, buf, &c.slots[0].w.x.(*redisWait).rules[c.slots[0].i].req)
		default:
			res, err = redisrl.ParseReplyBytes(&rs.dec, buf)
		}
	}
	k := rs.script(c)
	if redisrl.IsNoScript(err) && !c.alt {
		rs.p.host.IncrementMetric(rs.noscript, 1)
		rs.evalUntil[k] = now + noScriptEvalPeriod
		c.alt = true
		return outcome{retry: true}
	}
	if err != nil {
		return outcome{why: err.Error()}
	}
	switch c.kind {
	case callAcquire:
		rs.scriptSeen[leaseScript] = true
		return outcome{lease: lres}
	case callSettle:
		rs.scriptSeen[k] = true
	case callDecide:
		rs.scriptSeen[k] = true
		for n, sl := range c.slots {
			if sl.w == nil {
				continue // its wait was given up
			}
			d := &sl.w.x.(*redisWait).rules[sl.i]
			r := res
			if c.q != nil {
				r = b.At(int64(n), d.req.Cost)
			}
			d.res, d.eval = r, c.alt
			rs.e.decided(sl, r.Decision)
		}
	}
	return outcome{}
}

// failure implements remoteCodec: a nonzero callback status.
func (rs *redisState) failure(_ *remoteCall, status uint32) (string, bool) {
	return "redis call status " + strconv.FormatUint(uint64(status), 10), abi.RedisStatus(status) == abi.RedisStatusTimeout
}

// cancel implements remoteCodec: a command sent cannot be unsent.
func (rs *redisState) cancel(uint32) {}

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
		if p.redis == nil || p.remote.calls[token] == nil {
			continue
		}
		p.onRedisCallResponse(token, status, size)
		return
	}
}

// onRedisCallResponse hands the reply (or failure) of token to p's engine,
// recovering a panic (a function of its own: a defer in the caller's loop
// would be allocated on every reply).
func (p *Plugin) onRedisCallResponse(token, status uint32, size int) {
	defer func() {
		if r := recover(); r != nil {
			p.recovered(nil, r)
		}
	}()
	if abi.RedisStatus(status) != abi.RedisStatusOK {
		p.remote.onFailure(token, status)
	} else {
		p.remote.onReply(token, size)
	}
}
