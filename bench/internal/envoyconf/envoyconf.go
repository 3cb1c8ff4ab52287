// Package envoyconf renders the Envoy bootstraps the benchmark commands measure: an admin
// endpoint on a free loopback port, the upstream (a direct response from a listener of the same
// Envoy), and measured listeners routing to it, each with its filter chain — Envoy's native
// local_ratelimit with a token bucket per x-key value, a Wasm filter (sluice or the no-op
// module), a dynamic-module filter (libsluice.so or the C no-op), or none — before the
// router.
package envoyconf

import (
	"bytes"
	"strconv"
	"text/template"
)

// Bootstrap is a whole bootstrap.
type Bootstrap struct {
	Title        string // the header comment
	UpstreamPort int    // the upstream listener's port (the cluster names it)
	Listeners    []Listener
}

// Listener is a measured listener.
type Listener struct {
	Name    string // also its stat prefix
	Port    int    // 0: a free port (read it back from the admin endpoint)
	Exact   bool   // exact connection balance across the workers
	Filters Filters
}

// YAML renders the bootstrap.
func (b Bootstrap) YAML() ([]byte, error) {
	var buf bytes.Buffer
	err := bootstrapTmpl.Execute(&buf, b)
	return buf.Bytes(), err
}

var bootstrapTmpl = template.Must(template.New("bootstrap").Funcs(template.FuncMap{"filters": Filters.YAML}).Parse(`# {{.Title}}: every listener loopback, the admin endpoint on a free port,
# measured listeners on free ports (read back from the admin endpoint) unless given one.
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
      socket_address: {address: 127.0.0.1, port_value: {{.Port}}}
{{- if .Exact}}
    connection_balance_config: {exact_balance: {}}
{{- end}}
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
                route: {cluster: upstream}
          http_filters:
{{filters .Filters}}
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
`))

// Filters is one listener's filter chain.
type Filters struct {
	StatPrefix string // local_ratelimit's stat prefix
	Native     bool   // Envoy's local_ratelimit, a token bucket per x-key value
	Tokens     int    // native: the descriptor's bucket size and refill
	FillSecs   int    // native: the refill interval
	VMID       string // a Wasm filter when set: its name, root_id and vm_id
	WasmPath   string
	// DynModule, when set, is a dynamic-module filter: the library's name (Envoy loads
	// lib<DynModule>.so from $ENVOY_DYNAMIC_MODULES_SEARCH_PATH, and keeps it loaded), with
	// filter_name DynFilter and the plugin configuration as its filter_config.
	DynModule string
	DynFilter string
	Plugin    string // the plugin configuration as a JSON string literal
}

// YAML is the listener's http_filters list, indented for an HttpConnectionManager under
// static_resources.listeners[].filter_chains[].filters[].typed_config (list items at ten
// spaces), ending with the router.
func (f Filters) YAML() (string, error) {
	var b bytes.Buffer
	err := filtersTmpl.Execute(&b, f)
	return b.String(), err
}

var filtersTmpl = template.Must(template.New("filters").Funcs(template.FuncMap{"quote": strconv.Quote}).Parse(`
{{- if .Native}}
          - name: envoy.filters.http.local_ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
              stat_prefix: {{.StatPrefix}}
              token_bucket: {max_tokens: 1000000000, tokens_per_fill: 1000000000, fill_interval: 1s}
              filter_enabled:
                default_value: {numerator: 100, denominator: HUNDRED}
              filter_enforced:
                default_value: {numerator: 100, denominator: HUNDRED}
              always_consume_default_token_bucket: false
              max_dynamic_descriptors: 2000
              rate_limits:
              - actions:
                - request_headers: {header_name: x-key, descriptor_key: key}
              descriptors:
              - entries: [{key: key}]
                token_bucket: {max_tokens: {{.Tokens}}, tokens_per_fill: {{.Tokens}}, fill_interval: {{.FillSecs}}s}
{{- end}}
{{- if .VMID}}
          - name: {{.VMID}}
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: {{.VMID}}
                root_id: {{.VMID}}
                failure_policy: FAIL_CLOSED
                vm_config:
                  vm_id: {{.VMID}}
                  runtime: envoy.wasm.runtime.v8
                  code:
                    local:
                      filename: {{quote .WasmPath}}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: {{.Plugin}}
{{- end}}
{{- if .DynModule}}
          - name: {{.DynFilter}}
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {name: {{quote .DynModule}}, do_not_close: true}
              filter_name: {{quote .DynFilter}}
              filter_config:
                "@type": type.googleapis.com/google.protobuf.StringValue
                value: {{.Plugin}}
{{- end}}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router`))
