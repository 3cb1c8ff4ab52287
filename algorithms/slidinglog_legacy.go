package algorithms

import "encoding/binary"

// Format version 1 of the sliding_log state, still read so that a log
// written by an earlier sluice keeps counting (shared data can outlive a
// module upgrade in the same proxy: proxy-wasm-cpp-host drops a vm_id's
// data only when its last VM goes): Decide converts it (see load), Idle and
// Used measure it in place.
//
// It is the header (stateVersion, Kind), then entries oldest first.
// Requests admitted at the same nanosecond share one entry. An entry is a
// uvarint h = d<<1 | more, where d is the time (the first entry: absolute
// Unix ns; the others: the positive delta from the previous entry),
// followed, when more is 1, by a uvarint count >= 2 (otherwise the count is
// 1). A version-1 state longer than this limiter's MaxStateSize (possible
// only for a few entries each over a hundred milliseconds apart at a small
// limit) is treated as corrupt, so that a denial's copy of it never exceeds
// MaxStateSize.

// logIter walks the entries of a version-1 body.
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

// legacyCheck validates a version-1 state as that format was validated
// (well-formed, increasing, at most Limit in all, spanning less than the
// Window) and returns its body and its oldest and newest times (-1: empty).
func (l *slidingLog) legacyCheck(state []byte) (body []byte, oldest, newest int64, err error) {
	if err := checkHeader(state, SlidingLog, -1); err != nil {
		return nil, 0, 0, err
	}
	if len(state) > l.MaxStateSize() {
		return nil, 0, 0, corrupt("version-1 sliding_log of %d bytes, more than %d", len(state), l.MaxStateSize())
	}
	body = state[headerSize:]
	oldest, newest = -1, -1
	var total uint64
	it := newLogIter(body)
	for {
		t, count, ok, bad := it.next()
		if bad {
			return nil, 0, 0, corrupt("sliding_log entry malformed")
		}
		if !ok {
			break
		}
		if count > l.limit-total {
			return nil, 0, 0, corrupt("sliding_log holds more than limit %d", l.limit)
		}
		total += count
		if oldest < 0 {
			oldest = t
		}
		newest = t
	}
	if oldest >= 0 && newest-oldest >= int64(l.window) {
		return nil, 0, 0, corrupt("sliding_log entries span more than the window")
	}
	return body, oldest, newest, nil
}

// fromLegacy appends the version-2 form of a version-1 state: each entry
// count times, relative to the oldest.
func (l *slidingLog) fromLegacy(dst, state []byte) ([]byte, error) {
	body, oldest, _, err := l.legacyCheck(state)
	if err != nil {
		return dst, err
	}
	w := l.width()
	dst = append(dst, logVersion, byte(SlidingLog), byte(w))
	if oldest < 0 {
		return appendU64(dst, 0), nil
	}
	dst = appendU64(dst, uint64(oldest))
	for it := newLogIter(body); ; {
		t, count, ok, _ := it.next()
		if !ok {
			return dst, nil
		}
		dst = appendEntries(dst, w, uint64(t-oldest), count)
	}
}

// legacyUsed is measure for a version-1 state.
func (l *slidingLog) legacyUsed(state []byte, eff int64) (used uint64, _ int64, err error) {
	body, _, newest, err := l.legacyCheck(state)
	if err != nil {
		return 0, eff, err
	}
	eff = max(eff, newest)
	cutoff := eff - int64(l.window)
	for it := newLogIter(body); ; {
		t, count, ok, _ := it.next()
		if !ok {
			return used, eff, nil
		}
		if t > cutoff {
			used += count
		}
	}
}
