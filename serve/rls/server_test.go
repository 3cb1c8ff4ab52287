package rls

import (
	"context"
	"flag"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redistest"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

var cluster *redistest.Cluster

// TestMain starts the Redis Cluster the tests share; a fuzzing worker
// (which runs only fuzz targets, none of which needs Redis) does without,
// so that every worker (re)start is not a cluster start.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		os.Exit(m.Run())
	}
	os.Exit(redistest.Main(m, 3, &cluster))
}

// testNow is the pinned script time of the tests: 30 s into a minute and
// 30 min 30 s into an hour,
// so fixed windows of up to an hour never roll over during a test.
var testNow = time.Date(2030, 1, 1, 10, 30, 30, 0, time.UTC).UnixMicro()

// uniq makes keys unique per test run (the cluster lives as long as the
// test binary).
var uniqN atomic.Int64

func uniq(prefix string) string {
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.FormatInt(uniqN.Add(1), 10)
}

func backend(t testing.TB) *ClusterBackend {
	redistest.SkipShort(t)
	t.Helper()
	// A generous timeout: these tests check exactness, and a call that
	// times out on a loaded machine (thousands of concurrent calls, -race)
	// may have charged without the service learning it.
	b, err := NewClusterBackend(cluster.Addrs, "", "", redisclient.Options{}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// serve starts a Server on a loopback gRPC listener (a replica) and returns
// a client of it.
func serve(t testing.TB, opts Options) (*Server, pb.RateLimitServiceClient) {
	t.Helper()
	if opts.Backend == nil {
		opts.Backend = backend(t)
	}
	if opts.Now == nil {
		opts.Now = func() int64 { return testNow }
	}
	if opts.RefundTimeout == 0 {
		opts.RefundTimeout = 10 * time.Second
	}
	s := New(opts)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(g, s)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, pb.NewRateLimitServiceClient(conn)
}

func entries(kv ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	var es []*ratelimitv3.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: entries(kv...)}
}

// inlineDesc is the descriptor sluice.wasm sends for one rule.
func inlineDesc(rule, alg string, limit int64, window time.Duration, burst int64, key string) *ratelimitv3.RateLimitDescriptor {
	return desc(rlswire.Rule, rule, rlswire.Algorithm, alg, rlswire.Limit, strconv.FormatInt(limit, 10),
		rlswire.WindowUS, strconv.FormatInt(int64(window/time.Microsecond), 10), rlswire.Burst, strconv.FormatInt(burst, 10), rlswire.Key, key)
}

func call(t testing.TB, c pb.RateLimitServiceClient, domain string, ds ...*ratelimitv3.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: 1})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return r
}

func header(r *pb.RateLimitResponse, key string) []string {
	var v []string
	for _, h := range r.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), key) {
			v = append(v, h.GetValue())
		}
	}
	return v
}

// The contract's inline path: admissions with remaining, reset and a
// refund token; the denial with the exact retry; a refund with the token
// gives the unit back.
func TestInlineDecideDenyRefund(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	key := uniq("client")
	d := inlineDesc("api", "fixed_window", 3, time.Minute, 0, key)
	var tokens []string
	for i := int64(0); i < 3; i++ {
		r := call(t, c, "mesh", d)
		st := r.Statuses[0]
		if r.OverallCode != pb.RateLimitResponse_OK || st.Code != pb.RateLimitResponse_OK || st.LimitRemaining != uint32(2-i) {
			t.Fatalf("call %d: %v", i, r)
		}
		if st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.GetName() != "api" {
			t.Fatalf("current_limit %v", st.CurrentLimit)
		}
		// testNow is 30 s into its minute: the window ends in 30 s.
		if got := st.DurationUntilReset.AsDuration(); got != 30*time.Second {
			t.Fatalf("duration_until_reset %v, want 30s", got)
		}
		h := header(r, rlswire.RefundHeader)
		if len(h) != 1 || !strings.HasPrefix(h[0], "0:"+strconv.FormatInt(testNow, 10)+":") {
			t.Fatalf("refund header %q", h)
		}
		tokens = append(tokens, h[0])
	}
	r := call(t, c, "mesh", d)
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT ||
		r.Statuses[0].LimitRemaining != 0 || r.Statuses[0].DurationUntilReset.AsDuration() != 30*time.Second {
		t.Fatalf("4th call: %v", r)
	}
	if h := header(r, rlswire.RefundHeader); len(h) != 0 {
		t.Fatalf("refund token on a denial: %q", h)
	}
	// Refund the second admission: one unit comes back, once.
	_, stampRef, _ := strings.Cut(tokens[1], ":")
	refund := inlineDesc("api", "fixed_window", 3, time.Minute, 0, key)
	refund.Entries = append(refund.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rlswire.Refund, Value: stampRef})
	r = call(t, c, "mesh", refund)
	if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OK || len(header(r, rlswire.RefundHeader)) != 0 {
		t.Fatalf("refund: %v", r)
	}
	if r = call(t, c, "mesh", d); r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("after the refund: %v", r)
	}
	if r = call(t, c, "mesh", d); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after using the refunded unit: %v", r)
	}
}

// A rule of a "_rules_" scope is named "<scope>.<name>": up to 64 + 1 + 64 bytes.
func TestInlineScopedRuleName(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	d := inlineDesc(strings.Repeat("s", 64)+"."+strings.Repeat("r", 64), "fixed_window", 1, time.Minute, 0, uniq("k"))
	if r := call(t, c, "mesh", d); r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatal(r)
	}
	if r := call(t, c, "mesh", d); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatal(r)
	}
}

// A call denied by one descriptor is charged to none: the admitting
// descriptor is refunded before the answer.
func TestDeniedCallChargesNoDescriptor(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"*"}})
	wide := inlineDesc("wide", "token_bucket", 5, time.Minute, 0, uniq("k"))
	narrow := inlineDesc("narrow", "sliding_window", 1, time.Minute, 0, uniq("k"))
	if r := call(t, c, "any", wide, narrow); r.OverallCode != pb.RateLimitResponse_OK || len(header(r, rlswire.RefundHeader)) != 2 {
		t.Fatalf("first: %v", r)
	}
	for i := 0; i < 3; i++ {
		r := call(t, c, "any", wide, narrow)
		// wide admitted, then was refunded: its status says what remains
		// after the refund (4 of 5).
		if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != pb.RateLimitResponse_OK || r.Statuses[1].Code != pb.RateLimitResponse_OVER_LIMIT ||
			r.Statuses[0].LimitRemaining != 4 {
			t.Fatalf("denied call %d: %v", i, r)
		}
		if len(header(r, rlswire.RefundHeader)) != 0 {
			t.Fatalf("refund tokens on a denied call: %v", r)
		}
	}
	// wide was charged once: 4 left, then 3 after this call.
	if r := call(t, c, "any", wide); r.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("wide after the denied calls: %v", r)
	}
}

func TestInlineErrors(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	good := func() *ratelimitv3.RateLimitDescriptor {
		return inlineDesc("r", "token_bucket", 10, time.Second, 0, "k")
	}
	cases := []struct {
		name   string
		domain string
		d      func() *ratelimitv3.RateLimitDescriptor
		code   codes.Code
		msg    string
	}{
		{"domain not enabled", "other", good, codes.PermissionDenied, "not enabled for domain \"other\""},
		{"too few entries", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			d := good()
			d.Entries = d.Entries[:5]
			return d
		}, codes.InvalidArgument, "descriptor 1: an inline descriptor has 6 entries"},
		{"wrong order", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			d := good()
			d.Entries[2], d.Entries[3] = d.Entries[3], d.Entries[2]
			return d
		}, codes.InvalidArgument, "descriptor 1: entry 2 (\"sluice.window_us\"): expected sluice.limit here"},
		{"bad algorithm", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			d := good()
			d.Entries[1].Value = "gcra"
			return d
		}, codes.InvalidArgument, "entry 1 (sluice.algorithm): unknown algorithm"},
		{"limit zero", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			d := good()
			d.Entries[2].Value = "0"
			return d
		}, codes.InvalidArgument, "entry 2 (sluice.limit): must be a decimal integer >= 1"},
		{"burst on a window algorithm", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			return inlineDesc("r", "fixed_window", 10, time.Second, 5, "k")
		}, codes.InvalidArgument, "entry 4 (sluice.burst): must be 0 for fixed_window"},
		{"beyond the scripts' bounds", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			return inlineDesc("r", "sliding_window", 1_000_000_000, 300*24*time.Hour, 0, "k")
		}, codes.InvalidArgument, "descriptor 1: window is too long"},
		{"rule name with a slash", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			return inlineDesc("a/b", "fixed_window", 10, time.Second, 0, "k")
		}, codes.InvalidArgument, "entry 0 (sluice.rule): rule name may contain only"},
		{"rule name too long", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			return inlineDesc(strings.Repeat("s", 64)+"."+strings.Repeat("r", 65), "fixed_window", 10, time.Second, 0, "k")
		}, codes.InvalidArgument, "entry 0 (sluice.rule): rule name is longer than 129 bytes"},
		{"bad refund", "mesh", func() *ratelimitv3.RateLimitDescriptor {
			d := good()
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rlswire.Refund, Value: "12"})
			return d
		}, codes.InvalidArgument, "entry 6 (sluice.refund): must be <stamp>:<ref>"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Descriptor 0 is valid: the error names descriptor 1.
			_, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: tc.domain,
				Descriptors: []*ratelimitv3.RateLimitDescriptor{good(), tc.d()}})
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	tooMany := make([]*ratelimitv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range tooMany {
		tooMany[i] = good()
	}
	for _, req := range []*pb.RateLimitRequest{{Descriptors: []*ratelimitv3.RateLimitDescriptor{good()}}, {Domain: "mesh"}, {Domain: "mesh", Descriptors: tooMany}} {
		if _, err := c.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%v: %v", req, err)
		}
	}
}
