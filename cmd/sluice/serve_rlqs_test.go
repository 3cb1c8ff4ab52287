package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// sluice serve serves RLQS on its gRPC port: a configured bucket gets a
// token bucket, health names the service, /metrics has its counters, and
// a graceful stop ends the open stream with OK at once (it does not wait
// for the shutdown timeout).
func TestServeRLQS(t *testing.T) {
	c := testCluster(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "rl.yaml")
	if err := os.WriteFile(conf, []byte("domain: quota\ndescriptors:\n  - key: api\n    rate_limit: {unit: minute, requests_per_unit: 50}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrs := make(chan serveAddrs, 1)
	done := make(chan error, 1)
	cfg := serveConfig{listen: "127.0.0.1:0", admin: "127.0.0.1:0", configPath: conf, redisAddrs: c.Addrs,
		redisTimeout: time.Second, shutdownTimeout: 30 * time.Second}
	go func() { done <- serve(ctx, cfg, nil, io.Discard, func(a serveAddrs) { addrs <- a }) }()
	a := <-addrs
	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hr, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health of RLQS: %v %v", hr, err)
	}
	st, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	key := "k" + time.Now().Format("150405.000000")
	if err := st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"api": key}}, NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if tb := r.GetBucketAction()[len(r.GetBucketAction())-1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket(); tb.GetMaxTokens() != 5 {
		t.Fatalf("answer %v: want a token bucket of 5 (the floor, a tenth of 50)", r)
	}
	resp, err := http.Get("http://" + a.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_rlqs_streams{domain="quota"} 1`, `sluice_rlqs_assigned_total{domain="quota"} 5`, "sluice_rls_calls_total"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	start := time.Now()
	stop()
	if _, err := st.Recv(); err != io.EOF {
		t.Fatalf("stream after a graceful stop: %v, want EOF", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return after the stop")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("graceful stop took %v with an RLQS stream open", d)
	}
}
