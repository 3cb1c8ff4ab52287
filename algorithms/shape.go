package algorithms

import "time"

// Shaping: a request that does not fit now is admitted into the future
// instead of refused, when the instant it would fit is at most maxDelay
// away. The caller holds it until then (Decision.Delay) and releases it at
// its slot: the bucket as its authors describe it, a queue drained at the
// rate, instead of a meter that refuses.
//
// The slot is taken when the request arrives: the state is charged as if
// the request had arrived at its slot, so every later decision, on any
// worker that shares the state, queues behind it. Requests of one key leave
// spaced by the rate (one per Window/Limit after the first Burst), the
// upstream never sees more than the meter would have admitted in any
// interval, and the queue's length per key is bounded by the algorithm
// itself: at most maxDelay × Limit / Window cost units are held at once.
//
// Only the buckets shape. Their state can record an admission in the
// future (the "last" instant of both is the slot of the latest admission;
// a later decision is made at max(now, last), as for a clock that went
// backwards), and the instant a request fits is one number. The window
// algorithms have no such instant short of the next window, where every
// held request would leave at once — a burst, the opposite of shaping.

// Shaper is a Limiter that can hold requests: token_bucket and
// leaky_bucket implement it (As a Shaper).
type Shaper interface {
	Limiter
	// DecideDelay is Decide with a queue. A request that fits now is
	// admitted as by Decide. One that would fit within maxDelay is
	// admitted with Delay set to the wait until its slot, and the state
	// returned records its admission at that slot. One that would wait
	// longer is denied, nothing charged, with RetryAfter the shortest wait
	// after which the same request would be admitted with a delay of at
	// most maxDelay (its wait minus maxDelay). maxDelay <= 0 is Decide.
	//
	// Delay is also set, for an admission that fits at once, when the
	// state's latest slot is later than now: the request is admitted at
	// that slot, not before.
	DecideDelay(dst, state []byte, now, cost int64, maxDelay time.Duration) (newState []byte, d Decision, err error)
}

// AsShaper returns l as a Shaper when its algorithm can hold requests.
func AsShaper(l Limiter) (Shaper, bool) {
	s, ok := l.(Shaper)
	return s, ok
}

// Shapes reports whether algorithm k can hold requests (DecideDelay), and
// if not why, in a sentence for a configuration error.
func Shapes(k Kind) (bool, string) {
	switch k {
	case TokenBucket, LeakyBucket:
		return true, ""
	case FixedWindow, SlidingWindow:
		return false, k.String() + " has no instant at which a held request fits short of the next window, " +
			"where every held request would leave at once: use leaky_bucket or token_bucket"
	case SlidingLog:
		return false, "sliding_log frees its slots only as admissions leave the window, in the bursts they arrived in: " +
			"use leaky_bucket or token_bucket"
	}
	return false, "unknown algorithm"
}

func (l *tokenBucket) DecideDelay(dst, state []byte, now, cost int64, maxDelay time.Duration) ([]byte, Decision, error) {
	if maxDelay <= 0 {
		return l.Decide(dst, state, now, cost)
	}
	if cost < 1 {
		return dst, Decision{}, ErrInvalidCost
	}
	n, r, eff, err := l.load(state, now)
	if err != nil {
		return dst, Decision{}, err
	}
	c := uint64(cost)
	if c > l.burst {
		return append(dst, state...), l.tooCostly(int64(n), late(l.waitFor(n, r, l.burst), eff, now)), nil
	}
	now = clampNow(now)
	wait := l.waitFor(n, r, c) // from eff
	ahead := time.Duration(eff - now)
	if wait+ahead > maxDelay {
		return append(dst, state...), Decision{
			Limit:      int64(l.burst),
			Remaining:  int64(n),
			ResetAfter: late(l.waitFor(n, r, l.burst), eff, now),
			RetryAfter: wait + ahead - maxDelay,
		}, nil
	}
	slot := eff + int64(wait)
	if wait > 0 {
		n, r = l.refill(n, r, uint64(wait))
	}
	n -= c
	dst = appendHeader(dst, TokenBucket)
	dst = appendU64(dst, uint64(slot))
	dst = appendU64(dst, n)
	dst = appendU64(dst, r)
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.burst),
		Remaining:  int64(n),
		ResetAfter: l.waitFor(n, r, l.burst) + time.Duration(slot-now),
		Delay:      time.Duration(slot - now),
	}, nil
}

func (l *leakyBucket) DecideDelay(dst, state []byte, now, cost int64, maxDelay time.Duration) ([]byte, Decision, error) {
	if maxDelay <= 0 {
		return l.Decide(dst, state, now, cost)
	}
	if cost < 1 {
		return dst, Decision{}, ErrInvalidCost
	}
	tat, frac, eff, level, err := l.load(state, now)
	if err != nil {
		return dst, Decision{}, err
	}
	c := uint64(cost)
	if c > l.burst {
		return append(dst, state...), l.tooCostly(l.remaining(level), late(l.drainTime(level), eff, now)), nil
	}
	now = clampNow(now)
	pour := mul(c, l.window)
	after := level.add(pour)
	capacity := mul(l.burst, l.window)
	var wait time.Duration // from eff: until level + pour fits
	if capacity.less(after) {
		wait = l.drainTime(after.sub(capacity))
	}
	ahead := time.Duration(eff - now)
	if wait+ahead > maxDelay {
		return append(dst, state...), Decision{
			Limit:      int64(l.burst),
			Remaining:  l.remaining(level),
			ResetAfter: late(l.drainTime(level), eff, now),
			RetryAfter: wait + ahead - maxDelay,
		}, nil
	}
	// The admission is made at its slot, as the meter would make it
	// there: the slot is a whole nanosecond, at or just after the exact
	// instant the request fits, and a TAT before it is the slot (the
	// bucket is empty then). TAT += c × Window / Limit, exactly.
	slot := eff + int64(wait)
	if tat < slot {
		tat, frac = slot, 0
	}
	q, rem, _ := pour.div(l.limit)
	frac += rem
	if frac >= l.limit {
		frac -= l.limit
		q++
	}
	tat += int64(q)
	atSlot := u128{0, frac}
	if tat > slot {
		atSlot = mul(uint64(tat-slot), l.limit).add64(frac)
	}
	dst = appendHeader(dst, LeakyBucket)
	dst = appendU64(dst, uint64(tat))
	dst = appendU64(dst, frac)
	dst = appendU64(dst, uint64(slot))
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.burst),
		Remaining:  l.remaining(atSlot),
		ResetAfter: l.drainTime(atSlot) + time.Duration(slot-now),
		Delay:      time.Duration(slot - now),
	}, nil
}
