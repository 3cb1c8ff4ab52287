package filter

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/redisrl"
)

// Leases (rules[].lease, backend "redis" or "rls"): a proxy reserves up to
// N admissions of a (rule, key) pair with one call of the lease script
// (redisrl.LeaseScript: sent to Redis by the Redis backend, run by the
// rate-limit service for an acquire or return descriptor of the rls
// backend) and spends them locally. The pools below are the same for both
// backends; the remote-call engine (remote.go) sends the calls, which the
// backend's codec encodes, and hands their replies back (onAcquire).
//
// The pool. The admissions a proxy holds for a key live in one shared-data
// entry, "sluice:<plugin>:<rule>:lease:<slot>", slot = key hash mod max_keys
// (so a rule's leases take at most max_keys entries whatever the keys);
// every worker of the proxy spends from it with compare-and-swap, one
// admission per request. The entry (leaseEntrySize bytes) holds the key's
// hash, the admissions left, when they expire (host clock), the fixed
// window they belong to (the acquire's stamp), for the headers what Redis
// had left at the last grant and when the key resets, and the key a return
// names (the Redis lease key; for rls the rule's key as sent, which a
// pool holds up to rlsLeaseKeyMax bytes — a longer key is decided like a
// colliding one), so any worker can return what it reclaims. A key whose
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

// An acquire that got nothing holds the key's denial in its pool entry for
// the script's Retry-After, at most leaseHold: until then the proxy's
// requests for the key are denied from shared data, without a call. A key
// far over its limit then costs at most one call per leaseHold per proxy
// (fixed_window) or one per refilled admission (token_bucket: the wait is
// until the next token, exactly), instead of one per request; what other
// proxies give back meanwhile waits at most leaseHold for this one (they
// may take it at once).
const leaseHold = int64(time.Second)

// leaseEntrySize is the size of a pool entry's header: hash, tokens,
// expiry, stamp, remaining, reset, touched, want, spent, acquired, until,
// retry (little-endian 64-bit each); the key a return names follows. The
// entries' key prefix names the layout (":lease2:"; 80-byte entries of an
// earlier module under the same vm_id are not read as these).
const leaseEntrySize = 96

// The longest key a pool entry holds: the Redis lease key (bounded by
// redisrl), or for rls the rule's key as sent, up to rlsLeaseKeyMax bytes
// (a longer one is decided one admission per call, as a key whose slot
// holds another key's pool).
const (
	rlsLeaseKeyMax = 512
	leaseKeyMax    = max(redisrl.MaxLeaseKeyLen, rlsLeaseKeyMax)
)

// Lease metric names (counters), per backend.
const (
	MetricRedisLeased   = "sluice.redis.leased"   // admissions granted to this proxy's leases
	MetricRedisReturned = "sluice.redis.returned" // unspent admissions sent back to Redis
	MetricRLSLeased     = "sluice.rls.leased"     // admissions the service granted to this proxy's leases
	MetricRLSReturned   = "sluice.rls.returned"   // unspent admissions sent back through the service
)

// leases are the lease pools of a Plugin's remote backend. They call
// nothing of the engine: the returns they decide wait in out, which the
// engine sends (remote_lease.go).
type leases struct {
	p     *Plugin
	rules []*leaseRule
	scan  int64         // next time the tick looks at the pools
	out   []leaseReturn // returns decided, not yet sent
}

// leaseReturn is a return of unspent admissions of rule lr, to be sent.
type leaseReturn struct {
	lr *leaseRule
	q  *redisrl.LeaseRequest
}

// leaseRule is the lease side of a remote rule with "lease".
type leaseRule struct {
	kind   algorithms.Kind
	params algorithms.Params
	limit  int64 // the Limit of a decision (burst for token_bucket)
	n      int64
	inst   int64
	rule   int // the rule's index
	keyMax int // the longest key a pool holds (longer: one admission per call)
	prefix string
	slots  uint64
	key    []byte                 // shared-data key scratch
	known  map[uint64]struct{}    // slots this VM filled (checked on tick, returned at the end)
	fetch  map[uint64]*leaseFetch // the engine's acquires in flight, by key hash
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
	// A held denial (no tokens): requests for the key are denied without a
	// call until until, with Retry-After up to retry (leaseHold).
	until, retry int64
	key          []byte // what a return names
}

func (e *leaseEntry) fields() [11]*int64 {
	return [11]*int64{&e.tokens, &e.expiry, &e.stamp, &e.remaining, &e.reset, &e.touched, &e.want, &e.spent, &e.acquired, &e.until, &e.retry}
}

// expired reports whether the pool's admissions may no longer be spent.
func (e *leaseEntry) expired(now int64) bool {
	return now >= e.expiry || now >= e.touched+leaseIdle
}

func (e *leaseEntry) decode(b []byte, keyMax int) bool {
	if len(b) < leaseEntrySize || len(b) > leaseEntrySize+keyMax {
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

// newLeases returns the pools of the rules with "lease" among rules (nil
// when none has one), with the metric names of the backend. keyMax is the
// longest key a pool holds.
func newLeases(p *Plugin, rules []*rule, instances, keyMax int, leasedName, returnedName string) (*leases, error) {
	var ls *leases
	for i, r := range rules {
		if r.cfg.Lease <= 0 || !r.remote {
			continue
		}
		if ls == nil {
			ls = &leases{p: p}
		}
		lr, err := ls.newRule(r, i, instances, keyMax, leasedName, returnedName)
		if err != nil {
			return nil, err
		}
		ls.rules = append(ls.rules, lr)
	}
	return ls, nil
}

func (ls *leases) newRule(r *rule, i, instances, keyMax int, leasedName, returnedName string) (*leaseRule, error) {
	lim := r.cfg.Limiter
	lr := &leaseRule{
		kind:   lim.Kind(),
		params: lim.Params(),
		limit:  r.cfg.Limit,
		n:      r.cfg.Lease,
		inst:   int64(max(instances, 1)),
		rule:   i,
		keyMax: keyMax,
		prefix: "sluice:" + ls.p.name + ":" + r.id + ":lease2:",
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
	}{{&lr.leased, leasedName}, {&lr.ret, returnedName}} {
		if err := defineMetric(ls.p.host, abi.MetricCounter, m.name, m.id); err != nil {
			return nil, err
		}
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
func (ls *leases) read(lr *leaseRule, slot uint64, e *leaseEntry) (cas uint32, ok bool) {
	v, cas, st := ls.p.host.GetSharedData(lr.slotKey(slot))
	switch st {
	case abi.StatusOK:
		if !e.decode(v, lr.keyMax) {
			*e = leaseEntry{} // unreadable: overwritten
		}
		return cas, true
	case abi.StatusNotFound:
		*e = leaseEntry{}
		return createCAS, true
	}
	return 0, false
}

func (ls *leases) write(lr *leaseRule, slot uint64, e *leaseEntry, cas uint32) abi.Status {
	var buf [leaseEntrySize + leaseKeyMax]byte
	return ls.p.host.SetSharedData(lr.slotKey(slot), e.encode(buf[:0]), cas)
}

// take spends one admission of the pool of (lr, hash): taken reports it,
// with the decision and the grant's stamp — or, while the key's denial is
// held (leaseHold), taken reports that denial. It also returns admissions
// it finds expired in the slot. pooled is false when the slot holds another
// key's live lease; want is the size the next acquire of this key asks for.
func (ls *leases) take(lr *leaseRule, hash uint64, now int64) (d algorithms.Decision, stamp int64, taken, pooled bool, want int64) {
	slot := hash % lr.slots
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := ls.read(lr, slot, &e)
		if !ok {
			return d, 0, false, false, 1
		}
		if e.tokens > 0 && e.expired(now) {
			ls.reclaim(lr, slot, now, false)
			continue
		}
		if e.hash == hash {
			want = e.want
		}
		if e.tokens == 0 {
			if e.hash == hash && now < e.until {
				return leaseHeld(lr, &e, now), e.stamp, true, true, want
			}
			return d, 0, false, true, want
		}
		if e.hash != hash {
			return d, 0, false, false, 1
		}
		e.tokens--
		e.spent++
		e.touched = now
		switch ls.write(lr, slot, &e, cas) {
		case abi.StatusOK:
			return leaseDecision(lr, &e, now), e.stamp, true, true, want
		case abi.StatusCASMismatch:
			continue
		default:
			return d, 0, false, false, 1
		}
	}
	return d, 0, false, false, 1
}

// leaseDecision is the decision of an admission spent from pool e: Remaining
// what the pool still holds plus what the global state had left at its
// last grant (other proxies' pools and spending since are not seen),
// ResetAfter until the key resets as of that grant.
func leaseDecision(lr *leaseRule, e *leaseEntry, now int64) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Limit: lr.limit, Remaining: min(e.tokens+e.remaining, lr.limit),
		ResetAfter: time.Duration(max(e.reset-now, 0))}
}

// leaseHeld is the denial held in pool e: Retry-After the script's wait
// (as of the acquire that got nothing), ResetAfter as of that reply.
func leaseHeld(lr *leaseRule, e *leaseEntry, now int64) algorithms.Decision {
	return algorithms.Decision{Limit: lr.limit, ResetAfter: time.Duration(max(e.reset-now, 0)),
		RetryAfter: time.Duration(max(e.retry-now, int64(time.Microsecond)))}
}

// hold records in the key's pool entry that an acquire got nothing (res):
// its requests are denied from shared data until min(the wait, leaseHold)
// has passed. Nothing is held over a live pool (another worker's grant is
// there to spend) or when the slot holds another key's live pool.
func (ls *leases) hold(lr *leaseRule, slot, hash uint64, key []byte, res redisrl.LeaseResult, now int64) {
	wait := max(int64(res.RetryAfter), int64(time.Microsecond))
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := ls.read(lr, slot, &e)
		if !ok || e.tokens > 0 {
			return
		}
		old := e
		e = leaseEntry{hash: hash, stamp: res.Stamp, key: key, reset: now + int64(res.ResetAfter), touched: now,
			until: now + min(wait, leaseHold), retry: now + wait}
		if old.hash == hash {
			e.want, e.acquired = old.want, old.acquired
		}
		switch ls.write(lr, slot, &e, cas) {
		case abi.StatusCASMismatch:
			continue
		default:
			return
		}
	}
}

// reclaim takes the admissions of slot out of the pool (compare-and-swap:
// one worker gets them) and gives them back: expired ones, or all of them
// when all is set.
func (ls *leases) reclaim(lr *leaseRule, slot uint64, now int64, all bool) {
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := ls.read(lr, slot, &e)
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
		switch ls.write(lr, slot, &e, cas) {
		case abi.StatusOK:
			delete(lr.known, slot)
			ls.giveBack(lr, e.key, n, e.stamp, now)
			return
		case abi.StatusCASMismatch:
			continue
		default:
			return
		}
	}
}

// giveBack queues the lease script's return of n admissions of key (fire
// and forget: the engine sends it).
func (ls *leases) giveBack(lr *leaseRule, key []byte, n, stamp, now int64) {
	if n <= 0 || len(key) == 0 {
		return
	}
	k := append([]byte(nil), key...)
	q := &redisrl.LeaseRequest{Kind: lr.kind, Params: lr.params, Key: k, N: n, Instances: lr.inst, Return: true, Stamp: stamp}
	ls.out = append(ls.out, leaseReturn{lr, q})
}

// deposit puts g admissions of a grant into the pool of slot and returns
// what it could not (the slot holds another key's live lease, or shared
// data failed). Expired or stale admissions it replaces are returned.
func (ls *leases) deposit(lr *leaseRule, slot, hash uint64, key []byte, g, served int64, res redisrl.LeaseResult, expiry, resetAt, now int64) int64 {
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := ls.read(lr, slot, &e)
		if !ok {
			return g
		}
		live := e.tokens > 0 && !e.expired(now)
		var old leaseEntry
		switch {
		case live && e.hash != hash:
			return g
		case live && (e.stamp == res.Stamp || lr.kind == algorithms.TokenBucket):
			// A token bucket's admissions belong to no window: grants of
			// different stamps (the script's clock) merge, spent by the
			// earliest expiry, instead of the older pool going back.
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
		switch ls.write(lr, slot, &e, cas) {
		case abi.StatusOK:
			lr.known[slot] = struct{}{}
			if old.tokens > 0 {
				ls.giveBack(lr, old.key, old.tokens, old.stamp, now)
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

// refund gives back the admission a denied request took from the lease of
// stamp (key as dispatch named it): to the pool while it still holds that
// grant's admissions, else through the backend.
func (ls *leases) refund(lr *leaseRule, key []byte, stamp int64, hash uint64, now int64) {
	slot := hash % lr.slots
	for i := 0; i < MaxCASRetries; i++ {
		var e leaseEntry
		cas, ok := ls.read(lr, slot, &e)
		if !ok || e.hash != hash || e.stamp != stamp || e.expired(now) {
			break
		}
		e.tokens++
		st := ls.write(lr, slot, &e, cas)
		if st == abi.StatusOK {
			lr.known[slot] = struct{}{}
			return
		}
		if st != abi.StatusCASMismatch {
			break
		}
	}
	ls.giveBack(lr, key, 1, stamp, now)
}

// The tick looks at the pools this VM filled at most every leaseScanPeriod
// and at most leaseScanMax of them per rule (in map order, which Go
// randomises, so every pool is seen soon); a request that finds an expired
// pool returns it too.
const (
	leaseScanPeriod = int64(100 * time.Millisecond)
	leaseScanMax    = 256
)

// tick returns the expired admissions of the pools this VM filled (root
// context's tick), or all of them when all is set (the root ends).
func (ls *leases) tick(now int64, all bool) {
	if ls == nil || (!all && now < ls.scan) {
		return
	}
	ls.scan = now + leaseScanPeriod
	for _, lr := range ls.rules {
		n := 0
		for slot := range lr.known {
			if n++; !all && n > leaseScanMax {
				break
			}
			ls.reclaim(lr, slot, now, all)
		}
	}
}
