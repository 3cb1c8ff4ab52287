package algorithms

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

func mustShaper(tb testing.TB, k Kind, p Params) Shaper {
	tb.Helper()
	s, ok := AsShaper(mustNew(tb, k, p))
	if !ok {
		tb.Fatalf("%v is not a Shaper", k)
	}
	return s
}

func decideDelay(tb testing.TB, s Shaper, state []byte, now, cost int64, max time.Duration) ([]byte, Decision) {
	tb.Helper()
	out, d, err := s.DecideDelay(make([]byte, 0, s.MaxStateSize()), state, now, cost, max)
	if err != nil {
		tb.Fatalf("DecideDelay(%x, %d, %d, %v): %v", state, now, cost, max, err)
	}
	if d.Delay < 0 || d.Delay > max || (d.Delay > 0 && !d.Allowed) || (d.Allowed && d.RetryAfter != 0) {
		tb.Fatalf("decision out of range: %+v (max %v)", d, max)
	}
	if d.Remaining < 0 || d.Remaining > d.Limit || d.ResetAfter < d.Delay {
		tb.Fatalf("decision out of range: %+v", d)
	}
	return out, d
}

// The check of the shaping issue, on the algorithm alone: a burst of 50 at
// 10/s with burst 1 and a 3 s queue. 31 are admitted, spaced 100 ms exactly
// (the first at once, the last 3 s later); the other 19 are refused with
// the wait until a retry would be queued.
func TestShapeBurstOf50(t *testing.T) {
	for _, k := range []Kind{LeakyBucket, TokenBucket} {
		t.Run(k.String(), func(t *testing.T) {
			s := mustShaper(t, k, Params{Limit: 10, Window: time.Second, Burst: 1})
			var state []byte
			admitted := 0
			for i := 0; i < 50; i++ {
				out, d := decideDelay(t, s, state, t0, 1, 3*time.Second)
				if !d.Allowed {
					if i < 31 {
						t.Fatalf("request %d denied: %+v", i, d)
					}
					if d.RetryAfter != 100*time.Millisecond {
						t.Fatalf("request %d: RetryAfter %v, want 100ms", i, d.RetryAfter)
					}
					if string(out) != string(state) {
						t.Fatalf("request %d: a denial changed the state", i)
					}
					continue
				}
				if want := time.Duration(i) * 100 * time.Millisecond; d.Delay != want {
					t.Fatalf("request %d: Delay %v, want %v", i, d.Delay, want)
				}
				admitted++
				state = out
			}
			if admitted != 31 {
				t.Fatalf("admitted %d, want 31", admitted)
			}
			// Retrying at the RetryAfter of the refused: queued for 3 s
			// exactly; 1 ns earlier, still refused.
			_, d := decideDelay(t, s, state, t0+int64(100*time.Millisecond)-1, 1, 3*time.Second)
			if d.Allowed {
				t.Fatalf("1 ns before RetryAfter: admitted %+v", d)
			}
			_, d = decideDelay(t, s, state, t0+int64(100*time.Millisecond), 1, 3*time.Second)
			if !d.Allowed || d.Delay != 3*time.Second {
				t.Fatalf("at RetryAfter: %+v, want admitted with Delay 3s", d)
			}
			if s.Idle(state, t0+int64(3*time.Second)) {
				t.Fatal("a state with a slot pending is idle")
			}
		})
	}
}

// A burst above the bucket's burst: the first Burst pass at once, the rest
// are queued one interval apart.
func TestShapeBurstThenQueue(t *testing.T) {
	for _, k := range []Kind{LeakyBucket, TokenBucket} {
		t.Run(k.String(), func(t *testing.T) {
			s := mustShaper(t, k, Params{Limit: 10, Window: time.Second, Burst: 5})
			var state []byte
			for i := 0; i < 12; i++ {
				out, d := decideDelay(t, s, state, t0, 1, time.Second)
				want := time.Duration(max(i-4, 0)) * 100 * time.Millisecond
				if !d.Allowed || d.Delay != want {
					t.Fatalf("request %d: %+v, want admitted with Delay %v", i, d, want)
				}
				state = out
			}
		})
	}
}

// maxDelay <= 0 is Decide, byte for byte.
func TestShapeNoDelayIsDecide(t *testing.T) {
	for _, k := range []Kind{LeakyBucket, TokenBucket} {
		s := mustShaper(t, k, Params{Limit: 3, Window: time.Second})
		var a, b []byte
		for i := 0; i < 6; i++ {
			now := t0 + int64(i)*int64(100*time.Millisecond)
			na, da := decide(t, s, a, now, 1)
			nb, db := decideDelay(t, s, b, now, 1, 0)
			if string(na) != string(nb) || da != db {
				t.Fatalf("%v request %d: Decide %+v %x, DecideDelay(0) %+v %x", k, i, da, na, db, nb)
			}
			a, b = na, nb
		}
	}
}

// The property that makes it shaping: whatever the arrivals (several
// workers' requests interleaved on one state, costs 1..3), the requests
// released at their slots (now + Delay) form a sequence the meter admits —
// replayed through Decide in slot order, every one is admitted. So the
// upstream never sees more than the limit allows, in any interval — and the
// state after each is the meter's, byte for byte (slots are handed out in
// arrival order, so the replay's order is the decisions'). And a refused
// request's RetryAfter is exact.
func TestPropertyShapedReleasesFitTheMeter(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	for _, k := range []Kind{LeakyBucket, TokenBucket} {
		for round := 0; round < 200; round++ {
			p := Params{Limit: 1 + rng.Int64N(20), Window: time.Duration(1+rng.Int64N(3)) * time.Second, Burst: 1 + rng.Int64N(5)}
			s := mustShaper(t, k, p)
			maxDelay := time.Duration(1+rng.Int64N(3000)) * time.Millisecond
			type release struct {
				at, cost int64
				state    string // the state DecideDelay returned
			}
			var rel []release
			var state []byte
			now := t0
			for i := 0; i < 60; i++ {
				now += rng.Int64N(int64(200 * time.Millisecond))
				cost := 1 + rng.Int64N(3)
				out, d := decideDelay(t, s, state, now, cost, maxDelay)
				if !d.Allowed {
					if cost <= p.Burst {
						if _, d2 := decideDelay(t, s, state, now+int64(d.RetryAfter)-1, cost, maxDelay); d2.Allowed {
							t.Fatalf("%v %+v: admitted 1 ns before RetryAfter %v", k, p, d.RetryAfter)
						}
						if _, d2 := decideDelay(t, s, state, now+int64(d.RetryAfter), cost, maxDelay); !d2.Allowed {
							t.Fatalf("%v %+v: refused at RetryAfter %v: %+v", k, p, d.RetryAfter, d2)
						}
					}
					continue
				}
				state = out
				rel = append(rel, release{now + int64(d.Delay), cost, string(out)})
			}
			sort.SliceStable(rel, func(i, j int) bool { return rel[i].at < rel[j].at })
			var meter []byte
			for i, r := range rel {
				out, d := decide(t, s, meter, r.at, r.cost)
				if !d.Allowed {
					t.Fatalf("%v %+v max %v: release %d at +%v (cost %d) exceeds the meter: %+v",
						k, p, maxDelay, i, time.Duration(r.at-t0), r.cost, d)
				}
				if string(out) != r.state {
					t.Fatalf("%v %+v: release %d: the meter's state at the slot %x, the shaped state %x", k, p, i, out, r.state)
				}
				meter = out
			}
		}
	}
}

func TestShapes(t *testing.T) {
	for _, k := range Kinds {
		ok, why := Shapes(k)
		_, is := AsShaper(mustNew(t, k, Params{Limit: 5, Window: time.Second}))
		if ok != is || (ok == (why != "")) {
			t.Fatalf("%v: Shapes = %v %q, implements Shaper %v", k, ok, why, is)
		}
	}
}
