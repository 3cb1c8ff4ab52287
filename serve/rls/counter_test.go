package rls

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// commandLog is a Backend that records the name of every command.
type commandLog struct {
	Backend
	mu    sync.Mutex
	names []string
}

func (c *commandLog) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	v, err := resp.Parse(cmd)
	if err == nil && len(v.Elems) > 0 {
		c.mu.Lock()
		c.names = append(c.names, strings.ToUpper(string(v.Elems[0].Str)))
		c.mu.Unlock()
	}
	return c.Backend.Do(ctx, cmd)
}

func (c *commandLog) take() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := strings.Join(c.names, " ")
	c.names = nil
	return s
}

// counterValue reads the count of r's window at now (0 when no key).
func counterValue(t *testing.T, b Backend, r *redisrl.Request, now int64) int64 {
	t.Helper()
	n, err := getCounter(context.Background(), b, counterCall(r, now, 0))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A fixed_window decision is INCRBY + PEXPIREAT, a denial adds one DECRBY,
// no script runs, and the counter holds the admitted units only.
func TestWindowCounterCommands(t *testing.T) {
	b := backend(t)
	log := &commandLog{Backend: b}
	// The replica's clock (Now answers 0), as in production.
	_, c := serve(t, Options{Config: parse(t, exactConfig), Backend: log, Now: func() int64 { return 0 }})
	key := uniq("k")
	d := func() *ratelimitv3.RateLimitDescriptor { return desc("alg", "fixed_window", "ovr", key) }
	if r := call(t, c, "exact", d()); r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("first call: %v", r.OverallCode)
	}
	if got := log.take(); got != "INCRBY PEXPIREAT" {
		t.Fatalf("an admission sent %q, want INCRBY PEXPIREAT", got)
	}
	for i := 0; i < 3; i++ {
		r := call(t, c, "exact", d())
		if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("call %d: %v, %d left", i+2, r.OverallCode, r.Statuses[0].LimitRemaining)
		}
		if got := log.take(); got != "INCRBY PEXPIREAT DECRBY" {
			t.Fatalf("a denial sent %q, want INCRBY PEXPIREAT DECRBY", got)
		}
	}
	req := &redisrl.Request{Kind: algorithms.FixedWindow, Key: redisrl.AppendKey(nil, algorithms.FixedWindow, "exact/", redisKeyPart(d().Entries, nil))}
	req.Params.Window = time.Hour
	if n := counterValue(t, b, req, time.Now().UnixMicro()); n != 1 {
		t.Fatalf("the counter holds %d after 1 admission and 3 denials, want 1", n)
	}
}

// Mixed costs on one counter: each admitted exactly as the algorithm
// decides them one after the other, denials charged nothing; a refund
// stamped in an ended window takes nothing.
func TestWindowCounterMixedCosts(t *testing.T) {
	b := backend(t)
	ctx := context.Background()
	const now = 1_700_000_000_000_000 // a window start (W = 1 s)
	r := redisrl.Request{Kind: algorithms.FixedWindow, Params: algorithms.Params{Limit: 10, Window: time.Second},
		Key: redisrl.AppendKey(nil, algorithms.FixedWindow, "t/", uniq("mixed")), Now: now + 10}
	for i, step := range []struct {
		cost      int64
		allowed   bool
		remaining int64
	}{{6, true, 4}, {6, false, 4}, {4, true, 0}, {1, false, 0}, {11, false, 0}} {
		r.Cost = step.cost
		bt, err := runCounter(ctx, b, &r, nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res := bt.Last; res.Allowed != step.allowed || res.Remaining != step.remaining {
			t.Fatalf("step %d (cost %d): allowed %v remaining %d, want %v %d", i, step.cost, res.Allowed, res.Remaining, step.allowed, step.remaining)
		}
	}
	if n := counterValue(t, b, &r, r.Now); n != 10 {
		t.Fatalf("counter %d, want 10", n)
	}
	// A refund of the cost-4 admission in the same window gives it back;
	// one stamped in the previous window takes nothing.
	ref := r
	ref.Cost, ref.Refund = 4, &redisrl.Result{Stamp: now - 1}
	if _, err := runCounter(ctx, b, &ref, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	if n := counterValue(t, b, &r, r.Now); n != 10 {
		t.Fatalf("counter %d after a refund from an ended window, want 10", n)
	}
	ref.Refund = &redisrl.Result{Stamp: now + 5}
	if bt, err := runCounter(ctx, b, &ref, nil, nil, nil); err != nil || bt.Last.Remaining != 4 {
		t.Fatalf("refund: %+v, %v; want 4 remaining", bt.Last, err)
	}
	// A batch of 5 requests of cost 1: the first 4 admitted.
	r.Cost, r.N = 1, 5
	bt, err := runCounter(ctx, b, &r, nil, nil, nil)
	if err != nil || bt.Admitted != 4 || bt.Last.RetryAfter != time.Second-10*time.Microsecond {
		t.Fatalf("batch: %+v, %v; want 4 admitted, retry after the window's end", bt, err)
	}
	if n := counterValue(t, b, &r, r.Now); n != 10 {
		t.Fatalf("counter %d, want 10", n)
	}
}

// A denial whose units is_negative_hits took meanwhile puts the counter
// back to 0, with an expiry, rather than leaving it below 0.
func TestWindowCounterUndoNeverBelowZero(t *testing.T) {
	b := backend(t)
	ctx := context.Background()
	r := redisrl.Request{Kind: algorithms.FixedWindow, Params: algorithms.Params{Limit: 10, Window: time.Hour},
		Key: redisrl.AppendKey(nil, algorithms.FixedWindow, "t/", uniq("undo")), Now: time.Now().UnixMicro()}
	cc := counterCall(&r, r.Now, 0)
	if err := undoCounter(ctx, b, cc, 3, true, nil); err != nil {
		t.Fatal(err)
	}
	key, _ := cc.windowKey()
	if n := counterValue(t, b, &r, r.Now); n != 0 {
		t.Fatalf("counter %d, want 0", n)
	}
	reply, err := b.Do(ctx, counterCmd("PEXPIRE", key, 3_600_000))
	ttl, err := intReply(reply, err, "PEXPIRE")
	if err != nil || ttl != 1 {
		t.Fatalf("PEXPIRE: %d, %v: the key should exist", ttl, err)
	}
}

// Two replicas, concurrent calls of costs 1 to 3 on one key: the admitted
// units never exceed the limit, and once every call answered the counter
// holds exactly them (every denial gave its units back): what is left is
// admitted next.
func TestWindowCounterConcurrentMixedCosts(t *testing.T) {
	cfg := parse(t, exactConfig)
	b := backend(t)
	_, r1 := serve(t, Options{Config: cfg})
	_, r2 := serve(t, Options{Config: cfg})
	replicas := []pb.RateLimitServiceClient{r1, r2}
	key := uniq("k")
	var units, failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 600; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d := desc("alg", "fixed_window", "client", key)
			cost := int64(1 + i%3)
			d.HitsAddend = wrapperspb.UInt64(uint64(cost))
			r, err := replicas[i%2].ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "exact", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			switch {
			case err != nil:
				failed.Add(1)
			case r.OverallCode == pb.RateLimitResponse_OK:
				units.Add(cost)
			}
		}()
	}
	close(start)
	wg.Wait()
	if failed.Load() != 0 || units.Load() > 100 {
		t.Fatalf("%d units admitted, %d failed; want at most 100 and no failure", units.Load(), failed.Load())
	}
	t.Logf("%d units admitted of 100", units.Load())
	req := &redisrl.Request{Kind: algorithms.FixedWindow, Key: redisrl.AppendKey(nil, algorithms.FixedWindow, "exact/", redisKeyPart(desc("alg", "fixed_window", "client", key).Entries, nil))}
	req.Params.Window = time.Hour
	if n := counterValue(t, b, req, testNow); n != units.Load() {
		t.Fatalf("counter %d, admitted units %d", n, units.Load())
	}
	for left := 100 - units.Load(); left >= 0; left-- {
		want := pb.RateLimitResponse_OK
		if left == 0 {
			want = pb.RateLimitResponse_OVER_LIMIT
		}
		if r := call(t, r1, "exact", desc("alg", "fixed_window", "client", key)); r.OverallCode != want {
			t.Fatalf("%d left: %v, want %v", left, r.OverallCode, want)
		}
	}
}

// decrbyFails wraps a Backend: every DECRBY fails (no reply).
type decrbyFails struct{ Backend }

func (b decrbyFails) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	if strings.Contains(string(cmd), "\r\nDECRBY\r\n") {
		return nil, context.DeadlineExceeded
	}
	return b.Backend.Do(ctx, cmd)
}

// A denial whose DECRBY fails is still a denial, not UNAVAILABLE (which
// failure_mode might turn into an admission): its units stay charged,
// counted as a failed refund.
func TestWindowCounterUndoFailureKeepsTheDenial(t *testing.T) {
	s, c := serve(t, Options{Config: parse(t, exactConfig), Backend: decrbyFails{backend(t)}})
	key := uniq("k")
	if r := call(t, c, "exact", desc("alg", "fixed_window", "ovr", key)); r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("first call: %v", r.OverallCode)
	}
	if r := call(t, c, "exact", desc("alg", "fixed_window", "ovr", key)); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second call: %v", r.OverallCode)
	}
	if _, failed := s.Metrics.Refunds(); failed != 1 {
		t.Fatalf("%d failed refunds, want 1", failed)
	}
}
