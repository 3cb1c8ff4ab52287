package filter

import (
	"time"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// gRPC rejections.
//
// A local reply to a gRPC request is turned by Envoy into a trailers-only
// gRPC response: HTTP 200, content-type application/grpc, grpc-status from
// proxy_send_local_response's grpc_status argument (or, without one, from
// the HTTP status: 429 becomes UNAVAILABLE, which clients retry at once),
// the body percent-encoded as grpc-message, and the reply's headers beside
// them (Utility::prepareLocalReply, source/common/http/utility.cc; the
// argument is checked in Context::sendLocalResponse,
// source/extensions/common/wasm/context.cc). So for a gRPC request sluice
// passes response.grpc_status (default RESOURCE_EXHAUSTED) and adds
// grpc-retry-pushback-ms, the retry delay gRPC's retry design lets a
// server give (gRFC A6), in whole milliseconds rounded up.

const (
	grpcUnavailable  int32 = 14
	grpcPushbackName       = "grpc-retry-pushback-ms"
)

// grpcFailureMsg is the failure body as a grpc-message (no newline).
var grpcFailureMsg = grpcMessage(failureBody)

// isGRPC reports whether the current request is a gRPC request as Envoy
// decides it (Grpc::Common::isGrpcRequestHeaders, source/common/grpc/
// common.cc): its content-type is exactly application/grpc or starts with
// application/grpc+ (application/grpc-web is not gRPC).
func (p *Plugin) isGRPC() bool {
	v, st := p.host.GetHeader(abi.MapRequestHeaders, hdrContentType)
	return st == abi.StatusOK && isGRPCContentType(v)
}

func isGRPCContentType(v []byte) bool {
	const ct = "application/grpc"
	if len(v) < len(ct) || string(v[:len(ct)]) != ct {
		return false
	}
	return len(v) == len(ct) || v[len(ct)] == '+'
}

// grpcMessage is body as a gRPC rejection sends it: without trailing
// newlines (the proxy percent-encodes what remains into grpc-message, where
// "rate limited\n" would read "rate limited%0A").
func grpcMessage(body string) []byte {
	for len(body) > 0 && (body[len(body)-1] == '\n' || body[len(body)-1] == '\r') {
		body = body[:len(body)-1]
	}
	return []byte(body)
}

// ceilMillis is d in whole milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// sendDeniedGRPC rejects a gRPC request for rule r: response.grpc_status,
// Retry-After (retry, formatted in p.vals), grpc-retry-pushback-ms (the same
// wait in milliseconds, rounded up, at least 1: Retry-After is it in
// seconds, rounded up, at least 1) and the rate-limit headers.
func (p *Plugin) sendDeniedGRPC(r *rule, retry []byte) abi.Action {
	ms := max(ceilMillis(r.d.RetryAfter), 1)
	s := len(p.vals)
	p.vals = appendInt(p.vals, ms)
	e := len(p.vals)
	p.hdrs = append(p.hdrs[:0],
		abi.Header{Name: "retry-after", Value: retry},
		abi.Header{Name: grpcPushbackName, Value: p.vals[s:e:e]})
	p.hdrs = p.appendRateLimitHeaders(p.hdrs, r, &r.d, r.plan)
	return p.sent(p.host.SendLocalResponse(p.cfg.Response.Status, "sluice_rate_limited", p.grpcMsg, p.hdrs, int32(p.cfg.Response.GRPCStatus)))
}
