package algorithms

import (
	"encoding/binary"
	"time"
)

// slidingLog: an exact log of admitted requests. A request of cost c at t
// is admitted iff the cost admitted in (t − Window, t] plus c is at most
// Limit; so every interval of length Window holds at most Limit.
//
// State: header, then entries oldest first, each a uvarint time (the first
// absolute Unix ns, the others the positive delta from the previous entry)
// and a uvarint count (>= 1; requests admitted at the same nanosecond share
// one entry). Entries older than the window are pruned whenever the log is
// written, so at most Limit entries remain: O(Limit) bytes, at most
// 2 + Limit × 11 for Limit <= MaxSlidingLogLimit.
type slidingLog struct{ common }

func (l *slidingLog) Kind() Kind { return SlidingLog }

func (l *slidingLog) MaxStateSize() int {
	var b [binary.MaxVarintLen64]byte
	entry := len(binary.AppendUvarint(b[:0], uint64(maxTime))) + len(binary.AppendUvarint(b[:0], l.limit))
	return headerSize + int(l.limit)*entry
}

// logIter walks the entries of a validated (or being validated) log.
type logIter struct {
	b     []byte
	t     int64
	first bool
}

// next returns the next entry; ok is false at the end; bad reports a
// malformed entry.
func (it *logIter) next() (t int64, count uint64, ok, bad bool) {
	if len(it.b) == 0 {
		return 0, 0, false, false
	}
	d, n := binary.Uvarint(it.b)
	if n <= 0 {
		return 0, 0, false, true
	}
	it.b = it.b[n:]
	count, n = binary.Uvarint(it.b)
	if n <= 0 {
		return 0, 0, false, true
	}
	it.b = it.b[n:]
	if it.first {
		it.first = false
		if d > uint64(maxTime) {
			return 0, 0, false, true
		}
		it.t = int64(d)
	} else {
		if d == 0 || d > uint64(maxTime-it.t) {
			return 0, 0, false, true
		}
		it.t += int64(d)
	}
	return it.t, count, true, false
}

func (l *slidingLog) iter(state []byte) logIter {
	if len(state) < headerSize {
		return logIter{first: true}
	}
	return logIter{b: state[headerSize:], first: true}
}

// load validates state and returns the effective time and the cost still
// inside the window ending at it.
func (l *slidingLog) load(state []byte, now int64) (eff int64, inWindow uint64, err error) {
	eff = clampNow(now)
	if len(state) == 0 {
		return eff, 0, nil
	}
	if err := checkHeader(state, SlidingLog, -1); err != nil {
		return 0, 0, err
	}
	var total uint64
	oldest, newest := int64(-1), int64(0)
	it := l.iter(state)
	for {
		t, count, ok, bad := it.next()
		if bad {
			return 0, 0, corrupt("sliding_log entry malformed")
		}
		if !ok {
			break
		}
		if count < 1 || count > l.limit-total {
			return 0, 0, corrupt("sliding_log holds more than limit %d", l.limit)
		}
		total += count
		if oldest < 0 {
			oldest = t
		}
		newest = t
	}
	if oldest >= 0 && newest-oldest >= int64(l.window) {
		return 0, 0, corrupt("sliding_log entries span more than the window")
	}
	eff = max(eff, newest)
	it = l.iter(state)
	for {
		t, count, ok, _ := it.next()
		if !ok {
			break
		}
		if t > eff-int64(l.window) {
			inWindow += count
		}
	}
	return eff, inWindow, nil
}

func (l *slidingLog) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
	if cost < 1 {
		return dst, Decision{}, ErrInvalidCost
	}
	eff, used, err := l.load(state, now)
	if err != nil {
		return dst, Decision{}, err
	}
	cutoff := eff - int64(l.window) // entries at or before cutoff have expired
	c := uint64(cost)
	if c > l.limit || used+c > l.limit {
		d := Decision{Limit: int64(l.limit), Remaining: int64(l.limit - used), RetryAfter: l.p.Window}
		// Walk the live entries oldest first: the request fits once enough
		// of them have expired; an entry at t expires at t + Window.
		need := int64(used+c) - int64(l.limit)
		it := l.iter(state)
		for {
			t, count, ok, _ := it.next()
			if !ok {
				break
			}
			if t <= cutoff {
				continue
			}
			d.ResetAfter = time.Duration(t - cutoff) // the newest live entry sets it
			if need > 0 {
				need -= int64(count)
				if need <= 0 && c <= l.limit {
					d.RetryAfter = time.Duration(t - cutoff)
				}
			}
		}
		d.ResetAfter = late(d.ResetAfter, eff, now)
		if c <= l.limit {
			d.RetryAfter = late(d.RetryAfter, eff, now)
		}
		return append(dst, state...), d, nil
	}
	// Admitted: rewrite the live entries and append (or merge) this one.
	dst = appendHeader(dst, SlidingLog)
	prev := int64(-1)
	it := l.iter(state)
	for {
		t, count, ok, _ := it.next()
		if !ok {
			break
		}
		if t <= cutoff {
			continue
		}
		if t == eff {
			count += c
			c = 0
		}
		dst = appendEntry(dst, prev, t, count)
		prev = t
	}
	if c > 0 {
		dst = appendEntry(dst, prev, eff, c)
	}
	used += uint64(cost)
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.limit),
		Remaining:  int64(l.limit - used),
		ResetAfter: late(l.p.Window, eff, now),
	}, nil
}

func appendEntry(dst []byte, prev, t int64, count uint64) []byte {
	if prev < 0 {
		dst = binary.AppendUvarint(dst, uint64(t))
	} else {
		dst = binary.AppendUvarint(dst, uint64(t-prev))
	}
	return binary.AppendUvarint(dst, count)
}

func (l *slidingLog) Idle(state []byte, now int64) bool {
	_, used, err := l.load(state, now)
	return err == nil && used == 0
}
