package algorithms

import (
	"encoding/binary"
	"time"
)

// slidingLog: an exact log of admitted requests. A request of cost c at t
// is admitted iff the cost admitted in (t − Window, t] plus c is at most
// Limit; so every interval of length Window holds at most Limit.
//
// State: header, then entries oldest first. Requests admitted at the same
// nanosecond share one entry. An entry is a uvarint h = d<<1 | more, where d
// is the time (the first entry: absolute Unix ns; the others: the positive
// delta from the previous entry), followed, when more is 1, by a uvarint
// count >= 2 (otherwise the count is 1). Entries older than the window are
// pruned whenever the log is written, so at most Limit entries remain:
// O(Limit) bytes, typically 3 bytes per entry (millisecond gaps), at most
// 2 + Limit × 12. Because later entries are stored as deltas, pruning
// re-encodes only the first surviving entry and copies the rest as bytes.
type slidingLog struct{ common }

func (l *slidingLog) Kind() Kind { return SlidingLog }

func (l *slidingLog) MaxStateSize() int {
	var b [binary.MaxVarintLen64]byte
	entry := len(binary.AppendUvarint(b[:0], uint64(maxTime)<<1|1)) + len(binary.AppendUvarint(b[:0], l.limit))
	return headerSize + int(l.limit)*entry
}

// logIter walks the entries of a log body.
type logIter struct {
	b     []byte // the rest of the body
	t     int64
	first bool
}

func newLogIter(body []byte) logIter { return logIter{b: body, first: true} }

// next returns the next entry; ok is false at the end; bad reports a
// malformed entry.
func (it *logIter) next() (t int64, count uint64, ok, bad bool) {
	if len(it.b) == 0 {
		return 0, 0, false, false
	}
	h, n := binary.Uvarint(it.b)
	if n <= 0 {
		return 0, 0, false, true
	}
	count = 1
	if h&1 != 0 {
		c, m := binary.Uvarint(it.b[n:])
		if m <= 0 || c < 2 {
			return 0, 0, false, true
		}
		count, n = c, n+m
	}
	it.b = it.b[n:]
	d := h >> 1
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

// logScan is what one pass over a log learns about it at time eff.
type logScan struct {
	eff        int64
	used       uint64 // cost admitted in (eff − Window, eff]
	newest     int64  // time of the last entry (-1: empty log)
	firstT     int64  // the oldest live entry: time, count,
	firstCount uint64
	afterFirst int    // and the body offset just after it (-1: no live entry)
	lastCount  uint64 // the newest entry's count,
	lastAt     int    // its body offset,
	beforeLast int64  // and the time of the entry before it
}

// scan validates body and measures it at eff (assumed >= every entry's
// time if the result's newest <= eff).
func (l *slidingLog) scan(body []byte, eff int64) (s logScan, err error) {
	s = logScan{eff: eff, newest: -1, afterFirst: -1}
	cutoff := eff - int64(l.window) // entries at or before cutoff have expired
	var total uint64
	oldest := int64(-1)
	it := newLogIter(body)
	for {
		start, before := len(body)-len(it.b), s.newest
		t, count, ok, bad := it.next()
		if bad {
			return s, corrupt("sliding_log entry malformed")
		}
		if !ok {
			break
		}
		if count < 1 || count > l.limit-total {
			return s, corrupt("sliding_log holds more than limit %d", l.limit)
		}
		total += count
		if oldest < 0 {
			oldest = t
		}
		s.newest, s.lastCount, s.lastAt, s.beforeLast = t, count, start, before
		if t > cutoff {
			s.used += count
			if s.afterFirst < 0 {
				s.firstT, s.firstCount, s.afterFirst = t, count, len(body)-len(it.b)
			}
		}
	}
	if oldest >= 0 && s.newest-oldest >= int64(l.window) {
		return s, corrupt("sliding_log entries span more than the window")
	}
	return s, nil
}

// load decodes state and measures it at the effective time max(now, newest).
func (l *slidingLog) load(state []byte, now int64) (logScan, error) {
	now = clampNow(now)
	if len(state) == 0 {
		return logScan{eff: now, newest: -1, afterFirst: -1}, nil
	}
	if err := checkHeader(state, SlidingLog, -1); err != nil {
		return logScan{}, err
	}
	s, err := l.scan(state[headerSize:], now)
	if err == nil && s.newest > now { // the clock went backwards: measure at newest
		s, err = l.scan(state[headerSize:], s.newest)
	}
	return s, err
}

func (l *slidingLog) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
	if cost < 1 {
		return dst, Decision{}, ErrInvalidCost
	}
	s, err := l.load(state, now)
	if err != nil {
		return dst, Decision{}, err
	}
	eff, c := s.eff, uint64(cost)
	cutoff := eff - int64(l.window)
	if c > l.limit || s.used+c > l.limit {
		d := Decision{Limit: int64(l.limit), Remaining: int64(l.limit - s.used), RetryAfter: l.p.Window}
		if s.used > 0 {
			d.ResetAfter = late(time.Duration(s.newest-cutoff), eff, now) // the newest entry expires last
		}
		if c <= l.limit {
			// Walk the live entries oldest first: the request fits once
			// enough of them have expired; an entry at t expires at
			// t + Window.
			need := s.used + c - l.limit
			it := newLogIter(state[headerSize:])
			for {
				t, count, ok, _ := it.next()
				if !ok {
					break
				}
				if t <= cutoff {
					continue
				}
				if count >= need {
					d.RetryAfter = late(time.Duration(t-cutoff), eff, now)
					break
				}
				need -= count
			}
		}
		return append(dst, state...), d, nil
	}
	// Admitted: the first live entry becomes the absolute one, the later
	// ones keep their delta encoding and are copied as bytes; this request
	// is appended, or merged into the newest entry when at the same time.
	dst = appendHeader(dst, SlidingLog)
	switch {
	case s.afterFirst < 0: // nothing live
		dst = appendEntry(dst, -1, eff, c)
	case s.firstT == s.newest: // one live entry
		if s.newest == eff {
			dst = appendEntry(dst, -1, eff, s.firstCount+c)
		} else {
			dst = appendEntry(dst, -1, s.firstT, s.firstCount)
			dst = appendEntry(dst, s.firstT, eff, c)
		}
	default:
		body := state[headerSize:]
		dst = appendEntry(dst, -1, s.firstT, s.firstCount)
		if s.newest == eff {
			dst = append(dst, body[s.afterFirst:s.lastAt]...)
			dst = appendEntry(dst, s.beforeLast, eff, s.lastCount+c)
		} else {
			dst = append(dst, body[s.afterFirst:]...)
			dst = appendEntry(dst, s.newest, eff, c)
		}
	}
	used := s.used + c
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.limit),
		Remaining:  int64(l.limit - used),
		ResetAfter: late(l.p.Window, eff, now),
	}, nil
}

// appendEntry encodes an entry at t (absolute when prev < 0, else as the
// delta from prev) with its count.
func appendEntry(dst []byte, prev, t int64, count uint64) []byte {
	d := uint64(t)
	if prev >= 0 {
		d = uint64(t - prev)
	}
	if count == 1 {
		return binary.AppendUvarint(dst, d<<1)
	}
	return binary.AppendUvarint(binary.AppendUvarint(dst, d<<1|1), count)
}

func (l *slidingLog) Idle(state []byte, now int64) bool {
	s, err := l.load(state, now)
	return err == nil && s.used == 0 && s.eff == clampNow(now)
}

func (l *slidingLog) Used(state []byte, now int64) int64 {
	s, err := l.load(state, now)
	if err != nil {
		return 0
	}
	return int64(s.used)
}
