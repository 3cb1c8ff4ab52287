package redisrl

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// µsSettler is the reference the settle ops implement: package algorithms
// on the scripts' clock of whole µs read as nanoseconds (µsReference).
func µsSettler(t *testing.T, kind algorithms.Kind, p algorithms.Params) algorithms.Settler {
	t.Helper()
	if err := config.RedisParams(kind, p); err != nil {
		t.Fatal(err)
	}
	l, err := algorithms.New(kind, algorithms.Params{Limit: p.Limit, Window: p.Window / time.Microsecond, Burst: p.Burst})
	if err != nil {
		t.Fatal(err)
	}
	s, ok := algorithms.AsSettler(l)
	if !ok {
		t.Fatalf("%v %+v does not settle", kind, p)
	}
	return s
}

// scriptState is the script's value of a bucket state of the reference:
// token_bucket "<tokens × W + remainder> <last>", leaky_bucket "<tat>
// <frac> <last>", as little-endian doubles.
func scriptState(kind algorithms.Kind, wus int64, state []byte) []byte {
	u := func(off int) uint64 { return binary.LittleEndian.Uint64(state[off:]) }
	var f []float64
	if kind == algorithms.TokenBucket {
		f = []float64{float64(u(10)*uint64(wus) + u(18)), float64(u(2))}
	} else {
		f = []float64{float64(u(2)), float64(u(10)), float64(u(18))}
	}
	var b []byte
	for _, x := range f {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

func doubles(b []byte) []float64 {
	var f []float64
	for i := 0; i+8 <= len(b); i += 8 {
		f = append(f, math.Float64frombits(binary.LittleEndian.Uint64(b[i:])))
	}
	return f
}

// The settle ops (Request.Settle) do exactly what algorithms.Settler.Settle
// does, on pinned instants: every state the script writes is the
// reference's, bit for bit, and every decision between settlements (a key
// in debt refused with the exact wait, a refund reopening it) is the
// reference's. The clock goes backwards, stands still and jumps; charges
// put keys deep into debt, refunds come while in debt and on full keys.
func TestSettleConformanceWithAlgorithms(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	sets := []algorithms.Params{
		{Limit: 10, Window: time.Second, Burst: 1},
		{Limit: 100, Window: time.Minute, Burst: 400},
		{Limit: 7, Window: 10*time.Minute + 7*us, Burst: 3},
		{Limit: 1_000_000, Window: time.Hour + 13*us, Burst: 200_000},
	}
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.LeakyBucket} {
		for si, p := range sets {
			t.Run(kind.String()+"/"+strconv.Itoa(si), func(t *testing.T) {
				ref := µsSettler(t, kind, p)
				rng := rand.New(rand.NewPCG(uint64(kind)+200, uint64(si)))
				key := testKey(t, kind, "k")
				owner, err := cluster.NodeOf(string(key))
				if err != nil {
					t.Fatal(err)
				}
				pc := cluster.Client(owner)
				defer pc.Close()
				ctx := context.Background()
				wus := int64(p.Window / us)
				B := ref.Params().Burst
				interval := max(wus/p.Limit, 1)
				now := int64(1_700_000_000_123_457)
				var state []byte
				var admitted, denied, charged, refunded, debts int
				for step := 0; step < 400; step++ {
					switch r := rng.IntN(100); {
					case r < 10:
						now -= rng.Int64N(4 * interval) // clock goes backwards
					case r < 30: // same instant
					case r < 34:
						now += rng.Int64N(2 * wus)
					default:
						now += 1 + rng.Int64N(2*interval*max(B/8, 1))
					}
					if rng.IntN(100) < 45 {
						// A settlement: mostly refunds and charges around the
						// bucket's size, sometimes far beyond it (debt).
						delta := 1 + rng.Int64N(max(B/4, 2))
						switch r := rng.IntN(20); {
						case r < 10:
							delta = -delta
						case r < 12:
							delta = -(1 + rng.Int64N(4*B))
						case r < 14:
							delta = B * (1 + rng.Int64N(3)) // up to 3 buckets of debt
						}
						ns, err := ref.Settle(nil, state, now, delta)
						if err != nil {
							t.Fatal(err)
						}
						got, err := h.run(&Request{Kind: kind, Params: p, Key: key, Settle: delta, Now: now})
						if err != nil {
							t.Fatalf("step %d: settle %d: %v", step, delta, err)
						}
						if !got.Allowed || got.Limit != B || got.RetryAfter != 0 {
							t.Fatalf("step %d: settle reply %+v", step, got)
						}
						state = ns
						if delta > 0 {
							charged++
						} else {
							refunded++
						}
					} else {
						cost := int64(1)
						if r := rng.IntN(100); r < 20 {
							cost = 1 + rng.Int64N(B)
						} else if r < 23 {
							cost = B + 1
						}
						ns, want, err := ref.Decide(nil, state, now, cost)
						if err != nil {
							t.Fatal(err)
						}
						got, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: cost, Now: now})
						if err != nil {
							t.Fatalf("step %d: %v", step, err)
						}
						if got.Decision != inUS(want) {
							t.Fatalf("step %d (now %d, cost %d): script %+v, reference %+v", step, now, cost, got.Decision, inUS(want))
						}
						if !got.Allowed {
							denied++
							if got.RetryAfter > time.Duration(interval*int64(cost))*us {
								debts++ // refused beyond the refill of its cost: a debt
							}
							continue
						}
						admitted++
						state = ns
					}
					// The script's value is the reference's state. It is then
					// written back without a TTL: the pinned clock stands
					// still while real time passes.
					v, err := pc.Get(ctx, string(key)).Bytes()
					switch {
					case err == nil:
						if want := scriptState(kind, wus, state); string(v) != string(want) {
							t.Fatalf("step %d: script state %v, reference %v", step, doubles(v), doubles(want))
						}
					case !errors.Is(err, redis.Nil):
						t.Fatal(err)
					}
					if len(state) > 0 {
						if err := pc.Set(ctx, string(key), scriptState(kind, wus, state), 0).Err(); err != nil {
							t.Fatal(err)
						}
					}
				}
				t.Logf("%d admitted, %d denied (%d in debt), %d charged, %d refunded", admitted, denied, debts, charged, refunded)
				if admitted < 40 || denied < 40 || charged < 20 || refunded < 20 || debts < 5 {
					t.Errorf("%d admitted, %d denied (%d in debt), %d charged, %d refunded of 400: the workload does not exercise every outcome",
						admitted, denied, debts, charged, refunded)
				}
			})
		}
	}
}

// A refund to a key never seen writes nothing; a charge on a fresh key
// puts it into debt for exactly the excess's refill; the window algorithms
// have no settle op; a charge beyond the scripts' range and a bucket
// faster than a unit per µs are refused with nothing written.
func TestSettleEdges(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	ctx := context.Background()
	p := algorithms.Params{Limit: 10, Window: time.Second, Burst: 5}
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.LeakyBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			key := testKey(t, kind, "k")
			owner, err := cluster.NodeOf(string(key))
			if err != nil {
				t.Fatal(err)
			}
			pc := cluster.Client(owner)
			defer pc.Close()
			res, err := h.run(&Request{Kind: kind, Params: p, Key: key, Settle: -3})
			if err != nil || !res.Allowed || res.Remaining != 5 {
				t.Fatalf("refund to a fresh key: %+v %v", res, err)
			}
			if n, _ := pc.Exists(ctx, string(key)).Result(); n != 0 {
				t.Fatal("a refund to a fresh key wrote it")
			}
			// Redis TIME: 5 (the bucket) + 3 of debt; 10/s, so 300ms
			// until the bucket is back to empty, 100ms more for one.
			if _, err := h.run(&Request{Kind: kind, Params: p, Key: key, Settle: 8}); err != nil {
				t.Fatal(err)
			}
			d, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1})
			if err != nil || d.Allowed || d.RetryAfter < 390*time.Millisecond || d.RetryAfter > 400*time.Millisecond {
				t.Fatalf("after a charge of 8 on a bucket of 5: %+v %v, want denied for about 400ms", d, err)
			}
			// A refund of the debt and more reopens it at once.
			if _, err := h.run(&Request{Kind: kind, Params: p, Key: key, Settle: -5}); err != nil {
				t.Fatal(err)
			}
			if d, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 2}); err != nil || !d.Allowed {
				t.Fatalf("after the refund: %+v %v", d, err)
			}
			before, _ := pc.Get(ctx, string(key)).Result()
			for _, q := range []struct {
				r   Request
				msg string
			}{
				{Request{Kind: kind, Params: algorithms.Params{Limit: 2_000_000, Window: time.Second, Burst: 5}, Key: key, Settle: 1}, "one cost unit per microsecond"},
			} {
				if _, err := h.run(&q.r); err == nil || !strings.Contains(err.Error(), q.msg) {
					t.Errorf("%+v: %v, want %q", q.r, err, q.msg)
				}
			}
			if after, _ := pc.Get(ctx, string(key)).Result(); after != before {
				t.Error("a refused settlement wrote the key")
			}
			// A charge beyond what a state holds exactly (here the level's 2^53:
			// 10/s of 10^6 µs-units each, about 28.5 years of debt) leaves the key at
			// that deepest debt, and a second one leaves it there, as SettleCapped does
			// locally: the over-use is not dropped.
			deepest := time.Duration((1<<53-1-10-5_000_000)/10) * time.Microsecond
			for i := 0; i < 2; i++ {
				if _, err := h.run(&Request{Kind: kind, Params: p, Key: key, Settle: algorithms.MaxSettle}); err != nil {
					t.Fatalf("a charge of MaxSettle: %v", err)
				}
				d, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1})
				if err != nil || d.Allowed || d.RetryAfter < deepest-time.Second || d.RetryAfter > deepest+time.Second {
					t.Fatalf("after a charge of MaxSettle (%d): %+v %v, want denied for %v", i, d, err, deepest)
				}
			}
		})
	}
	for _, kind := range []algorithms.Kind{algorithms.FixedWindow, algorithms.SlidingWindow, algorithms.SlidingLog} {
		r := &Request{Kind: kind, Params: p, Key: testKey(t, kind, "k"), Settle: 1}
		if _, err := h.run(r); err == nil || !strings.Contains(err.Error(), "bad arguments") {
			t.Errorf("%v: settle %v, want bad arguments", kind, err)
		}
	}
	// The command: op 2 charges, op 3 refunds |delta|, eight arguments.
	r := &Request{Kind: algorithms.TokenBucket, Params: p, Key: []byte("k"), Settle: -7, Cost: 3, N: 4, MaxDelay: time.Second}
	if cmd := string(r.AppendEvalSHA(nil)); !strings.HasPrefix(cmd, "*12\r\n") || !strings.HasSuffix(cmd, "$1\r\n7\r\n$1\r\n0\r\n$1\r\n3\r\n$1\r\n0\r\n$1\r\n0\r\n") {
		t.Fatalf("settle command %q", cmd)
	}
	if maxDebtUS != strconv.FormatInt(int64(algorithms.MaxDebtWait/time.Microsecond), 10) {
		t.Fatalf("maxDebtUS %s, algorithms.MaxDebtWait %v", maxDebtUS, algorithms.MaxDebtWait)
	}
}
