package filter

import (
	"errors"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
)

// Seeding failure_mode "local"'s fallback from the remote answers.
//
// The fallback store of a remote rule decides with the limit divided by
// instances (config.FallbackParams). Started from zero when the remote side
// fails, every proxy would admit its whole share in the window where the
// failure begins, on top of what the fleet had already spent: up to twice
// the limit. So each remote answer for a key also raises the key's state in
// the fallback store to this proxy's share of what the answer says the fleet
// used (capacity − remaining, scaled by share/capacity, rounded up). When
// the remote side fails, the fallback goes on from there: the proxies of the
// fleet split what was left, not the whole limit again. The bound and why it
// holds are in RATIONALE.md ("Why seed the local fallback?").

// capacity is what a limiter with p admits from fresh: Burst for the
// buckets, else Limit.
func capacity(p algorithms.Params) int64 {
	if p.Burst > 0 {
		return p.Burst
	}
	return p.Limit
}

// seedShare is the part of share a fallback key must show as used when the
// fleet has used `used` of remote capacity capR: rounded up, so that the
// shares of the proxies never sum to more than what was left.
func seedShare(used, capR, share int64) int64 {
	if used <= 0 || capR <= 0 || share <= 0 {
		return 0
	}
	if used >= capR {
		return share
	}
	// used < capR and share ≤ capR (a share of the limit): no overflow for
	// the limits the scripts accept (config.RedisParams).
	return (used*share + capR - 1) / capR
}

// seed raises key h's state in s so that it shows at least target used (s's
// limiter's Used): the remote decision reported remaining of capR. A key the
// table would have to evict a live key for is left alone (the seed is a hint,
// not a request), as is a state the limiter cannot charge more of.
func (s *slotStore) seed(h uint64, capR, remaining, now int64) error {
	target := seedShare(capR-remaining, capR, capacity(s.lim.Params()))
	if target == 0 {
		return nil
	}
	var e entry
	for i := 0; i < MaxCASRetries; i++ {
		if err := s.load(h, now, &e); err != nil {
			return err
		}
		if e.evicted {
			return nil
		}
		cost := target - s.lim.Used(e.state, now)
		if cost <= 0 {
			return nil
		}
		ns, d, err := s.lim.Decide(s.stateBuf(), e.state, now, cost)
		if err == nil && !d.Allowed && d.Remaining > 0 && d.Remaining < cost {
			// Charge what fits: the state holds less room than the share.
			ns, d, err = s.lim.Decide(s.stateBuf(), e.state, now, d.Remaining)
		}
		if err != nil || !d.Allowed {
			return err
		}
		ok, err := s.store(&e, ns)
		if err != nil || ok {
			return err
		}
	}
	return errCASExhausted
}

// seedFallback records remote decision d of rule i (a rule without leases,
// whose grants seedFromGrant records; under failure_mode local) in its fallback store. A failure to record it
// costs nothing but the seed: it is counted with the rule's store errors.
func (e *remote) seedFallback(r *rule, i int, d algorithms.Decision, hash uint64) {
	fb := e.fallback[i]
	if fb == nil || e.lease[i] != nil {
		return
	}
	capR := capacity(r.cfg.Limiter.Params())
	if err := fb.seed(hash, capR, min(max(d.Remaining, 0), capR), e.p.host.Now()); err != nil && !errors.Is(err, algorithms.ErrCorruptState) {
		e.p.host.IncrementMetric(r.metrics.storeErrors, 1)
	}
}

// seedFromGrant records lease rule lr's grant for the key of hash in its
// fallback store (under failure_mode local): remaining is what the key holds
// beyond every lease, so capacity − remaining is what the fleet has admitted
// or holds in pools. The pools' admissions are counted there already: when
// the remote side fails, a proxy spends its pool and then the fallback's
// share of what no proxy held, not its whole share again.
func (e *remote) seedFromGrant(lr *leaseRule, hash uint64, remaining int64) {
	fb := e.fallback[lr.rule]
	if fb == nil || e.p.cfg.FailureMode != config.FailLocal {
		return
	}
	r := e.p.rules[lr.rule]
	capR := capacity(r.cfg.Limiter.Params())
	if err := fb.seed(hash, capR, min(max(remaining, 0), capR), e.p.host.Now()); err != nil && !errors.Is(err, algorithms.ErrCorruptState) {
		e.p.host.IncrementMetric(r.metrics.storeErrors, 1)
	}
}
