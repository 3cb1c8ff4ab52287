package algorithms

import "time"

// fixedWindow: time is cut into windows aligned to multiples of Window since
// the Unix epoch; at most Limit cost units are admitted per window. Up to
// 2×Limit can pass across a window boundary, by design.
//
// State (18 bytes): header, start (int64 ns, the start of the window the
// count belongs to, a multiple of Window), count (1 <= count <= Limit).
type fixedWindow struct{ common }

const fixedWindowSize = headerSize + 16

func (l *fixedWindow) Kind() Kind        { return FixedWindow }
func (l *fixedWindow) MaxStateSize() int { return fixedWindowSize }

// load returns the effective time, the start of its window and the count
// already admitted in that window.
func (l *fixedWindow) load(state []byte, now int64) (eff, start int64, count uint64, err error) {
	eff = clampNow(now)
	if len(state) != 0 {
		if err := checkHeader(state, FixedWindow, fixedWindowSize); err != nil {
			return 0, 0, 0, err
		}
		start, count = int64(getU64(state, 2)), getU64(state, 10)
		if start < 0 || start > maxTime || uint64(start)%l.window != 0 {
			return 0, 0, 0, corrupt("fixed_window start %d is not a window boundary", start)
		}
		if count < 1 || count > l.limit {
			return 0, 0, 0, corrupt("fixed_window count %d out of range", count)
		}
		eff = max(eff, start)
	}
	ws := eff - eff%int64(l.window)
	if ws != start {
		count = 0
	}
	return eff, ws, count, nil
}

func (l *fixedWindow) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
	if cost < 1 {
		return dst, Decision{}, ErrInvalidCost
	}
	eff, start, count, err := l.load(state, now)
	if err != nil {
		return dst, Decision{}, err
	}
	untilNext := time.Duration(start + int64(l.window) - eff)
	reset := late(untilNext, eff, now)
	if count == 0 {
		reset = 0
	}
	c := uint64(cost)
	if c > l.limit {
		return append(dst, state...), l.tooCostly(int64(l.limit-count), reset), nil
	}
	if count+c > l.limit {
		return append(dst, state...), Decision{
			Limit:      int64(l.limit),
			Remaining:  int64(l.limit - count),
			ResetAfter: reset,
			RetryAfter: late(untilNext, eff, now),
		}, nil
	}
	count += c
	dst = appendHeader(dst, FixedWindow)
	dst = appendU64(dst, uint64(start))
	dst = appendU64(dst, count)
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.limit),
		Remaining:  int64(l.limit - count),
		ResetAfter: late(untilNext, eff, now),
	}, nil
}

func (l *fixedWindow) Idle(state []byte, now int64) bool {
	_, _, count, err := l.load(state, now)
	return err == nil && count == 0
}

func (l *fixedWindow) Used(state []byte, now int64) int64 {
	_, _, count, err := l.load(state, now)
	if err != nil {
		return 0
	}
	return int64(count)
}
