package e2e

import "net/http"

// gRPC. A rejected gRPC request must reach the client as the trailers-only gRPC
// response the proxy makes of sluice's local reply: HTTP 200, content-type
// application/grpc, grpc-status RESOURCE_EXHAUSTED (8, passed as proxy_send_local_response's
// grpc_status: without it Envoy would derive UNAVAILABLE from 429), grpc-message,
// grpc-retry-pushback-ms and Retry-After, and the rate-limit headers. These scenarios speak
// HTTP (the upstream is the targets' plain one: an admitted call gets its 200); the
// grpc-go client and server tests are grpc_test.go.

const grpcCheckPath = "/grpc.health.v1.Health/Check"

func grpcCall(http2 bool, kv ...string) Request {
	r := request(http.MethodPost, grpcCheckPath, append([]string{"Content-Type", "application/grpc", "Te", "trailers"}, kv...)...)
	r.HTTP2 = http2
	return r
}

// grpcResourceExhausted: 5 calls per tenant (gRPC metadata x-tenant, a request header) on the
// health service, the limited calls over HTTP/2 and HTTP/1.1 alike.
func grpcResourceExhausted() Scenario {
	exhausted := Expect{Status: 200, Header: map[string]Check{
		"Content-Type":           Exact("application/grpc"),
		"Grpc-Status":            Exact("8"),
		"Grpc-Message":           Exact("rate limited"),
		"Grpc-Retry-Pushback-Ms": IntIn(1, 3600_000),
		hRetryAfter:              IntIn(1, 3600),
		hRateLimit:               Matches(`^"grpc-health";r=0;t=[0-9]+$`),
		hRemaining:               Exact("0"),
	}}
	return Scenario{
		Name: "grpc-resource-exhausted",
		Config: `{"rules":[{"name":"grpc-health","match":{"path_prefix":"/grpc.health.v1.Health/"},
 "key":[{"header":"x-tenant"}],"algorithm":"sliding_log","limit":5,"window":"1h"}]}`,
		Steps: []Step{
			{Desc: "admitted calls (HTTP/2)", Req: grpcCall(true, "X-Tenant", "acme"), Times: 3, Want: Expect{Status: 200, Header: map[string]Check{
				hRateLimit: Matches(`^"grpc-health";r=[0-9];t=[0-9]+$`), "Grpc-Status": Absent()}}},
			{Desc: "admitted calls (HTTP/1.1)", Req: grpcCall(false, "X-Tenant", "acme"), Times: 2, Want: ok()},
			{Desc: "RESOURCE_EXHAUSTED (HTTP/2)", Req: grpcCall(true, "X-Tenant", "acme"), Times: 10, Want: exhausted},
			{Desc: "RESOURCE_EXHAUSTED (HTTP/1.1)", Req: grpcCall(false, "X-Tenant", "acme"), Times: 5, Want: exhausted},
			{Desc: "grpc-web is not gRPC: the HTTP rejection", Req: request(http.MethodPost, grpcCheckPath, "Content-Type", "application/grpc-web", "X-Tenant", "acme"),
				Want: Expect{Status: 429, Body: "rate limited\n", Header: map[string]Check{"Grpc-Status": Absent(), "Grpc-Retry-Pushback-Ms": Absent(), hRetryAfter: IntIn(1, 3600)}}},
			{Desc: "another tenant", Req: grpcCall(true, "X-Tenant", "other"), Want: Expect{Status: 200, Header: map[string]Check{"Grpc-Status": Absent()}}},
			{Desc: "another service is not limited", Req: request(http.MethodPost, "/grpc.testing.TestService/EmptyCall", "Content-Type", "application/grpc", "X-Tenant", "acme"),
				Want: Expect{Status: 200, Header: map[string]Check{hRateLimit: Absent()}}},
		},
	}
}

// grpcCustomStatus: response.grpc_status chooses the code; response.body is the message
// (its trailing newline dropped, the rest percent-encoded by the proxy).
func grpcCustomStatus() Scenario {
	return Scenario{
		Name: "grpc-custom-status",
		Config: `{"rules":[{"name":"one","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],
 "response":{"body":"quota: 100% used\n","grpc_status":14,"headers":"none"}}`,
		Steps: []Step{
			{Desc: "admitted", Req: grpcCall(true), Want: ok()},
			{Desc: "UNAVAILABLE as configured", Req: grpcCall(true), Want: Expect{Status: 200, Header: map[string]Check{
				"Grpc-Status": Exact("14"), "Grpc-Message": Exact("quota: 100%25 used"), "Grpc-Retry-Pushback-Ms": IntIn(1, 3600_000),
				hRetryAfter: IntIn(1, 3600), hRateLimit: Absent()}}},
		},
	}
}
