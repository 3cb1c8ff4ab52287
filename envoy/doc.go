// Package envoy holds sluice's deployment manifests (envoy.yaml, the Istio
// WasmPlugin) and the test that checks them against Envoy's and Istio's
// official schemas. It has no Go API.
package envoy
