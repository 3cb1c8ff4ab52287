package integration

import (
	"testing"

	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// The compiled module's gRPC rejection in the embedded host is what Envoy sends on the
// wire: a trailers-only response (HTTP 200, grpc-status 8, grpc-message from the body
// without its newline, content-type application/grpc), with Retry-After,
// grpc-retry-pushback-ms and the rate-limit headers. filter's TestGRPCRejection pins the
// guest's side of it (proxy_send_local_response's arguments).
func TestGRPCRejectionOnTheWire(t *testing.T) {
	cfg := `{"rules":[{"name":"svc","match":{"path_prefix":"/grpc.health.v1.Health/"},"key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	ht := startHost(t, cfg, 1)
	call := filtertest.NewRequest("10.7.0.1:1", "content-type", "application/grpc", "te", "trailers")
	call.Method, call.Path = "POST", "/grpc.health.v1.Health/Check"
	if r := ht.do(call); r.Local {
		t.Fatalf("first call rejected: %+v", r)
	}
	r := ht.do(call)
	if !r.Local || r.Status != 200 || r.GRPCStatus != 8 || r.Body != "" || r.Header("grpc-status") != "8" ||
		r.Header("grpc-message") != "rate limited" || r.Header("content-type") != "application/grpc" {
		t.Fatalf("gRPC rejection on the wire: %+v", r)
	}
	if !r.Has("retry-after") || !r.Has("grpc-retry-pushback-ms") || !r.Has("ratelimit") || !r.Has("x-ratelimit-remaining") {
		t.Errorf("headers %v: want retry-after, grpc-retry-pushback-ms and the rate-limit headers", r.Headers)
	}
	if got := ht.metric("sluice.svc.denied"); got != 1 {
		t.Errorf("denied %d", got)
	}
}
