package filter_test

import (
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

const grpcHealthCheck = "/grpc.health.v1.Health/Check"

func grpcReq(src, contentType string, hdrs ...string) filtertest.Request {
	r := req(src, hdrs...)
	r.Method, r.Path = "POST", grpcHealthCheck
	r.Headers = append(r.Headers, [2]string{"content-type", contentType}, [2]string{"te", "trailers"})
	return r
}

// A gRPC request is rejected with response.grpc_status passed as
// proxy_send_local_response's grpc_status, the body without its newline
// (the proxy makes it the grpc-message), Retry-After, grpc-retry-pushback-ms
// and the rate-limit headers; a plain request to the same rule keeps the
// HTTP answer.
func TestGRPCRejection(t *testing.T) {
	cfg := `{"rules":[{"name":"svc","match":{"path_prefix":"/grpc.health.v1.Health/"},"key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		if r := tg.do(grpcReq("10.7.0.1:1", "application/grpc")); r.Local {
			t.Fatalf("first call rejected: %+v", r)
		}
		r := tg.do(grpcReq("10.7.0.1:1", "application/grpc"))
		if !r.Local || r.Status != 429 || r.GRPCStatus != 8 || r.Body != "rate limited" {
			t.Fatalf("gRPC rejection: status %d grpc_status %d body %q, want 429, 8 (RESOURCE_EXHAUSTED), %q", r.Status, r.GRPCStatus, r.Body, "rate limited")
		}
		ra, pb := r.Header("retry-after"), r.Header("grpc-retry-pushback-ms")
		if ra == "" || pb == "" || !r.Has("ratelimit") || !r.Has("x-ratelimit-remaining") {
			t.Errorf("headers %v: want retry-after, grpc-retry-pushback-ms and the rate-limit headers", r.Headers)
		}
		if r.Has("content-type") {
			t.Errorf("content-type %q on a gRPC rejection (the proxy sets application/grpc)", r.Header("content-type"))
		}
		if got := tg.metric("sluice.svc.denied"); got != 1 {
			t.Errorf("denied %d", got)
		}
		// The same rule, the same client, plain HTTP: unchanged.
		h := tg.do(filtertest.Request{Source: "10.7.0.1:1", Method: "POST", Path: grpcHealthCheck, Headers: [][2]string{{"content-type", "application/json"}}})
		if h.Status != 429 || h.GRPCStatus != abi.NoGRPCStatus || h.Body != "rate limited\n" || h.Header("content-type") != "text/plain; charset=utf-8" || h.Has("grpc-retry-pushback-ms") {
			t.Errorf("plain HTTP rejection: %d grpc_status %d body %q headers %v", h.Status, h.GRPCStatus, h.Body, h.Headers)
		}
	})
}

// What counts as gRPC is what Envoy converts: application/grpc exactly or
// application/grpc+codec (Grpc::Common::hasGrpcContentType).
func TestGRPCContentTypes(t *testing.T) {
	cfg := `{"rules":[{"name":"all","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	n := startNative(t, cfg, t0)
	for i, c := range []struct {
		ct   string
		grpc bool
	}{
		{"application/grpc", true},
		{"application/grpc+proto", true},
		{"application/grpc+json", true},
		{"application/grpc-web", false},
		{"application/grpc-web+proto", false},
		{"application/grpc;charset=utf-8", false},
		{"Application/GRPC", false},
		{"application/grp", false},
		{"text/plain", false},
	} {
		user := string(rune('a' + i))
		n.do(grpcReq("10.7.0.2:1", c.ct, "x-user", user))
		r := n.do(grpcReq("10.7.0.2:1", c.ct, "x-user", user))
		if got := r.GRPCStatus == 8; got != c.grpc || r.Status != 429 {
			t.Errorf("content-type %q: status %d grpc_status %d, want gRPC %v", c.ct, r.Status, r.GRPCStatus, c.grpc)
		}
	}
}

// grpc-retry-pushback-ms is the exact wait rounded up to the millisecond;
// Retry-After is the same wait in seconds, rounded up.
func TestGRPCPushbackIsExactRetry(t *testing.T) {
	cfg := `{"rules":[{"name":"tb","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":10,"window":"10s","burst":1}]}`
	n := startNative(t, cfg, t0)
	if r := n.do(grpcReq("10.7.0.3:1", "application/grpc")); r.Local {
		t.Fatal("first call rejected")
	}
	for _, c := range []struct {
		advance        time.Duration
		pushback, secs string
	}{
		{0, "1000", "1"},                           // one token per second, none left
		{250*time.Millisecond + 1, "750", "1"},     // 749.999999 ms rounds up to 750
		{749*time.Millisecond + 999_998, "1", "1"}, // 1 ns to go: at least 1
	} {
		n.advance(c.advance)
		r := n.do(grpcReq("10.7.0.3:1", "application/grpc"))
		if r.GRPCStatus != 8 || r.Header("grpc-retry-pushback-ms") != c.pushback || r.Header("retry-after") != c.secs {
			t.Errorf("after +%v: grpc_status %d pushback %q retry-after %q, want 8, %s, %s", c.advance, r.GRPCStatus, r.Header("grpc-retry-pushback-ms"), r.Header("retry-after"), c.pushback, c.secs)
		}
	}
	n.advance(1)
	if r := n.do(grpcReq("10.7.0.3:1", "application/grpc")); r.Local {
		t.Errorf("after the pushback: rejected %+v", r)
	}
}

// response.grpc_status and response.body shape the gRPC rejection.
func TestGRPCRejectionConfigured(t *testing.T) {
	cfg := `{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1m"}],` +
		`"response":{"status":503,"body":"slow down, see https://example.test/limits\r\n","headers":"none","grpc_status":14}}`
	n := startNative(t, cfg, t0)
	n.do(grpcReq("10.7.0.4:1", "application/grpc"))
	r := n.do(grpcReq("10.7.0.4:1", "application/grpc"))
	if r.Status != 503 || r.GRPCStatus != 14 || r.Body != "slow down, see https://example.test/limits" {
		t.Errorf("got %d grpc_status %d body %q", r.Status, r.GRPCStatus, r.Body)
	}
	if r.Header("retry-after") != "60" || r.Header("grpc-retry-pushback-ms") != "60000" || r.Has("ratelimit") {
		t.Errorf("headers %v: want retry-after 60, pushback 60000, no rate-limit headers (headers: none)", r.Headers)
	}
}

// failure_mode closed answers a gRPC request UNAVAILABLE.
func TestGRPCStoreFailureClosed(t *testing.T) {
	cfg := `{"rules":[{"name":"f","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],"failure_mode":"closed"}`
	n := startNative(t, cfg, t0)
	n.w.Host.FailShared = abi.StatusInternalFailure
	r := n.do(grpcReq("10.7.0.5:1", "application/grpc"))
	if r.Status != 503 || r.GRPCStatus != 14 || r.Body != "rate limiter unavailable" || len(r.Headers) != 0 {
		t.Errorf("got %d grpc_status %d body %q headers %v, want 503, 14 (UNAVAILABLE), no headers", r.Status, r.GRPCStatus, r.Body, r.Headers)
	}
	h := n.do(req("10.7.0.5:1"))
	if h.Status != 503 || h.GRPCStatus != abi.NoGRPCStatus || h.Body != "rate limiter unavailable\n" {
		t.Errorf("plain HTTP: %d grpc_status %d body %q", h.Status, h.GRPCStatus, h.Body)
	}
}
