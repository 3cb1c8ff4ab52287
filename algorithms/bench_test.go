package algorithms

import (
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// benchDecide runs Decide+encode on one key, swapping two buffers of
// MaxStateSize capacity as a caller holding the state would. step is the
// time between requests.
func benchDecide(b *testing.B, l Limiter, step time.Duration) {
	a := make([]byte, 0, l.MaxStateSize())
	c := make([]byte, 0, l.MaxStateSize())
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		out, _, err := l.Decide(c[:0], a, now, 1)
		if err != nil {
			b.Fatal(err)
		}
		a, c = out, a
		now += int64(step)
	}
}

// BenchmarkDecide: every algorithm, 1000 per second, requests every 800 µs
// (a fifth of them over the rate), and for sliding_log also a full log of
// 1000 entries (the worst case it is built for).
func BenchmarkDecide(b *testing.B) {
	for _, k := range Kinds {
		b.Run(k.String(), func(b *testing.B) {
			benchDecide(b, mustNew(b, k, Params{Limit: 1000, Window: time.Second}), 800*time.Microsecond)
		})
	}
	b.Run("sliding_log/limit=100", func(b *testing.B) {
		benchDecide(b, mustNew(b, SlidingLog, Params{Limit: 100, Window: time.Second}), 8*time.Millisecond)
	})
}

// BenchmarkTokenBucketVsXTimeRate: the same workload (1000 per second, burst
// 100) on our token bucket, state decode and encode included, and on
// golang.org/x/time/rate.Limiter.AllowN: one request every 800 µs (all
// admitted) and every 100 µs (nine in ten denied).
func BenchmarkTokenBucketVsXTimeRate(b *testing.B) {
	for _, w := range []struct {
		name string
		step time.Duration
	}{{"admitted", 800 * time.Microsecond}, {"mostly-denied", 100 * time.Microsecond}} {
		b.Run("sluice/"+w.name, func(b *testing.B) {
			benchDecide(b, mustNew(b, TokenBucket, Params{Limit: 1000, Window: time.Second, Burst: 100}), w.step)
		})
		b.Run("x-time-rate/"+w.name, func(b *testing.B) {
			lim := rate.NewLimiter(1000, 100)
			now := time.Unix(0, t0)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				lim.AllowN(now, 1)
				now = now.Add(w.step)
			}
		})
	}
}

// The two token buckets agree on the benchmark workload, so the benchmark
// compares equal work.
func TestTokenBucketAgreesWithXTimeRate(t *testing.T) {
	l := mustNew(t, TokenBucket, Params{Limit: 1000, Window: time.Second, Burst: 100})
	lim := rate.NewLimiter(1000, 100)
	var state []byte
	now := t0
	allowed := 0
	for i := range 20000 {
		step := 800 * time.Microsecond
		if i%1000 < 200 {
			step = 100 * time.Microsecond // bursts that drain the bucket
		}
		var d Decision
		state, d = decide(t, l, state, now, 1)
		if want := lim.AllowN(time.Unix(0, now), 1); d.Allowed != want {
			t.Fatalf("request %d: sluice %v, x/time/rate %v", i, d.Allowed, want)
		}
		if d.Allowed {
			allowed++
		}
		now += int64(step)
	}
	if allowed == 0 || allowed == 20000 {
		t.Fatalf("workload not discriminating: %d allowed", allowed)
	}
}
