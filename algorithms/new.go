package algorithms

import (
	"errors"
	"math"
	"strconv"
	"time"
)

// Bounds on Params. They keep every intermediate value of every algorithm
// inside 64-bit integers (128-bit where a product needs it), so no decision
// can overflow.
const (
	// MaxLimit is the largest Limit (and Burst) New accepts.
	MaxLimit = 1_000_000_000
	// MaxWindow is the longest Window New accepts (366 days).
	MaxWindow = 366 * 24 * time.Hour
	// MaxSlidingLogLimit is the largest Limit New accepts for SlidingLog:
	// its state holds one entry per admitted request in the window, so its
	// size grows with Limit (at most 7 bytes per entry).
	MaxSlidingLogLimit = 10_000
	// MaxFillTime bounds Burst × Window / Limit, the time an empty token or
	// leaky bucket takes to refill (100 × 366 days).
	MaxFillTime = 100 * MaxWindow
)

// maxTime is the latest instant (Unix nanoseconds, in 2157) the algorithms
// work with; later instants are treated as maxTime, earlier than the epoch as
// 0. It leaves room for maxTime + MaxFillTime + a few windows without
// overflow.
const maxTime = math.MaxInt64 - int64(MaxFillTime) - 4*int64(MaxWindow)

// ErrInvalidCost is returned by Decide when cost < 1.
var ErrInvalidCost = errors.New("cost must be at least 1")

// ParamError is the error New returns for parameters out of range. Field
// is the parameter's configuration name ("limit", "window", "burst",
// "algorithm"); Error() is a short user-facing sentence such as
// "limit must be at most 10000 for sliding_log".
type ParamError struct {
	Field  string
	Reason string
}

func (e *ParamError) Error() string { return e.Field + " " + e.Reason }

// New returns the Limiter of kind k for p, after validating p:
// 1 <= Limit <= MaxLimit (MaxSlidingLogLimit for SlidingLog),
// 0 < Window <= MaxWindow, 0 <= Burst <= MaxLimit, and for the buckets
// Burst × Window / Limit <= MaxFillTime. Burst 0 means Limit; the
// window-based algorithms have no burst and report Burst == Limit.
func New(k Kind, p Params) (Limiter, error) {
	switch k {
	case TokenBucket, LeakyBucket, FixedWindow, SlidingLog, SlidingWindow:
	default:
		return nil, &ParamError{"algorithm", "is unknown: " + strconv.Itoa(int(k))}
	}
	if p.Limit < 1 {
		return nil, &ParamError{"limit", "must be at least 1"}
	}
	if p.Limit > MaxLimit {
		return nil, &ParamError{"limit", "must be at most " + strconv.Itoa(MaxLimit)}
	}
	if k == SlidingLog && p.Limit > MaxSlidingLogLimit {
		return nil, &ParamError{"limit", "must be at most " + strconv.Itoa(MaxSlidingLogLimit) + " for sliding_log"}
	}
	if p.Window <= 0 {
		return nil, &ParamError{"window", "must be positive"}
	}
	if p.Window > MaxWindow {
		return nil, &ParamError{"window", "must be at most 366d"}
	}
	if p.Burst < 0 {
		return nil, &ParamError{"burst", "must not be negative"}
	}
	if p.Burst > MaxLimit {
		return nil, &ParamError{"burst", "must be at most " + strconv.Itoa(MaxLimit)}
	}
	if p.Burst == 0 {
		p.Burst = p.Limit
	}
	c := common{p: p, limit: uint64(p.Limit), window: uint64(p.Window), burst: uint64(p.Burst)}
	switch k {
	case TokenBucket, LeakyBucket:
		fill, ok := mul(c.burst, c.window).divCeil(c.limit)
		if !ok || fill > uint64(MaxFillTime) {
			return nil, &ParamError{"burst", "is too large for this limit and window: refilling it would take more than 100 years"}
		}
		if k == TokenBucket {
			return &tokenBucket{c}, nil
		}
		return &leakyBucket{c}, nil
	}
	c.p.Burst = c.p.Limit
	c.burst = c.limit
	switch k {
	case FixedWindow:
		return &fixedWindow{c}, nil
	case SlidingWindow:
		return &slidingWindow{c}, nil
	}
	return &slidingLog{c}, nil
}

// common holds the validated parameters shared by every limiter.
type common struct {
	p                    Params
	limit, window, burst uint64
}

func (c *common) Params() Params { return c.p }

// clampNow maps now into [0, maxTime].
func clampNow(now int64) int64 {
	if now < 0 {
		return 0
	}
	if now > maxTime {
		return maxTime
	}
	return now
}

// tooCostly is the decision for a cost that can never be admitted (above
// the capacity): denied, with RetryAfter = Window as a safe back-off.
func (c *common) tooCostly(remaining int64, resetAfter time.Duration) Decision {
	return Decision{Limit: int64(c.burst), Remaining: remaining, ResetAfter: resetAfter, RetryAfter: c.p.Window}
}

// late converts a wait measured from the effective time (which is later than
// now when the clock went backwards) into a wait measured from now, so that
// a caller retrying at now+wait on its own clock is on time. Zero stays zero.
func late(wait time.Duration, eff, now int64) time.Duration {
	if wait <= 0 {
		return wait
	}
	return wait + time.Duration(eff-clampNow(now))
}
