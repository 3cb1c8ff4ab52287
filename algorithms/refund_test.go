package algorithms

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func refund(tb testing.TB, l Limiter, state []byte, at, now, cost int64) []byte {
	tb.Helper()
	r, ok := AsRefunder(l)
	if !ok {
		tb.Fatalf("%v is not a Refunder", l.Kind())
	}
	out, err := r.Refund(make([]byte, 0, l.MaxStateSize()), state, at, now, cost)
	if err != nil {
		tb.Fatalf("Refund(%x, %d, %d, %d): %v", state, at, now, cost, err)
	}
	return out
}

// The login scenario: 5 failed attempts per 15 minutes. Five failures lock
// the key for the rest of the window whatever comes next; a success given
// back before the lock-out leaves room; the next window opens again.
func TestRefundFixedWindowLogin(t *testing.T) {
	const w = 15 * time.Minute
	l := mustNew(t, FixedWindow, Params{Limit: 5, Window: w})
	var st []byte
	now := t0 + int64(time.Minute)
	// Ten successes, each admitted then given back: unlimited.
	for i := 0; i < 10; i++ {
		var d Decision
		st, d = decide(t, l, st, now, 1)
		if !d.Allowed {
			t.Fatalf("success %d refused", i)
		}
		st = refund(t, l, st, now, now+int64(time.Millisecond), 1)
		now += int64(time.Second)
	}
	if len(st) != 0 {
		t.Fatalf("after the give-backs the key is not fresh: %x", st)
	}
	for i := 0; i < 5; i++ {
		var d Decision
		st, d = decide(t, l, st, now, 1)
		if !d.Allowed {
			t.Fatalf("failure %d refused", i)
		}
	}
	_, d := decide(t, l, st, now+int64(time.Second), 1)
	if d.Allowed {
		t.Fatal("sixth attempt admitted")
	}
	if want := time.Duration(t0 + int64(w) - now - int64(time.Second)); d.RetryAfter != want {
		t.Fatalf("RetryAfter %v, want %v (the window's end)", d.RetryAfter, want)
	}
	_, d = decide(t, l, st, t0+int64(w)-1, 1)
	if d.Allowed {
		t.Fatal("admitted 1 ns before the window's end")
	}
	_, d = decide(t, l, st, t0+int64(w), 1)
	if !d.Allowed {
		t.Fatal("refused at the window's end")
	}
	// A give-back after the window rolled changes nothing.
	if out := refund(t, l, st, now, t0+int64(w)+1, 1); !bytes.Equal(out, st) {
		t.Fatalf("a give-back into a gone window changed the state: %x -> %x", st, out)
	}
}

// A sliding_window give-back is exact in the admission's window and in the
// next one: the state afterwards decides exactly as one that never admitted
// the request.
func TestRefundSlidingWindowExact(t *testing.T) {
	const w = int64(10 * time.Second)
	l := mustNew(t, SlidingWindow, Params{Limit: 7, Window: time.Duration(w)})
	rng := rand.New(rand.NewPCG(3, 9))
	for trial := 0; trial < 3000; trial++ {
		var st []byte
		now := t0 + rng.Int64N(w)
		for i, n := 0, rng.IntN(12); i < n; i++ {
			st, _ = decide(t, l, st, now, 1+rng.Int64N(2))
			now += rng.Int64N(w / 2)
		}
		without := append([]byte(nil), st...)
		at := now
		with, d := decide(t, l, st, at, 1)
		if !d.Allowed {
			continue
		}
		back := at + rng.Int64N(3*w)
		got := refund(t, l, with, at, back, 1)
		for k := 0; k < 5; k++ {
			q := back + rng.Int64N(2*w)
			for c := int64(1); c <= 2; c++ {
				_, dg := decide(t, l, got, q, c)
				_, dw := decide(t, l, without, q, c)
				if dg != dw {
					t.Fatalf("trial %d: admitted at %d, given back at %d (+%d windows); at %d cost %d: %+v, never admitted: %+v",
						trial, at-t0, back-t0, (windowOf(back, uint64(w))-windowOf(at, uint64(w)))/w, q-t0, c, dg, dw)
				}
			}
		}
	}
}

// Give-backs never exceed what the counter holds, refuse a bad cost and read
// a corrupt state as corrupt; sliding_log and the buckets do not give back.
func TestRefundEdges(t *testing.T) {
	p := Params{Limit: 3, Window: time.Second}
	for _, k := range []Kind{FixedWindow, SlidingWindow} {
		l := mustNew(t, k, p)
		r, _ := AsRefunder(l)
		st, _ := decide(t, l, nil, t0, 1)
		if out := refund(t, l, st, t0, t0, 2); !bytes.Equal(out, st) {
			t.Fatalf("%v: a give-back of 2 from a counter of 1 changed it", k)
		}
		if _, err := r.Refund(nil, st, t0, t0, 0); !errors.Is(err, ErrInvalidCost) {
			t.Fatalf("%v: cost 0: %v", k, err)
		}
		if _, err := r.Refund(nil, []byte{1, 2, 3}, t0, t0, 1); !errors.Is(err, ErrCorruptState) {
			t.Fatalf("%v: corrupt state: %v", k, err)
		}
		if out := refund(t, l, nil, t0, t0, 1); len(out) != 0 {
			t.Fatalf("%v: a give-back to a fresh key wrote %x", k, out)
		}
		if out := refund(t, l, st, -5, -1, 1); !bytes.Equal(out, st) {
			t.Fatalf("%v: a give-back dated before the epoch changed the state", k)
		}
		if ok, _ := Refunds(k); !ok {
			t.Fatalf("Refunds(%v) = false", k)
		}
	}
	for _, k := range []Kind{SlidingLog, TokenBucket, LeakyBucket} {
		if _, ok := AsRefunder(mustNew(t, k, p)); ok {
			t.Fatalf("%v is a Refunder", k)
		}
		if ok, why := Refunds(k); ok || why == "" {
			t.Fatalf("Refunds(%v) = %v, %q", k, ok, why)
		}
	}
}

// A sliding_window whose current counter was given back to 0 keeps its
// previous counter's weight.
func TestRefundSlidingWindowZeroCurrent(t *testing.T) {
	w := int64(time.Second)
	l := mustNew(t, SlidingWindow, Params{Limit: 4, Window: time.Second})
	var st []byte
	for i := 0; i < 4; i++ {
		st, _ = decide(t, l, st, t0, 1)
	}
	st, _ = decide(t, l, st, t0+w, 1) // refused: prev 4 weighs it all
	st2, d := decide(t, l, st, t0+w+w/2, 1)
	if !d.Allowed {
		t.Fatal("half a window on, 2 of 4 should be free")
	}
	st2 = refund(t, l, st2, t0+w+w/2, t0+w+w/2, 1)
	if l.Idle(st2, t0+w+w/2) {
		t.Fatal("the previous window's count was forgotten")
	}
	if u := l.Used(st2, t0+w+w/2); u != 2 {
		t.Fatalf("Used = %d, want 2 (prev 4 at half weight)", u)
	}
}
