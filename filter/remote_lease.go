package filter

import (
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
)

// The lease route of the remote-call engine. A remote rule with "lease" is
// decided from its pool (lease.go) when the pool has an admission for the
// key, else it waits for an acquire this route sends; the reply serves the
// waiters, and what is left goes into the pool. The route calls the pools
// (take, deposit, hold, refund, reclaim); the pools call nothing of the
// engine: the returns they decide wait in their outbox, which the route
// sends after each call into them (sendReturns).

// leaseFetch is one acquire in flight and the requests waiting for it.
type leaseFetch struct {
	rule    int
	hash    uint64
	pooled  bool // the grant may go into the pool (false: the slot holds another key)
	sent    int64
	n       int64 // admissions asked for
	key     []byte
	waiters []leaseWaiter
}

// leaseWaiter is a request waiting for an acquire: rule i of wait w, which
// belonged to stream id when it started waiting.
type leaseWaiter struct {
	w  *remoteWait
	id uint32
	i  int
}

// leaseDispatch decides rule lr (index i) of the request of w from its
// pool, or makes it wait for an acquire (counted in w's missing). key is
// what the acquire names (the Redis lease key; the rule's key for rls).
func (e *remote) leaseDispatch(lr *leaseRule, hash uint64, key []byte, w *remoteWait, i int, now int64) {
	x := leaseWaiter{w: w, id: w.id, i: i}
	d, stamp, taken, pooled, want := e.leases.take(lr, hash, now)
	e.sendReturns(now)
	if taken {
		e.leaseDecide(&x, d, stamp)
		return
	}
	w.missing++
	if f := lr.fetch[hash]; f != nil {
		f.waiters = append(f.waiters, x)
		return
	}
	if len(key) > lr.keyMax {
		pooled = false
	}
	e.acquire(lr, hash, append([]byte(nil), key...), pooled, want, []leaseWaiter{x}, now, false)
}

// acquire sends an acquire for the key of hash with the given waiters. A
// call refused at once fails them (completing their waits when inRoot).
func (e *remote) acquire(lr *leaseRule, hash uint64, key []byte, pooled bool, want int64, waiters []leaseWaiter, now int64, inRoot bool) {
	n := lr.n
	switch {
	case !pooled:
		n = 1
	case want > 0 && want < n:
		n = want
	}
	f := &leaseFetch{rule: lr.rule, hash: hash, key: key, pooled: pooled, sent: now, n: n, waiters: waiters}
	lr.fetch[hash] = f
	q := &redisrl.LeaseRequest{Kind: lr.kind, Params: lr.params, Key: key, N: n, Instances: lr.inst}
	if why, ok := e.leaseSend(lr, f, q, now); !ok {
		e.failFetch(lr, f, why, false, now, inRoot)
	}
}

// failFetch fails the live waiters of acquire f (failure_mode decides
// them), completing their waits when inRoot.
func (e *remote) failFetch(lr *leaseRule, f *leaseFetch, why string, timeout bool, now int64, inRoot bool) {
	if lr.fetch[f.hash] == f {
		delete(lr.fetch, f.hash)
	}
	for k := range f.waiters {
		x := &f.waiters[k]
		if !e.leaseLive(x) {
			continue
		}
		e.leaseFailed(x, why, timeout)
		e.leaseCountDown(x, now, inRoot)
	}
}

// leaseCountDown counts x's decision in and completes its wait when it
// was the last (and inRoot: root-context callbacks only).
func (e *remote) leaseCountDown(x *leaseWaiter, now int64, inRoot bool) {
	b := x.w
	b.missing--
	if inRoot && b.missing == 0 {
		e.complete(x.w, now)
	}
}

// onAcquire handles the reply of acquire f (root context): res, or err
// when the call failed. The grant serves f's live waiters first; what is
// left goes into the pool (or back); the waiters beyond it take from the
// pool (other workers' grants), then ask again while the global state
// grants; a grant of 0 denies them.
func (e *remote) onAcquire(lr *leaseRule, f *leaseFetch, res redisrl.LeaseResult, err error, timeout bool, now int64) {
	if err != nil {
		e.failFetch(lr, f, err.Error(), timeout, now, true)
		return
	}
	if lr.fetch[f.hash] == f {
		delete(lr.fetch, f.hash)
	}
	ls := e.leases
	g := res.Granted
	ls.p.host.IncrementMetric(lr.leased, g)
	e.seedFromGrant(lr, f.hash, res.Remaining)
	expiry := f.sent + leaseLifetime
	if res.Valid > 0 {
		expiry = min(expiry, f.sent+int64(res.Valid))
	}
	served := g
	var rest []leaseWaiter
	for k := range f.waiters {
		x := &f.waiters[k]
		if !e.leaseLive(x) {
			continue
		}
		if g > 0 {
			g--
			d := res.Decision
			d.Allowed, d.RetryAfter, d.Remaining = true, 0, g+res.Remaining
			e.leaseServe(x, d, res.Stamp, now)
			continue
		}
		rest = append(rest, *x)
	}
	slot := f.hash % lr.slots
	served -= g
	if g > 0 || f.pooled {
		left := g
		if f.pooled {
			left = ls.deposit(lr, slot, f.hash, f.key, g, served, res, expiry, now+int64(res.ResetAfter), now)
		}
		ls.giveBack(lr, f.key, left, res.Stamp, now)
	}
	var still []leaseWaiter
	for k := range rest {
		x := &rest[k]
		if d, stamp, taken, _, _ := ls.take(lr, f.hash, now); taken {
			e.leaseServe(x, d, stamp, now)
			continue
		}
		still = append(still, *x)
	}
	e.sendReturns(now)
	if len(still) > 0 {
		e.askAgain(lr, f, res, still, slot, now)
	}
}

// askAgain decides the waiters of acquire f that neither its grant nor
// the pool served: they join the next acquire while the global state
// grants; a grant of 0 holds the key's denial in the pool and denies them.
func (e *remote) askAgain(lr *leaseRule, f *leaseFetch, res redisrl.LeaseResult, still []leaseWaiter, slot uint64, now int64) {
	if res.Granted == 0 && f.pooled {
		e.leases.hold(lr, slot, f.hash, f.key, res, now)
	}
	if res.Granted > 0 {
		if g2 := lr.fetch[f.hash]; g2 != nil {
			g2.waiters = append(g2.waiters, still...)
			return
		}
		e.acquire(lr, f.hash, f.key, f.pooled, f.n, still, now, true)
		return
	}
	for k := range still {
		d := res.Decision
		d.Allowed, d.Remaining = false, 0
		if d.RetryAfter <= 0 {
			d.RetryAfter = time.Microsecond
		}
		e.leaseServe(&still[k], d, res.Stamp, now)
	}
}

// leaseServe gives waiter x decision d (root context).
func (e *remote) leaseServe(x *leaseWaiter, d algorithms.Decision, stamp, now int64) {
	e.leaseDecide(x, d, stamp)
	e.leaseCountDown(x, now, true)
}

// leaseRefund gives back the admission of rule lr a denied request took
// from its lease (lease.go refund), and sends what that returns.
func (e *remote) leaseRefund(lr *leaseRule, key []byte, stamp int64, hash uint64, now int64) {
	e.leases.refund(lr, key, stamp, hash, now)
	e.sendReturns(now)
}

// leaseTick returns the pools' expired admissions (all of them when all
// is set: the root ends).
func (e *remote) leaseTick(now int64, all bool) {
	e.leases.tick(now, all)
	e.sendReturns(now)
}

// sendReturns sends the returns the pools queued (fire and forget),
// counted in the rule's returned admissions when the host takes the call.
func (e *remote) sendReturns(now int64) {
	ls := e.leases
	if ls == nil {
		return
	}
	for k := range ls.out {
		r := ls.out[k]
		ls.out[k] = leaseReturn{}
		if _, ok := e.leaseSend(r.lr, nil, r.q, now); ok {
			ls.p.host.IncrementMetric(r.lr.ret, r.q.N)
		}
	}
	ls.out = ls.out[:0]
}

// leaseSend sends q, an acquire for f (f non-nil) or a return (fire and
// forget). It reports false with the reason when the host refused the
// call at once (a lost return counts as a refund that did not land).
func (e *remote) leaseSend(lr *leaseRule, f *leaseFetch, q *redisrl.LeaseRequest, now int64) (string, bool) {
	k := callReturn
	if f != nil {
		k = callAcquire
	}
	c := e.newCall(k)
	c.lease, c.fetch, c.lr, c.n = lr, f, q, 1
	if why := e.post(c, now); why != "" {
		if f == nil {
			e.p.host.IncrementMetric(e.m.refundFailures, 1)
		}
		e.freeCall(c)
		return why, false
	}
	return "", true
}

// leaseLive reports whether waiter x's request still waits for the
// decision of its rule.
func (e *remote) leaseLive(x *leaseWaiter) bool {
	w := x.w
	return w.id == x.id && w.s != nil && !w.res[x.i].done
}

// leaseDecide records decision d of x's rule, from a lease granted with
// stamp (a denial when !d.Allowed).
func (e *remote) leaseDecide(x *leaseWaiter, d algorithms.Decision, stamp int64) {
	res := &x.w.res[x.i]
	res.done, res.d, res.stamp = true, d, stamp
}

// leaseFailed records that x's rule could not be decided (failure_mode
// decides it).
func (e *remote) leaseFailed(x *leaseWaiter, why string, timeout bool) {
	res := &x.w.res[x.i]
	res.done, res.failed, res.why = true, true, why
	e.countFailure(timeout)
}
