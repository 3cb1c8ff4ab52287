// Package envoyconf renders the parts of Envoy bootstraps the benchmark commands share: the
// HTTP filter chain of a measured listener — Envoy's native local_ratelimit with a token bucket
// per x-key value, a Wasm filter (sluice or the no-op module), or neither — before the router.
package envoyconf

import (
	"bytes"
	"strconv"
	"text/template"
)

// Filters is one listener's filter chain.
type Filters struct {
	StatPrefix string // local_ratelimit's stat prefix
	Native     bool   // Envoy's local_ratelimit, a token bucket per x-key value
	Tokens     int    // native: the descriptor's bucket size and refill
	FillSecs   int    // native: the refill interval
	VMID       string // a Wasm filter when set: its name, root_id and vm_id
	WasmPath   string
	Plugin     string // the plugin configuration as a JSON string literal
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
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router`))
