package redisrl

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// runBatch is host.run for a call deciding r.N requests.
func (h *host) runBatch(t testing.TB, r *Request) Batch {
	t.Helper()
	for _, cmd := range [][]byte{r.AppendEvalSHA(nil), r.AppendEval(nil)} {
		st, reply, err := h.c.Do(context.Background(), "rc", cmd)
		if err != nil || st != 0 {
			t.Fatalf("redis call: %v %v", st, err)
		}
		v, err := resp.Parse(reply)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ParseBatchReply(v, max(r.N, 1))
		if IsNoScript(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Fatal("NOSCRIPT after EVAL")
	return Batch{}
}

// A call deciding n requests at one instant decides each as package
// algorithms does n requests arriving one after the other at that instant:
// the same admissions, remaining and retry after for each, and the reset
// after of the last admitted (the state after the batch) — for every
// algorithm, with the clock going backwards and costs above the capacity.
func TestBatchIsSequentialAtOneInstant(t *testing.T) {
	h := newHost(t)
	sets := []algorithms.Params{
		{Limit: 5, Window: time.Hour, Burst: 8},
		{Limit: 7, Window: time.Hour, Burst: 3},
		{Limit: 13, Window: 7*time.Minute + 11*us, Burst: 5},
	}
	for _, kind := range algorithms.Kinds {
		for si, p := range sets {
			t.Run(kind.String()+"/"+strconv.Itoa(si), func(t *testing.T) {
				ref, err := algorithms.New(kind, p)
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(uint64(kind)+100, uint64(si)))
				key := testKey(t, kind, "k")
				now := int64(1_700_000_000_123_456)
				var state []byte
				partial := 0 // batches with admissions and denials
				for step := 0; step < 120; step++ {
					switch r := rng.IntN(100); {
					case r < 10:
						now -= rng.Int64N(int64(p.Window/us) / 4)
					case r < 15:
					case r < 20:
						now += rng.Int64N(2 * int64(p.Window/us))
					default:
						now += 1 + rng.Int64N(6*int64(p.Window/us)/p.Limit)
					}
					cost := int64(1)
					if r := rng.IntN(100); r < 20 {
						cost = 2
					} else if r < 23 {
						cost = ref.Params().Burst + 1
					}
					n := 1 + rng.Int64N(8)
					want := make([]algorithms.Decision, n)
					lastAdmitted := -1
					for i := range want {
						var d algorithms.Decision
						state, d, err = ref.Decide(nil, state, now*1000, cost)
						if err != nil {
							t.Fatal(err)
						}
						d.ResetAfter, d.RetryAfter = ceilUS(d.ResetAfter), ceilUS(d.RetryAfter)
						want[i] = d
						if d.Allowed {
							lastAdmitted = i
						}
					}
					b := h.runBatch(t, &Request{Kind: kind, Params: p, Key: key, Cost: cost, Now: now, N: n})
					if b.Admitted > 0 && b.Admitted < n {
						partial++
					}
					for i := range want {
						got := b.At(int64(i), cost)
						w := want[i]
						if w.Allowed {
							w.ResetAfter = want[lastAdmitted].ResetAfter
						}
						if got.Decision != w {
							t.Fatalf("step %d (now %d, cost %d, n %d) request %d: script %+v (admitted %d), reference %+v",
								step, now, cost, n, i, got.Decision, b.Admitted, w)
						}
					}
				}
				if partial < 5 {
					t.Errorf("%d batches were partly admitted: the workload does not exercise them", partial)
				}
			})
		}
	}
}

// Each admission of a batch is refunded on its own: sliding_log's i-th
// admission owns the log entries from ref + i × c.
func TestBatchRefundsOneAdmission(t *testing.T) {
	h := newHost(t)
	for _, kind := range algorithms.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			p := algorithms.Params{Limit: 10, Window: time.Hour}
			key := testKey(t, kind, "k")
			now := int64(1_700_000_000_000_000)
			b := h.runBatch(t, &Request{Kind: kind, Params: p, Key: key, Cost: 2, Now: now, N: 4})
			if b.Admitted != 4 {
				t.Fatalf("admitted %d of 4", b.Admitted)
			}
			for _, i := range []int64{1, 3} {
				res := b.At(i, 2)
				if _, err := h.run(&Request{Kind: kind, Params: p, Key: key, Cost: 2, Now: now, Refund: &res}); err != nil {
					t.Fatal(err)
				}
			}
			// Two admissions of 2 remain: 3 more fit, the 4th does not.
			b = h.runBatch(t, &Request{Kind: kind, Params: p, Key: key, Cost: 2, Now: now, N: 4})
			if b.Admitted != 3 || b.Last.Remaining != 0 {
				t.Fatalf("after the refunds: admitted %d of 4, remaining %d; want 3, 0", b.Admitted, b.Last.Remaining)
			}
		})
	}
}

func TestParseBatchReply(t *testing.T) {
	ints := func(xs ...int64) resp.Value {
		v := resp.Value{Type: resp.Array}
		for _, x := range xs {
			v.Elems = append(v.Elems, resp.Value{Type: resp.Integer, Int: x})
		}
		return v
	}
	b, err := ParseBatchReply(ints(3, 10, 1, 5000, 7000, 99, 4), 5)
	if err != nil {
		t.Fatal(err)
	}
	if b.Admitted != 3 {
		t.Fatal(b)
	}
	for i, want := range []struct {
		allowed    bool
		rem, retry int64
		ref        int64
	}{{true, 5, 0, 4}, {true, 3, 0, 6}, {true, 1, 0, 8}, {false, 1, 7000, 4}, {false, 1, 7000, 4}} {
		r := b.At(int64(i), 2)
		if r.Allowed != want.allowed || r.Remaining != want.rem || r.RetryAfter != time.Duration(want.retry)*us || r.Ref != want.ref ||
			r.ResetAfter != 5000*us || r.Stamp != 99 {
			t.Errorf("request %d: %+v", i, r)
		}
	}
	for _, bad := range []resp.Value{
		ints(6, 10, 1, 0, 0, 1, 0),  // more than n
		ints(-1, 10, 1, 0, 1, 1, 0), // negative
		ints(5, 10, 1, 0, 7, 1, 0),  // all admitted with a retry after
		ints(2, 10, 1, 0, 0, 1, 0),  // some denied without one
		ints(2, 10, 11, 0, 1, 1, 0), // remaining above the limit
		ints(2, 10, 1, 0, 1, 1),     // short
		{Type: resp.Error, Str: []byte("ERR x")},
	} {
		if _, err := ParseBatchReply(bad, 5); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
