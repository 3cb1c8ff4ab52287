package redisrl

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/resp"
)

func (h *host) lease(t testing.TB, r *LeaseRequest) LeaseResult {
	t.Helper()
	res, err := h.leaseErr(r)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func (h *host) leaseErr(r *LeaseRequest) (LeaseResult, error) {
	do := func(cmd []byte) (LeaseResult, error) {
		st, reply, err := h.c.Do(context.Background(), "rc", cmd)
		if err != nil {
			return LeaseResult{}, err
		}
		if st != redisclient.StatusOK {
			return LeaseResult{}, errors.New("redis call failed: " + st.String())
		}
		var d resp.Decoder
		v, err := d.Parse(reply)
		if err != nil {
			return LeaseResult{}, err
		}
		return ParseLeaseReply(v, r.N)
	}
	res, err := do(r.AppendEvalSHA(nil))
	if IsNoScript(err) {
		return do(r.AppendEval(nil))
	}
	return res, err
}

// Fixed window: grants are min(n, ⌈available/instances⌉), they add up to
// exactly the limit, a return gives back admissions of the same window only,
// and a lease is valid until the window's end.
func TestLeaseFixedWindow(t *testing.T) {
	h := newHost(t)
	p := algorithms.Params{Limit: 100, Window: time.Hour}
	key := AppendLeaseKey(nil, algorithms.FixedWindow, t.Name(), "k")
	now := int64(1_700_000_000_000_000) // µs, 2023-11-14T22:13:20Z; window start 22:00
	ws := now / 3_600_000_000 * 3_600_000_000
	req := func(n int64, ret bool, stamp int64) *LeaseRequest {
		return &LeaseRequest{Kind: algorithms.FixedWindow, Params: p, Key: key, N: n, Instances: 3, Now: now, Return: ret, Stamp: stamp}
	}
	var grants []int64
	total := int64(0)
	for {
		r := h.lease(t, req(10, false, 0))
		if r.Granted == 0 {
			if r.Allowed || r.Remaining != 0 || r.RetryAfter != time.Duration(ws+3_600_000_000-now)*time.Microsecond {
				t.Fatalf("denial %+v", r)
			}
			break
		}
		total += r.Granted
		grants = append(grants, r.Granted)
		if r.Stamp != ws || r.Remaining != 100-total || r.Valid != time.Duration(ws+3_600_000_000-now)*time.Microsecond {
			t.Fatalf("grant %+v after %d", r, total)
		}
	}
	// 100 → ten grants of 10 would leave nothing for a second proxy near
	// the end: from 29 left the grants shrink to a third of what is left.
	want := []int64{10, 10, 10, 10, 10, 10, 10, 10, 7, 5, 3, 2, 1, 1, 1}
	if total != 100 || len(grants) != len(want) {
		t.Fatalf("grants %v (total %d), want %v", grants, total, want)
	}
	for i := range want {
		if grants[i] != want[i] {
			t.Fatalf("grants %v, want %v", grants, want)
		}
	}
	// A return of another window gives back nothing; of this one, at most n.
	if r := h.lease(t, req(5, true, ws-3_600_000_000)); r.Granted != 0 || r.Remaining != 0 {
		t.Fatalf("stale return %+v", r)
	}
	if r := h.lease(t, req(5, true, ws)); r.Granted != 5 || r.Remaining != 5 {
		t.Fatalf("return %+v", r)
	}
	if r := h.lease(t, req(10, false, 0)); r.Granted != 2 || r.Remaining != 3 {
		t.Fatalf("acquire after return %+v", r)
	}
	// The next window starts afresh.
	now = ws + 3_600_000_000
	if r := h.lease(t, req(10, false, 0)); r.Granted != 10 || r.Remaining != 90 || r.Stamp != now {
		t.Fatalf("next window %+v", r)
	}
}

// Token bucket: grants take whole tokens, the bucket refills at its rate,
// and a return never fills it beyond the burst.
func TestLeaseTokenBucket(t *testing.T) {
	h := newHost(t)
	p := algorithms.Params{Limit: 3600, Window: time.Hour, Burst: 20} // 1 token/s
	key := AppendLeaseKey(nil, algorithms.TokenBucket, t.Name(), "k")
	now := int64(1_700_000_000_000_000)
	req := func(n int64, ret bool) *LeaseRequest {
		return &LeaseRequest{Kind: algorithms.TokenBucket, Params: p, Key: key, N: n, Instances: 1, Now: now, Return: ret}
	}
	if r := h.lease(t, req(8, false)); r.Granted != 8 || r.Remaining != 12 || r.Limit != 20 || r.Valid != 0 || r.ResetAfter != 8*time.Second {
		t.Fatalf("first %+v", r)
	}
	if r := h.lease(t, req(15, false)); r.Granted != 12 || r.Remaining != 0 {
		t.Fatalf("second %+v", r)
	}
	if r := h.lease(t, req(1, false)); r.Granted != 0 || r.RetryAfter != time.Second {
		t.Fatalf("empty %+v", r)
	}
	now += 2_500_000 // 2.5 tokens
	if r := h.lease(t, req(5, false)); r.Granted != 2 || r.Remaining != 0 {
		t.Fatalf("refilled %+v", r)
	}
	if r := h.lease(t, req(30, true)); r.Granted != 19 || r.Remaining != 19 {
		t.Fatalf("return %+v", r) // 0.5 + 19 tokens: one whole token stays missing
	}
	if r := h.lease(t, req(3, true)); r.Granted != 0 {
		t.Fatalf("return into a full bucket %+v", r)
	}
}

// With n = 1 and one instance, the lease script decides exactly like the
// reference algorithm (Allowed, Remaining) on a random walk of instants.
func TestLeaseOneIsTheAlgorithm(t *testing.T) {
	h := newHost(t)
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.FixedWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			p := algorithms.Params{Limit: 7, Window: 10 * time.Minute, Burst: 5}
			if kind == algorithms.FixedWindow {
				p.Burst = 0
			}
			ref, err := algorithms.New(kind, p)
			if err != nil {
				t.Fatal(err)
			}
			key := AppendLeaseKey(nil, kind, t.Name(), "k")
			rng := rand.New(rand.NewPCG(uint64(kind), 7))
			now := int64(1_700_000_000_123_456)
			var state []byte
			allowed := 0
			for step := 0; step < 200; step++ {
				now += rng.Int64N(int64(p.Window/us) / p.Limit)
				st, want, err := ref.Decide(nil, state, now*1000, 1)
				if err != nil {
					t.Fatal(err)
				}
				state = st
				got := h.lease(t, &LeaseRequest{Kind: kind, Params: p, Key: key, N: 1, Instances: 1, Now: now})
				if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
					t.Fatalf("step %d: lease %+v, reference %+v", step, got.Decision, want)
				}
				if want.Allowed {
					allowed++
				}
			}
			if allowed < 20 || allowed > 180 {
				t.Fatalf("%d of 200 admitted: the walk does not exercise both outcomes", allowed)
			}
		})
	}
}

// Three hosts race 600 acquires of up to 10 on one key (limit 100, three
// instances): the grants add up to exactly the limit.
func TestLeaseExactUnderConcurrency(t *testing.T) {
	hosts := []*host{newHost(t), newHost(t), newHost(t)}
	for _, kind := range []algorithms.Kind{algorithms.TokenBucket, algorithms.FixedWindow} {
		t.Run(kind.String(), func(t *testing.T) {
			p := algorithms.Params{Limit: 100, Window: time.Hour}
			key := AppendLeaseKey(nil, kind, t.Name(), "k")
			var granted, calls atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 600)
			for i := 0; i < 600; i++ {
				wg.Add(1)
				go func(h *host) {
					defer wg.Done()
					r, err := h.leaseErr(&LeaseRequest{Kind: kind, Params: p, Key: key, N: 10, Instances: 3})
					if err != nil {
						errs <- err
						return
					}
					calls.Add(1)
					granted.Add(r.Granted)
				}(hosts[i%3])
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			// token_bucket refills 100/h: at most one more token in a test run.
			if g := granted.Load(); g < 100 || g > 101 || (kind == algorithms.FixedWindow && g != 100) {
				t.Fatalf("granted %d over %d calls, want 100", g, calls.Load())
			}
		})
	}
}

func TestParseLeaseReply(t *testing.T) {
	ints := func(x ...int64) resp.Value {
		v := resp.Value{Type: resp.Array}
		for _, i := range x {
			v.Elems = append(v.Elems, resp.Value{Type: resp.Integer, Int: i})
		}
		return v
	}
	if r, err := ParseLeaseReply(ints(3, 10, 4, 5, 0, 7, 9), 5); err != nil || r.Granted != 3 || !r.Allowed || r.Stamp != 7 || r.Valid != 9*us {
		t.Fatalf("%+v %v", r, err)
	}
	for i, v := range []resp.Value{
		ints(6, 10, 4, 5, 0, 7, 9), ints(-1, 10, 4, 5, 0, 7, 9), ints(1, 0, 0, 5, 0, 7, 9),
		ints(1, 10, 11, 5, 0, 7, 9), ints(1, 10, 4, -5, 0, 7, 9), ints(1, 10, 4, 5, 0, -7, 9),
		ints(1, 10, 4), {Type: resp.Integer, Int: 1},
	} {
		if _, err := ParseLeaseReply(v, 5); !errors.Is(err, ErrBadReply) {
			t.Errorf("case %d: %v, want ErrBadReply", i, err)
		}
	}
}
