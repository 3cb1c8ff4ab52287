package rlqs

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/serve/rls"
)

// listen serves s on a local port and returns a client.
func listen(t *testing.T, s *Server) pb.RateLimitQuotaServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitQuotaServiceServer(g, s)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitQuotaServiceClient(conn)
}

const grpcConfig = `
domain: d
descriptors:
  - key: api
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tb
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket}
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
  - key: pair
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5}
`

func usage(id map[string]string, allowed, denied uint64) *pb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	return &pb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &pb.BucketId{Bucket: id}, NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func open(t *testing.T, c pb.RateLimitQuotaServiceClient) grpc.BidiStreamingClient[pb.RateLimitQuotaUsageReports, pb.RateLimitQuotaResponse] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func strategyOf(a *pb.RateLimitQuotaResponse_BucketAction) string {
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	switch {
	case a.GetAbandonAction() != nil:
		return "abandon"
	case s.GetTokenBucket() != nil:
		return fmt.Sprintf("token_bucket %d", s.GetTokenBucket().GetMaxTokens())
	case s.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL:
		return "deny_all"
	case s.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL:
		return "allow_all"
	}
	return "?"
}

// Each bucket is matched as a descriptor of its entries sorted by key: a
// limit gets a token bucket, no limit / unlimited / another algorithm
// ALLOW_ALL, a zero limit DENY_ALL; each with a TTL of whole seconds.
func TestStreamAnswersPerBucket(t *testing.T) {
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return config(t, grpcConfig) }})
	st := open(t, listen(t, s))
	k := uniq(t)
	ids := []map[string]string{
		{"api": k},
		{"user": k, "pair": "p"}, // sorted: pair, user
		{"nothing": k},
		{"tb": k},
		{"zero": k},
		{"free": k},
	}
	m := &pb.RateLimitQuotaUsageReports{Domain: "d"}
	for _, id := range ids {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(id, 1, 0))
	}
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range r.BucketAction {
		got = append(got, strategyOf(a))
		if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive(); ttl.GetSeconds() < 2 || ttl.GetNanos() != 0 {
			t.Errorf("TTL %v: want whole seconds, at least 2", ttl)
		}
	}
	want := "deny_all,token_bucket 10,deny_all,token_bucket 4,allow_all,allow_all,deny_all,allow_all" // a grant: DENY_ALL, then its bucket
	if strings.Join(got, ",") != want {
		t.Errorf("got %s, want %s", strings.Join(got, ","), want)
	}
	snap := s.Metrics.Domain("d")
	if snap.Streams != 1 || snap.Buckets != 6 || snap.Assigned != 14 || snap.Unsupported != 1 || snap.NoLimit != 2 {
		t.Errorf("metrics %+v", snap)
	}
	var b strings.Builder
	if err := s.Metrics.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{`sluice_rlqs_streams{domain="d"} 1`, `sluice_rlqs_buckets{domain="d"} 6`, `sluice_rlqs_assigned_total{domain="d"} 14`,
		`sluice_rlqs_used_total{domain="d"} 3`, `sluice_rlqs_actions_total{domain="d",action="token_bucket"} 2`} {
		if !strings.Contains(b.String(), line+"\n") {
			t.Errorf("metrics lack %q:\n%s", line, b.String())
		}
	}
}

func wantCode(t *testing.T, st grpc.BidiStreamingClient[pb.RateLimitQuotaUsageReports, pb.RateLimitQuotaResponse], code codes.Code, msg string) {
	t.Helper()
	n := 0
	for {
		_, err := st.Recv()
		if err == nil {
			n++
			continue
		}
		t.Logf("%d messages before %v", n, err)
		if status.Code(err) != code || !strings.Contains(err.Error(), msg) {
			t.Fatalf("got %v, want %v with %q", err, code, msg)
		}
		return
	}
}

// Bad streams end with INVALID_ARGUMENT naming the problem.
func TestStreamInvalid(t *testing.T) {
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return config(t, grpcConfig) }, MaxBucketsPerReport: 4, MaxReportBytes: 4096})
	c := listen(t, s)
	big := strings.Repeat("x", 600)
	for _, tc := range []struct {
		name string
		msgs []*pb.RateLimitQuotaUsageReports
		msg  string
	}{
		{"no domain", []*pb.RateLimitQuotaUsageReports{{BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"a": "b"}, 1, 0)}}}, "no domain"},
		{"other domain", []*pb.RateLimitQuotaUsageReports{{Domain: "d"}, {Domain: "e"}}, `domain "e" on a stream of domain "d"`},
		{"too many buckets", []*pb.RateLimitQuotaUsageReports{{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"a": "1"}, 1, 0), usage(map[string]string{"a": "2"}, 1, 0), usage(map[string]string{"a": "3"}, 1, 0),
			usage(map[string]string{"a": "4"}, 1, 0), usage(map[string]string{"a": "5"}, 1, 0)}}}, "5 buckets in one report (at most 4)"},
		{"empty bucket", []*pb.RateLimitQuotaUsageReports{{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{{}}}}, "empty bucket_id"},
		{"big value", []*pb.RateLimitQuotaUsageReports{{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"a": big}, 1, 0)}}}, "over 512 bytes"},
		{"big report", []*pb.RateLimitQuotaUsageReports{{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			usage(map[string]string{"a": big[:500], "b": big[:500], "c": big[:500], "d": big[:500], "e": big[:500], "f": big[:500], "g": big[:500], "h": big[:500], "i": big[:500]}, 1, 0)}}}, "bytes (at most 4096)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := open(t, c)
			for _, m := range tc.msgs {
				if err := st.Send(m); err != nil {
					break
				}
			}
			wantCode(t, st, codes.InvalidArgument, tc.msg)
		})
	}
}

// A client that sends and never reads is cut with RESOURCE_EXHAUSTED once
// the responses it does not read fill the transport and the queue; the
// server's memory is bounded by the queue.
func TestStreamSlowReaderCut(t *testing.T) {
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return config(t, grpcConfig) }, SendQueue: 2, SendTimeout: time.Second})
	st := open(t, listen(t, s))
	m := &pb.RateLimitQuotaUsageReports{Domain: "d"}
	for i := 0; i < 1000; i++ {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"nothing": fmt.Sprintf("%s-%d-%s", uniq(t), i, strings.Repeat("v", 200))}, 1, 0))
	}
	// The client sends from a goroutine (its sends block once the server
	// stops reading) and reads nothing until the server has cut it.
	go func() {
		for st.Send(m) == nil {
		}
	}()
	// A generous deadline: on a loaded machine deciding the reports that fill the
	// transport took longer than 15 s (the cut itself comes 1 s after sends block).
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) && s.Metrics.StreamErrors(codes.ResourceExhausted.String()) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.Metrics.StreamErrors(codes.ResourceExhausted.String()); n != 1 {
		t.Fatalf("%d streams cut with RESOURCE_EXHAUSTED, want 1", n)
	}
	wantCode(t, st, codes.ResourceExhausted, "does not read")
}

// A bucket idle (reported with no requests) for AbandonAfter is abandoned:
// the Envoy drops it, and the stream forgets it.
func TestStreamAbandonsIdleBucket(t *testing.T) {
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return config(t, grpcConfig) }, AbandonAfter: 300 * time.Millisecond})
	st := open(t, listen(t, s))
	id := map[string]string{"api": uniq(t)}
	deadline := time.Now().Add(10 * time.Second)
	n := uint64(1)
	for time.Now().Before(deadline) {
		if err := st.Send(&pb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(id, n, 0)}}); err != nil {
			t.Fatal(err)
		}
		n = 0
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if strategyOf(r.BucketAction[0]) == "abandon" {
			if snap := s.Metrics.Domain("d"); snap.Buckets != 0 || snap.Actions[actionAbandon] != 1 {
				t.Errorf("metrics %+v", snap)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the idle bucket was never abandoned")
}

// Shutdown ends the streams with OK and refuses new ones.
func TestShutdownEndsStreams(t *testing.T) {
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return config(t, grpcConfig) }})
	c := listen(t, s)
	st := open(t, c)
	if err := st.Send(&pb.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*pb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(map[string]string{"api": uniq(t)}, 1, 0)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.Shutdown(ctx)
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("after Shutdown: %v, want the stream ended with OK (EOF)", err)
	}
	st2 := open(t, c)
	wantCode(t, st2, codes.Unavailable, "shutting down")
}

// Concurrent participants on one pool (two replicas, eight streams each
// asking far more than the limit, at one instant): the grants sum to the
// limit exactly, never more.
func TestAllocateConcurrentExact(t *testing.T) {
	backs := []rls.Backend{backend(t), backend(t)}
	key := Key("d", "api="+uniq(t))
	now := time.Now().Truncate(time.Minute).Add(10 * time.Second)
	var mu sync.Mutex
	var total int64
	var wg sync.WaitGroup
	for p := 0; p < 16; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &Allocator{Backend: backs[p%2]}
			for i := 0; i < 40; i++ {
				q := &Request{Key: key, Limit: 1000, Window: time.Minute, Now: now, Participant: fmt.Sprintf("p%d", p),
					Allowed: 0, Denied: 500, Elapsed: time.Second, CurrentWindow: -1, Interval: time.Second, Expiry: time.Minute}
				r, err := a.Allocate(context.Background(), q)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				total += r.Grant
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if total != 1000 {
		t.Fatalf("grants sum to %d, want exactly the limit 1000", total)
	}
}

// A stream that names more buckets than MaxBucketsPerStream, over several
// reports, ends with RESOURCE_EXHAUSTED: its memory is bounded.
func TestStreamBucketsBounded(t *testing.T) {
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return config(t, grpcConfig) }, MaxBucketsPerStream: 3})
	st := open(t, listen(t, s))
	k := uniq(t)
	report := func(vals ...string) *pb.RateLimitQuotaUsageReports {
		m := &pb.RateLimitQuotaUsageReports{Domain: "d"}
		for _, v := range vals {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"nothing": k + v}, 1, 0))
		}
		return m
	}
	if err := st.Send(report("a", "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(report("a", "c")); err != nil { // 3 buckets: still fine
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(report("d")); err != nil {
		t.Fatal(err)
	}
	wantCode(t, st, codes.ResourceExhausted, "more than 3 buckets on one stream")
}
