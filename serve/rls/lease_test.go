package rls

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/internal/redisrl"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// leaseDesc is the acquire descriptor sluice.wasm sends for a rule with
// "lease": the rule's entries and sluice.lease = "<n>:<instances>".
func leaseDesc(alg string, limit int64, window time.Duration, key string, n, inst int) *ratelimitv3.RateLimitDescriptor {
	d := inlineDesc("api", alg, limit, window, 0, key)
	d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rlswire.Lease, Value: strconv.Itoa(n) + ":" + strconv.Itoa(inst)})
	return d
}

// returnDesc gives back n admissions of the grant of stamp.
func returnDesc(alg string, limit int64, window time.Duration, key string, n int, stamp string) *ratelimitv3.RateLimitDescriptor {
	d := inlineDesc("api", alg, limit, window, 0, key)
	d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rlswire.Return, Value: strconv.Itoa(n) + ":" + stamp})
	return d
}

// grant reads status i of r as the filter does: the grant (quota.requests
// when OK, 0 when OVER_LIMIT) and the x-sluice-lease stamp and validity.
func grant(t *testing.T, r *pb.RateLimitResponse, i int) (g int64, stamp string, valid time.Duration) {
	t.Helper()
	st := r.Statuses[i]
	switch st.Code {
	case pb.RateLimitResponse_OK:
		g = int64(st.GetQuota().GetRequests())
		if g < 1 {
			t.Fatalf("status %d: OK without a grant: %v", i, st)
		}
	case pb.RateLimitResponse_OVER_LIMIT:
		if st.Quota != nil {
			t.Fatalf("status %d: OVER_LIMIT with a quota: %v", i, st)
		}
		return 0, "", 0
	default:
		t.Fatalf("status %d: code %v", i, st.Code)
	}
	for _, h := range header(r, rlswire.LeaseHeader) {
		parts := strings.Split(h, ":")
		if len(parts) != 3 {
			t.Fatalf("%s %q", rlswire.LeaseHeader, h)
		}
		if parts[0] == strconv.Itoa(i) {
			us, err := strconv.ParseInt(parts[2], 10, 64)
			if err != nil || us < 0 {
				t.Fatalf("%s %q", rlswire.LeaseHeader, h)
			}
			return g, parts[1], time.Duration(us) * time.Microsecond
		}
	}
	t.Fatalf("a grant without %s for descriptor %d: %v", rlswire.LeaseHeader, i, r)
	return
}

// An acquire reserves min(n, ⌈available / instances⌉) (fixed_window: valid
// until the window's end), OVER_LIMIT with the exact wait once nothing is
// left, a return gives back, and a per-request decision of the same rule
// and key is not affected (the lease script keeps its own key).
func TestLeaseAcquireAndReturn(t *testing.T) {
	s, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	key := uniq("lease")
	const limit = 25
	acq := func(n, inst int) (int64, string, time.Duration, *pb.RateLimitResponse) {
		r := call(t, c, "mesh", leaseDesc("fixed_window", limit, time.Hour, key, n, inst))
		if r.OverallCode != pb.RateLimitResponse_OK {
			t.Fatalf("a lease call's overall_code %v, want OK (leases take no part in it)", r.OverallCode)
		}
		if len(header(r, rlswire.RefundHeader)) != 0 {
			t.Fatalf("a refund token for a lease: %v", r)
		}
		g, stamp, valid := grant(t, r, 0)
		return g, stamp, valid, r
	}
	// 30 min 30 s into the hour: the window ends in 29 min 30 s.
	wantValid := 29*time.Minute + 30*time.Second
	g, stamp, valid, r := acq(10, 3) // ⌈25/3⌉ = 9
	if g != 9 || valid != wantValid || r.Statuses[0].LimitRemaining != 16 {
		t.Fatalf("acquire: granted %d valid %v remaining %d, want 9 %v 16", g, valid, r.Statuses[0].LimitRemaining, wantValid)
	}
	if g, _, _, _ := acq(10, 1); g != 10 {
		t.Fatalf("second acquire granted %d, want 10", g)
	}
	if g, _, _, _ := acq(10, 1); g != 6 {
		t.Fatalf("third acquire granted %d, want the 6 left", g)
	}
	g, _, _, r = acq(10, 1)
	if g != 0 || r.Statuses[0].DurationUntilReset.AsDuration() != wantValid {
		t.Fatalf("exhausted: granted %d, wait %v, want 0 and %v", g, r.Statuses[0].DurationUntilReset.AsDuration(), wantValid)
	}
	// Give 4 of the first grant back; they can be acquired again.
	r = call(t, c, "mesh", returnDesc("fixed_window", limit, time.Hour, key, 4, stamp))
	if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OK || r.Statuses[0].GetQuota().GetRequests() != 4 {
		t.Fatalf("return: %v", r)
	}
	if g, _, _, _ := acq(10, 1); g != 4 {
		t.Fatalf("after the return granted %d, want 4", g)
	}
	// A return naming another window gives nothing back.
	r = call(t, c, "mesh", returnDesc("fixed_window", limit, time.Hour, key, 4, "1"))
	if r.Statuses[0].Code != pb.RateLimitResponse_OK || r.Statuses[0].Quota != nil {
		t.Fatalf("stale return: %v", r)
	}
	if g, _, _, _ := acq(1, 1); g != 0 {
		t.Fatalf("a stale return gave back %d", g)
	}
	// The per-request decisions of the same rule and key are untouched.
	if r := call(t, c, "mesh", inlineDesc("api", "fixed_window", limit, time.Hour, 0, key)); r.Statuses[0].Code != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != limit-1 {
		t.Fatalf("per-request decision: %v", r)
	}
	leased, returned := s.Metrics.Leases()
	if leased != 9+10+6+4 || returned != 4 {
		t.Fatalf("metrics: leased %d returned %d, want 29 and 4", leased, returned)
	}
	if s.Metrics.Descriptors("mesh", outcomeLease) != 4 || s.Metrics.Descriptors("mesh", outcomeLeaseOver) != 2 || s.Metrics.Descriptors("mesh", outcomeReturn) != 2 {
		t.Fatalf("descriptor outcomes: lease %d over %d return %d", s.Metrics.Descriptors("mesh", outcomeLease),
			s.Metrics.Descriptors("mesh", outcomeLeaseOver), s.Metrics.Descriptors("mesh", outcomeReturn))
	}
}

// Proxies acquiring concurrently through two replicas never get more than
// the limit between them: 400 acquires of up to 10 (instances 3) on a
// limit of 100 grant exactly 100 for fixed_window and token_bucket (time
// pinned: no refill), and every grant is within 1..10.
func TestLeaseExactUnderConcurrency(t *testing.T) {
	_, r1 := serve(t, Options{InlineDomains: []string{"mesh"}})
	_, r2 := serve(t, Options{InlineDomains: []string{"mesh"}})
	replicas := []pb.RateLimitServiceClient{r1, r2}
	const acquires, limit = 400, 100
	for _, alg := range []string{"fixed_window", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			key := uniq("exact")
			var granted, grants, over atomic.Int64
			var wg sync.WaitGroup
			for i := 0; i < acquires; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := replicas[i%2].ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "mesh",
						Descriptors: []*ratelimitv3.RateLimitDescriptor{leaseDesc(alg, limit, time.Hour, key, 10, 3)}, HitsAddend: 1})
					if err != nil {
						t.Errorf("acquire: %v", err)
						return
					}
					st := r.Statuses[0]
					switch st.Code {
					case pb.RateLimitResponse_OK:
						g := int64(st.GetQuota().GetRequests())
						if g < 1 || g > 10 {
							t.Errorf("granted %d", g)
						}
						granted.Add(g)
						grants.Add(1)
					case pb.RateLimitResponse_OVER_LIMIT:
						over.Add(1)
					}
				}()
			}
			wg.Wait()
			t.Logf("%s: %d acquires through 2 replicas: %d granted in %d grants, %d over the limit", alg, acquires, granted.Load(), grants.Load(), over.Load())
			if granted.Load() != limit || grants.Load()+over.Load() != acquires {
				t.Fatalf("granted %d in %d grants (+%d over), want exactly %d", granted.Load(), grants.Load(), over.Load(), limit)
			}
		})
	}
}

// failPerRequest is a Backend that fails every per-request script call
// (not the lease script's), to fail a call that also holds an acquire.
type failPerRequest struct{ Backend }

func (b failPerRequest) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	if !strings.Contains(string(cmd), redisrl.LeaseScript.SHA1) && !strings.Contains(string(cmd), "sluice lease") {
		return nil, errors.New("injected failure")
	}
	return b.Backend.Do(ctx, cmd)
}

// A lease descriptor in a call with per-request descriptors takes no part
// in the all-or-nothing: a denial of another descriptor does not undo the
// grant (it is the caller's until it returns it) and is not counted twice;
// an acquire that gets nothing does not make the call OVER_LIMIT nor undo
// the other admissions; and a call that fails returns what it granted (the
// caller never learns of it).
func TestLeaseInMixedCall(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	key, other := uniq("mixed"), uniq("other")
	const limit = 20
	// A per-request descriptor with a limit of 1, used up.
	one := inlineDesc("one", "fixed_window", 1, time.Hour, 0, other)
	call(t, c, "mesh", one)

	r := call(t, c, "mesh", leaseDesc("fixed_window", limit, time.Hour, key, 5, 1), one)
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[1].Code != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("denied call: %v", r)
	}
	if g, _, _ := grant(t, r, 0); g != 5 {
		t.Fatalf("the acquire of a denied call granted %d, want 5 (kept by the caller)", g)
	}
	// The grant stands: 15 are left, not 20 (undone) nor 10 (counted twice).
	if g, _, _ := grant(t, call(t, c, "mesh", leaseDesc("fixed_window", limit, time.Hour, key, 20, 1)), 0); g != 15 {
		t.Fatalf("after a denied call's grant of 5: %d left, want 15", g)
	}
	// Exhausted acquire + admitting per-request descriptor: the call is OK,
	// the admission stands with its refund token.
	fresh := inlineDesc("two", "fixed_window", 2, time.Hour, 0, uniq("fresh"))
	r = call(t, c, "mesh", leaseDesc("fixed_window", limit, time.Hour, key, 5, 1), fresh)
	if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[1].Code != pb.RateLimitResponse_OK {
		t.Fatalf("exhausted acquire beside an admission: %v", r)
	}
	if tok := header(r, rlswire.RefundHeader); len(tok) != 1 || !strings.HasPrefix(tok[0], "1:") {
		t.Fatalf("refund tokens %v, want one for descriptor 1", tok)
	}
	if r := call(t, c, "mesh", fresh); r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("the admission beside an exhausted acquire was undone: %v", r)
	}

	// A failing call returns its grant.
	be := backend(t)
	_, cf := serve(t, Options{InlineDomains: []string{"mesh"}, Backend: failPerRequest{be}})
	key2 := uniq("failed")
	_, err := cf.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "mesh", HitsAddend: 1,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{leaseDesc("token_bucket", limit, time.Hour, key2, 8, 1), inlineDesc("x", "token_bucket", 5, time.Hour, 0, key2)}})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("call with a failing descriptor: %v, want UNAVAILABLE", err)
	}
	if g, _, _ := grant(t, call(t, cf, "mesh", leaseDesc("token_bucket", limit, time.Hour, key2, 20, 1)), 0); g != limit {
		t.Fatalf("after a failed call: %d available, want all %d (its grant returned)", g, limit)
	}
}

// Malformed lease entries are INVALID_ARGUMENT naming the entry.
func TestLeaseErrors(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	with := func(alg, k, v string) *ratelimitv3.RateLimitDescriptor {
		d := inlineDesc("r", alg, 10, time.Second, 0, "k")
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
		return d
	}
	cases := []struct {
		d   *ratelimitv3.RateLimitDescriptor
		msg string
	}{
		{with("fixed_window", rlswire.Lease, "5"), "entry 6 (sluice.lease): must be <n>:<instances>"},
		{with("fixed_window", rlswire.Lease, "0:1"), "entry 6 (sluice.lease): must be <n>:<instances>"},
		{with("fixed_window", rlswire.Lease, "5:0"), "entry 6 (sluice.lease): must be <n>:<instances>"},
		{with("fixed_window", rlswire.Lease, "5:10001"), "entry 6 (sluice.lease): must be <n>:<instances>"},
		{with("fixed_window", rlswire.Lease, "11:1"), "entry 6 (sluice.lease): n (11) must not exceed the capacity (10)"},
		{with("sliding_window", rlswire.Lease, "5:1"), "entry 6 (sluice.lease): leases apply only to token_bucket and fixed_window, not sliding_window"},
		{with("leaky_bucket", rlswire.Return, "5:1"), "entry 6 (sluice.return): leases apply only to token_bucket and fixed_window"},
		{with("token_bucket", rlswire.Return, "x"), "entry 6 (sluice.return): must be <n>:<stamp>"},
		{with("token_bucket", rlswire.Return, "3:-1"), "entry 6 (sluice.return): must be <n>:<stamp>"},
		{with("token_bucket", "sluice.other", "1"), "entry 6 (\"sluice.other\"): expected sluice.refund, sluice.lease, sluice.return, sluice.max_delay_us or sluice.settle here"},
	}
	for _, tc := range cases {
		_, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "mesh", Descriptors: []*ratelimitv3.RateLimitDescriptor{tc.d}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%v: got %v, want INVALID_ARGUMENT containing %q", tc.d.Entries[6], err, tc.msg)
		}
	}
}
