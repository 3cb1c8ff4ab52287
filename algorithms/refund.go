package algorithms

// Give-backs: the window algorithms' counterpart of settlement, for a rule that
// charges a request only when its response matches (config's "count"). The
// request is decided as any other (Decide with its cost: refused when the window
// has no room, so a key locked out stays out); when its response does not match,
// its cost is given back (Refund) to the window it was counted in.
//
//   - fixed_window: the cost goes back to the window's count when the admission's
//     window is still the state's; once the window has rolled its count is
//     forgotten and there is nothing to give back (the unit left with it).
//   - sliding_window: the cost goes back to the counter it was added to: the
//     current one while the admission's window is the state's, the previous one
//     in the next window (where it still weighs prev × (Window − e)/Window); two
//     windows on it weighs nothing and nothing is given back. Either way the
//     estimate afterwards is exactly the one the state would hold had the request
//     never been admitted: the give-back is exact across the window boundary.
//   - A counter holding less than the cost (reset meanwhile: a corrupt state
//     replaced, a key evicted and admitted afresh) is left as it is: a give-back
//     never takes from another admission.
//
// The window an admission was counted in is the one holding at, its decision's
// instant. A decision made on a clock behind the state's window (another
// worker's, ahead of it) was counted in the state's window, later than at's: its
// give-back finds another window and gives nothing back. The error is on the
// strict side: a give-back never reopens room it did not take.
//
// sliding_log does not give back: the admission's own entry would have to be
// found in the log, and an entry is only a time (moved to the newest entry's when
// a clock is behind), so the log cannot name which entry was this request's.

// Refunder is a window Limiter that can give an admission back: fixed_window and
// sliding_window implement it (AsRefunder).
type Refunder interface {
	Limiter
	// Refund gives back cost units admitted at instant at (Unix ns: the
	// admission's decision) to state at now, and appends the new state to
	// dst: unchanged when the admission's window is gone or its counter
	// holds less than cost, empty when the key is fresh afterwards (the
	// caller writes it). cost < 1 is ErrInvalidCost; a corrupt or foreign
	// state, an error wrapping ErrCorruptState. dst may be state[:0] but
	// must not otherwise overlap state. It never allocates when dst has
	// capacity for MaxStateSize bytes.
	Refund(dst, state []byte, at, now, cost int64) ([]byte, error)
}

// AsRefunder returns l as a Refunder when its algorithm gives back (fixed_window,
// sliding_window).
func AsRefunder(l Limiter) (Refunder, bool) {
	r, ok := l.(Refunder)
	return r, ok
}

// Refunds reports whether algorithm k gives an admission back (Refunder), and if
// not why, in a sentence for a configuration error.
func Refunds(k Kind) (bool, string) {
	switch k {
	case FixedWindow, SlidingWindow:
		return true, ""
	case SlidingLog:
		return false, "sliding_log cannot give an admission back: its entries are times, " +
			"so the log cannot name which entry was the request's; use sliding_window, whose give-back is exact"
	}
	return false, k.String() + " settles instead of giving back"
}

// windowOf is the start of the aligned window of length w holding at.
func windowOf(at int64, w uint64) int64 {
	at = clampNow(at)
	return at - at%int64(w)
}

func (l *fixedWindow) Refund(dst, state []byte, at, now, cost int64) ([]byte, error) {
	if cost < 1 {
		return dst, ErrInvalidCost
	}
	_, ws, count, err := l.load(state, now)
	if err != nil {
		return dst, err
	}
	c := uint64(cost)
	if len(state) == 0 || windowOf(at, l.window) != ws || count < c {
		return append(dst, state...), nil
	}
	count -= c
	if count == 0 {
		return dst, nil
	}
	dst = appendHeader(dst, FixedWindow)
	dst = appendU64(dst, uint64(ws))
	return appendU64(dst, count), nil
}

func (l *slidingWindow) Refund(dst, state []byte, at, now, cost int64) ([]byte, error) {
	if cost < 1 {
		return dst, ErrInvalidCost
	}
	_, ws, prev, cur, err := l.load(state, now)
	if err != nil {
		return dst, err
	}
	c, aw := uint64(cost), windowOf(at, l.window)
	switch {
	case len(state) == 0:
		return dst, nil
	case aw == ws && cur >= c:
		cur -= c
	case aw == ws-int64(l.window) && prev >= c:
		prev -= c
	default:
		return append(dst, state...), nil
	}
	if prev == 0 && cur == 0 {
		return dst, nil
	}
	dst = appendHeader(dst, SlidingWindow)
	dst = appendU64(dst, uint64(ws))
	dst = appendU64(dst, prev)
	return appendU64(dst, cur), nil
}
