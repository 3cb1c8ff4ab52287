// Package dynmod is sluice's filter as an Envoy dynamic module (libsluice.so, built from
// cmd/sluice-dynmod): the same filter.VM that sluice.wasm runs, driven through abi.Host over
// Envoy's dynamic-module ABI (Envoy 1.38 and later) instead of Proxy-Wasm.
//
// The binding is our own: envoy_abi.h declares the callbacks the module calls (weak, so that
// an Envoy without them is detected at load), hooks.c defines the hooks Envoy calls and
// answers in C every hook that needs nothing of Go, and cgo.go holds the exports and the
// envoy interface over the callbacks. Above that, plain Go tested against a fake Envoy:
//
//   - module.go: one VM per Envoy worker, one shared-data map for the process
//     (internal/shareddata), the configurations, streams, and the tick (through a paused
//     stream's scheduler);
//   - host.go: abi.Host for one worker, the current stream being the hook's;
//   - effects.go: the calls into Envoy that can run Envoy's code back into the module, made
//     once the worker's lock is free;
//   - guard.go: what a recovered panic does (failure_mode), keeper.go: the runtime's P kept
//     busy, panic_on.go: the sluice_panictest build.
//
// docs/deploy.md ("Envoy dynamic module") is the user's side; RATIONALE.md the decisions.
package dynmod
