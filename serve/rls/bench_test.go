package rls

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkShouldRateLimit is one sequential call over loopback gRPC, one
// descriptor (a token bucket that never runs out), Redis TIME: the
// service's latency per call, Redis round trip included.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, kind := range []string{"inline", "config"} {
		b.Run(kind, func(b *testing.B) {
			cfg := parse(b, "domain: bench\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000000, algorithm: token_bucket}\n")
			_, c := serve(b, Options{InlineDomains: []string{"bench"}, Config: cfg, Now: func() int64 { return 0 }})
			d := desc("k", uniq("b"))
			if kind == "inline" {
				d = inlineDesc("r", "token_bucket", 1_000_000_000, time.Second, 0, uniq("b"))
			}
			req := &pb.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
			ctx := context.Background()
			for b.Loop() {
				r, err := c.ShouldRateLimit(ctx, req)
				if err != nil || r.OverallCode != pb.RateLimitResponse_OK {
					b.Fatal(r, err)
				}
			}
		})
	}
}
