package redisrl

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// runFor is run for a request whose reply ParseReplyFor reads (a max
// delay: eight integers).
func (h *host) runFor(r *Request) (Result, error) {
	send := func(cmd []byte) (Result, error) {
		st, reply, err := h.c.Do(context.Background(), "rc", cmd)
		if err != nil {
			return Result{}, err
		}
		if st != redisclient.StatusOK {
			return Result{}, errors.New("redis call failed: " + st.String())
		}
		var d resp.Decoder
		return ParseReplyBytesFor(&d, reply, r)
	}
	res, err := send(r.AppendEvalSHA(nil))
	if IsNoScript(err) {
		return send(r.AppendEval(nil))
	}
	return res, err
}

// µsReference is the algorithm the scripts implement on their clock of
// whole microseconds: package algorithms with every instant and duration
// in µs read as nanoseconds (the window of W µs as W ns). Its arithmetic on
// those numbers is the scripts' on theirs, exactly, delays included.
func µsReference(t *testing.T, kind algorithms.Kind, p algorithms.Params) algorithms.Shaper {
	t.Helper()
	if err := config.RedisParams(kind, p); err != nil {
		t.Fatal(err)
	}
	l, err := algorithms.New(kind, algorithms.Params{Limit: p.Limit, Window: p.Window / time.Microsecond, Burst: p.Burst})
	if err != nil {
		t.Fatal(err)
	}
	sh, ok := algorithms.AsShaper(l)
	if !ok {
		t.Fatalf("%v does not shape", kind)
	}
	return sh
}

// inUS converts a reference decision (µs as ns) to the script's (µs).
func inUS(d algorithms.Decision) algorithms.Decision {
	d.ResetAfter *= time.Microsecond
	d.RetryAfter *= time.Microsecond
	d.Delay *= time.Microsecond
	return d
}

// The bucket scripts with a max delay (ARGV[10]) decide exactly like
// algorithms.Shaper.DecideDelay, step by step on pinned instants: the
// clock going backwards and standing still, costs above the capacity, no
// max delay (a meter) between shaped decisions, and refunds of delayed
// admissions, after which the key decides from the admission's slot on as
// if it had never been made.
func TestShapingConformanceWithAlgorithms(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	sets := []algorithms.Params{
		{Limit: 10, Window: time.Second, Burst: 1},
		{Limit: 5, Window: time.Hour, Burst: 8},
		{Limit: 7, Window: 10*time.Minute + 7*us, Burst: 3},
		{Limit: 13, Window: 7*time.Minute + 11*us, Burst: 5},
	}
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.LeakyBucket} {
		for si, p := range sets {
			t.Run(kind.String()+"/"+strconv.Itoa(si), func(t *testing.T) {
				ref := µsReference(t, kind, p)
				rng := rand.New(rand.NewPCG(uint64(kind)+100, uint64(si)))
				key := testKey(t, kind, "k")
				owner, err := cluster.NodeOf(string(key))
				if err != nil {
					t.Fatal(err)
				}
				pc := cluster.Client(owner)
				defer pc.Close()
				ctx := context.Background()
				wus := int64(p.Window / us)
				interval := wus / p.Limit // µs per request at the rate
				now := int64(1_700_000_000_123_457)
				var state []byte
				var delayed, denied, refunded int
				// After a refund the key's time is the refunded slot, and
				// the reference's before it: the clock goes back no
				// further than that slot (where they would differ).
				floor := int64(0)
				for step := 0; step < 300; step++ {
					switch r := rng.IntN(100); {
					case r < 8:
						now = max(now-rng.Int64N(interval), floor) // clock goes backwards
					case r < 30: // same instant: a burst queues
					case r < 34:
						now += rng.Int64N(2 * wus) // often idle again
					default:
						now += 1 + rng.Int64N(interval)
					}
					cost := int64(1)
					if r := rng.IntN(100); r < 12 {
						cost = 2
					} else if r < 15 {
						cost = ref.Params().Burst + 1
					}
					var maxDelay int64 // µs
					switch r := rng.IntN(10); {
					case r < 1: // a meter between shaped decisions
					case r < 4:
						maxDelay = 1 + rng.Int64N(interval)
					default:
						maxDelay = 1 + rng.Int64N(4*interval)
					}
					newState, want, err := ref.DecideDelay(nil, state, now, cost, time.Duration(maxDelay))
					if err != nil {
						t.Fatal(err)
					}
					req := &Request{Kind: kind, Params: p, Key: key, Cost: cost, Now: now, MaxDelay: time.Duration(maxDelay) * us}
					got, err := h.runFor(req)
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					if got.Decision != inUS(want) {
						t.Fatalf("step %d (now %d, cost %d, max delay %dµs): script %+v, reference %+v", step, now, cost, maxDelay, got.Decision, inUS(want))
					}
					if !got.Allowed {
						denied++
						continue
					}
					if got.Delay > 0 {
						delayed++
						if got.Stamp != now+int64(got.Delay/us) {
							t.Fatalf("step %d: stamp %d, want the slot %d", step, got.Stamp, now+int64(got.Delay/us))
						}
					}
					if err := pc.Persist(ctx, string(key)).Err(); err != nil { // the pinned clock stands still
						t.Fatal(err)
					}
					if got.Delay > 0 && rng.IntN(8) == 0 {
						// Refund it (a request another rule denied): from its
						// slot on, the key is as if it had never been admitted.
						rf := &Request{Kind: kind, Params: p, Key: key, Cost: cost, Now: now, Refund: &got}
						if _, err := h.run(rf); err != nil {
							t.Fatalf("step %d: refund: %v", step, err)
						}
						// The key outlives everything the reference still
						// holds (a refunded last slot left an empty bucket
						// ahead of now: its TTL was 1 ms). The TTL runs in
						// real time since the refund: 50 ms allowed for it.
						pttl, err := pc.PTTL(ctx, string(key)).Result()
						if err != nil {
							t.Fatal(err)
						}
						if !ref.Idle(state, now+int64((pttl+50*time.Millisecond)/us)) {
							t.Fatalf("step %d: after the refund the key expires in %v, before the reference is idle", step, pttl)
						}
						if err := pc.Persist(ctx, string(key)).Err(); err != nil {
							t.Fatal(err)
						}
						now = got.Stamp + rng.Int64N(2)
						floor = got.Stamp
						refunded++
						continue
					}
					state = newState
				}
				if delayed < 20 || denied < 20 || refunded < 2 {
					t.Errorf("%d delayed, %d denied, %d refunded of 300: the workload does not exercise every outcome", delayed, denied, refunded)
				}
			})
		}
	}
}

// A burst on one key from three hosts at one pinned instant: each request
// is admitted into the next slot, one interval after the previous, until
// the queue is delay.max long; the rest are denied with the wait until a
// slot comes within reach.
func TestShapingQueueAcrossHosts(t *testing.T) {
	redistest.SkipShort(t)
	hosts := []*host{newHost(t), newHost(t), newHost(t)}
	p := algorithms.Params{Limit: 10, Window: time.Second, Burst: 1}
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.LeakyBucket} {
		t.Run(kind.String(), func(t *testing.T) {
			key := testKey(t, kind, "k")
			now := int64(1_700_000_000_000_000)
			for i := 0; i < 40; i++ {
				req := &Request{Kind: kind, Params: p, Key: key, Cost: 1, Now: now, MaxDelay: 3 * time.Second}
				got, err := hosts[i%3].runFor(req)
				if err != nil {
					t.Fatal(err)
				}
				if i <= 30 {
					if !got.Allowed || got.Delay != time.Duration(i)*100*time.Millisecond {
						t.Fatalf("request %d: %+v, want admitted with a delay of %v", i, got.Decision, time.Duration(i)*100*time.Millisecond)
					}
					continue
				}
				if got.Allowed || got.RetryAfter != 100*time.Millisecond {
					t.Fatalf("request %d: %+v, want denied, retry after 100ms", i, got.Decision)
				}
			}
		})
	}
}

// A call with a max delay is not coalesced (n > 1), nor a refund; the
// script refuses both. Its reply without a delay, or with one out of
// range, is an error, as is a delay on a denial.
func TestShapingArguments(t *testing.T) {
	redistest.SkipShort(t)
	h := newHost(t)
	p := algorithms.Params{Limit: 10, Window: time.Second, Burst: 1}
	r := &Request{Kind: algorithms.LeakyBucket, Params: p, Key: testKey(t, algorithms.LeakyBucket, "k"), Cost: 1, MaxDelay: time.Second}
	cmd := string(r.AppendEvalSHA(nil))
	if !strings.HasSuffix(cmd, "$1\r\n0\r\n$1\r\n0\r\n$1\r\n0\r\n$1\r\n1\r\n$7\r\n1000000\r\n") || !strings.HasPrefix(cmd, "*14\r\n") {
		t.Fatalf("command %q", cmd)
	}
	if _, err := h.runFor(r); err != nil { // the script is on the node now
		t.Fatal(err)
	}
	bad := strings.Replace(cmd, "$1\r\n1\r\n$7\r\n1000000", "$1\r\n2\r\n$7\r\n1000000", 1)
	if _, err := h.send([]byte(bad)); err == nil || !strings.Contains(err.Error(), "bad arguments") {
		t.Fatalf("n = 2 with a max delay: %v", err)
	}
	// The other algorithms, N > 1 and refunds send no max delay.
	for _, q := range []Request{
		{Kind: algorithms.FixedWindow, Params: p, Key: []byte("k"), Cost: 1, MaxDelay: time.Second},
		{Kind: algorithms.TokenBucket, Params: p, Key: []byte("k"), Cost: 1, N: 3, MaxDelay: time.Second},
		{Kind: algorithms.TokenBucket, Params: p, Key: []byte("k"), Cost: 1, Refund: &Result{}, MaxDelay: time.Second},
		{Kind: algorithms.TokenBucket, Params: p, Key: []byte("k"), Cost: 1, MaxDelay: time.Microsecond - 1},
	} {
		if q.shapes() || q.replyLen() != ReplyLen {
			t.Errorf("%+v shapes", q)
		}
	}
	var d resp.Decoder
	for in, msg := range map[string]string{
		"*7\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:5\r\n:0\r\n":                 "7 elements instead of 8",
		"*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:5\r\n:0\r\n:-1\r\n":          "delay -1µs outside 0..1000000",
		"*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:5\r\n:0\r\n:1000001\r\n":     "delay 1000001µs outside 0..1000000",
		"*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:5\r\n:0\r\n:99999999999\r\n": "outside 0..1000000",
		"*8\r\n:0\r\n:1\r\n:0\r\n:100000\r\n:5\r\n:5\r\n:0\r\n:7\r\n":           "delay on a denied request",
		"*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:5\r\n:0\r\n$1\r\n7\r\n":      "element 7 is a bulk string",
	} {
		_, err := ParseReplyBytesFor(&d, []byte(in), r)
		if !errors.Is(err, ErrBadReply) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", in, err, msg)
		}
	}
	res, err := ParseReplyBytesFor(&d, []byte("*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:5\r\n:0\r\n:1000000\r\n"), r)
	if err != nil || res.Delay != time.Second || !res.Allowed {
		t.Fatalf("%+v %v", res, err)
	}
	// A reply of eight to a call without a max delay is refused too.
	if _, err := ParseReplyBytes(&d, []byte("*8\r\n:1\r\n:1\r\n:0\r\n:100000\r\n:0\r\n:5\r\n:0\r\n:0\r\n")); !errors.Is(err, ErrBadReply) {
		t.Fatalf("eight integers without a max delay: %v", err)
	}
}
