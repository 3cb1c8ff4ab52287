package filter

// Counting by response on a window algorithm (config.Count on fixed_window or
// sliding_window): the request takes its unit from the window at its headers like any
// request — refused when the window has no room, so a key locked out stays out until the
// window lets it in — and a response that does not count gives the unit back to the window
// it was counted in (algorithms.Refunder): fixed_window while that window lasts (after it
// the count is forgotten anyway), sliding_window to its current or previous counter,
// exactly. A response that counts, and a stream that ends without a response, keep it.
//
//   - Local: the give-back is a compare-and-swap on the key's slot, as a decision is,
//     with the limiter the admission was decided with (its plan's); a key evicted or
//     reset meanwhile holds nothing to give back.
//   - Redis: the script's refund op (redisrl Request.Refund) with the stamp and ref of the
//     admission's reply, the parameters the admission was decided with (its plan's).
//   - rls (sluice serve): a descriptor with the rule's entries (its plan's), the key and
//     sluice.refund = "<stamp>:<ref>", the refund token the service answered the
//     admission with (x-sluice-refund); hits_addend the cost. A service that gave no
//     token (not sluice serve) cannot take it back: the unit stays counted, and the
//     give-back counts in settlement_failures.
//
// Either remote give-back is fire and forget, counted in the backend's settlements (and
// settlement_failures when refused or lost); a lost one leaves the unit counted until the
// window forgets it. The rule's settled and refunded metrics count the give-backs made.

import (
	"bytes"
	"errors"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// giveBack names a counting admission on a window algorithm, to give it back.
type giveBack struct {
	at         int64             // the admission's decision instant (local)
	plan       *config.PlanEntry // the plan it was decided under; nil: the rule's own
	token      bool              // remote: the backend named the admission (stamp, ref)
	stamp, ref int64
	cost       int64
}

// refundTokener is a remote codec that names an admission for a later give-back.
type refundTokener interface {
	refundToken(w *remoteWait, i int) (stamp, ref int64, ok bool)
}

// openGiveBack records, as the admission of rule r is billed, what giving it back needs.
func (p *Plugin) openGiveBack(it *billItem, r *rule, now int64) {
	it.giveBack = giveBack{at: now, plan: r.plan, cost: r.units}
	if !it.remote {
		return
	}
	if t, ok := p.remote.codec.(refundTokener); ok && p.remote.current != nil {
		g := &it.giveBack
		g.stamp, g.ref, g.token = t.refundToken(p.remote.current, it.ri)
	}
}

// giveBackItem gives a counting item's unit back when its response does not count
// (delta < 0: the whole reservation) and returns the delta given back.
func (p *Plugin) giveBackItem(it *billItem, delta, now int64) int64 {
	if delta >= 0 {
		return 0
	}
	g := &it.giveBack
	if it.remote {
		if !g.token {
			p.host.IncrementMetric(p.remote.m.settlements, 1)
			p.host.IncrementMetric(p.remote.m.settleFailures, 1)
			return 0
		}
		p.remote.sendGiveBack(it.ri, it.key, g, now)
		return -g.cost
	}
	n, err := p.refundOn(it.r, it.by, it.hash, g, now)
	if err != nil {
		p.storeFailed(it.r, err)
		return 0
	}
	return -n
}

// refundOn gives g's cost back to key hash on rule r's slot in st (the rule's store, or a
// remote rule's local fallback) with compare-and-swap, and returns the units given back:
// 0 when the window is gone, the key evicted or its state not one the limiter reads.
func (p *Plugin) refundOn(r *rule, st *slotStore, hash uint64, g *giveBack, now int64) (int64, error) {
	lim := st.lim
	if g.plan != nil && st == r.store {
		lim = g.plan.Limiter
	}
	f, ok := algorithms.AsRefunder(lim)
	if !ok {
		return 0, errors.New(lim.Kind().String() + " cannot give an admission back")
	}
	var e entry
	for i := 0; i < MaxCASRetries; i++ {
		if err := st.load(hash, now, &e); err != nil {
			return 0, err
		}
		if len(e.state) == 0 || e.evicted {
			return 0, nil // nothing holds the admission any more
		}
		ns, err := f.Refund(st.stateBuf(), e.state, g.at, now, g.cost)
		if errors.Is(err, algorithms.ErrCorruptState) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if bytes.Equal(ns, e.state) {
			return 0, nil
		}
		ok, err := st.store(&e, ns)
		if err != nil {
			return 0, err
		}
		if ok {
			return g.cost, nil
		}
	}
	return 0, errCASExhausted
}

// sendGiveBack sends the give-back g of rule i's key in a call of its own, fire and
// forget, counted as a settlement.
func (e *remote) sendGiveBack(i int, key []byte, g *giveBack, now int64) {
	c := e.newCall(callSettle)
	c.rule, c.delta, c.n = i, -g.cost, 1
	c.key = append(c.key[:0], key...)
	c.back, c.giveBack = *g, true
	e.p.host.IncrementMetric(e.m.settlements, 1)
	if why := e.post(c, now); why != "" {
		e.p.host.IncrementMetric(e.m.settleFailures, 1)
		e.freeCall(c)
	}
}

// refundToken implements refundTokener: the stamp and ref of the script's reply.
func (rs *redisState) refundToken(w *remoteWait, i int) (int64, int64, bool) {
	res := &w.x.(*redisWait).rules[i].res
	return res.Stamp, res.Ref, true
}

// giveBackRequest is the script call undoing give-back c: the refund op with the
// admission's parameters (its plan's), cost and reply.
func (rs *redisState) giveBackRequest(c *remoteCall, batch *redisrl.Request) *redisrl.Request {
	rr := rs.p.rules[c.rule].redis
	c.undo = redisrl.Result{Stamp: c.back.stamp, Ref: c.back.ref}
	*batch = redisrl.Request{Kind: rr.kind, Params: rr.params, Key: c.key, Cost: c.back.cost, Refund: &c.undo}
	if c.back.plan != nil {
		batch.Params = c.back.plan.Params
	}
	return batch
}

// refundToken implements refundTokener: the x-sluice-refund token the service answered
// the admission with, if any.
func (rs *rlsState) refundToken(w *remoteWait, i int) (int64, int64, bool) {
	x := &w.x.(*rlsWait).res[i]
	return x.stamp, x.ref, x.token && !x.undone
}

// appendGiveBackRequest appends the RateLimitRequest giving back c: one descriptor, the
// rule's entries (its plan's), the key, sluice.refund = "<stamp>:<ref>" and the cost.
func (rs *rlsState) appendGiveBackRequest(b []byte, c *remoteCall) []byte {
	b = rs.appendDomain(b)
	rs.num = rlswire.AppendPair(rs.num[:0], c.back.stamp, c.back.ref)
	b = appendDescriptor(b, rs.entriesForPlan(c.rule, c.back.plan), c.key, rlswire.Refund, rs.num, c.back.cost)
	b = append(b, 3<<3|wireVarint)
	return append(b, 1) // hits_addend
}
