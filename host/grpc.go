package host

import (
	"strconv"
	"strings"
)

// gRPC requests, as Envoy's HTTP connection manager treats them.
//
// Envoy decides once, from the request headers as they arrive, whether a
// request is gRPC (FilterManager::requestHeadersInitialized,
// source/common/http/filter_manager.h → Grpc::Common::isGrpcRequestHeaders,
// source/common/grpc/common.cc: a :path and a content-type that is exactly
// application/grpc or starts with application/grpc+). A local reply to such
// a request is sent as a trailers-only gRPC response, whatever the HTTP
// version (Utility::prepareLocalReply and Utility::encodeLocalReply,
// source/common/http/utility.cc):
//
//   - the reply's headers are :status with the filter's code, then the
//     filter's headers (modify_headers);
//   - :status becomes 200 and content-type application/grpc (replacing the
//     filter's);
//   - grpc-status is set unless the filter's headers carry one: the
//     grpc_status given to proxy_send_local_response when it is a known code
//     (0..16; Context::sendLocalResponse, source/extensions/common/wasm/
//     context.cc, maps anything else, like the SDKs' -1, to "none"), else
//     the HTTP code mapped by Grpc::Utility::httpToGrpcStatus
//     (source/common/grpc/status.cc);
//   - a non-empty body becomes grpc-message, percent-encoded
//     (PercentEncoding::encode), except for HEAD; content-length is removed;
//   - everything goes in one HEADERS frame with end of stream: no body, no
//     trailers frame.
//
// Encoder filters — the guest's proxy_on_response_headers — see the
// converted headers, with end of stream.

const (
	grpcContentType = "application/grpc"
	grpcMaxKnown    = 16 // UNAUTHENTICATED, Envoy's WellKnownGrpcStatus::MaximumKnown
)

// isGRPCContentType is Grpc::Common::hasGrpcContentType.
func isGRPCContentType(ct string) bool {
	rest, ok := strings.CutPrefix(ct, grpcContentType)
	return ok && (rest == "" || rest[0] == '+')
}

// isGRPCRequest is Grpc::Common::isGrpcRequestHeaders for a request header
// map (first content-type value, as Envoy's inline header).
func isGRPCRequest(m *headerMap) bool {
	if p, ok := m.get(":path"); !ok || p == "" {
		return false
	}
	ct, _ := m.get("content-type")
	return isGRPCContentType(ct)
}

// httpToGRPCStatus is Envoy's Grpc::Utility::httpToGrpcStatus (from gRPC's
// doc/http-grpc-status-mapping.md).
func httpToGRPCStatus(code int) int {
	switch code {
	case 400:
		return 13 // INTERNAL
	case 401:
		return 16 // UNAUTHENTICATED
	case 403:
		return 7 // PERMISSION_DENIED
	case 404:
		return 12 // UNIMPLEMENTED
	case 429, 502, 503, 504:
		return 14 // UNAVAILABLE
	default:
		return 2 // UNKNOWN
	}
}

// percentEncodeGRPCMessage is Envoy's PercentEncoding::encode as
// prepareLocalReply uses it for grpc-message: bytes below 0x20, from 0x7e
// ('~') up, and '%' become %XX (upper-case hex); the rest stays. (gRPC's
// PROTOCOL-HTTP2.md asks for 0x20..0x7e except '%' to stay; Envoy also
// encodes '~', which decoders accept.)
func percentEncodeGRPCMessage(s string) string {
	const hex = "0123456789ABCDEF"
	i := 0
	for i < len(s) && s[i] >= ' ' && s[i] < '~' && s[i] != '%' {
		i++
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for ; i < len(s); i++ {
		c := s[i]
		if c < ' ' || c >= '~' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// grpcLocalReply turns the local reply lr to a gRPC request into the
// trailers-only response Envoy sends (see above). head: the request's
// method is HEAD.
func grpcLocalReply(lr *localReply, head bool) *localReply {
	m := headerMap{kv: make([][2]string, 0, len(lr.headers)+3)}
	message := len(lr.body) > 0 && !head
	hasStatus := false
	for _, p := range lr.headers {
		switch {
		case p[0] == "content-type" || p[0] == "content-length":
			continue // replaced, removed
		case p[0] == "grpc-message" && message:
			continue // replaced
		case p[0] == "grpc-status":
			hasStatus = true
		}
		m.kv = append(m.kv, p)
	}
	m.kv = append(m.kv, [2]string{"content-type", grpcContentType})
	if !hasStatus {
		code := httpToGRPCStatus(lr.status)
		if lr.grpcStatus >= 0 && lr.grpcStatus <= grpcMaxKnown {
			code = int(lr.grpcStatus)
		}
		m.kv = append(m.kv, [2]string{"grpc-status", strconv.Itoa(code)})
	}
	if message {
		m.kv = append(m.kv, [2]string{"grpc-message", percentEncodeGRPCMessage(string(lr.body))})
	}
	return &localReply{status: 200, details: lr.details, headers: m.kv, grpcStatus: lr.grpcStatus, trailersOnly: true}
}

// sanitizeTE is ConnectionManagerUtility::sanitizeTEHeader
// (source/common/http/conn_manager_utility.cc), which runs before the
// filters see the request: a TE header listing "trailers" becomes exactly
// "trailers", any other TE header is removed (keep false).
func sanitizeTE(v string) (out string, keep bool) {
	for t := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(t) == "trailers" {
			return "trailers", true
		}
	}
	return "", false
}
