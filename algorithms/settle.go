package algorithms

import (
	"errors"
	"strconv"
)

// Settlement: token budgets, where a request's cost (an LLM API's tokens)
// is known only once its response has ended. The caller reserves an
// estimate when the request arrives — a Decide with cost = reserved,
// admitted only if it fits — and settles when the response ends with
// delta = actual − reserved:
//
//   - delta < 0 refunds the unused part of the reservation. It is credited
//     when it is made, up to fresh: a refund never gives a key more than a
//     key never seen (a full bucket). A reservation holds its units only
//     while the bucket is short of them, so the refund of a reservation
//     made long ago, after the bucket has refilled, finds less room and
//     the rest is not credited: a refund never creates capacity.
//   - delta > 0 charges the excess unconditionally, even when it does not
//     fit: the key goes below zero (a debt), and no request is admitted
//     until the debt has been refilled, exactly — Decide's RetryAfter and
//     ResetAfter, DecideDelay's Delay count it. Over-use is never dropped.
//   - delta == 0 changes nothing: the state is copied.
//
// The balance of a key is the bucket's as Decide sees it (tokens =
// Burst − level), extended below zero: at a now before the state's last
// instant, the balance is the one at that instant less the refill between
// now and then. A settlement is applied to that balance at now — so a
// refund while a key is in debt shortens its wait exactly, and a
// settlement made on a clock that went backwards (or another worker's,
// behind the one that wrote the state) leaves the key at most as open as
// the same settlement made at the state's last instant, and exactly as
// open from that instant on: the clock going backwards never unblocks a
// key.
//
// A key in debt is not Idle, its Used is Burst (Used does not count below
// zero), Decide refuses it with the exact RetryAfter and ResetAfter, and
// DecideDelay holds a request until the debt and the request's own cost
// are refilled.
//
// A key in debt is an ordinary state, readable by code that predates
// settlement: the last instant (token_bucket) or the last admission
// (leaky_bucket, whose TAT moves on by excess × Window/Limit) is moved to
// the instant the debt is paid back, at which the bucket holds less than
// one unit; Decide decides at max(now, last), so every request before that
// instant is refused, with the exact wait. That needs a refill of at most
// one unit per nanosecond (Limit <= Window in nanoseconds): a faster
// bucket refills more than a unit within the last nanosecond of a debt, and
// a request just before it would be admitted early. Such a bucket does not
// settle (SettlesWith, ErrSettleRate).
//
// # Guarantee
//
// On one key, take the events on a clock that does not go backwards:
// admissions (Decide, reservation r_i at a_i) and settlements (delta_i at
// s_i >= a_i, actual cost u_i = r_i + delta_i). For two events e and f,
// e before f and f an admission,
//
//	Σ r over admissions in (e, f] + Σ delta over settlements in (e, f]
//	    <= Burst + Limit × (t_f − t_e) / Window,
//
// the bucket's own bound with a settlement counted (a refund credited)
// when it is made: Decide never admits into a debt, and nothing but the
// refill, capped at Burst, and refunds, capped at fresh, gives units back.
// In the actual cost of the requests admitted in any interval (a, b] that
// ends with an admission,
//
//	Σ u_i over a_i in (a, b] <= Burst + Limit × (b − a) / Window + X + R,
//
// where X is the excess of those requests still in flight at b — not yet
// charged; it will be, when they end, and the key will wait it off — and R
// the refunds made in (a, b] for requests admitted before a (a reservation
// returns its unused part when its request ends). A window of length
// Window admits at most Limit + Burst + X + R. Both are tested as
// properties (settle_test.go), and every decision against an exact model of
// a bucket that may go below zero.
//
// # Bounds
//
// |delta| is at most MaxSettle, and a charge may leave a key in debt for at
// most MaxDebtWait (and not past the latest instant, in 2157): beyond
// either, Settle returns ErrSettleRange and nothing is charged. A refund
// within MaxSettle never fails on range.
//
// # The window algorithms do not settle
//
// A fixed_window or sliding_window counter and a sliding_log hold at most
// Limit per window, and forget what they hold when it leaves the window: an
// excess beyond the window's room could not be carried into later windows,
// only dropped. Dating it into a later window (as the buckets date a debt)
// does not help: Decide decides a state dated in the future as of that
// instant, so requests before it would be admitted into the later window's
// room early, instead of waiting.

// MaxSettle is the largest |delta| Settle accepts (1000 × MaxLimit).
const MaxSettle = 1000 * MaxLimit

// MaxDebtWait is the longest a charge may leave a key in debt: the wait,
// from the settlement, until its balance is back to zero (MaxFillTime,
// 100 × 366 days).
const MaxDebtWait = MaxFillTime

// ErrSettleRange is returned by Settle when |delta| > MaxSettle, or when
// the charge would leave the key in debt for longer than MaxDebtWait or
// past the latest instant. Nothing is charged.
var ErrSettleRange = errors.New("settlement out of range")

// ErrSettleRate is returned by Settle of a bucket that refills more than
// one cost unit per nanosecond (Limit > Window in nanoseconds), which
// cannot hold a debt exactly (see SettlesWith).
var ErrSettleRate = errors.New("settlement needs a rate of at most one cost unit per nanosecond")

// Settler is a Limiter that can settle a reservation: token_bucket and
// leaky_bucket implement it (AsSettler).
type Settler interface {
	Limiter
	// Settle applies delta = actual − reserved cost of a request admitted
	// earlier to state at now (Unix nanoseconds), and appends the new
	// state to dst: delta > 0 charges it even below zero, delta < 0
	// refunds it up to fresh, delta == 0 copies state. See the package's
	// settle.go for the semantics and the guarantee. A corrupt or foreign
	// state yields an error wrapping ErrCorruptState; |delta| > MaxSettle
	// or a debt beyond MaxDebtWait, ErrSettleRange; a bucket faster than
	// one unit per nanosecond, ErrSettleRate. On an error nothing is
	// appended. It never allocates when dst has capacity for MaxStateSize
	// bytes; dst may be state[:0] but must not otherwise overlap state.
	Settle(dst, state []byte, now, delta int64) (newState []byte, err error)
}

// AsSettler returns l as a Settler when it settles exactly: its algorithm
// settles and its rate allows it (SettlesWith).
func AsSettler(l Limiter) (Settler, bool) {
	s, ok := l.(Settler)
	if !ok {
		return nil, false
	}
	if ok, _ := SettlesWith(l.Kind(), l.Params()); !ok {
		return nil, false
	}
	return s, true
}

// Settles reports whether algorithm k can settle reservations (Settler),
// and if not why, in a sentence for a configuration error. A bucket also
// needs a rate of at most one unit per nanosecond: see SettlesWith.
func Settles(k Kind) (bool, string) {
	const use = ": use token_bucket or leaky_bucket"
	switch k {
	case TokenBucket, LeakyBucket:
		return true, ""
	case FixedWindow:
		return false, "fixed_window holds at most limit per window and forgets it when the window rolls: " +
			"an excess beyond the window's room could not be charged to later windows, only dropped" + use
	case SlidingWindow:
		return false, "sliding_window holds at most limit per window in each counter and forgets it two windows later: " +
			"an excess beyond the window's room could not be charged to later windows, only dropped" + use
	case SlidingLog:
		return false, "sliding_log holds at most limit entries, each leaving the window one window after its admission: " +
			"an excess beyond the window's room could not be charged to later windows, only dropped" + use
	}
	return false, "unknown algorithm"
}

// SettlesWith is Settles for k with parameters p: a token_bucket or
// leaky_bucket settles exactly when it refills at most one cost unit per
// nanosecond (Limit <= Window in nanoseconds), so that a key in debt is
// held below one unit up to the instant its debt is paid back.
func SettlesWith(k Kind, p Params) (bool, string) {
	if ok, why := Settles(k); !ok {
		return false, why
	}
	if p.Limit > int64(p.Window) {
		return false, k.String() + " settles only at a rate of at most one cost unit per nanosecond (limit <= window in ns): " +
			"limit " + strconv.FormatInt(p.Limit, 10) + " per " + p.Window.String() + " refills more than one unit in a nanosecond, " +
			"so a key in debt could not be held until it is paid back"
	}
	return true, ""
}

// settleLevel applies delta to level, the key's level at now in scaled
// units (ns × Limit: one cost unit is Window of them, the bucket holds
// Burst × Window), which may exceed the bucket when the key is in debt. It
// returns the new level at now and the instant from which it is at most
// Burst × Window (now unless the key is in debt afterwards): the state's
// last instant.
func (c *common) settleLevel(level u128, now, delta int64) (u128, int64, error) {
	if delta > 0 {
		level = level.add(mul(uint64(delta), c.window))
	} else if g := mul(uint64(-delta), c.window); level.less(g) {
		level = u128{}
	} else {
		level = level.sub(g)
	}
	capacity := mul(c.burst, c.window)
	if !capacity.less(level) {
		return level, now, nil
	}
	// In debt: the level drains to the bucket's at ⌈excess / Limit⌉ ns. A
	// refund's is never later than the state's last instant was.
	wait, ok := level.sub(capacity).divCeil(c.limit)
	if delta > 0 && (!ok || wait > uint64(MaxDebtWait) || wait > uint64(maxTime-now)) {
		return u128{}, 0, ErrSettleRange
	}
	return level, now + int64(wait), nil
}

// checkSettle validates delta and the rate.
func (c *common) checkSettle(delta int64) error {
	if c.limit > c.window {
		return ErrSettleRate
	}
	if delta > MaxSettle || delta < -MaxSettle {
		return ErrSettleRange
	}
	return nil
}

func (l *tokenBucket) Settle(dst, state []byte, now, delta int64) ([]byte, error) {
	if err := l.checkSettle(delta); err != nil {
		return dst, err
	}
	n, r, eff, err := l.load(state, now)
	if err != nil {
		return dst, err
	}
	if delta == 0 || (delta < 0 && len(state) == 0) { // a fresh key stays fresh
		return append(dst, state...), nil
	}
	now = clampNow(now)
	// The level at now: Burst − tokens at eff, plus the refill from now to
	// eff when the state's last instant is later than now.
	level := mul(l.burst, l.window).sub(mul(n, l.window).add64(r)).add(mul(uint64(eff-now), l.limit))
	level, last, err := l.settleLevel(level, now, delta)
	if err != nil {
		return dst, err
	}
	// Tokens at last, in 1/Window units: Burst × Window − the level then,
	// which is below Limit <= Window when the key is in debt (n = 0).
	v := mul(l.burst, l.window).sub(level.sub(mul(uint64(last-now), l.limit)))
	n, r, _ = v.div(l.window)
	dst = appendHeader(dst, TokenBucket)
	dst = appendU64(dst, uint64(last))
	dst = appendU64(dst, n)
	dst = appendU64(dst, r)
	return dst, nil
}

func (l *leakyBucket) Settle(dst, state []byte, now, delta int64) ([]byte, error) {
	if err := l.checkSettle(delta); err != nil {
		return dst, err
	}
	_, _, eff, level, err := l.load(state, now)
	if err != nil {
		return dst, err
	}
	if delta == 0 || (delta < 0 && len(state) == 0) {
		return append(dst, state...), nil
	}
	now = clampNow(now)
	level = level.add(mul(uint64(eff-now), l.limit)) // the level at now
	level, last, err := l.settleLevel(level, now, delta)
	if err != nil {
		return dst, err
	}
	// TAT = now + level / Limit, exactly; the level at last is at most
	// Burst × Window, as load requires.
	q, frac, _ := level.div(l.limit) // fits: <= MaxDebtWait + MaxFillTime, or the state's TAT − now
	dst = appendHeader(dst, LeakyBucket)
	dst = appendU64(dst, uint64(now+int64(q)))
	dst = appendU64(dst, frac)
	dst = appendU64(dst, uint64(last))
	return dst, nil
}

// SettleCapped is Settle, except that a charge whose debt would be deeper than a state can
// hold (beyond MaxDebtWait, or past the latest instant) charges the deepest debt it can
// instead of failing: an over-use is never dropped, only bounded at a wait of a century. It
// returns the new state and the delta it applied. dst must not overlap state.
func SettleCapped(s Settler, dst, state []byte, now, delta int64) ([]byte, int64, error) {
	out, err := s.Settle(dst, state, now, delta)
	if err == nil || delta <= 0 || delta > MaxSettle || !errors.Is(err, ErrSettleRange) {
		return out, delta, err
	}
	// Settle(lo) succeeds (0 copies the state), Settle(hi) fails on range: the largest
	// charge that fits is found by bisection (at most 40 steps for MaxSettle).
	lo, hi := int64(0), delta
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		_, err := s.Settle(dst, state, now, mid)
		switch {
		case err == nil:
			lo = mid
		case errors.Is(err, ErrSettleRange):
			hi = mid
		default:
			return dst, 0, err
		}
	}
	out, err = s.Settle(dst, state, now, lo)
	return out, lo, err
}
