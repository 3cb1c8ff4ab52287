package rlqs

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/serve/rls"
)

// named is a simulated Envoy that reports every 5 s (as Envoy does) on a
// stream of s that names it.
func named(t *testing.T, s *Server, id map[string]string, client string) *simEnvoy {
	e := newSimEnvoy(t, s, id)
	e.every = 50
	e.st.client = client
	return e
}

// reconnect moves e to a new stream of s (the old stream broke; the Envoy
// keeps its bucket and assignment).
func reconnect(e *simEnvoy, s *Server) {
	e.st = &stream{s: s, id: newID(), buckets: map[string]*bucket{}, client: e.st.client}
	e.pending = nil // responses in flight on the old stream are lost
}

// An Envoy whose stream moves to another replica mid-window: named, it
// continues its participant there — its bucket and the tokens in it are
// kept — so the window admits the limit in full; unnamed, the new
// replica's first grant replaces the bucket and what the old participant
// held stays taken until the window ends. No window of grants exceeds the
// limit in either (sim checks every tick).
func TestSimReconnectContinues(t *testing.T) {
	run := func(t *testing.T, client string, brk bool) (window int64, s2 *Server, kept bool) {
		c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 2*time.Second)}
		s1, s2 := newServer(t, c, config(t, simConfig)), newServer(t, c, config(t, simConfig))
		a := named(t, s1, map[string]string{"api": uniq(t)}, client)
		b := named(t, s2, a.id, client+"-b")
		if client == "" {
			b.st.client = ""
		}
		first := minuteStart(c.now).UnixMicro()
		demand := func(i int, _ time.Time) int { return []int{2, 1}[i] } // 20/s and 10/s: 300/min is spent in 10 s
		wall := sim(t, c, []*simEnvoy{a, b}, demand, 6*time.Second+50*time.Millisecond, 300)
		held := a.tokens
		nanos := a.strategy.GetTokenBucket().GetFillInterval().GetNanos()
		if brk {
			reconnect(a, s2)
		}
		for w, n := range sim(t, c, []*simEnvoy{a, b}, demand, 60*time.Second, 300) {
			wall[w] += n
		}
		kept = a.strategy.GetTokenBucket().GetFillInterval().GetNanos() == nanos
		t.Logf("a held %d at the break; the window admitted %d (a %d, b %d)", held, wall[first], a.admitted[first], b.admitted[first])
		return wall[first], s2, kept
	}
	base, _, _ := run(t, "envoy-a", false)
	t.Run("named", func(t *testing.T) {
		w, s2, _ := run(t, "envoy-a", true)
		if got := s2.Metrics.Continued("adopted"); got != 1 {
			t.Errorf("adopted %d, want 1", got)
		}
		if w < base-2 {
			t.Errorf("the window admitted %d, %d without the break: the continued participant's tokens were lost", w, base)
		}
	})
	t.Run("unnamed", func(t *testing.T) {
		w, s2, _ := run(t, "", true)
		if got := s2.Metrics.Continued("adopted"); got != 0 {
			t.Errorf("adopted %d, want 0", got)
		}
		t.Logf("unnamed: the window admitted %d, %d without the break", w, base)
	})
}

// A report lost between the streams (built and sent on the stream that
// died: the Envoy's counts reset) shows in the next report's time_elapsed:
// the new stream is a participant of its own, and no window of grants
// exceeds the limit.
func TestSimContinueAfterLostReport(t *testing.T) {
	c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 2*time.Second)}
	s1, s2 := newServer(t, c, config(t, simConfig)), newServer(t, c, config(t, simConfig))
	a := named(t, s1, map[string]string{"api": uniq(t)}, "envoy-a")
	b := named(t, s2, a.id, "envoy-b")
	demand := func(i int, _ time.Time) int { return []int{2, 1}[i] }
	sim(t, c, []*simEnvoy{a, b}, demand, 6*time.Second+50*time.Millisecond, 300)
	for k := 0; k < 10; k++ { // a: 1 s of requests, then a report that is lost
		c.now = c.now.Add(100 * time.Millisecond)
		a.apply(c.now)
		for j := 0; j < 2; j++ {
			a.request(context.Background(), c.now)
		}
	}
	a.usage()
	for k := 0; k < 49; k++ { // the next report is the Envoy's next tick
		c.now = c.now.Add(100 * time.Millisecond)
		a.apply(c.now)
		a.request(context.Background(), c.now)
	}
	reconnect(a, s2)
	sim(t, c, []*simEnvoy{a, b}, demand, 30*time.Second, 300)
	if got := s2.Metrics.Continued("adopted"); got != 0 {
		t.Errorf("adopted %d after a lost report, want 0", got)
	}
	if got := s2.Metrics.Continued("own"); got != 1 {
		t.Errorf("own %d, want 1", got)
	}
}

// Two live Envoys configured with the same name, on two replicas, and an
// Envoy restarted under its old name (a new process: its bucket is new):
// neither continues another's participant wrongly — no window of grants
// exceeds the limit (checked every tick), and the duplicate is counted.
func TestSimContinueDuplicateAndRestart(t *testing.T) {
	c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 2*time.Second)}
	s1, s2 := newServer(t, c, config(t, simConfig)), newServer(t, c, config(t, simConfig))
	id := map[string]string{"api": uniq(t)}
	a, b := named(t, s1, id, "same"), named(t, s2, id, "same")
	// a reports 200 ms after b: when b's stream moves, the name's index
	// points to a's participant, whose last report matches b's
	// time_elapsed; only the take's check (a reported again) refuses it.
	a.phase, b.phase = 3, 1
	demand := func(i int, _ time.Time) int { return []int{2, 1}[i] }
	sim(t, c, []*simEnvoy{a, b}, demand, 30*time.Second, 300)
	// b's stream breaks and it reconnects to s1, while a goes on.
	reconnect(b, s1)
	sim(t, c, []*simEnvoy{a, b}, demand, 30*time.Second, 300)
	// a restarts: a new process under the same name, on s2.
	a2 := named(t, s2, id, "same")
	sim(t, c, []*simEnvoy{a2, b}, demand, 70*time.Second, 300)
	if got := s1.Metrics.Continued("own") + s2.Metrics.Continued("own"); got == 0 {
		t.Error("no continuation was refused")
	}
	if got := s1.Metrics.Continued("adopted") + s2.Metrics.Continued("adopted"); got != 0 {
		t.Errorf("%d participants adopted across Envoys", got)
	}
	t.Logf("adopted %d/%d own %d/%d duplicate %d/%d", s1.Metrics.Continued("adopted"), s2.Metrics.Continued("adopted"),
		s1.Metrics.Continued("own"), s2.Metrics.Continued("own"), s1.Metrics.Continued("duplicate"), s2.Metrics.Continued("duplicate"))
}

// The Envoy's name comes from the stream's metadata; a name with a space
// or over 256 bytes ends the stream with INVALID_ARGUMENT naming the
// header, and a good one is the stream's.
func TestClientHeader(t *testing.T) {
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return config(t, grpcConfig) }})
	c := listen(t, s)
	for _, bad := range []string{"two words", strings.Repeat("x", 257)} {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), ClientHeader, bad), 10*time.Second)
		st, err := c.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(&pb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api": "k"}, 1, 0)}})
		_, err = st.Recv()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), ClientHeader) {
			t.Errorf("name %.20q: %v, want INVALID_ARGUMENT naming %s", bad, err, ClientHeader)
		}
		cancel()
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), ClientHeader, "envoy-7"), 10*time.Second)
	defer cancel()
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&pb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api": uniq(t)}, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Recv(); err != nil || strategyOf(r.BucketAction[len(r.BucketAction)-1]) != "token_bucket 10" {
		t.Fatalf("%v %v", r, err)
	}
}
