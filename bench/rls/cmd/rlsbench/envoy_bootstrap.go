package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"text/template"
)

// The -envoy comparison's configurations: what one listener of the round's Envoy does.
// Six go through Envoy's own envoy.filters.http.ratelimit to a rate-limit service (the
// peer, sluice serve as shipped, and sluice serve --charge-denied, which counts as the
// peer does: each a cluster of its own) on one descriptor key of the peer's file; two are
// sluice.wasm with one fixed_window rule, decided locally (shared data) or through sluice
// serve with a lease.
type envoyConfig struct {
	name    string // also the listener's name and stat prefix
	kind    string // "ratelimit" or "wasm"
	service string // ratelimit: "peer", "sluice" or "charged" (sluice serve --charge-denied)
	variant string // ratelimit: "ok" or "denied" (the descriptor key); wasm: "local" or "lease"
}

// The descriptor values the load spreads over (sluice-load -keys): the ok and denied
// variants as rlsbench's gRPC comparison has them, the wasm pair on its own count.
func (c envoyConfig) keys(o options) int {
	switch {
	case c.kind == "wasm":
		return o.leaseKeys
	case c.variant == "denied":
		return o.deniedKeys
	}
	return o.okKeys
}

// envoyConfigs are the listeners of every round, in the order of round 1.
var envoyConfigs = []envoyConfig{
	{name: "rl-peer-ok", kind: "ratelimit", service: "peer", variant: "ok"},
	{name: "rl-sluice-ok", kind: "ratelimit", service: "sluice", variant: "ok"},
	{name: "rl-charged-ok", kind: "ratelimit", service: "charged", variant: "ok"},
	{name: "rl-peer-denied", kind: "ratelimit", service: "peer", variant: "denied"},
	{name: "rl-sluice-denied", kind: "ratelimit", service: "sluice", variant: "denied"},
	{name: "rl-charged-denied", kind: "ratelimit", service: "charged", variant: "denied"},
	{name: "wasm-local", kind: "wasm", variant: "local"},
	{name: "wasm-lease", kind: "wasm", variant: "lease"},
}

// label is how the report names a configuration.
func (c envoyConfig) label() string {
	switch {
	case c.kind == "ratelimit" && c.service == "peer":
		return "ratelimit filter → envoyproxy/ratelimit"
	case c.kind == "ratelimit" && c.service == "charged":
		return "ratelimit filter → sluice serve --charge-denied"
	case c.kind == "ratelimit":
		return "ratelimit filter → sluice serve"
	case c.variant == "lease":
		return "sluice.wasm rls + lease"
	}
	return "sluice.wasm local"
}

// roundOrder is the order of round r (0-based): the list rotated to start at its r-th
// configuration, walked forwards in even rounds and backwards in odd ones, so that no
// configuration always runs first or right after the same one.
func roundOrder(cs []envoyConfig, r int) []envoyConfig {
	n := len(cs)
	out := make([]envoyConfig, n)
	for i := range cs {
		if r%2 == 0 {
			out[i] = cs[(r+i)%n]
		} else {
			out[i] = cs[((r-i)%n+n)%n]
		}
	}
	return out
}

// The wasm pair's rule: a fixed window of an hour on x-key with a limit no load here
// reaches, the fleet-wide limit a lease serves; the local rule is the same without the
// service. wasmDomain is the rls.domain sluice serve accepts inline descriptors for.
const (
	keyHeader  = "x-key"
	wasmLimit  = 1_000_000_000
	wasmWindow = "1h"
	wasmDomain = "bench-wasm"
)

// pluginConfig is sluice.wasm's configuration of a wasm configuration; rule names carry
// the round, so that a round never meets the lease state of another.
func pluginConfig(c envoyConfig, round, lease int) string {
	rule := fmt.Sprintf("%s-r%d", c.name, round)
	if c.variant == "local" {
		return fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":%q}],"algorithm":"fixed_window","limit":%d,"window":%q}]}`,
			rule, keyHeader, wasmLimit, wasmWindow)
	}
	return fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":%q}],"algorithm":"fixed_window","limit":%d,"window":%q,"backend":"rls","lease":%d}],`+
		`"failure_mode":"closed","rls":{"cluster":"rls_sluice","domain":%q,"timeout_ms":5000,"instances":1}}`,
		rule, keyHeader, wasmLimit, wasmWindow, lease, wasmDomain)
}

// envoySpec is one round's bootstrap.
type envoySpec struct {
	round        int
	upstreamPort int
	peerPort     int // envoyproxy/ratelimit's gRPC port
	sluicePort   int // sluice serve's
	chargedPort  int // sluice serve --charge-denied's
	wasm         string
	lease        int
	configs      []envoyConfig
}

// bootstrapData is what the template renders.
type bootstrapData struct {
	UpstreamPort int
	Services     []serviceCluster // the rate-limit services (gRPC, cleartext HTTP/2)
	Listeners    []listenerData
}

type serviceCluster struct {
	Name string
	Port int
}

type listenerData struct {
	Name          string
	DescriptorKey string // ratelimit: the route's descriptor key
	Cluster       string // ratelimit: the rate-limit service's cluster
	VMID, Wasm    string // wasm
	Plugin        string // wasm: the configuration as a JSON string literal
}

// renderEnvoy renders the round's bootstrap: an admin endpoint on a free loopback port, the
// upstream (a direct response from a listener of the same Envoy), the two rate-limit
// services as HTTP/2 clusters, and one listener per configuration.
func renderEnvoy(s envoySpec) ([]byte, error) {
	d := bootstrapData{UpstreamPort: s.upstreamPort,
		Services: []serviceCluster{{"rls_peer", s.peerPort}, {"rls_sluice", s.sluicePort}, {"rls_charged", s.chargedPort}}}
	for _, c := range s.configs {
		l := listenerData{Name: c.name}
		switch c.kind {
		case "ratelimit":
			l.DescriptorKey, l.Cluster = c.variant, "rls_"+c.service
		case "wasm":
			b, err := json.Marshal(pluginConfig(c, s.round, s.lease))
			if err != nil {
				return nil, err
			}
			l.VMID, l.Wasm, l.Plugin = c.variant, s.wasm, string(b)
		default:
			return nil, fmt.Errorf("%s: unknown kind %q", c.name, c.kind)
		}
		d.Listeners = append(d.Listeners, l)
	}
	var b bytes.Buffer
	err := envoyTmpl.Execute(&b, d)
	return b.Bytes(), err
}

var envoyTmpl = template.Must(template.New("envoy").Funcs(template.FuncMap{"quote": strconv.Quote}).Parse(`# rlsbench -envoy: every address loopback; admin and the measured listeners on free ports.
admin:
  address:
    socket_address: {address: 127.0.0.1, port_value: 0}
static_resources:
  listeners:
  - name: upstream
    address:
      socket_address: {address: 127.0.0.1, port_value: {{.UpstreamPort}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: upstream
          route_config:
            virtual_hosts:
            - name: upstream
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                direct_response: {status: 200, body: {inline_string: "ok\n"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{{- range .Listeners}}
  - name: {{.Name}}
    address:
      socket_address: {address: 127.0.0.1, port_value: 0}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: {{.Name}}
          route_config:
            virtual_hosts:
            - name: backend
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: upstream
{{- if .Cluster}}
                  rate_limits:
                  - actions:
                    - request_headers: {header_name: x-key, descriptor_key: {{.DescriptorKey}}}
{{- end}}
          http_filters:
{{- if .Cluster}}
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: bench
              # Generous for a loaded 2-core machine (the default is 20 ms); a failed call
              # is a 500, so that the load generator counts it as an error.
              timeout: 2s
              failure_mode_deny: true
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {cluster_name: {{.Cluster}}}
{{- else}}
          - name: sluice-{{.VMID}}
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: sluice-{{.VMID}}
                root_id: sluice
                failure_policy: FAIL_CLOSED
                vm_config:
                  vm_id: {{.VMID}}
                  runtime: envoy.wasm.runtime.v8
                  code:
                    local:
                      filename: {{quote .Wasm}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {{.Plugin}}
{{- end}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{{- end}}
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    circuit_breakers:
      thresholds:
      - {max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: {{.UpstreamPort}}}
{{- range .Services}}
  - name: {{.Name}}
    type: STATIC
    connect_timeout: 1s
    circuit_breakers:
      thresholds:
      - {max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
    load_assignment:
      cluster_name: {{.Name}}
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: 127.0.0.1, port_value: {{.Port}}}
{{- end}}
`))
