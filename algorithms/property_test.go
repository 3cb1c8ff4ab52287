package algorithms

import (
	"testing"
	"time"
)

// admission is one admitted request.
type admission struct{ at, cost int64 }

func admitAll(t *testing.T, l Limiter, reqs []request) []admission {
	t.Helper()
	var state []byte
	var got []admission
	for _, r := range reqs {
		out, d := decide(t, l, state, r.at, r.cost)
		if d.Allowed {
			got = append(got, admission(r))
		}
		state = out
	}
	return got
}

// sliding_log never admits more than limit in any interval (t−window, t],
// checked by brute force over every admission instant as the right end.
func TestPropertySlidingLogNeverExceedsLimit(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		p := Params{Limit: 1 + int64(seed*3)%17, Window: time.Duration(seed) * 700 * time.Millisecond}
		l := mustNew(t, SlidingLog, p)
		adm := admitAll(t, l, workload(seed, 1500, p.Window, p.Limit, 0))
		if len(adm) < int(p.Limit) {
			t.Fatalf("seed %d: only %d admitted", seed, len(adm))
		}
		saturated := false
		for j, a := range adm {
			var sum int64
			for i := j; i >= 0 && adm[i].at > a.at-int64(p.Window); i-- {
				sum += adm[i].cost
			}
			if sum > p.Limit {
				t.Fatalf("seed %d: %d admitted in the window ending at %d, limit %d", seed, sum, a.at, p.Limit)
			}
			saturated = saturated || sum == p.Limit
		}
		if !saturated {
			t.Fatalf("seed %d: the workload never reached the limit", seed)
		}
	}
}

// Token and leaky bucket never admit more than burst + rate × elapsed over
// any interval [a, b] of admissions; checked exactly in integers:
// admitted × window <= burst × window + limit × (b − a).
func TestPropertyBucketsNeverExceedBurstPlusRate(t *testing.T) {
	for _, k := range []Kind{TokenBucket, LeakyBucket} {
		for seed := uint64(1); seed <= 6; seed++ {
			p := Params{Limit: int64(seed*5) % 13, Window: time.Duration(seed) * 300 * time.Millisecond, Burst: int64(seed) * 2}
			p.Limit++
			l := mustNew(t, k, p)
			adm := admitAll(t, l, workload(seed, 800, p.Window, p.Burst, 0))
			for i := range adm {
				var sum int64
				for j := i; j < len(adm); j++ {
					sum += adm[j].cost
					lhs := mul(uint64(sum), uint64(p.Window))
					rhs := mul(uint64(p.Burst), uint64(p.Window)).add(mul(uint64(p.Limit), uint64(adm[j].at-adm[i].at)))
					if rhs.less(lhs) {
						t.Fatalf("%v seed %d: %d admitted in [%d, %d], more than burst %d + %d/%v",
							k, seed, sum, adm[i].at, adm[j].at, p.Burst, p.Limit, p.Window)
					}
				}
			}
		}
	}
}

// As meters the token bucket and the leaky bucket are the same
// (tokens = burst − level); two different state layouts must agree on every
// decision, clock jumps included.
func TestPropertyTokenAndLeakyBucketAgree(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		p := Params{Limit: 1 + int64(seed)*7%19, Window: time.Duration(seed) * 333_333_333, Burst: int64(seed)}
		tb, lb := mustNew(t, TokenBucket, p), mustNew(t, LeakyBucket, p)
		var st, sl []byte
		for i, r := range workload(seed, 2000, p.Window, p.Burst+1, p.Window) {
			var dt, dl Decision
			st, dt = decide(t, tb, st, r.at, r.cost)
			sl, dl = decide(t, lb, sl, r.at, r.cost)
			if dt != dl {
				t.Fatalf("seed %d request %d (%+v): token bucket %+v, leaky bucket %+v", seed, i, r, dt, dl)
			}
			if tb.Idle(st, r.at) != lb.Idle(sl, r.at) {
				t.Fatalf("seed %d request %d: Idle disagrees", seed, i)
			}
		}
	}
}

// The sliding window's estimate never lets more than 2×limit through any
// window-long interval.
func TestPropertySlidingWindowAtMostTwiceLimit(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		p := Params{Limit: 2 + int64(seed), Window: time.Duration(seed) * 500 * time.Millisecond}
		l := mustNew(t, SlidingWindow, p)
		adm := admitAll(t, l, workload(seed, 1500, p.Window, p.Limit, 0))
		for j, a := range adm {
			var sum int64
			for i := j; i >= 0 && adm[i].at > a.at-int64(p.Window); i-- {
				sum += adm[i].cost
			}
			if sum > 2*p.Limit {
				t.Fatalf("seed %d: %d admitted in one window, limit %d", seed, sum, p.Limit)
			}
		}
	}
}

// A steady client at exactly the rate (one request every 200 ms for 5/s,
// offset by 1 ns from the window boundaries) is never refused by the exact
// algorithms. The sliding window is an estimate: it assumes the previous
// window's requests were spread evenly, so just after a boundary it counts
// nearly all 5 of them and refuses the 6th request (a documented trade-off).
func TestSteadyClientAtTheRate(t *testing.T) {
	forEachKind(t, p5, func(t *testing.T, l Limiter) {
		var state []byte
		for i := range 50 {
			var d Decision
			state, d = decide(t, l, state, t0+int64(i)*int64(200*ms)+1, 1)
			if l.Kind() == SlidingWindow && i == 5 {
				if d.Allowed {
					t.Fatal("sliding_window admitted the request its estimate exceeds")
				}
				return
			}
			if !d.Allowed {
				t.Fatalf("steady 5/s client refused at request %d: %+v", i, d)
			}
		}
	})
}
