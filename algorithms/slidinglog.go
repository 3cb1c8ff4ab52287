package algorithms

import (
	"encoding/binary"
	"math/bits"
	"time"
)

// slidingLog: an exact log of admitted requests. A request of cost c at t
// is admitted iff the cost admitted in (t − Window, t] plus c is at most
// Limit; so every interval of length Window holds at most Limit.
//
// State (format version 2):
//
//	[0]     logVersion
//	[1]     Kind
//	[2]     w, the width of an entry in bytes (this limiter's: logWidth)
//	[3:11]  base, Unix ns (uint64, little-endian)
//	[11:]   the entries, oldest first: t − base in w bytes (little-endian),
//	        one per unit of cost admitted at t, never decreasing
//
// Every entry lies within one Window of the newest (expired ones are
// dropped whenever the log is written) and there are at most Limit of them,
// so the state is at most 11 + w × Limit bytes. Because entries have a
// fixed width and are sorted, a decision finds the first live entry by
// binary search (galloping from the oldest, so pruning one or two costs
// two or three probes), reads the used quota as a count of entries and the
// Retry-After as one entry, and an admission copies the live entries as
// bytes and appends its own: no pass decodes or re-encodes the log. base
// moves only when a new entry's offset would not fit w bytes; w holds
// 2 × Window, so that happens at most once per Window, when the live
// entries are rewritten relative to the oldest of them.
//
// Format version 1 (delta-encoded varints, see slidinglog_legacy.go) is
// still read; the first admission rewrites it in this format.
type slidingLog struct{ common }

const (
	logVersion    = 2
	logHeaderSize = 11
)

func (l *slidingLog) Kind() Kind { return SlidingLog }

// logWidth is the width in bytes of an entry for window: the fewest bytes
// holding 2 × window − 1 ns (4 bytes for windows from 8.4 ms up to 2.1 s,
// 5 up to 9 min, 6 up to 1.6 days, 7 up to MaxWindow).
func logWidth(window uint64) int { return (bits.Len64(2*window-1) + 7) / 8 }

func (l *slidingLog) width() int { return logWidth(l.window) }

func (l *slidingLog) MaxStateSize() int { return logHeaderSize + int(l.limit)*l.width() }

// logView reads a log without decoding it.
type logView struct {
	body []byte // the entries
	w    int
	mask uint64 // the low 8w bits
	n    int
	base int64
	last int64 // the newest entry's time (n > 0)
}

// raw returns the time of entry i as stored.
func (v *logView) raw(i int) int64 {
	p := i * v.w
	var x uint64
	if p+8 <= len(v.body) {
		x = binary.LittleEndian.Uint64(v.body[p:]) & v.mask
	} else {
		for j := v.w - 1; j >= 0; j-- {
			x = x<<8 | uint64(v.body[p+j])
		}
	}
	return v.base + int64(x)
}

// at returns the time of entry i, at most the newest's. In a log sluice
// wrote that bound never applies (entries are sorted); whatever the bytes
// hold, it keeps every instant derived from an entry at most the newest.
func (v *logView) at(i int) int64 { return min(v.raw(i), v.last) }

// after returns the number of entries at or before cutoff — the index of
// the first entry after it: probes 0, 1, 3, 7, … until an entry after
// cutoff, then a binary search within the last step. Over any bytes (not
// only sorted entries) it is non-decreasing in cutoff and n from the newest
// entry on, which is all the exactness of Retry-After relies on.
func (v *logView) after(cutoff int64) int {
	lo, hi, step := 0, 0, 1
	for ; hi < v.n; hi, step = hi+step, step<<1 {
		if v.at(hi) > cutoff {
			break
		}
		lo = hi + 1
	}
	hi = min(hi, v.n)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if v.at(m) > cutoff {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// readyAt returns the earliest cutoff at which at least k entries have
// expired (after(cutoff) >= k), given that after(from) < k <= n: the time
// of entry k−1, or, should the bytes not be sorted, what a search over
// instants finds.
func (v *logView) readyAt(k int, from int64) int64 {
	t := v.at(k - 1)
	if v.after(t) >= k && v.after(t-1) < k {
		return t
	}
	lo, hi := from, v.last // after(lo) < k <= after(hi) = n
	for hi-lo > 1 {
		m := lo + (hi-lo)/2
		if v.after(m) >= k {
			hi = m
		} else {
			lo = m
		}
	}
	return hi
}

// view validates a version-2 state in O(1): header, length, at most Limit
// entries, the newest not after maxTime and the oldest within one Window
// of it. An empty state is an empty log. The interior is not read here;
// see at and after for what a log whose entries are out of order (which
// sluice never writes) gets.
func (l *slidingLog) view(state []byte) (logView, error) {
	if len(state) == 0 {
		return logView{}, nil
	}
	if len(state) < logHeaderSize {
		return logView{}, corrupt("%d bytes is too short", len(state))
	}
	if state[0] != logVersion {
		return logView{}, corrupt("unsupported version %d", state[0])
	}
	if Kind(state[1]) != SlidingLog {
		return logView{}, corrupt("state of kind %d, want %s", state[1], SlidingLog)
	}
	w := int(state[2])
	if w < 1 || w > 7 {
		return logView{}, corrupt("sliding_log entry width %d", w)
	}
	body := state[logHeaderSize:]
	if len(body)%w != 0 {
		return logView{}, corrupt("sliding_log body of %d bytes, not whole %d-byte entries", len(body), w)
	}
	if len(state) > l.MaxStateSize() {
		return logView{}, corrupt("sliding_log state of %d bytes, at most %d", len(state), l.MaxStateSize())
	}
	v := logView{body: body, w: w, mask: 1<<(8*w) - 1, n: len(body) / w}
	if uint64(v.n) > l.limit {
		return logView{}, corrupt("sliding_log holds more than limit %d", l.limit)
	}
	base := getU64(state, 3)
	if base > uint64(maxTime) {
		return logView{}, corrupt("sliding_log base after the latest instant")
	}
	v.base = int64(base)
	if v.n == 0 {
		return v, nil
	}
	v.last = v.raw(v.n - 1) // base + an offset below 2^56: no overflow
	if v.last > maxTime {
		return logView{}, corrupt("sliding_log entry after the latest instant")
	}
	if v.last-v.at(0) >= int64(l.window) {
		return logView{}, corrupt("sliding_log entries span more than the window")
	}
	return v, nil
}

// load returns the log in state at this limiter's width. A version-1
// state, or one of another width (written under another window), is
// converted first, into dst's spare capacity (where the decision is then
// written, as when dst is state[:0]); src is the state to copy back on a
// denial.
func (l *slidingLog) load(dst, state []byte) (v logView, src []byte, err error) {
	src = state
	legacy := len(state) >= headerSize && state[0] == stateVersion
	if !legacy {
		if v, err = l.view(state); err != nil || v.n == 0 || v.w == l.width() {
			return v, src, err
		}
	}
	// A rare path (an old state, once per key; a window change), so when
	// dst is state[:0] the original is simply copied first.
	if tail := dst[len(dst):cap(dst)]; len(tail) > 0 && len(state) > 0 && &tail[0] == &state[0] {
		src = append([]byte(nil), state...)
		if !legacy {
			v, _ = l.view(src)
		}
	}
	var out []byte
	if legacy {
		if out, err = l.fromLegacy(dst, src); err != nil {
			return logView{}, src, err
		}
	} else {
		out = l.rewrite(dst, &v, 0, v.at(0))
	}
	v, err = l.view(out[len(dst):])
	return v, src, err
}

func (l *slidingLog) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
	if cost < 1 {
		return dst, Decision{}, ErrInvalidCost
	}
	v, src, err := l.load(dst, state)
	if err != nil {
		return dst, Decision{}, err
	}
	eff := clampNow(now)
	if v.n > 0 && v.last > eff { // the clock went backwards: decide at the newest entry
		eff = v.last
	}
	cutoff := eff - int64(l.window) // entries at or before cutoff have expired
	idx := v.after(cutoff)
	used, c := uint64(v.n-idx), uint64(cost)
	if c > l.limit || used+c > l.limit {
		d := Decision{Limit: int64(l.limit), Remaining: int64(l.limit - used), RetryAfter: l.p.Window}
		if used > 0 {
			d.ResetAfter = late(time.Duration(v.last-cutoff), eff, now) // the newest entry expires last
		}
		if c <= l.limit {
			// The request fits once v.n + c − Limit entries have expired;
			// entry k−1 expires Window after its time.
			k := v.n - int(l.limit-c)
			d.RetryAfter = late(time.Duration(v.readyAt(k, cutoff)-cutoff), eff, now)
		}
		return append(dst, src...), d, nil
	}
	// Admitted: the live entries are kept as they are, this request's
	// appended. A fresh log starts at eff; one whose newest offset would
	// not fit is rewritten relative to its oldest live entry.
	switch {
	case used == 0:
		dst = l.rewrite(dst, &v, v.n, eff)
		dst = appendEntries(dst, l.width(), 0, c)
	case uint64(eff-v.base) > 1<<(8*v.w)-1:
		base := v.at(idx)
		dst = l.rewrite(dst, &v, idx, base)
		dst = appendEntries(dst, v.w, uint64(eff-base), c)
	default:
		dst = append(dst, logVersion, byte(SlidingLog), byte(v.w))
		dst = appendU64(dst, uint64(v.base))
		dst = append(dst, v.body[idx*v.w:]...)
		dst = appendEntries(dst, v.w, uint64(eff-v.base), c)
	}
	return dst, Decision{
		Allowed:    true,
		Limit:      int64(l.limit),
		Remaining:  int64(l.limit - used - c),
		ResetAfter: late(l.p.Window, eff, now),
	}, nil
}

// rewrite appends the header of a log at this limiter's width relative to
// base, then the entries of v from i on. Entries are clamped into
// [base, newest], which changes nothing in a sorted log. dst may be the
// start of v's own state when v has this width: each entry is read before
// its bytes are written, and no later entry's are.
func (l *slidingLog) rewrite(dst []byte, v *logView, i int, base int64) []byte {
	w := l.width()
	dst = append(dst, logVersion, byte(SlidingLog), byte(w))
	dst = appendU64(dst, uint64(base))
	for ; i < v.n; i++ {
		dst = appendEntries(dst, w, uint64(max(v.at(i), base)-base), 1)
	}
	return dst
}

// appendEntries appends c entries of offset x, w bytes each.
func appendEntries(dst []byte, w int, x, c uint64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], x)
	for range c {
		dst = append(dst, b[:w]...)
	}
	return dst
}

func (l *slidingLog) Idle(state []byte, now int64) bool {
	u, eff, err := l.measure(state, now)
	return err == nil && u == 0 && eff == clampNow(now)
}

func (l *slidingLog) Used(state []byte, now int64) int64 {
	u, _, err := l.measure(state, now)
	if err != nil {
		return 0
	}
	return int64(u)
}

// measure returns the cost admitted in the window ending at the effective
// time, and that time: max(now, newest entry).
func (l *slidingLog) measure(state []byte, now int64) (used uint64, eff int64, err error) {
	eff = clampNow(now)
	if len(state) >= headerSize && state[0] == stateVersion {
		return l.legacyUsed(state, eff)
	}
	v, err := l.view(state)
	if err != nil || v.n == 0 {
		return 0, eff, err
	}
	eff = max(eff, v.last)
	return uint64(v.n - v.after(eff-int64(l.window))), eff, nil
}
