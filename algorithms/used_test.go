package algorithms

import (
	"testing"
	"time"
)

// Used is the distance from fresh: Limit − Remaining of a cost-1 decision
// at the same instant, 0 for a fresh or idle state, and exactly what
// forgetting the state gains right now — a fresh key is admitted Limit
// cost-1 requests at one instant, the state Limit − Used of them. Checked
// for every algorithm on random workloads, with the clock also stepping
// backwards.
func TestUsedIsDistanceFromFresh(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		p := Params{Limit: 3 + int64(seed)*2, Window: time.Duration(seed) * 900 * time.Millisecond, Burst: 4 + int64(seed)}
		forEachKind(t, p, func(t *testing.T, l Limiter) {
			if u := l.Used(nil, t0); u != 0 {
				t.Fatalf("Used(fresh) = %d", u)
			}
			var state []byte
			for i, r := range workload(seed, 600, p.Window, 3, p.Window/4) {
				// Probe at the request's instant and a little later.
				for _, at := range []int64{r.at, r.at + int64(p.Window)/3} {
					u := l.Used(state, at)
					_, d := decide(t, l, state, at, 1)
					want := d.Limit - d.Remaining
					if d.Allowed {
						want--
					}
					if u != want || u < 0 || u > d.Limit {
						t.Fatalf("request %d at %d: Used = %d, want Limit %d − Remaining %d = %d", i, at, u, d.Limit, d.Remaining, want)
					}
					if l.Idle(state, at) && u != 0 {
						t.Fatalf("request %d: idle state with Used %d", i, u)
					}
					if i%50 == 0 { // the gain, counted: admissions at one instant
						if got, fresh := burstAt(t, l, state, at), burstAt(t, l, nil, at); fresh-got != u {
							t.Fatalf("request %d at %d: state admits %d, fresh %d, Used %d", i, at, got, fresh, u)
						}
					}
				}
				state, _ = decide(t, l, state, r.at, r.cost)
			}
		})
	}
}

// burstAt counts the cost-1 requests state admits at one instant.
func burstAt(t *testing.T, l Limiter, state []byte, at int64) int64 {
	var n int64
	for {
		out, d := decide(t, l, state, at, 1)
		if !d.Allowed {
			return n
		}
		state = out
		n++
	}
}

// A corrupt state counts as fresh: the filter decides it as a new key.
func TestUsedCorruptIsZero(t *testing.T) {
	forEachKind(t, Params{Limit: 5, Window: time.Second}, func(t *testing.T, l Limiter) {
		for _, s := range [][]byte{{1}, {9, byte(l.Kind())}, {stateVersion, byte(l.Kind()), 1, 2, 3}} {
			if u := l.Used(s, t0); u != 0 {
				t.Errorf("Used(%x) = %d", s, u)
			}
		}
	})
}
