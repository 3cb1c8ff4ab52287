package algorithms

import "time"

// tokenBucket: a bucket of Burst tokens, full when a key is first seen,
// refilled continuously at Limit per Window; a request of cost c is admitted
// iff the bucket holds at least c tokens, and then takes them.
//
// State (26 bytes): header, last (int64 Unix ns of the last admission),
// n (whole tokens at last), r (fraction of a token at last, in units of
// 1/Window-nanoseconds: tokens = n + r/Window, 0 <= r < Window).
// Refilling dt nanoseconds adds dt×Limit to r and carries whole tokens into
// n, so the accumulator is exact: no token fraction is ever lost.
type tokenBucket struct{ common }

const tokenBucketSize = headerSize + 24

func (l *tokenBucket) Kind() Kind        { return TokenBucket }
func (l *tokenBucket) MaxStateSize() int { return tokenBucketSize }

// load decodes state (fresh when empty) and returns it refilled up to the
// effective time max(now, last).
func (l *tokenBucket) load(state []byte, now int64) (n, r uint64, eff int64, err error) {
	now = clampNow(now)
	if len(state) == 0 {
		return l.burst, 0, now, nil
	}
	if err := checkHeader(state, TokenBucket, tokenBucketSize); err != nil {
		return 0, 0, 0, err
	}
	last := int64(getU64(state, 2))
	n, r = getU64(state, 10), getU64(state, 18)
	switch {
	case last < 0 || last > maxTime:
		return 0, 0, 0, corrupt("token_bucket time %d out of range", last)
	case n > l.burst || r >= l.window || (n == l.burst && r != 0):
		return 0, 0, 0, corrupt("token_bucket tokens %d+%d/%d exceed burst %d", n, r, l.window, l.burst)
	}
	eff = max(now, last)
	n, r = l.refill(n, r, uint64(eff-last))
	return n, r, eff, nil
}

// refill adds dt nanoseconds' worth of tokens, capped at burst.
func (l *tokenBucket) refill(n, r, dt uint64) (uint64, uint64) {
	q, rem, ok := mul(dt, l.limit).add64(r).div(l.window)
	if !ok || q >= l.burst-n {
		return l.burst, 0
	}
	return n + q, rem
}

// waitFor returns the exact time until the bucket holds `want` tokens
// (want <= burst): ⌈((want−n)×Window − r) / Limit⌉ nanoseconds.
func (l *tokenBucket) waitFor(n, r, want uint64) time.Duration {
	if n >= want {
		return 0
	}
	w, _ := mul(want-n, l.window).sub(u128{0, r}).divCeil(l.limit) // fits: bounded by MaxFillTime
	return time.Duration(w)
}

func (l *tokenBucket) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
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
	if n < c {
		return append(dst, state...), Decision{
			Limit:      int64(l.burst),
			Remaining:  int64(n),
			ResetAfter: late(l.waitFor(n, r, l.burst), eff, now),
			RetryAfter: late(l.waitFor(n, r, c), eff, now),
		}, nil
	}
	n -= c
	dst = appendHeader(dst, TokenBucket)
	dst = appendU64(dst, uint64(eff))
	dst = appendU64(dst, n)
	dst = appendU64(dst, r)
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.burst),
		Remaining:  int64(n),
		ResetAfter: late(l.waitFor(n, r, l.burst), eff, now),
	}, nil
}

func (l *tokenBucket) Idle(state []byte, now int64) bool {
	n, _, eff, err := l.load(state, now)
	return err == nil && n == l.burst && eff == clampNow(now)
}

func (l *tokenBucket) Used(state []byte, now int64) int64 {
	n, _, _, err := l.load(state, now)
	if err != nil {
		return 0
	}
	return int64(l.burst - n)
}
