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

// BenchmarkFullLog: sliding_log with its log full against token_bucket on
// the same workload, limit 1000 per second, Decide+encode as a caller
// holding the state does it. admitted: a full window of requests 1 ms
// apart first, then one every 1 ms, all admitted — each sliding_log
// decision prunes one entry and appends one to a log of 1000. denied: the
// log (or bucket) filled, then requests at the instant of the last one, all
// denied with the full log read.
func BenchmarkFullLog(b *testing.B) {
	p := Params{Limit: 1000, Window: time.Second}
	step := p.Window / time.Duration(p.Limit)
	for _, k := range []Kind{TokenBucket, SlidingLog} {
		b.Run(k.String()+"/admitted", func(b *testing.B) {
			l := mustNew(b, k, p)
			state, now := fill(b, l, step)
			benchSteady(b, l, state, now+int64(step), step, true)
		})
		b.Run(k.String()+"/denied", func(b *testing.B) {
			l := mustNew(b, k, p)
			fillStep := step
			if k == TokenBucket {
				fillStep = 0 // drain the bucket at one instant
			}
			state, now := fill(b, l, fillStep)
			benchSteady(b, l, state, now, 0, false)
		})
	}
}

// fill admits Limit cost-1 requests step apart from t0 and returns the
// state and the instant of the last one.
func fill(b *testing.B, l Limiter, step time.Duration) ([]byte, int64) {
	var state []byte
	now := t0
	for i := range l.Params().Limit {
		now = t0 + i*int64(step)
		var d Decision
		state, d = decide(b, l, state, now, 1)
		if !d.Allowed {
			b.Fatalf("fill: request %d denied", i)
		}
	}
	return state, now
}

// benchSteady decides cost-1 requests step apart from now on state, each
// of which must be allowed (or denied) as want says.
func benchSteady(b *testing.B, l Limiter, state []byte, now int64, step time.Duration, want bool) {
	a := append(make([]byte, 0, l.MaxStateSize()), state...)
	c := make([]byte, 0, l.MaxStateSize())
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		out, d, err := l.Decide(c[:0], a, now, 1)
		if err != nil || d.Allowed != want {
			b.Fatalf("at %d: %+v %v, want allowed=%v", now, d, err, want)
		}
		a, c = out, a
		now += int64(step)
	}
}
