package filter

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/redisrl"
)

// Leases (rules[].lease, backend "redis"): a proxy reserves up to N
// admissions of a (rule, key) pair with one call of the lease script
// (redisrl.LeaseScript) and spends them locally.
//
// The pool. The admissions a proxy holds for a key live in one shared-data
// entry, "sluice:<plugin>:<rule>:lease:<slot>", slot = key hash mod max_keys
// (so a rule's leases take at most max_keys entries whatever the keys);
// every worker of the proxy spends from it with compare-and-swap, one
// admission per request. The entry (leaseEntrySize bytes) holds the key's
// hash, the admissions left, when they expire (host clock), the fixed
// window they belong to (the acquire's stamp), for the headers what Redis
// had left at the last grant and when the key resets, and the Redis key
// (so any worker can return what it reclaims). A key whose
// slot holds another key's live lease is decided one admission per call
// (an acquire of 1).
//
// Acquire. A request that finds the pool empty waits for an acquire of its
// (rule, key): the one this VM has in flight, or a new one (each VM has at
// most one per key, so a burst costs one call per worker). It asks for N,
// or after a pool went back unspent for what that pool served, doubling
// back towards N while acquires follow each other within leaseIdle (the
// entry keeps want, spent and acquired); the script grants at most
// ⌈available / instances⌉ of it. When the
// reply grants g, the waiters are served from g first, and what is left
// goes into the pool (merged with what other workers put there). Waiters
// still unserved take from the pool, then ask again while Redis still
// grants; a grant of 0 denies them with the script's Retry-After.
//
// Expiry and return. A pool's admissions expire when none was spent for
// leaseIdle, at the latest leaseLifetime after the acquire was sent, and
// for fixed_window at the end of the window it was granted in (measured
// from the send: the script ran later, so the window ends no earlier).
// Expired admissions are taken out of the pool with compare-and-swap — so
// exactly one worker gets them — and given back with the lease script's
// return: on the root context's tick (the slots this VM filled, see
// leaseTick), when a request finds them, and for all of them when the root
// context ends (proxy_on_done: the proxy stops, or a new configuration
// replaced this one and the old root drains). A denied request gives its
// admission back to the pool (or to Redis when the pool moved on).
//
// Bounds. Redis hands out admissions before they are spent, so the proxies
// together never admit more than the algorithm allows (fixed_window: per
// window, exactly; token_bucket: every admission was a token in the
// bucket, spent at most leaseLifetime after it was taken, so any interval
// admits at most the bucket's bound plus what pools held at its start).
// The cost is under-admission: what sits unspent in pools, at most
// instances × N, until it is spent or returned (a killed proxy's come back
// as an unused quota would: at the window's end, or by refill).

// A pool expires when no admission was spent from it for leaseIdle (an
// idle proxy gives its lease back promptly), and at the latest
// leaseLifetime after its acquire was sent (a fixed window's also at the
// window's end); then what it holds is returned.
const (
	leaseIdle     = int64(time.Second)
	leaseLifetime = int64(30 * time.Second)
)

// leaseEntrySize is the size of a pool entry's header: hash, tokens,
// expiry, stamp, remaining, reset, touched, want, spent, acquired
// (little-endian 64-bit each); the Redis key follows.
const leaseEntrySize = 80

// Lease metric names (counters).
const (
	MetricRedisLeased   = "sluice.redis.leased"   // admissions granted to this proxy's leases
	MetricRedisReturned = "sluice.redis.returned" // unspent admissions sent back to Redis
)

// leaseRule is the lease side of a Redis rule with "lease".
type leaseRule struct {
	kind   algorithms.Kind
	params algorithms.Params
	limit  int64 // the Limit of a decision (burst for token_bucket)
	n      int64
	inst   int64
	prefix string
	slots  uint64
	key    []byte                 // shared-data key scratch
	known  map[uint64]struct{}    // slots this VM filled (checked on tick, returned at the end)
	fetch  map[uint64]*leaseFetch // acquires in flight by key hash
	leased uint32                 // metric ids
	ret    uint32
}

// leaseEntry is a decoded pool entry.
type leaseEntry struct {
	hash                                    uint64
	tokens, expiry, stamp, remaining, reset int64
	touched                                 int64 // last spend or deposit (host clock)
	// The size of the next acquire (0: the rule's lease): halved to what
	// was spent when a pool goes back unused, doubled (up to the lease)
	// when acquires follow each other within leaseIdle. spent counts the
	// admissions of the current pool, acquired is the last grant's time.
	want, spent, acquired int64
	key                   []byte // the Redis key
}

func (e *leaseEntry) fields() [9]*int64 {
	return [9]*int64{&e.tokens, &e.expiry, &e.stamp, &e.remaining, &e.reset, &e.touched, &e.want, &e.spent, &e.acquired}
}

// expired reports whether the pool's admissions may no longer be spent.
func (e *leaseEntry) expired(now int64) bool {
	return now >= e.expiry || now >= e.touched+leaseIdle
}

func (e *leaseEntry) decode(b []byte) bool {
	if len(b) < leaseEntrySize || len(b) > leaseEntrySize+redisrl.MaxLeaseKeyLen {
		*e = leaseEntry{}
		return len(b) == 0
	}
	e.key = append(e.key[:0], b[leaseEntrySize:]...)
	e.hash = binary.LittleEndian.Uint64(b)
	for i, p := range e.fields() {
		*p = int64(binary.LittleEndian.Uint64(b[8+8*i:]))
	}
	if e.tokens < 0 {
		e.tokens = 0
	}
	return true
}

func (e *leaseEntry) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b[:0], e.hash)
	for _, p := range e.fields() {
		b = binary.LittleEndian.AppendUint64(b, uint64(*p))
	}
	return append(b, e.key...)
}

// leaseFetch is one acquire in flight and the requests waiting for it.
type leaseFetch struct {
	rule    int
	hash    uint64
	pooled  bool // the grant may go into the pool (false: the slot holds another key)
	sent    int64
	key     []byte
	call    redisCall
	waiters []leaseWaiter
}

type leaseWaiter struct {
	w  *redisWait
	id uint32
	c  *redisCall
}

func (x *leaseWaiter) live() bool {
	return x.c.w == x.w && x.w.id == x.id && x.w.s != nil && !x.c.done
}

func newLeaseRule(p *Plugin, r *rule, instances int) (*leaseRule, error) {
	lim := r.cfg.Limiter
	lr := &leaseRule{
		kind:   lim.Kind(),
		params: lim.Params(),
		limit:  r.cfg.Limit,
		n:      r.cfg.Lease,
		inst:   int64(max(instances, 1)),
		prefix: "sluice:" + p.name + ":" + r.id + ":lease:",
		slots:  uint64(max(r.cfg.MaxKeys, 1)),
		known:  make(map[uint64]struct{}),
		fetch:  make(map[uint64]*leaseFetch),
	}
	if lr.kind == algorithms.TokenBucket {
		lr.limit = r.cfg.Burst
	}
	lr.key = make([]byte, 0, len(lr.prefix)+20)
	for _, m := range []struct {
		id   *uint32
		name string
	}{{&lr.leased, MetricRedisLeased}, {&lr.ret, MetricRedisReturned}} {
		id, st := p.host.DefineMetric(abi.MetricCounter, m.name)
		if st != abi.StatusOK {
			return nil, errString("defining metric " + m.name + ": " + st.String())
		}
		*m.id = id
	}
	return lr, nil
}

type errString string

func (e errString) Error() string { return string(e) }

func (lr *leaseRule) slotKey(slot uint64) []byte {
	lr.key = strconv.AppendUint(append(lr.key[:0], lr.prefix...), slot, 10)
	return lr.key
}

// read returns the pool entry of slot and its CAS token (createCAS when it
// does not exist). ok is false when shared data fails.
func (rs *redisState) leaseRead(lr *leaseRule, slot uint64, e *leaseEntry) (cas uint32, ok bool) {
	v, cas, st := rs.p.host.GetSharedData(lr.slotKey(slot))
	switch st {
	case abi.StatusOK:
		if !e.decode(v) {
			*e = leaseEntry{} // unreadable: overwritten
		}
		return cas, true
	case abi.StatusNotFound:
		*e = leaseEntry{}
		return createCAS, true
	}
	return 0, false
}

func (rs *redisState) leaseWrite(lr *leaseRule, slot uint64, e *leaseEntry, cas uint32) abi.Status {
	var buf [leaseEntrySize + redisrl.MaxLeaseKeyLen]byte
	return rs.p.host.SetSharedData(lr.slotKey(slot), e.encode(buf[:0]), cas)
}

// leaseTake spends one admission of the pool of (r, hash) into c. It also
// returns admissions it finds expired in the slot. pooled is false when
// the slot holds another key's live lease; want is the size the next
// acquire of this key asks for.
func (rs *redisState) leaseTake(lr *leaseRule, hash uint64, c *redisCall, now int64) (taken, pooled bool, want int64) {
	slot := hash % lr.slots
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := rs.leaseRead(lr, slot, &e)
		if !ok {
			return false, false, 1
		}
		if e.tokens > 0 && e.expired(now) {
			rs.leaseReclaim(lr, slot, now, false)
			continue
		}
		if e.hash == hash {
			want = e.want
		}
		if e.tokens == 0 {
			return false, true, want
		}
		if e.hash != hash {
			return false, false, 1
		}
		e.tokens--
		e.spent++
		e.touched = now
		switch rs.leaseWrite(lr, slot, &e, cas) {
		case abi.StatusOK:
			c.done, c.leased, c.stamp = true, true, e.stamp
			c.res = redisrl.Result{Decision: leaseDecision(lr, &e, now)}
			return true, true, want
		case abi.StatusCASMismatch:
			continue
		default:
			return false, false, 1
		}
	}
	return false, false, 1
}

// leaseDecision is the decision of an admission spent from pool e: Remaining
// what the pool still holds plus what Redis had left at its last grant
// (other proxies' pools and spending since are not seen), ResetAfter until
// the key resets as of that grant.
func leaseDecision(lr *leaseRule, e *leaseEntry, now int64) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Limit: lr.limit, Remaining: min(e.tokens+e.remaining, lr.limit),
		ResetAfter: time.Duration(max(e.reset-now, 0))}
}

// leaseReclaim takes the admissions of slot out of the pool (compare-and-
// swap: one worker gets them) and gives them back to Redis: expired ones,
// or all of them when all is set.
func (rs *redisState) leaseReclaim(lr *leaseRule, slot uint64, now int64, all bool) {
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := rs.leaseRead(lr, slot, &e)
		if !ok || e.tokens == 0 || (!all && !e.expired(now)) {
			if ok && e.tokens == 0 {
				delete(lr.known, slot)
			}
			return
		}
		n := e.tokens
		e.tokens = 0
		if !all {
			e.want, e.spent = max(e.spent, 1), 0 // what the unused pool served
		}
		switch rs.leaseWrite(lr, slot, &e, cas) {
		case abi.StatusOK:
			delete(lr.known, slot)
			rs.leaseReturn(lr, e.key, n, e.stamp, now)
			return
		case abi.StatusCASMismatch:
			continue
		default:
			return
		}
	}
}

// leaseReturn sends the lease script's return of n admissions of the
// Redis key (fire and forget).
func (rs *redisState) leaseReturn(lr *leaseRule, key []byte, n, stamp, now int64) {
	if n <= 0 || len(key) == 0 {
		return
	}
	k := append([]byte(nil), key...)
	c := &redisCall{rule: -1, key: k, leaseOf: lr, lr: &redisrl.LeaseRequest{Kind: lr.kind, Params: lr.params,
		Key: k, N: n, Instances: lr.inst, Return: true, Stamp: stamp}}
	rs.send(c, now)
	if !c.failed {
		rs.p.host.IncrementMetric(lr.ret, n)
	}
}

// leaseDispatch decides c (rule i, in w) from its pool, or makes it wait
// for an acquire. It counts the wait in w.missing.
func (rs *redisState) leaseDispatch(r *rule, i int, c *redisCall, w *redisWait, now int64) {
	lr := r.redis.lease
	taken, pooled, want := rs.leaseTake(lr, r.hash, c, now)
	if taken {
		return
	}
	w.missing++
	if f := lr.fetch[r.hash]; f != nil {
		f.waiters = append(f.waiters, leaseWaiter{w: w, id: w.id, c: c})
		return
	}
	key := append([]byte(nil), c.key...)
	rs.leaseAcquire(lr, i, r.hash, key, pooled, want, []leaseWaiter{{w: w, id: w.id, c: c}}, now, false)
}

// leaseAcquire sends an acquire for the key of hash with the given waiters.
// A call refused at once fails them (completing their waits when inRoot).
func (rs *redisState) leaseAcquire(lr *leaseRule, i int, hash uint64, key []byte, pooled bool, want int64, waiters []leaseWaiter, now int64, inRoot bool) {
	n := lr.n
	switch {
	case !pooled:
		n = 1
	case want > 0 && want < n:
		n = want
	}
	f := &leaseFetch{rule: i, hash: hash, key: key, pooled: pooled, sent: now, waiters: waiters}
	f.call = redisCall{rule: i, fetch: f, leaseOf: lr, key: key,
		lr: &redisrl.LeaseRequest{Kind: lr.kind, Params: lr.params, Key: key, N: n, Instances: lr.inst}}
	lr.fetch[hash] = f
	rs.send(&f.call, now)
	if f.call.failed {
		delete(lr.fetch, hash)
		rs.leaseFail(f, f.call.why, false, now, inRoot)
	}
}

// leaseFail fails the live waiters of f (failure_mode decides them).
func (rs *redisState) leaseFail(f *leaseFetch, why string, timeout bool, now int64, inRoot bool) {
	for k := range f.waiters {
		x := &f.waiters[k]
		if !x.live() {
			continue
		}
		rs.fail(x.c, why, timeout)
		if inRoot && x.w.missing == 0 {
			rs.complete(x.w, now)
		}
	}
}

// onLeaseReply handles the reply of an acquire or a return (root context).
func (rs *redisState) onLeaseReply(c *redisCall, res redisrl.LeaseResult, err error, timeout bool, now int64) {
	lr := c.leaseOf
	if c.fetch == nil { // a return (counted in returned when sent)
		if err != nil {
			rs.p.host.IncrementMetric(rs.m.refundFailures, 1)
		}
		return
	}
	f := c.fetch
	if lr.fetch[f.hash] == f {
		delete(lr.fetch, f.hash)
	}
	if err != nil {
		rs.leaseFail(f, err.Error(), timeout, now, true)
		return
	}
	rs.scriptSeen[7] = true
	g := res.Granted
	rs.p.host.IncrementMetric(lr.leased, g)
	expiry := f.sent + leaseLifetime
	if res.Valid > 0 {
		expiry = min(expiry, f.sent+int64(res.Valid))
	}
	resetAt := now + int64(res.ResetAfter)
	served := g
	var rest []leaseWaiter
	for k := range f.waiters {
		x := &f.waiters[k]
		if !x.live() {
			continue
		}
		if g > 0 {
			g--
			d := res.Decision
			d.Allowed, d.RetryAfter, d.Remaining = true, 0, g+res.Remaining
			rs.leaseServe(x, d, res.Stamp, now)
			continue
		}
		rest = append(rest, *x)
	}
	slot := f.hash % lr.slots
	served -= g
	if g > 0 || f.pooled {
		left := g
		if f.pooled {
			left = rs.leaseDeposit(lr, slot, f.hash, f.key, g, served, res, expiry, resetAt, now)
		}
		if left > 0 {
			rs.leaseReturn(lr, f.key, left, res.Stamp, now)
		}
	}
	if len(rest) == 0 {
		return
	}
	// Waiters beyond the grant: the pool (other workers' grants), then ask
	// again while Redis grants; a grant of 0 denies them.
	var still []leaseWaiter
	for k := range rest {
		x := &rest[k]
		if taken, _, _ := rs.leaseTake(lr, f.hash, x.c, now); taken {
			x.w.missing--
			if x.w.missing == 0 {
				rs.complete(x.w, now)
			}
			continue
		}
		still = append(still, *x)
	}
	if len(still) == 0 {
		return
	}
	if res.Granted > 0 {
		if g2 := lr.fetch[f.hash]; g2 != nil {
			g2.waiters = append(g2.waiters, still...)
			return
		}
		rs.leaseAcquire(lr, f.rule, f.hash, f.key, f.pooled, f.call.lr.N, still, now, true)
		return
	}
	for k := range still {
		d := res.Decision
		d.Allowed, d.Remaining = false, 0
		if d.RetryAfter <= 0 {
			d.RetryAfter = time.Microsecond
		}
		rs.leaseServe(&still[k], d, res.Stamp, now)
	}
}

// leaseServe gives waiter x decision d (root context).
func (rs *redisState) leaseServe(x *leaseWaiter, d algorithms.Decision, stamp, now int64) {
	x.c.done, x.c.leased, x.c.stamp = true, d.Allowed, stamp
	x.c.res = redisrl.Result{Decision: d}
	x.w.missing--
	if x.w.missing == 0 {
		rs.complete(x.w, now)
	}
}

// leaseDeposit puts g admissions of a grant into the pool of slot and
// returns what it could not (the slot holds another key's live lease, or
// shared data failed). Expired or stale admissions it replaces are returned.
func (rs *redisState) leaseDeposit(lr *leaseRule, slot, hash uint64, key []byte, g, served int64, res redisrl.LeaseResult, expiry, resetAt, now int64) int64 {
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := rs.leaseRead(lr, slot, &e)
		if !ok {
			return g
		}
		live := e.tokens > 0 && !e.expired(now)
		var old leaseEntry
		switch {
		case live && e.hash != hash:
			return g
		case live && e.stamp == res.Stamp:
			e.tokens += g
			e.expiry = min(e.expiry, expiry)
		default:
			old = e
			e = leaseEntry{hash: hash, tokens: g, expiry: expiry, stamp: res.Stamp, key: key}
			if old.hash == hash {
				e.want, e.acquired = old.want, old.acquired
			}
		}
		if e.want > 0 && e.acquired > 0 && now-e.acquired < leaseIdle {
			e.want = min(2*e.want, lr.n) // busy again: grow back
		}
		e.remaining, e.reset, e.touched = res.Remaining, resetAt, now
		e.spent += served
		e.acquired = now
		switch rs.leaseWrite(lr, slot, &e, cas) {
		case abi.StatusOK:
			lr.known[slot] = struct{}{}
			if old.tokens > 0 {
				rs.leaseReturn(lr, old.key, old.tokens, old.stamp, now)
			}
			return 0
		case abi.StatusCASMismatch:
			continue
		default:
			return g
		}
	}
	return g
}

// leaseRefund gives back the admission a denied request took (rule i of
// w): to the pool while it still holds that grant's admissions, else to
// Redis.
func (rs *redisState) leaseRefund(lr *leaseRule, c *redisCall, hash uint64, now int64) {
	slot := hash % lr.slots
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := rs.leaseRead(lr, slot, &e)
		if !ok || e.hash != hash || e.stamp != c.stamp || e.expired(now) {
			break
		}
		e.tokens++
		st := rs.leaseWrite(lr, slot, &e, cas)
		if st == abi.StatusOK {
			lr.known[slot] = struct{}{}
			return
		}
		if st != abi.StatusCASMismatch {
			break
		}
	}
	rs.leaseReturn(lr, c.key, 1, c.stamp, now)
}

// The tick looks at the pools this VM filled at most every leaseScanPeriod
// and at most leaseScanMax of them per rule (in map order, which Go
// randomises, so every pool is seen soon); a request that finds an expired
// pool returns it too.
const (
	leaseScanPeriod = int64(100 * time.Millisecond)
	leaseScanMax    = 256
)

// leaseTick returns the expired admissions of the pools this VM filled
// (root context's tick), or all of them when all is set (the root ends).
func (rs *redisState) leaseTick(now int64, all bool) {
	if !all && now < rs.leaseScan {
		return
	}
	rs.leaseScan = now + leaseScanPeriod
	for _, r := range rs.p.rules {
		if r.redis == nil || r.redis.lease == nil {
			continue
		}
		lr := r.redis.lease
		n := 0
		for slot := range lr.known {
			if n++; !all && n > leaseScanMax {
				break
			}
			rs.leaseReclaim(lr, slot, now, all)
		}
	}
}
