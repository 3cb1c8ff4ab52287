package algorithms

import "time"

// leakyBucket: a leaky bucket used as a meter, implemented by virtual
// scheduling (GCRA). Each admitted request of cost c pours c units into the
// bucket; the level drains continuously at Limit per Window; a request is
// admitted iff level + c <= Burst. There is no queue and no timer: the state
// is the theoretical arrival time (TAT), the instant the bucket will be
// empty, and level(t) = max(TAT − t, 0) / I with I = Window/Limit.
//
// State (26 bytes): header, tat (int64 ns) and frac (0 <= frac < Limit) with
// TAT = tat + frac/Limit exactly, and last (int64 ns of the last admission,
// so that a clock going backwards is treated as standing still).
//
// Internally levels are measured in "scaled" units of ns × Limit, in which
// one request is Window units and the bucket holds Burst × Window.
type leakyBucket struct{ common }

const leakyBucketSize = headerSize + 24

func (l *leakyBucket) Kind() Kind        { return LeakyBucket }
func (l *leakyBucket) MaxStateSize() int { return leakyBucketSize }

// load decodes state and returns the effective time and the TAT as seen at
// that time (never earlier than it), plus the level in scaled units.
func (l *leakyBucket) load(state []byte, now int64) (tat int64, frac uint64, eff int64, level u128, err error) {
	now = clampNow(now)
	if len(state) == 0 {
		return now, 0, now, u128{}, nil
	}
	if err := checkHeader(state, LeakyBucket, leakyBucketSize); err != nil {
		return 0, 0, 0, u128{}, err
	}
	tat, frac = int64(getU64(state, 2)), getU64(state, 10)
	last := int64(getU64(state, 18))
	switch {
	case last < 0 || last > maxTime || tat < 0:
		return 0, 0, 0, u128{}, corrupt("leaky_bucket time out of range")
	case frac >= l.limit:
		return 0, 0, 0, u128{}, corrupt("leaky_bucket fraction %d >= limit %d", frac, l.limit)
	case tat >= last && mul(l.burst, l.window).less(mul(uint64(tat-last), l.limit).add64(frac)):
		return 0, 0, 0, u128{}, corrupt("leaky_bucket level exceeds burst")
	}
	eff = max(now, last)
	if tat < eff {
		tat, frac = eff, 0
	}
	return tat, frac, eff, mul(uint64(tat-eff), l.limit).add64(frac), nil
}

// drainTime is the time for a level (scaled units) to drain to zero.
func (l *leakyBucket) drainTime(level u128) time.Duration {
	d, _ := level.divCeil(l.limit) // fits: level <= Burst × Window
	return time.Duration(d)
}

// remaining is how many cost-1 requests fit above level.
func (l *leakyBucket) remaining(level u128) int64 {
	capacity := mul(l.burst, l.window)
	if capacity.less(level) {
		return 0
	}
	q, _, _ := capacity.sub(level).div(l.window)
	return int64(q)
}

func (l *leakyBucket) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
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
	pour := mul(c, l.window)
	after := level.add(pour)
	capacity := mul(l.burst, l.window)
	if capacity.less(after) {
		return append(dst, state...), Decision{
			Limit:      int64(l.burst),
			Remaining:  l.remaining(level),
			ResetAfter: late(l.drainTime(level), eff, now),
			RetryAfter: late(l.drainTime(after.sub(capacity)), eff, now),
		}, nil
	}
	// TAT += c × Window / Limit, exactly.
	q, rem, _ := pour.div(l.limit) // fits: <= Burst × Window / Limit
	frac += rem
	if frac >= l.limit {
		frac -= l.limit
		q++
	}
	tat += int64(q)
	dst = appendHeader(dst, LeakyBucket)
	dst = appendU64(dst, uint64(tat))
	dst = appendU64(dst, frac)
	dst = appendU64(dst, uint64(eff))
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.burst),
		Remaining:  l.remaining(after),
		ResetAfter: late(l.drainTime(after), eff, now),
	}, nil
}

func (l *leakyBucket) Idle(state []byte, now int64) bool {
	_, _, eff, level, err := l.load(state, now)
	return err == nil && level.isZero() && eff == clampNow(now)
}

func (l *leakyBucket) Used(state []byte, now int64) int64 {
	_, _, _, level, err := l.load(state, now)
	if err != nil {
		return 0
	}
	return int64(l.burst) - l.remaining(level)
}
