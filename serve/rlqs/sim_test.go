package rlqs

import (
	"context"
	"os"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/serve/rls"
)

var cluster *redistest.Cluster

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &cluster)) }

func backend(t testing.TB) rls.Backend {
	t.Helper()
	redistest.SkipShort(t)
	b, err := rls.NewClusterBackend(cluster.Addrs, "", "", redisclient.Options{}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func config(t *testing.T, yaml string) *rls.Config {
	t.Helper()
	c, err := rls.ParseConfig([]string{"test.yaml"}, [][]byte{[]byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// clock is a fake clock shared by the simulated Envoys and the servers.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func newServer(t *testing.T, c *clock, cfg *rls.Config) *Server {
	return New(Options{Backend: backend(t), Config: func() *rls.Config { return cfg }, Now: c.Now, ScriptClock: true})
}

// simEnvoy is one Envoy's rate_limit_quota filter for one bucket, as
// Envoy 1.40 behaves (docs/rlqs.md): a new bucket is reported at once and
// then with every report; a token-bucket assignment whose max_tokens,
// tokens_per_fill and fill_interval are unchanged keeps the bucket's
// tokens, any other creates a full bucket; an assignment expires after
// its TTL (seconds) to the no_assignment_behavior; the counts reset at
// each report. A response is applied at the next tick (a round trip).
type simEnvoy struct {
	t      *testing.T
	st     *stream
	denyNo bool // no_assignment_behavior DENY_ALL
	id     map[string]string

	created  bool
	strategy *typev3.RateLimitStrategy
	expires  time.Time
	tokens   int64
	tag      int64 // window of the tokens (the grant's)
	allowed  uint64
	denied   uint64
	pending  []pendingResp
	admitted map[int64]int64 // by window of the tokens spent
	total    int64
	late     int64     // denials after lateAfter
	lateAt   time.Time // zero: none counted
	every    int       // ticks between reports (0: 10, a second)
	phase    int       // the tick of its reports in the period (0: its index)
	lastRep  time.Time // the bucket's last report (time_elapsed)
}

type pendingResp struct {
	r   *pb.RateLimitQuotaResponse
	tag int64
}

func newSimEnvoy(t *testing.T, s *Server, id map[string]string) *simEnvoy {
	return &simEnvoy{t: t, st: &stream{s: s, id: newID(), buckets: map[string]*bucket{}}, id: id, admitted: map[int64]int64{}}
}

func (e *simEnvoy) key() string { k, _ := canonical(e.id); return k }

// send passes a report to the service; the response is applied later.
func (e *simEnvoy) send(ctx context.Context, m *pb.RateLimitQuotaUsageReports) {
	al, de := m.BucketQuotaUsages[0].NumRequestsAllowed, m.BucketQuotaUsages[0].NumRequestsDenied
	r, err := e.st.report(ctx, m)
	if err != nil {
		e.t.Fatal(err)
	}
	if os.Getenv("SIMDEBUG") != "" {
		b := e.st.buckets[e.key()]
		e.t.Logf("%s %s a=%d d=%d tokens=%d -> %v kind=%d size=%d", e.st.s.o.Now().Format("05.0"), e.st.id[:4], al, de, e.tokens, r.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy(), b.kind, b.size)
	}
	e.queue(r)
}

func (e *simEnvoy) queue(r *pb.RateLimitQuotaResponse) {
	if r == nil || len(r.BucketAction) == 0 {
		return
	}
	tag := int64(-1)
	if b := e.st.buckets[e.key()]; b != nil {
		tag = b.ws
	}
	e.pending = append(e.pending, pendingResp{r, tag})
}

func (e *simEnvoy) usage() *pb.RateLimitQuotaUsageReports {
	now := e.st.s.o.Now()
	// time_elapsed as Envoy sends it: whole seconds since the bucket's
	// last report (or its creation).
	el := durationpb.New(now.Sub(e.lastRep).Truncate(time.Second))
	e.lastRep = now
	m := &pb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &pb.BucketId{Bucket: e.id}, NumRequestsAllowed: e.allowed, NumRequestsDenied: e.denied, TimeElapsed: el}}}
	e.allowed, e.denied = 0, 0
	return m
}

// apply applies the pending responses.
func (e *simEnvoy) apply(now time.Time) {
	for _, p := range e.pending {
		for _, a := range p.r.BucketAction {
			if a.GetAbandonAction() != nil {
				e.created, e.strategy = false, nil
				continue
			}
			qa := a.GetQuotaAssignmentAction()
			ns := qa.GetRateLimitStrategy()
			if tb := ns.GetTokenBucket(); tb != nil {
				old := e.strategy.GetTokenBucket()
				switch {
				case old == nil:
					e.tokens, e.tag = int64(tb.GetMaxTokens()), p.tag
				case old.GetMaxTokens() != tb.GetMaxTokens() || old.GetTokensPerFill().GetValue() != tb.GetTokensPerFill().GetValue() ||
					old.GetFillInterval().GetNanos() != tb.GetFillInterval().GetNanos():
					// Envoy 1.40: as full as the replaced bucket was.
					e.tokens, e.tag = int64(tb.GetMaxTokens())*e.tokens/int64(old.GetMaxTokens()), p.tag
				}
			} else {
				e.tokens = 0
			}
			e.strategy = proto.Clone(ns).(*typev3.RateLimitStrategy)
			e.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
		}
	}
	e.pending = nil
}

// request decides one request; it reports a new bucket at once.
func (e *simEnvoy) request(ctx context.Context, now time.Time) bool {
	if !e.created {
		e.created, e.strategy, e.lastRep = true, nil, now
		ok := !e.denyNo
		if ok {
			e.allowed++
			e.total++
			e.admitted[-1]++
		} else {
			e.denied++
		}
		e.send(ctx, e.usage())
		return ok
	}
	s := e.strategy
	if s != nil && !now.Before(e.expires) {
		e.strategy, e.tokens, s = nil, 0, nil
	}
	ok := !e.denyNo
	switch {
	case s == nil:
	case s.GetTokenBucket() != nil:
		ok = e.tokens > 0
		if ok {
			e.tokens--
			e.admitted[e.tag]++
		}
	default:
		ok = s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
		if ok && s.GetTokenBucket() == nil {
			e.admitted[-1]++
		}
	}
	if ok {
		e.allowed++
		e.total++
	} else {
		e.denied++
		if !e.lateAt.IsZero() && now.After(e.lateAt) {
			e.late++
		}
	}
	return ok
}

// holding is what the Envoy's current bucket can still admit, by window.
func (e *simEnvoy) holding(now time.Time) (int64, int64) {
	if e.strategy.GetTokenBucket() == nil || !now.Before(e.expires) {
		return -1, 0
	}
	return e.tag, e.tokens
}

const simConfig = `
domain: d
descriptors:
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 300}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 300, algorithm: token_bucket}
`

// sim runs the Envoys for d in ticks of 100 ms with the given demand
// (requests per tick, by Envoy), each reporting every second, pushes
// every tick; it checks at every tick that no window's admissions plus
// the tokens the Envoys still hold of it exceed the limit, and returns the
// admissions by window (of the wall clock).
func sim(t *testing.T, c *clock, envoys []*simEnvoy, demand func(i int, now time.Time) int, d time.Duration, limit int64) map[int64]int64 {
	t.Helper()
	ctx := context.Background()
	wall := map[int64]int64{}
	const tick = 100 * time.Millisecond
	steps := int(d / tick)
	for k := 0; k < steps; k++ {
		c.now = c.now.Add(tick)
		now := c.now
		for i, e := range envoys {
			e.apply(now)
			every := e.every
			if every == 0 {
				every = 10
			}
			ph := i
			if e.phase != 0 {
				ph = e.phase
			}
			if g := int(now.UnixMilli() / 100); g%every == ph%every && e.created { // phases kept across calls
				if n := demand(i, now); n >= 0 {
					e.send(ctx, e.usage())
				}
			}
			e.queue(e.st.push(ctx))
			n := demand(i, now)
			for j := 0; j < n; j++ {
				if e.request(ctx, now) {
					wall[now.UnixMicro()-now.UnixMicro()%int64(time.Minute/time.Microsecond)]++
				}
			}
		}
		// The invariant: per window of the grants, admitted + held ≤ limit.
		spent, held := map[int64]int64{}, map[int64]int64{}
		for _, e := range envoys {
			for w, n := range e.admitted {
				spent[w] += n
			}
			if w, n := e.holding(now); w >= 0 {
				held[w] += n
			}
		}
		for w, n := range spent {
			if w >= 0 && n+held[w] > limit {
				t.Fatalf("at %v window %d: %d admitted + %d held > limit %d", now, w, n, held[w], limit)
			}
		}
	}
	return wall
}

func minuteStart(t time.Time) time.Time { return t.Truncate(time.Minute) }

// Two Envoys far over the limit with uneven demand (20 and 2 requests per
// 100 ms against 300 per minute): no window of grants admits more than
// the limit (checked at every tick), the busy Envoy gets most of it, and
// each full window admits at least 90 % of the limit.
func TestSimUnevenOverLimit(t *testing.T) {
	c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 10*time.Second)}
	s1 := newServer(t, c, config(t, simConfig))
	s2 := newServer(t, c, config(t, simConfig))
	id := map[string]string{"api": uniq(t)}
	a, b := newSimEnvoy(t, s1, id), newSimEnvoy(t, s2, id)
	wall := sim(t, c, []*simEnvoy{a, b}, func(i int, _ time.Time) int { return []int{20, 2}[i] }, 200*time.Second, 300)
	full := 0
	for w, n := range wall {
		ws := time.UnixMicro(w)
		if ws.Before(c.now.Add(-200*time.Second)) || ws.Add(time.Minute).After(c.now) {
			continue
		}
		full++
		t.Logf("window %v: admitted %d of 300", ws.Format("15:04"), n)
		if n > 300+22 { // + what the previous window's grants admit before the push (one tick)
			t.Errorf("window %v admitted %d", ws, n)
		}
		if n < 270 {
			t.Errorf("window %v admitted only %d of 300", ws, n)
		}
	}
	if full < 2 {
		t.Fatalf("only %d full windows", full)
	}
	if a.total <= 2*b.total {
		t.Errorf("busy Envoy admitted %d, the other %d: shares do not follow demand", a.total, b.total)
	}
	t.Logf("admitted: busy %d, light %d", a.total, b.total)
}

// Under the limit (3 requests per second in all against 5), nothing is
// denied once the Envoys have reported (after 3 s).
func TestSimUnderLimitAdmitsAll(t *testing.T) {
	c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 5*time.Second)}
	s := newServer(t, c, config(t, simConfig))
	id := map[string]string{"api": uniq(t)}
	a, b := newSimEnvoy(t, s, id), newSimEnvoy(t, s, id)
	start := c.now
	envoys := []*simEnvoy{a, b}
	for _, e := range envoys {
		e.lateAt = start.Add(3 * time.Second) // after the first reports
	}
	demand := func(i int, now time.Time) int {
		// 2 per second and 1 per second
		k := int(now.Sub(start) / (100 * time.Millisecond))
		if i == 0 && k%5 == 0 || i == 1 && k%10 == 3 {
			return 1
		}
		return 0
	}
	sim(t, c, envoys, demand, 150*time.Second, 300)
	for _, e := range envoys {
		if e.total == 0 {
			t.Fatal("nothing admitted")
		}
	}
	if n := a.late + b.late; n != 0 {
		t.Errorf("%d requests denied under the limit after the first reports (admitted %d and %d)", n, a.total, b.total)
	}
	t.Logf("admitted %d and %d, none denied after 3 s", a.total, b.total)
}

// A silent Envoy's share returns: once the light Envoy stops (no reports,
// no requests) it leaves the split after its TTL and grace, and the busy
// one gets the rest of the window but what the silent one may have spent
// unreported (at most its last grant and a replaced bucket: six reporting
// intervals of its demand, 60 here); the next window is all the busy one's.
func TestSimSilentEnvoyShareReturns(t *testing.T) {
	c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 2*time.Second)}
	s := newServer(t, c, config(t, simConfig))
	id := map[string]string{"api": uniq(t)}
	a, b := newSimEnvoy(t, s, id), newSimEnvoy(t, s, id)
	start := c.now
	first := minuteStart(start).UnixMicro()
	// Both demand 10 per second for 10 s, then only the busy one (10 per tick).
	demand := func(i int, now time.Time) int {
		if now.Sub(start) < 10*time.Second {
			return 1
		}
		if i == 1 {
			return -1 // silent: no requests, no reports
		}
		return 10
	}
	wall := sim(t, c, []*simEnvoy{a, b}, demand, 117*time.Second, 300)
	if got := wall[first]; got < 300-60 || got > 300 {
		t.Errorf("first window admitted %d (the silent Envoy %d): want 240..300", got, b.total)
	}
	if got := wall[first+int64(time.Minute/time.Microsecond)]; got < 300-10 || got > 300+10 {
		t.Errorf("second window admitted %d, want 300 (± one tick across the boundary)", got)
	}
	t.Logf("first window %d (silent Envoy %d), second %d", wall[first], b.total, wall[first+int64(time.Minute/time.Microsecond)])
}

var uniqN int

func uniq(t *testing.T) string {
	uniqN++
	return t.Name() + "-" + time.Now().Format("150405.000000") + "-" + string(rune('a'+uniqN%26))
}

// An Envoy whose stream breaks reconnects to another replica (a new stream
// there): it keeps its bucket until the new replica's first grant replaces
// it, its admissions since its last report are charged to the pool there,
// no window of grants exceeds the limit (checked every tick), and it goes
// on being granted its share; what its old stream held comes back with the
// next window, which admits the limit in full.
func TestSimReconnectToOtherReplica(t *testing.T) {
	c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 2*time.Second)}
	s1, s2 := newServer(t, c, config(t, simConfig)), newServer(t, c, config(t, simConfig))
	id := map[string]string{"api": uniq(t)}
	a, b := newSimEnvoy(t, s1, id), newSimEnvoy(t, s2, id)
	first := minuteStart(c.now).UnixMicro()
	demand := func(i int, _ time.Time) int { return []int{3, 1}[i] } // 30/s and 10/s: over 300/min
	sim(t, c, []*simEnvoy{a, b}, demand, 20*time.Second, 300)
	before := a.total
	a.st = &stream{s: s2, id: newID(), buckets: map[string]*bucket{}} // the stream broke; the Envoy keeps its bucket
	wall := sim(t, c, []*simEnvoy{a, b}, demand, 97*time.Second, 300)
	if a.total == before {
		t.Fatal("the reconnected Envoy admitted nothing more")
	}
	next := first + int64(time.Minute/time.Microsecond)
	if got := wall[next]; got < 290 || got > 310 {
		t.Errorf("the window after the reconnection admitted %d, want 300 (± one tick across the boundary)", got)
	}
	t.Logf("before the reconnection %d, after %d; the next window %d", before, a.total-before, wall[next])
}
