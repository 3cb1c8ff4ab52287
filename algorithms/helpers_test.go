package algorithms

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// t0 is the fixed instant every table starts from: midnight, so it is a
// multiple of every window used in the tables.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

func mustNew(tb testing.TB, k Kind, p Params) Limiter {
	tb.Helper()
	l, err := New(k, p)
	if err != nil {
		tb.Fatalf("New(%v, %+v): %v", k, p, err)
	}
	return l
}

// forEachKind runs f as a subtest for every algorithm with the same Params,
// the way uber-go/ratelimit runs each behaviour against every limiter.
func forEachKind(t *testing.T, p Params, f func(t *testing.T, l Limiter)) {
	t.Helper()
	for _, k := range Kinds {
		t.Run(k.String(), func(t *testing.T) { f(t, mustNew(t, k, p)) })
	}
}

// capacity is the largest cost l can ever admit.
func capacity(l Limiter) int64 { return l.Params().Burst }

// decide calls Decide with a fresh buffer of MaxStateSize capacity.
func decide(tb testing.TB, l Limiter, state []byte, now, cost int64) ([]byte, Decision) {
	tb.Helper()
	out, d, err := l.Decide(make([]byte, 0, l.MaxStateSize()), state, now, cost)
	if err != nil {
		tb.Fatalf("Decide(%x, %d, %d): %v", state, now, cost, err)
	}
	if len(out) > l.MaxStateSize() {
		tb.Fatalf("state of %d bytes exceeds MaxStateSize %d", len(out), l.MaxStateSize())
	}
	return out, d
}

// checkDecision asserts the invariants every decision satisfies, and for a
// denial the exactness of RetryAfter: retrying at now+RetryAfter is admitted
// and 1 ns earlier is not.
func checkDecision(tb testing.TB, l Limiter, state, out []byte, now, cost int64, d Decision) {
	tb.Helper()
	if d.Remaining < 0 || d.Remaining > d.Limit || d.ResetAfter < 0 || d.RetryAfter < 0 {
		tb.Fatalf("at %d cost %d: decision out of range: %+v", now, cost, d)
	}
	if d.Limit != capacity(l) {
		tb.Fatalf("Limit = %d, want %d", d.Limit, capacity(l))
	}
	if d.Allowed {
		if d.RetryAfter != 0 {
			tb.Fatalf("admitted with RetryAfter %v", d.RetryAfter)
		}
		return
	}
	if !bytes.Equal(out, state) {
		tb.Fatalf("denied request changed the state: %x -> %x", state, out)
	}
	if cost > capacity(l) {
		if d.RetryAfter != l.Params().Window {
			tb.Fatalf("cost above capacity: RetryAfter = %v, want the window", d.RetryAfter)
		}
		return
	}
	if d.RetryAfter <= 0 {
		tb.Fatalf("denied with RetryAfter %v", d.RetryAfter)
	}
	if _, e := decide(tb, l, state, now+int64(d.RetryAfter), cost); !e.Allowed {
		tb.Fatalf("at %d cost %d: denied again at RetryAfter %v: %+v", now, cost, d.RetryAfter, e)
	}
	if _, e := decide(tb, l, state, now+int64(d.RetryAfter)-1, cost); e.Allowed {
		tb.Fatalf("at %d cost %d: admitted 1ns before RetryAfter %v", now, cost, d.RetryAfter)
	}
}

// checkRemaining asserts Remaining is honest: exactly that many cost-1
// requests are admitted at the same instant, and not one more.
func checkRemaining(tb testing.TB, l Limiter, state []byte, now int64, d Decision) {
	tb.Helper()
	s := state
	for i := int64(0); i < d.Remaining; i++ {
		var e Decision
		s, e = decide(tb, l, s, now, 1)
		if !e.Allowed {
			tb.Fatalf("Remaining %d, but request %d at the same instant was denied", d.Remaining, i+1)
		}
	}
	if _, e := decide(tb, l, s, now, 1); e.Allowed {
		tb.Fatalf("Remaining %d, but one more request was admitted", d.Remaining)
	}
}

// step is one row of a table: a request of Cost at t0+At, and what must
// come out. Retry/Reset are checked when the row sets them (-1 skips).
type step struct {
	At        time.Duration
	Cost      int64
	Allowed   bool
	Remaining int64
	Retry     time.Duration
	Reset     time.Duration
}

func runSteps(t *testing.T, l Limiter, steps []step) {
	t.Helper()
	var state []byte
	for i, s := range steps {
		now := t0 + int64(s.At)
		out, d := decide(t, l, state, now, s.Cost)
		checkDecision(t, l, state, out, now, s.Cost, d)
		if d.Allowed != s.Allowed || d.Remaining != s.Remaining ||
			(s.Retry >= 0 && d.RetryAfter != s.Retry) || (s.Reset >= 0 && d.ResetAfter != s.Reset) {
			t.Fatalf("step %d (at %v cost %d): got %+v, want allowed=%v remaining=%d retry=%v reset=%v",
				i, s.At, s.Cost, d, s.Allowed, s.Remaining, s.Retry, s.Reset)
		}
		state = out
	}
}

// request is one element of a random workload.
type request struct{ at, cost int64 }

// workload returns n requests with seeded random gaps (often zero, mostly
// small against the window, sometimes longer than it) and costs (mostly 1,
// sometimes up to maxCost). back > 0 lets the clock step backwards by up to
// back nanoseconds now and then.
func workload(seed uint64, n int, window time.Duration, maxCost int64, back time.Duration) []request {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	reqs := make([]request, n)
	now := t0 + r.Int64N(int64(window))
	for i := range reqs {
		switch x := r.IntN(20); {
		case x < 6: // same instant
		case x < 18:
			now += r.Int64N(int64(window)/8 + 1)
		case x < 19:
			now += r.Int64N(2*int64(window) + 1)
		default:
			if back > 0 {
				now -= r.Int64N(int64(back) + 1)
			}
		}
		cost := int64(1)
		if r.IntN(5) == 0 {
			cost = 1 + r.Int64N(maxCost)
		}
		reqs[i] = request{now, cost}
	}
	return reqs
}

func isCorrupt(err error) bool { return errors.Is(err, ErrCorruptState) }
