package algorithms

import (
	"encoding/binary"
	"errors"
	"time"
)

// Concurrency is the kind of an in-flight limit: at most Limit requests of
// one key at once. It is not one of Kinds (the rate algorithms): it has no
// window, and a request gives its slot back when it ends (Release).
const Concurrency Kind = 6

// The state of a concurrency key lists who holds its slots: one entry per
// holder (a worker's root context), each with the slots it holds and when
// its lease on them expires. A holder renews its leases while its requests
// live (Renew); an entry past its expiry belongs to a holder that can no
// longer release (a VM that trapped or was replaced) and is dropped by the
// next write, its slots reclaimed.
//
//	[0]    format version (concVersion)
//	[1]    Concurrency
//	[2]    n, the number of entries (at most MaxConcurrencyHolders)
//	[3:]   n × 20 bytes: holder (8), slots (4), expiry (8, Unix ns; 0 = never)
const (
	concVersion    = 1
	concHeader     = 3
	concEntry      = 20
	concNeverLapse = 0
)

// MaxConcurrencyHolders bounds the holders one key's state lists at once:
// more workers than that holding slots of one key at the same instant is
// refused as a store error (ErrHoldersFull).
const MaxConcurrencyHolders = 64

// ErrHoldersFull is returned by Decide when a new holder would be the
// (MaxConcurrencyHolders+1)-th live holder of a key.
var ErrHoldersFull = errors.New("concurrency: too many holders of one key")

// ConcurrencyOp is a write of a holder's slots other than an acquire.
type ConcurrencyOp uint8

const (
	ConcurrencyRelease ConcurrencyOp = iota + 1 // give slots back (Release)
	ConcurrencyRenew                            // renew the lease (Renew)
)

// ConcurrencyLimiter decides in-flight admissions for one holder. Its
// parameters are immutable; Bind gives the limiter of one holder.
type ConcurrencyLimiter struct {
	limit  int64
	retry  time.Duration // the Retry-After hint of a refusal
	holder uint64
	ttl    time.Duration // a lease's length; 0: leases never lapse
}

// NewConcurrency returns the in-flight limiter of limit (1..MaxLimit) with
// retry as the wait a refusal suggests (at least 1 ms).
func NewConcurrency(limit int64, retry time.Duration) (*ConcurrencyLimiter, error) {
	if limit < 1 || limit > MaxLimit {
		return nil, &ParamError{"limit", "must be 1..1000000000"}
	}
	if retry < time.Millisecond || retry > MaxWindow {
		return nil, &ParamError{"retry_after", "must be 1ms..366d"}
	}
	return &ConcurrencyLimiter{limit: limit, retry: retry}, nil
}

// Bind returns the limiter of holder, whose leases last ttl from each
// acquire or renewal (0: never lapse, for a holder that cannot disappear
// without the state going with it).
func (c *ConcurrencyLimiter) Bind(holder uint64, ttl time.Duration) *ConcurrencyLimiter {
	b := *c
	b.holder, b.ttl = holder, ttl
	return &b
}

// Kind implements Limiter.
func (c *ConcurrencyLimiter) Kind() Kind { return Concurrency }

// Params implements Limiter: Limit and Burst are the limit, Window the
// Retry-After hint.
func (c *ConcurrencyLimiter) Params() Params {
	return Params{Limit: c.limit, Window: c.retry, Burst: c.limit}
}

// RetryAfter is the hint a refusal carries.
func (c *ConcurrencyLimiter) RetryAfter() time.Duration { return c.retry }

// MaxStateSize implements Limiter.
func (c *ConcurrencyLimiter) MaxStateSize() int {
	return concHeader + MaxConcurrencyHolders*concEntry
}

// concState is a decoded view of a state.
type concState struct{ b []byte }

func parseConc(state []byte) (concState, error) {
	if len(state) == 0 {
		return concState{}, nil
	}
	if len(state) < concHeader || state[0] != concVersion || Kind(state[1]) != Concurrency {
		return concState{}, corrupt("concurrency: bad header")
	}
	n := int(state[2])
	if n > MaxConcurrencyHolders || len(state) != concHeader+n*concEntry {
		return concState{}, corrupt("concurrency: bad length")
	}
	return concState{state[concHeader:]}, nil
}

func (s concState) n() int { return len(s.b) / concEntry }
func (s concState) at(i int) (holder uint64, slots int64, expiry int64) {
	e := s.b[i*concEntry:]
	return binary.LittleEndian.Uint64(e), int64(binary.LittleEndian.Uint32(e[8:])), int64(binary.LittleEndian.Uint64(e[12:]))
}

func concLive(expiry, now int64) bool { return expiry == concNeverLapse || expiry > now }

// census sums the slots held at now: by every live holder (inFlight), by
// this limiter's holder (mine, live or not), and in lapsed entries
// (lapsed).
func (c *ConcurrencyLimiter) census(s concState, now int64) (inFlight, mine, lapsed int64, holders int) {
	for i := 0; i < s.n(); i++ {
		h, k, exp := s.at(i)
		switch {
		case h == c.holder:
			mine = k
			inFlight += k
			holders++
		case concLive(exp, now):
			inFlight += k
			holders++
		default:
			lapsed += k
		}
	}
	return
}

// rewrite appends to dst the state s at now with this holder's entry set
// to slots (dropped at 0) and a fresh lease; lapsed entries of other
// holders are dropped.
func (c *ConcurrencyLimiter) rewrite(dst []byte, s concState, now, slots int64) []byte {
	start := len(dst)
	dst = append(dst, concVersion, byte(Concurrency), 0)
	n := 0
	for i := 0; i < s.n(); i++ {
		h, _, exp := s.at(i)
		if h == c.holder || !concLive(exp, now) {
			continue
		}
		dst = append(dst, s.b[i*concEntry:(i+1)*concEntry]...)
		n++
	}
	if slots > 0 {
		exp := int64(concNeverLapse)
		if c.ttl > 0 {
			exp = max(now, 0) + int64(c.ttl)
		}
		dst = binary.LittleEndian.AppendUint64(dst, c.holder)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(slots))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(exp))
		n++
	}
	dst[start+2] = byte(n)
	return dst
}

// Decide implements Limiter: it acquires cost slots for this holder at
// now if the live holders hold at most Limit − cost; the new state drops
// lapsed entries (Reclaimed says how many slots they held).
func (c *ConcurrencyLimiter) Decide(dst, state []byte, now, cost int64) ([]byte, Decision, error) {
	if cost < 1 {
		return append(dst, state...), Decision{}, ErrInvalidCost
	}
	s, err := parseConc(state)
	if err != nil {
		return append(dst, state...), Decision{}, err
	}
	inFlight, mine, _, holders := c.census(s, now)
	if cost > c.limit || inFlight > c.limit-cost {
		return append(dst, state...), Decision{Limit: c.limit, ResetAfter: c.retry, RetryAfter: c.retry}, nil
	}
	if mine == 0 && holders >= MaxConcurrencyHolders {
		return append(dst, state...), Decision{}, ErrHoldersFull
	}
	rem := c.limit - inFlight - cost
	d := Decision{Allowed: true, Limit: c.limit, Remaining: rem}
	if rem == 0 {
		d.ResetAfter = c.retry
	}
	return c.rewrite(dst, s, now, mine+cost), d, nil
}

// Release appends to dst the state after this holder gives n slots back
// at now (never below 0). held is what the holder had before.
func (c *ConcurrencyLimiter) Release(dst, state []byte, now, n int64) (newState []byte, held int64, err error) {
	s, err := parseConc(state)
	if err != nil {
		return append(dst, state...), 0, err
	}
	_, mine, _, _ := c.census(s, now)
	return c.rewrite(dst, s, now, max(mine-n, 0)), mine, nil
}

// Renew appends to dst the state with this holder's lease renewed at now
// for slots (what it knows it holds).
func (c *ConcurrencyLimiter) Renew(dst, state []byte, now, slots int64) ([]byte, error) {
	s, err := parseConc(state)
	if err != nil {
		return append(dst, state...), err
	}
	return c.rewrite(dst, s, now, slots), nil
}

// Reclaimed is the number of slots that lapsed entries of other holders
// hold in state at now: what the next write of the state recovers.
func (c *ConcurrencyLimiter) Reclaimed(state []byte, now int64) int64 {
	s, err := parseConc(state)
	if err != nil {
		return 0
	}
	_, _, lapsed, _ := c.census(s, now)
	return lapsed
}

// InFlight is the number of slots live holders (this one included) hold
// in state at now.
func (c *ConcurrencyLimiter) InFlight(state []byte, now int64) int64 {
	s, err := parseConc(state)
	if err != nil {
		return 0
	}
	n, _, _, _ := c.census(s, now)
	return n
}

// Idle implements Limiter: no live holder holds a slot (a corrupt state
// is not idle).
func (c *ConcurrencyLimiter) Idle(state []byte, now int64) bool {
	s, err := parseConc(state)
	if err != nil {
		return false
	}
	n, _, _, _ := c.census(s, now)
	return n == 0
}

// Used implements Limiter: the slots live holders hold.
func (c *ConcurrencyLimiter) Used(state []byte, now int64) int64 { return c.InFlight(state, now) }

var _ Limiter = (*ConcurrencyLimiter)(nil)
