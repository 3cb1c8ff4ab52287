// Package algorithms implements the five rate-limiting algorithms of sluice as
// pure functions over a compact binary state.
//
// Nothing in this package reads a clock: the time is always an argument
// (Unix nanoseconds), so every behaviour is testable on fixed instants and the
// same code runs in the Wasm guest, in the simulator and in tests. The state of
// one key is a short byte slice (the bytes stored in Proxy-Wasm shared data);
// an empty state means "a key never seen". This package imports only the
// standard library.
//
// All arithmetic is exact integer arithmetic (128-bit where a product needs
// it): no floating point, no rounding inside an accumulator. New bounds the
// parameters (MaxLimit, MaxWindow, MaxFillTime, MaxSlidingLogLimit) so that
// nothing can overflow; instants are taken in [0, ~5.9e18] ns (until 2157),
// earlier ones as 0 and later ones as that bound.
//
// Encoded states start with a format version byte and the Kind byte:
//
//	token_bucket    26 bytes  last admission, whole tokens, token fraction
//	leaky_bucket    26 bytes  theoretical arrival time (ns + fraction), last admission
//	fixed_window    18 bytes  window start, count
//	sliding_window  26 bytes  current window start, previous count, current count
//	sliding_log     11 bytes, then w bytes per request (cost unit) admitted
//	                in the window: w = 4 up to a 2.1 s window, 5 up to
//	                9 min, 6 up to 1.6 days, 7 beyond (at most 11 + w × Limit)
//	concurrency     3 bytes, then 20 per holder: holder, slots, lease expiry
//	                (concurrency.go: an in-flight limit, not a rate)
//
// Token and leaky bucket also settle token budgets (settle.go): a request's
// actual cost, known after it, is charged against its reservation — a refund
// up to fresh, an excess below zero that later requests wait off.
package algorithms

import (
	"errors"
	"time"
)

// Kind names an algorithm. The zero Kind is invalid.
type Kind uint8

// The five algorithms. Their numeric values are part of the state format
// (the second byte of every encoded state) and must never change.
const (
	TokenBucket   Kind = 1
	LeakyBucket   Kind = 2
	FixedWindow   Kind = 3
	SlidingLog    Kind = 4
	SlidingWindow Kind = 5
)

// Kinds lists every algorithm in a stable order.
var Kinds = [...]Kind{TokenBucket, LeakyBucket, FixedWindow, SlidingLog, SlidingWindow}

// String returns the configuration name of k ("token_bucket", ...).
func (k Kind) String() string {
	switch k {
	case TokenBucket:
		return "token_bucket"
	case LeakyBucket:
		return "leaky_bucket"
	case FixedWindow:
		return "fixed_window"
	case SlidingLog:
		return "sliding_log"
	case SlidingWindow:
		return "sliding_window"
	case Concurrency:
		return "concurrency"
	}
	return "unknown"
}

// ParseKind maps a configuration name to its Kind.
func ParseKind(s string) (Kind, bool) {
	for _, k := range Kinds {
		if k.String() == s {
			return k, true
		}
	}
	return 0, false
}

// Params are the numbers a limiter is built from.
type Params struct {
	// Limit is the number of requests (cost units) admitted per Window.
	Limit int64
	// Window is the period Limit applies to.
	Window time.Duration
	// Burst is the capacity of the token bucket and leaky bucket; 0 means Limit.
	// The window-based algorithms ignore it.
	Burst int64
}

// Decision is the outcome of one Decide call. Every field is exact.
type Decision struct {
	// Allowed reports whether the request is admitted. When false the state
	// returned by Decide is equivalent to the input state: a denied request
	// is never charged.
	Allowed bool
	// Limit is the number of requests the key may make per window (the
	// bucket capacity for token and leaky bucket).
	Limit int64
	// Remaining is how many more requests of cost 1 would be admitted right
	// now, after this decision took effect. Never negative.
	Remaining int64
	// ResetAfter is how long until the key is back to its full quota
	// (Remaining == Limit) if no further requests arrive.
	ResetAfter time.Duration
	// RetryAfter is, when Allowed is false, the shortest wait after which the
	// same request (same cost) would be admitted; zero when Allowed. A cost
	// above the capacity (Limit, or Burst for the buckets) can never be
	// admitted: such a request is denied with RetryAfter equal to the Window,
	// as a back-off.
	//
	// ResetAfter and RetryAfter are measured from the now passed to Decide:
	// if the clock went backwards (now is before the time recorded in the
	// state) they include the difference, so retrying at now+RetryAfter on
	// the same clock is admitted, and 1 ns earlier is not.
	RetryAfter time.Duration
	// Delay is, for an admission by Shaper.DecideDelay, how long the
	// request must be held before it goes on: the wait until its slot.
	// Zero from Decide, and for a request that fits now.
	Delay time.Duration
}

// Limiter decides requests for one rule. A Limiter holds only its immutable
// parameters; it is safe for concurrent use. The state of each key is
// owned by the caller.
type Limiter interface {
	// Kind returns the algorithm.
	Kind() Kind
	// Params returns the (normalised) parameters.
	Params() Params
	// Decide evaluates a request of the given cost (>= 1) at now (Unix
	// nanoseconds) against state, and appends the state to store if the
	// request is admitted to dst. It never allocates when dst has capacity
	// for MaxStateSize bytes. A corrupt or foreign state yields an error
	// wrapping ErrCorruptState; a cost < 1 yields ErrInvalidCost. A now
	// earlier than the time recorded in the state is treated as that
	// recorded time (the clock going backwards never unblocks a key and
	// never panics).
	//
	// When the request is denied, the bytes appended are a copy of state
	// (nothing is charged; the caller need not write anything). dst may be
	// state[:0] (the state is read before it is overwritten) but must not
	// otherwise overlap state.
	Decide(dst, state []byte, now, cost int64) (newState []byte, d Decision, err error)
	// Idle reports whether state is equivalent to a fresh key at now (it
	// could be dropped without changing any future decision). A corrupt
	// state, or one recorded after now, is not idle.
	Idle(state []byte, now int64) bool
	// Used is how far state is from fresh at now, in cost units: the
	// capacity (Decision.Limit) minus the Remaining a cost-1 request would
	// see — so 0 for a fresh or idle key, and exactly the extra cost-1
	// requests the key would be admitted right now if its state were
	// forgotten. It is what a slot table weighs when it must evict a key
	// (the least-used goes). A corrupt state counts as 0: a caller that
	// cannot decode a state decides the key as fresh.
	Used(state []byte, now int64) int64
	// MaxStateSize is the largest encoded state this limiter produces.
	MaxStateSize() int
}

// ErrCorruptState is wrapped by every state-decoding error.
var ErrCorruptState = errors.New("corrupt rate-limit state")
