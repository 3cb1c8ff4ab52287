// Package envoy holds sluice's deployment manifests (envoy.yaml, the Istio
// WasmPlugin; for `sluice serve`: ratelimit-service.yaml with Envoy's own
// rate-limit filter, istio-ratelimit-service.yaml, istio-wasmplugin-rls.yaml)
// and the tests that check them against Envoy's and Istio's official schemas.
// It has no Go API.
package envoy
