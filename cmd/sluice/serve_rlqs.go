package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-proxy/sluice/serve/rlqs"
	"github.com/sluice-proxy/sluice/serve/rls"
)

// serveRLQSUsage is the RLQS paragraph of `sluice serve --help`.
const serveRLQSUsage = `The gRPC port also serves envoy.service.rate_limit_quota.v3.RateLimitQuotaService
(Envoy's rate_limit_quota filter): buckets match --config as descriptors; fixed_window
limits get grants whose sum over all Envoys stays within the limit (docs/rlqs.md).
`

// registerRLQS registers the Rate Limit Quota Service on g, on the RLS
// server's backend and (reloaded) configuration, and its health status.
func registerRLQS(g *grpc.Server, hs *health.Server, srv *rls.Server, backend rls.Backend, cfg serveConfig, logger *slog.Logger) *rlqs.Server {
	q := rlqs.New(rlqs.Options{Backend: backend, Config: srv.Config, Logger: logger, RedisTimeout: cfg.redisTimeout})
	rlqspb.RegisterRateLimitQuotaServiceServer(g, q)
	hs.SetServingStatus("envoy.service.rate_limit_quota.v3.RateLimitQuotaService", healthpb.HealthCheckResponse_SERVING)
	return q
}

// withRLQSMetrics appends the RLQS metrics to h's /metrics.
func withRLQSMetrics(q *rlqs.Server, h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		q.Metrics.WritePrometheus(w)
	})
	return mux
}

// stopRLQS ends the RLQS streams (each Envoy reconnects, to another
// replica) so that a graceful stop does not wait for them.
func stopRLQS(q *rlqs.Server, d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	q.Shutdown(ctx)
}
