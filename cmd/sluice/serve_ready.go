package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-proxy/sluice/serve/rls"
)

// Readiness of `sluice serve` (docs/serve.md, "Health and readiness"): the
// Redis calls go through an rls.Watch, which logs Redis's refusals and says
// whether the service can decide; gRPC health and /ready follow it.

// servedServices are the gRPC services whose health follows readiness ("":
// the server as a whole).
var servedServices = []string{"", "envoy.service.ratelimit.v3.RateLimitService", "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"}

// newServeWatch watches backend's calls; readiness changes set the serving
// status of the services in hs (once set; after hs.Shutdown they are
// ignored). Stop it when the service stops.
func newServeWatch(backend rls.Backend, logger *slog.Logger, hs *atomic.Pointer[health.Server]) *rls.Watch {
	var node func([]byte) string
	if n, ok := backend.(interface{ NodeOf([]byte) string }); ok {
		node = n.NodeOf
	}
	w := rls.NewWatch(backend, node, logger, func(ready bool, _ string) {
		h := hs.Load()
		if h == nil {
			return
		}
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			st = healthpb.HealthCheckResponse_SERVING
		}
		for _, s := range servedServices {
			h.SetServingStatus(s, st)
		}
	})
	w.Start()
	return w
}

// withReady adds /ready (200 "ready" while the service can decide, else 503
// with the reason) to h, and the Watch's metrics to its /metrics.
func withReady(w *rls.Watch, h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/metrics", func(rw http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(rw, r)
		w.WritePrometheus(rw)
	})
	mux.HandleFunc("/ready", func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !w.Ready() {
			rw.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(rw, "not ready: every Redis call failed for", w.FailFor)
			return
		}
		fmt.Fprintln(rw, "ready")
	})
	return mux
}
