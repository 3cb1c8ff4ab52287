//go:build wasip1

package abi

import "runtime/debug"

// Garbage collection only where every host survives it.
//
// Envoy 1.33–1.37 (proxy-wasm-cpp-host before PR #533) answer WASI poll_oneoff with ENOSYS,
// and trap any host call but proxy_log, fd_write and clock_time_get made while
// proxy_on_memory_allocate runs. Go's runtime calls poll_oneoff whenever it restarts the
// world after a stop (netpoll), once the network poller is initialised — which happens the
// first time a runtime timer is armed, and the background scavenger arms one after it has
// returned memory. A collection started by an allocation (inside proxy_on_memory_allocate,
// say) then either traps or throws "poll_oneoff failed": the VM dies.
//
// So the module never lets an allocation start a collection (the pacer is off from
// package initialisation: SetGCPercent(-1)), and collects itself, with runtime.GC, at the
// start of a top-level callback when the heap has grown by its budget since the last
// collection. With the pacer off the scavenger has no goal to meet, never sleeps on a
// timer, and the poller is never initialised: a collection makes no host call but
// clock_time_get. The host's poll_oneoff counter and the guest's gc metrics pin this in
// tests (e2e/survival_test.go).
func init() { debug.SetGCPercent(-1) }
