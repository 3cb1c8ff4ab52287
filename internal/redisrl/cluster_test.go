package redisrl

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// These tests run the scripts on a real 3-master Redis Cluster, through the
// same path the embedded host uses (raw RESP in, raw RESP out, internal/redisclient).

var cluster *redistest.Cluster

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &cluster)) }

// host is one proxy instance's view of the cluster.
type host struct {
	c        *redisclient.Clusters
	noscript atomic.Int64 // EVALSHA answered NOSCRIPT, EVAL sent
}

func newHost(t testing.TB) *host {
	redistest.SkipShort(t)
	t.Helper()
	c := redisclient.New(map[string][]string{"rc": cluster.Addrs}, redisclient.Options{})
	if err := c.Init("rc", "", "", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &host{c: c}
}

func (h *host) send(cmd []byte) (Result, error) {
	st, reply, err := h.c.Do(context.Background(), "rc", cmd)
	if err != nil {
		return Result{}, err
	}
	if st != redisclient.StatusOK {
		return Result{}, errors.New("redis call failed: " + st.String())
	}
	var d resp.Decoder
	v, err := d.Parse(reply)
	if err != nil {
		return Result{}, err
	}
	return ParseReply(v)
}

// run is what the filter does: EVALSHA, and EVAL when the node answers
// NOSCRIPT.
func (h *host) run(r *Request) (Result, error) {
	res, err := h.send(r.AppendEvalSHA(nil))
	if IsNoScript(err) {
		h.noscript.Add(1)
		return h.send(r.AppendEval(nil))
	}
	return res, err
}

func testKey(t testing.TB, k algorithms.Kind, key string) []byte {
	return AppendKey(nil, k, t.Name(), key)
}

func params(k algorithms.Kind, limit int64, window time.Duration, burst int64) algorithms.Params {
	return algorithms.Params{Limit: limit, Window: window, Burst: burst}
}

const us = time.Microsecond

// keyState is a key's value as Redis serializes it ("" when the key does
// not exist) and its expiry.
type keyState struct {
	dump string
	pttl time.Duration
}

func dumpKey(t *testing.T, pc *goredis.Client, key []byte) keyState {
	t.Helper()
	ctx := context.Background()
	v, err := pc.Dump(ctx, string(key)).Result()
	if errors.Is(err, goredis.Nil) {
		return keyState{}
	}
	if err != nil {
		t.Fatal(err)
	}
	pttl, err := pc.PTTL(ctx, string(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return keyState{v, pttl}
}

// same reports whether a and b are one state read twice: the same value,
// the expiry apart by no more than the time between the reads could take.
func (a keyState) same(b keyState) bool {
	d := a.pttl - b.pttl
	return a.dump == b.dump && d >= -10*time.Millisecond && d < time.Second
}

// ceilUS is the script's view of a duration the reference computes in ns.
func ceilUS(d time.Duration) time.Duration {
	return (d + us - 1) / us * us
}

// The scripts decide exactly like package algorithms, step by step, on
// pinned instants (including the clock going backwards and requests costing
// more than the capacity).
func TestConformanceWithAlgorithms(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	sets := []algorithms.Params{
		{Limit: 5, Window: time.Hour, Burst: 8},
		{Limit: 7, Window: time.Hour, Burst: 3},
		{Limit: 3, Window: 10*time.Minute + 7*us},
		{Limit: 13, Window: 7*time.Minute + 11*us, Burst: 5},
	}
	for _, kind := range algorithms.Kinds {
		for si, p := range sets {
			t.Run(kind.String()+"/"+strconv.Itoa(si), func(t *testing.T) {
				ref, err := algorithms.New(kind, p)
				if err != nil {
					t.Fatal(err)
				}
				if err := config.RedisParams(kind, p); err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(uint64(kind), uint64(si)))
				key := testKey(t, kind, "k")
				now := int64(1_700_000_000_123_456) // µs
				var state []byte
				nAllowed := 0
				defer func() {
					if nAllowed < 10 || nAllowed > 140 {
						t.Errorf("%d of 150 admitted: the workload does not exercise both outcomes", nAllowed)
					}
				}()
				owner, err := cluster.NodeOf(string(key))
				if err != nil {
					t.Fatal(err)
				}
				pc := cluster.Client(owner)
				defer pc.Close()
				ctx := context.Background()
				for step := 0; step < 150; step++ {
					switch r := rng.IntN(100); {
					case r < 10:
						now -= rng.Int64N(int64(p.Window/us) / 4) // clock goes backwards
					case r < 20: // same instant
					case r < 25:
						now += rng.Int64N(2 * int64(p.Window/us)) // often idle again
					default:
						now += 1 + rng.Int64N(2*int64(p.Window/us)/p.Limit) // about the limit's rate
					}
					cost := int64(1)
					if r := rng.IntN(100); r < 15 {
						cost = 2
					} else if r < 18 {
						cost = ref.Params().Burst + 1
					}
					newState, want, err := ref.Decide(nil, state, now*1000, cost)
					if err != nil {
						t.Fatal(err)
					}
					state = newState
					if want.Allowed {
						nAllowed++
					}
					// A peek first: the same decision, and the key untouched.
					before := dumpKey(t, pc, key)
					peek, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: cost, Now: now, Peek: true, N: 3})
					if err != nil {
						t.Fatalf("step %d: peek: %v", step, err)
					}
					if after := dumpKey(t, pc, key); !before.same(after) {
						t.Fatalf("step %d: the peek changed the key: %+v, then %+v", step, before, after)
					}
					got, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: cost, Now: now})
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					want.ResetAfter = ceilUS(want.ResetAfter)
					want.RetryAfter = ceilUS(want.RetryAfter)
					if peek.Decision != want {
						t.Fatalf("step %d (now %d, cost %d): peek %+v, reference %+v", step, now, cost, peek.Decision, want)
					}
					if got.Decision != want {
						t.Fatalf("step %d (now %d, cost %d): script %+v, reference %+v", step, now, cost, got.Decision, want)
					}
					if !got.Allowed {
						continue
					}
					// The admission set the TTL to the time until the key is
					// idle (plus one rounding millisecond), and the
					// reference agrees the key is idle by then, so its
					// vanishing changes no decision.
					pttl, err := pc.PTTL(ctx, string(key)).Result()
					if err != nil {
						t.Fatal(err)
					}
					sized := (got.ResetAfter+time.Millisecond-1)/time.Millisecond*time.Millisecond + time.Millisecond
					if pttl <= 0 || pttl > sized || pttl < sized-50*time.Millisecond {
						t.Fatalf("step %d: PTTL %v, want %v (reset after %v)", step, pttl, sized, got.ResetAfter)
					}
					if !ref.Idle(state, now*1000+int64(got.ResetAfter)) {
						t.Fatalf("step %d: reference not idle after reset-after %v", step, got.ResetAfter)
					}
					// Real time must not expire the key while the pinned
					// clock stands still: keep it for the rest of the test.
					if err := pc.Persist(ctx, string(key)).Err(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// 3,000 concurrent requests on one key from three hosts (three clients of the
// cluster), limit 100 per hour: exactly 100 admitted, for every algorithm.
// Then a spent key is denied with an honest Retry-After, and its TTL is
// sized to the time it takes to become idle.
func TestExactAdmissionUnderConcurrency(t *testing.T) {
	redistest.SkipShort(t)
	hosts := []*host{newHost(t), newHost(t), newHost(t)}
	for _, kind := range algorithms.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			p := params(kind, 100, time.Hour, 0)
			key := testKey(t, kind, "203.0.113.7")
			const n = 3000
			var admitted, failed atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(h *host) {
					defer wg.Done()
					<-start
					res, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1})
					if err != nil {
						failed.Add(1)
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
				}(hosts[i%len(hosts)])
			}
			close(start)
			wg.Wait()
			if failed.Load() != 0 || admitted.Load() != 100 {
				t.Fatalf("admitted %d of %d (failed %d), want exactly 100", admitted.Load(), n, failed.Load())
			}

			// Spent: denied, Retry-After within (0, window].
			res, err := hosts[0].run(&Request{Kind: kind, Params: p, Key: key, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed || res.Remaining != 0 || res.Limit != 100 || res.RetryAfter <= 0 || res.RetryAfter > time.Hour {
				t.Fatalf("spent key: %+v", res.Decision)
			}
			if res.ResetAfter < res.RetryAfter || res.ResetAfter > 2*time.Hour {
				t.Fatalf("reset after %v, retry after %v", res.ResetAfter, res.RetryAfter)
			}

			// TTL: set, and equal to the time until the key is idle.
			n0, err := cluster.NodeOf(string(key))
			if err != nil {
				t.Fatal(err)
			}
			pc := cluster.Client(n0)
			defer pc.Close()
			pttl, err := pc.PTTL(context.Background(), string(key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			resetMS := res.ResetAfter.Milliseconds()
			if pttl <= 0 || pttl > time.Duration(resetMS+2)*time.Millisecond || pttl < time.Duration(resetMS-1000)*time.Millisecond {
				t.Fatalf("PTTL %v, want about the reset-after %v", pttl, res.ResetAfter)
			}
		})
	}
}

// After SCRIPT FLUSH every EVALSHA answers NOSCRIPT; the EVAL fallback
// decides and re-caches the script.
func TestNoScriptFallback(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	ctx := context.Background()
	for _, kind := range algorithms.Kinds {
		p := params(kind, 2, time.Hour, 0)
		key := testKey(t, kind, "k")
		owner, err := cluster.NodeOf(string(key))
		if err != nil {
			t.Fatal(err)
		}
		pc := cluster.Client(owner)
		if err := pc.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		before := h.noscript.Load()
		res, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1})
		if err != nil || !res.Allowed || res.Remaining != 1 {
			t.Fatalf("%v after flush: %+v %v", kind, res, err)
		}
		if h.noscript.Load() != before+1 {
			t.Fatalf("%v: no NOSCRIPT fallback happened", kind)
		}
		exists, err := pc.ScriptExists(ctx, ScriptFor(kind).SHA1).Result()
		pc.Close()
		if err != nil || !exists[0] {
			t.Fatalf("%v: script not cached after EVAL: %v %v", kind, exists, err)
		}
		res, err = h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1})
		if err != nil || !res.Allowed || res.Remaining != 0 || h.noscript.Load() != before+1 {
			t.Fatalf("%v second call: %+v %v (noscript %d)", kind, res, err, h.noscript.Load()-before)
		}
	}
}

// A refund undoes exactly one admission: the key then decides as if the
// refunded request had never been admitted.
func TestRefundUndoesAdmission(t *testing.T) {
	h := newHost(t)
	for _, kind := range algorithms.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			p := params(kind, 3, time.Hour, 0)
			ref, _ := algorithms.New(kind, p)
			key := testKey(t, kind, "k")
			now := int64(1_700_000_000_000_000) + 1234
			decide := func(at, cost int64) Result {
				t.Helper()
				res, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: cost, Now: at})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			first := decide(now, 1)
			second := decide(now+1000, 2)
			if !first.Allowed || !second.Allowed {
				t.Fatalf("admissions: %+v %+v", first, second)
			}
			if _, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 2, Now: now + 2000, Refund: &second}); err != nil {
				t.Fatal(err)
			}
			// Reference: only the first admission.
			st, _, _ := ref.Decide(nil, nil, now*1000, 1)
			_, want, _ := ref.Decide(nil, st, (now+3000)*1000, 1)
			got := decide(now+3000, 1)
			want.ResetAfter, want.RetryAfter = ceilUS(want.ResetAfter), ceilUS(want.RetryAfter)
			if got.Decision != want {
				t.Fatalf("after refund: %+v, want %+v", got.Decision, want)
			}
		})
	}
}

// A refund of a large cost (sliding_log removes its members in chunks) undoes
// exactly that admission, for every algorithm.
func TestRefundLargeCost(t *testing.T) {
	h := newHost(t)
	for _, kind := range algorithms.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			p := params(kind, 1000, time.Hour, 0)
			ref, _ := algorithms.New(kind, p)
			key := testKey(t, kind, "k")
			now := int64(1_700_000_000_000_000) + 99
			if res, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 200, Now: now}); err != nil || !res.Allowed {
				t.Fatalf("admission: %+v %v", res, err)
			}
			big := &Request{Kind: kind, Params: p, Key: key, Cost: 700, Now: now + 10}
			second, err := h.run(big)
			if err != nil || !second.Allowed {
				t.Fatalf("admission: %+v %v", second, err)
			}
			refund := *big
			refund.Now, refund.Refund = now+20, &second
			if _, err := h.run(&refund); err != nil {
				t.Fatal(err)
			}
			// Reference: only the 200.
			st, _, _ := ref.Decide(nil, nil, now*1000, 200)
			_, want, _ := ref.Decide(nil, st, (now+30)*1000, 1)
			got, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1, Now: now + 30})
			if err != nil {
				t.Fatal(err)
			}
			want.ResetAfter, want.RetryAfter = ceilUS(want.ResetAfter), ceilUS(want.RetryAfter)
			if got.Decision != want {
				t.Fatalf("after refund: %+v, want %+v", got.Decision, want)
			}
		})
	}
}

// sliding_log prunes its dead entries at the first admission of a window
// after the newest entry's, so the set never holds more than two windows of
// entries (at most 2 × limit), and the skipped pruning changes no decision
// (TestConformanceWithAlgorithms).
func TestSlidingLogPruning(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	p := params(algorithms.SlidingLog, 5, time.Millisecond, 0)
	key := testKey(t, algorithms.SlidingLog, "k")
	owner, err := cluster.NodeOf(string(key))
	if err != nil {
		t.Fatal(err)
	}
	pc := cluster.Client(owner)
	defer pc.Close()
	now := int64(1_700_000_000_000_000)
	rng := rand.New(rand.NewPCG(1, 2))
	maxCard := int64(0)
	for i := 0; i < 400; i++ {
		now += 1 + rng.Int64N(400) // µs: several admissions per 1 ms window
		if _, err := h.run(&Request{Kind: algorithms.SlidingLog, Params: p, Key: key, Cost: 1, Now: now}); err != nil {
			t.Fatal(err)
		}
		n, err := pc.ZCard(context.Background(), string(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		maxCard = max(maxCard, n)
		if n > 2*p.Limit {
			t.Fatalf("step %d: %d entries, more than two windows' worth (%d)", i, n, 2*p.Limit)
		}
	}
	if maxCard <= p.Limit {
		t.Errorf("at most %d entries: the workload never kept dead entries", maxCard)
	}
}

// The state layout README documents: a string of little-endian doubles
// (each an integer below 2^53) under the v2 key (sliding_log: a sorted set under "sl"), whose TTL the admission
// set; a v1 hash left under the old name (…:fw, …:tb) is neither read nor
// written.
func TestStateLayout(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	ctx := context.Background()
	fields := map[algorithms.Kind]int{algorithms.TokenBucket: 2, algorithms.LeakyBucket: 3, algorithms.FixedWindow: 2, algorithms.SlidingWindow: 3}
	for _, kind := range algorithms.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			key := testKey(t, kind, "k")
			owner, err := cluster.NodeOf(string(key))
			if err != nil {
				t.Fatal(err)
			}
			pc := cluster.Client(owner)
			defer pc.Close()
			old := strings.TrimSuffix(string(key), "2")
			if old != string(key) {
				if err := pc.HSet(ctx, old, "w", "1", "n", "999999", "s", "0", "ts", "1", "tat", "9999999999999999", "f", "0", "p", "999999").Err(); err != nil {
					t.Fatal(err)
				}
			}
			p := params(kind, 5, time.Minute, 0)
			res, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1})
			if err != nil || !res.Allowed || res.Remaining != 4 {
				t.Fatalf("first decision %+v %v (a v1 hash must not count)", res, err)
			}
			typ, err := pc.Type(ctx, string(key)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if kind == algorithms.SlidingLog {
				if typ != "zset" {
					t.Fatalf("type %s", typ)
				}
			} else {
				v, err := pc.Get(ctx, string(key)).Result()
				if err != nil {
					t.Fatal(err)
				}
				if len(v) != 8*fields[kind] {
					t.Fatalf("value %q: %d bytes, want %d doubles", v, len(v), fields[kind])
				}
				var f []float64
				for i := 0; i < len(v); i += 8 {
					x := math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[i:])))
					if x < 0 || x != math.Trunc(x) || x >= 1<<53 {
						t.Fatalf("value %q: field %v is not an integer below 2^53", v, x)
					}
					f = append(f, x)
				}
				// The fields: the time (window start, last update) is
				// Redis's clock, within a minute of ours.
				at := map[algorithms.Kind]int{algorithms.TokenBucket: 1, algorithms.LeakyBucket: 2, algorithms.FixedWindow: 0, algorithms.SlidingWindow: 0}[kind]
				if d := time.Since(time.UnixMicro(int64(f[at]))); d < -time.Minute || d > 2*time.Minute {
					t.Fatalf("value %v: field %d is not the time (%v ago)", f, at, d)
				}
				if (kind == algorithms.FixedWindow && f[1] != 1) || (kind == algorithms.SlidingWindow && (f[1] != 0 || f[2] != 1)) ||
					(kind == algorithms.TokenBucket && f[0] != 4*float64(time.Minute/time.Microsecond)) {
					t.Fatalf("value %v after one admission", f)
				}
			}
			if pttl, err := pc.PTTL(ctx, string(key)).Result(); err != nil || pttl <= 0 || pttl > 2*time.Minute+2*time.Millisecond {
				t.Fatalf("PTTL %v %v", pttl, err)
			}
			if old != string(key) {
				if n, err := pc.HLen(ctx, old).Result(); err != nil || n != 7 {
					t.Fatalf("v1 hash touched: %d fields, %v", n, err)
				}
			}
		})
	}
}

// A request matching two Redis rules, one of which denies it, is not charged
// by the other: it is decided by both, then refunded on the one that
// admitted it.
func TestMultiRuleDenialIsNotCharged(t *testing.T) {
	h := newHost(t)
	wide := Request{Kind: algorithms.SlidingWindow, Params: params(algorithms.SlidingWindow, 10, time.Hour, 0),
		Key: AppendKey(nil, algorithms.SlidingWindow, t.Name()+"-wide", "tenant")}
	narrow := Request{Kind: algorithms.TokenBucket, Params: params(algorithms.TokenBucket, 1, time.Hour, 0),
		Key: AppendKey(nil, algorithms.TokenBucket, t.Name()+"-narrow", "client")}
	if redistest.Slot(string(wide.Key)) == redistest.Slot(string(narrow.Key)) {
		t.Log("both rules landed in one slot; the scheme does not depend on it")
	}
	request := func() bool {
		rules := []Request{wide, narrow}
		results := make([]Result, len(rules))
		var wg sync.WaitGroup
		for i := range rules {
			wg.Add(1)
			go func(i int) { // in parallel, as the filter dispatches them
				defer wg.Done()
				r := rules[i]
				r.Cost = 1
				res, err := h.run(&r)
				if err != nil {
					t.Error(err)
				}
				results[i] = res
			}(i)
		}
		wg.Wait()
		allowed := true
		for _, r := range results {
			allowed = allowed && r.Allowed
		}
		if !allowed {
			for i, r := range results {
				if r.Allowed {
					rf := rules[i]
					rf.Cost, rf.Refund = 1, &results[i]
					if _, err := h.run(&rf); err != nil {
						t.Error(err)
					}
				}
			}
		}
		return allowed
	}
	if !request() {
		t.Fatal("first request denied")
	}
	for i := 0; i < 5; i++ {
		if request() {
			t.Fatalf("request %d admitted past the narrow rule", i+2)
		}
	}
	// The wide rule was charged once, by the admitted request only.
	wide.Cost = 1
	res, err := h.run(&wide)
	if err != nil || !res.Allowed || res.Remaining != 8 {
		t.Fatalf("wide rule after 5 denials: %+v %v (want remaining 8 = 10 - 1 admitted - this one)", res.Decision, err)
	}
}

func BenchmarkDecideRoundTrip(b *testing.B) {
	h := newHost(b)
	for _, kind := range algorithms.Kinds {
		b.Run(kind.String(), func(b *testing.B) {
			p := params(kind, 1_000_000_000, time.Hour, 0)
			if kind == algorithms.SlidingLog {
				p.Limit = algorithms.MaxSlidingLogLimit
			}
			r := &Request{Kind: kind, Params: p, Key: AppendKey(nil, kind, b.Name(), "k"), Cost: 1}
			buf := make([]byte, 0, 512)
			var d resp.Decoder
			if _, err := h.run(r); err != nil { // cache the script
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				st, reply, err := h.c.Do(context.Background(), "rc", r.AppendEvalSHA(buf[:0]))
				if err != nil || st != redisclient.StatusOK {
					b.Fatal(err, st)
				}
				v, err := d.Parse(reply)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := ParseReply(v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Bad arguments and a key holding a foreign type are error replies, which
// the filter turns into its failure mode; nothing panics and nothing is
// written.
func TestScriptErrorReplies(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	ctx := context.Background()
	for _, kind := range algorithms.Kinds {
		key := testKey(t, kind, "k")
		_, err := h.run(&Request{Kind: kind, Params: params(kind, 5, time.Second, 0), Key: key, Cost: 0})
		var re *resp.ReplyError
		if !errors.As(err, &re) || re.Code != resp.CodeErr || !strings.Contains(re.Msg, "sluice: bad arguments") {
			t.Errorf("%v cost 0: %v", kind, err)
		}
		owner, _ := cluster.NodeOf(string(key))
		pc := cluster.Client(owner)
		if n, _ := pc.Exists(ctx, string(key)).Result(); n != 0 {
			t.Errorf("%v: bad call wrote the key", kind)
		}
		if kind == algorithms.SlidingLog {
			pc.Set(ctx, string(key), "not a zset", 0)
		} else {
			pc.RPush(ctx, string(key), "not a hash")
		}
		pc.Close()
		_, err = h.run(&Request{Kind: kind, Params: params(kind, 5, time.Second, 0), Key: key, Cost: 1})
		if !errors.As(err, &re) || re.Code != resp.CodeWrongType {
			t.Errorf("%v on a foreign key: %v", kind, err)
		}
	}
}

// Throughput of decisions on distinct keys (spread over the three masters)
// from concurrent callers through one host.
func BenchmarkDecideParallel(b *testing.B) {
	h := newHost(b)
	p := params(algorithms.TokenBucket, 1_000_000_000, time.Hour, 0)
	var seq atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		key := AppendKey(nil, algorithms.TokenBucket, b.Name(), strconv.FormatInt(seq.Add(1), 10))
		r := &Request{Kind: algorithms.TokenBucket, Params: p, Key: key, Cost: 1}
		for pb.Next() {
			if _, err := h.run(r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Retry-After is exact: one microsecond earlier the same request is still
// denied, at Retry-After it is admitted.
func TestRetryAfterIsExact(t *testing.T) {
	h := newHost(t)
	for _, kind := range algorithms.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			p := params(kind, 7, time.Hour, 0)
			key := testKey(t, kind, "k")
			now := int64(1_700_000_000_000_000) + 987_654
			at := func(now int64) Result {
				t.Helper()
				res, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 1, Now: now})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			for i := 0; i < 7; i++ { // spend the key, spread over 7 minutes
				if !at(now + int64(i)*60_000_000).Allowed {
					t.Fatalf("request %d denied", i)
				}
			}
			now += 7 * 60_000_000
			denied := at(now)
			if denied.Allowed || denied.RetryAfter <= 0 || denied.RetryAfter > time.Hour {
				t.Fatalf("spent key: %+v", denied.Decision)
			}
			retry := int64(denied.RetryAfter / us)
			if res := at(now + retry - 1); res.Allowed || res.RetryAfter != us {
				t.Fatalf("1µs before Retry-After: %+v", res.Decision)
			}
			if res := at(now + retry); !res.Allowed {
				t.Fatalf("at Retry-After %v: %+v", denied.RetryAfter, res.Decision)
			}
		})
	}
}
