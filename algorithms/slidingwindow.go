package algorithms

import "time"

// slidingWindow: two counters, the cost admitted in the current aligned
// window and in the previous one. At elapsed time e into the current window
// the estimate is prev × (1 − e/Window) + cur; a request of cost c is
// admitted iff estimate + c <= Limit. Everything is computed multiplied by
// Window, in 128-bit integers, so there is no floating-point drift.
//
// State (26 bytes): header, start (int64 ns, a multiple of Window: the
// current window), prev, cur (0 <= prev <= Limit, 0 <= cur <= Limit, not
// both 0: a current counter of 0 is left by a give-back, refund.go).
type slidingWindow struct{ common }

const slidingWindowSize = headerSize + 24

func (l *slidingWindow) Kind() Kind        { return SlidingWindow }
func (l *slidingWindow) MaxStateSize() int { return slidingWindowSize }

// load returns the effective time, the start of its window and the two
// counters as seen from that window.
func (l *slidingWindow) load(state []byte, now int64) (eff, start int64, prev, cur uint64, err error) {
	eff = clampNow(now)
	w := int64(l.window)
	if len(state) == 0 {
		return eff, eff - eff%w, 0, 0, nil
	}
	if err := checkHeader(state, SlidingWindow, slidingWindowSize); err != nil {
		return 0, 0, 0, 0, err
	}
	start, prev, cur = int64(getU64(state, 2)), getU64(state, 10), getU64(state, 18)
	if start < 0 || start > maxTime || start%w != 0 {
		return 0, 0, 0, 0, corrupt("sliding_window start %d is not a window boundary", start)
	}
	if prev > l.limit || cur > l.limit || prev == 0 && cur == 0 {
		return 0, 0, 0, 0, corrupt("sliding_window counters %d, %d out of range", prev, cur)
	}
	eff = max(eff, start)
	ws := eff - eff%w
	switch ws {
	case start:
	case start + w:
		prev, cur = cur, 0
	default:
		prev, cur = 0, 0
	}
	return eff, ws, prev, cur, nil
}

// weighted returns prev × (Window − e) + cur × Window: the estimate times
// Window.
func (l *slidingWindow) weighted(prev, cur, e uint64) u128 {
	return mul(prev, l.window-e).add(mul(cur, l.window))
}

// remaining is the number of cost-1 requests admissible at elapsed e.
func (l *slidingWindow) remaining(prev, cur, e uint64) int64 {
	room := mul(l.limit, l.window)
	est := l.weighted(prev, cur, e)
	if room.less(est) {
		return 0
	}
	q, _, _ := room.sub(est).div(l.window)
	return int64(q)
}

// resetAfter is the time until both counters weigh nothing.
func (l *slidingWindow) resetAfter(eff, start int64, prev, cur uint64) time.Duration {
	switch {
	case cur > 0:
		return time.Duration(start + 2*int64(l.window) - eff)
	case prev > 0:
		return time.Duration(start + int64(l.window) - eff)
	}
	return 0
}

// admitFrom returns the smallest elapsed time e' in [0, Window] at which
// p × (Window − e') <= a × Window holds (a >= 0).
func (l *slidingWindow) admitFrom(p, a uint64) uint64 {
	if p <= a {
		return 0
	}
	q, _, _ := mul(a, l.window).div(p) // a < p, so q < Window
	return l.window - q
}

func (l *slidingWindow) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
	if cost < 1 {
		return dst, Decision{}, ErrInvalidCost
	}
	eff, start, prev, cur, err := l.load(state, now)
	if err != nil {
		return dst, Decision{}, err
	}
	e := uint64(eff - start)
	c := uint64(cost)
	if c > l.limit {
		return append(dst, state...), l.tooCostly(l.remaining(prev, cur, e), late(l.resetAfter(eff, start, prev, cur), eff, now)), nil
	}
	if mul(l.limit, l.window).less(l.weighted(prev, cur+c, e)) {
		// Denied. The shortest wait: later in this window, if the
		// previous window's weight can fade enough; else in the next one,
		// where the current counter becomes the previous.
		var wait int64
		if cur+c <= l.limit {
			if at := l.admitFrom(prev, l.limit-cur-c); at < l.window {
				wait = int64(at) - int64(e)
			}
		}
		if wait == 0 {
			wait = start + int64(l.window) + int64(l.admitFrom(cur, l.limit-c)) - eff
		}
		return append(dst, state...), Decision{
			Limit:      int64(l.limit),
			Remaining:  l.remaining(prev, cur, e),
			ResetAfter: late(l.resetAfter(eff, start, prev, cur), eff, now),
			RetryAfter: late(time.Duration(wait), eff, now),
		}, nil
	}
	cur += c
	dst = appendHeader(dst, SlidingWindow)
	dst = appendU64(dst, uint64(start))
	dst = appendU64(dst, prev)
	dst = appendU64(dst, cur)
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.limit),
		Remaining:  l.remaining(prev, cur, e),
		ResetAfter: late(l.resetAfter(eff, start, prev, cur), eff, now),
	}, nil
}

func (l *slidingWindow) Idle(state []byte, now int64) bool {
	_, _, prev, cur, err := l.load(state, now)
	return err == nil && prev == 0 && cur == 0
}

func (l *slidingWindow) Used(state []byte, now int64) int64 {
	eff, start, prev, cur, err := l.load(state, now)
	if err != nil {
		return 0
	}
	return int64(l.limit) - l.remaining(prev, cur, uint64(eff-start))
}
