//go:build wasip1

package abi

import "runtime/debug"

// Garbage collection only where every host survives it.
//
// Envoy 1.33–1.38 (proxy-wasm-cpp-host before PR #533) answer WASI poll_oneoff with ENOSYS
// and trap any host call but proxy_log, fd_write and clock_time_get made while
// proxy_on_memory_allocate runs. Go's runtime calls poll_oneoff whenever it restarts the
// world after a stop (netpoll), once the network poller is initialised — the first time a
// runtime timer is armed; the background scavenger arms one after it has returned memory.
// A collection started by an allocation — inside proxy_on_memory_allocate when a large
// header overflows the buffer arena — then traps, and elsewhere the runtime throws
// "poll_oneoff failed": the VM dies.
//
// Two measures, each enough for one half:
//   - the module answers poll_oneoff itself (internal/wasmpatch, applied by `make wasm`):
//     the runtime never reaches the host's function, wherever it polls;
//   - no allocation ever starts a collection (the pacer is off from package initialisation:
//     SetGCPercent(-1)); the module collects with runtime.GC at the start of a top-level
//     callback when the heap has grown by its budget (gc.go). So no collection runs inside
//     proxy_on_memory_allocate, whatever the host allows there, and collections finish
//     without the guest ever yielding.
//
// The host's poll_oneoff and restricted-call counters and the module's gc metrics pin both
// in tests (e2e/survival_test.go).
func init() { debug.SetGCPercent(-1) }
