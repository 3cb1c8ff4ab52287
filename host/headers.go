package host

import (
	"strings"
)

// headerMap is an ordered multimap with lower-case keys, as Envoy's header maps.
type headerMap struct {
	kv [][2]string
	// edited is set when an entry is replaced or removed, or the whole map is set; a map
	// that is not edited holds its original entries followed by the ones the guest added,
	// so the net/http path copies back only the additions (or nothing).
	edited bool
}

// lowerBytes returns b lower-cased as a new string (one allocation).
func lowerBytes(b []byte) string {
	for i := 0; i < len(b); i++ {
		if c := b[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(string(b))
		}
	}
	return string(b)
}

func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// eqFold compares an ASCII key case-insensitively with a lower-case name.
func eqFold(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

func (m *headerMap) getBytes(key []byte) (string, bool) {
	for _, p := range m.kv {
		if eqFold(key, p[0]) {
			return p[1], true
		}
	}
	return "", false
}

func (m *headerMap) get(name string) (string, bool) {
	return m.getBytes([]byte(lower(name)))
}

func (m *headerMap) getOr(name, def string) string {
	if v, ok := m.get(name); ok {
		return v
	}
	return def
}

func (m *headerMap) add(key, value string) {
	m.kv = append(m.kv, [2]string{lower(key), value})
}

// replace sets the first entry named key to value and removes the others; adds when absent.
func (m *headerMap) replace(key, value string) {
	key = lower(key)
	found := false
	out := m.kv[:0]
	for _, p := range m.kv {
		if p[0] == key {
			if found {
				continue
			}
			found = true
			p[1] = value
		}
		out = append(out, p)
	}
	m.kv = out
	m.edited = true
	if !found {
		m.kv = append(m.kv, [2]string{key, value})
	}
}

func (m *headerMap) removeBytes(key []byte) {
	out := m.kv[:0]
	for _, p := range m.kv {
		if !eqFold(key, p[0]) {
			out = append(out, p)
		}
	}
	for i := len(out); i < len(m.kv); i++ {
		m.kv[i] = [2]string{}
	}
	if len(out) != len(m.kv) {
		m.edited = true
	}
	m.kv = out
}

// regular returns the entries that are not pseudo-headers, as a new slice.
func (m *headerMap) regular() [][2]string {
	out := make([][2]string, 0, len(m.kv))
	for _, p := range m.kv {
		if !strings.HasPrefix(p[0], ":") {
			out = append(out, p)
		}
	}
	return out
}

// Envoy keeps some headers "inline" (O(1) slots): a repeat of one of those is appended to the
// first with "," when the codec adds it (HeaderMapImpl::addViaMove → appendToHeader,
// envoyproxy/envoy source/common/http/header_map_impl.cc), so the module sees one entry; any
// other repeated header stays separate entries. The inline set is the static lists of
// envoy/http/header_map.h (INLINE_REQ_*, INLINE_RESP_*, INLINE_REQ_RESP_*) plus the custom
// inline headers the extensions of a release build register (CustomInlineHeaderRegistry).
// These two sets are what the 1.36.4 and 1.40.0 release builds joined when a probe module
// listed the pairs of ~100 repeated header names (the request's over HTTP/1.1 and HTTP/2, the
// upstream's response); names Envoy strips before filters (te, connection, x-envoy-retry-on,
// …) are not listed. cookie is separate over HTTP/1.1 and joined with "; " over HTTP/2 (the
// HTTP/2 codec reassembles crumbled cookies).
var inlineRequest = nameSet("accept", "accept-encoding", "access-control-request-headers",
	"access-control-request-method", "access-control-request-private-network", "authorization",
	"cache-control", "cdn-loop", "content-encoding", "content-type", "expect",
	"grpc-accept-encoding", "grpc-timeout", "if-match", "if-modified-since", "if-none-match",
	"if-range", "if-unmodified-since", "origin", "pragma", "proxy-status", "referer",
	"user-agent", "via", "x-client-trace-id", "x-envoy-attempt-count",
	"x-envoy-decorator-operation", "x-envoy-downstream-service-cluster",
	"x-envoy-downstream-service-node", "x-envoy-external-address", "x-envoy-original-path",
	"x-forwarded-for", "x-forwarded-host", "x-forwarded-port", "x-forwarded-proto",
	"x-request-id")

var inlineResponse = nameSet("access-control-allow-credentials", "access-control-allow-headers",
	"access-control-allow-methods", "access-control-allow-origin",
	"access-control-allow-private-network", "access-control-expose-headers",
	"access-control-max-age", "age", "cache-control", "content-encoding", "content-type", "date",
	"etag", "expires", "grpc-message", "grpc-status", "last-modified", "location",
	"proxy-status", "server", "vary", "via", "x-envoy-attempt-count",
	"x-envoy-decorator-operation", "x-envoy-degraded", "x-envoy-immediate-health-check-fail",
	"x-envoy-ratelimited", "x-envoy-upstream-canary", "x-envoy-upstream-healthchecked-cluster",
	"x-request-id")

// joinDelim returns the delimiter Envoy joins repeats of the lower-case header name with in
// a request (response: false) over HTTP/2 or not, and false when they stay separate.
func joinDelim(name string, response, h2 bool) (string, bool) {
	if !response && name == "cookie" {
		return "; ", h2
	}
	if response {
		return ",", inlineResponse[name]
	}
	return ",", inlineRequest[name]
}

// joinInline coalesces kv's repeated inline headers into their first entry, in place.
func joinInline(kv [][2]string, response, h2 bool) [][2]string {
	out := kv[:0]
	for _, p := range kv {
		if d, ok := joinDelim(p[0], response, h2); ok {
			merged := false
			for i := range out {
				if out[i][0] == p[0] {
					out[i][1] += d + p[1]
					merged = true
					break
				}
			}
			if merged {
				continue
			}
		}
		out = append(out, p)
	}
	for i := len(out); i < len(kv); i++ {
		kv[i] = [2]string{}
	}
	return out
}

func nameSet(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}
