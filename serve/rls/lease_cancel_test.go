package rls

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// A lease return whose caller has gone (a stopping Envoy deletes its VM, and
// with it the call, right after sending it) still gives the admissions back
// (the scripts run detached from the caller), and sluice_rls_returned_total
// counts them as an answered return would.
func TestLeaseReturnCallerGone(t *testing.T) {
	s, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	key := uniq("lease-gone")
	const limit = 10
	r := call(t, c, "mesh", leaseDesc("fixed_window", limit, time.Hour, key, 10, 1))
	g, stamp, _ := grant(t, r, 0)
	if g != 10 {
		t.Fatalf("granted %d, want 10", g)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "mesh", Descriptors: []*ratelimitv3.RateLimitDescriptor{returnDesc("fixed_window", limit, time.Hour, key, 7, stamp)}})
	if err == nil {
		t.Fatal("a call whose caller has gone answered")
	}
	if leased, returned := s.Metrics.Leases(); leased != 10 || returned != 7 {
		t.Fatalf("metrics: leased %d returned %d, want 10 and 7", leased, returned)
	}
	r = call(t, c, "mesh", leaseDesc("fixed_window", limit, time.Hour, key, 10, 1))
	if g, _, _ := grant(t, r, 0); g != 7 {
		t.Fatalf("after the return granted %d, want the 7 given back", g)
	}
}
