//go:build wasip1

package abi

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

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

// GC budget: a collection runs when the bytes allocated since the last one exceed
// max(gcMinBudget, live heap after the last one) — the growth GOGC=100 allows, with a floor
// so that a small heap is not collected on every check.
const (
	gcMinBudget = 4 << 20
	// gcCheckEvery callbacks the heap is measured (a runtime/metrics read, several µs in
	// wazero, 15–20 µs of Envoy's CPU in V8: at 256, about 0.4 µs a request, as much as
	// a host call); sooner when large host buffers were allocated meanwhile. A request
	// allocates nothing on the Go heap otherwise, so between two checks the heap grows by
	// little beyond its budget. A power of two (enter tests the low bits).
	gcCheckEvery = 4096
	gcBigBytes   = 1 << 20
)

// gcCheckEvery is a power of two (a zero-length array, or no compile).
var _ [0]struct{} = [gcCheckEvery & (gcCheckEvery - 1)]struct{}{}

var (
	gcSamples = []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
	}
	gcAllocsAtLast uint64 // cumulative allocated bytes at the last collection
	gcLive         uint64 // live heap after the last collection
	gcChecks       uint32 // top-level callbacks so far (wraps); a check when its low bits are 0
	gcBigSince     uint64 // bytes of overflow buffers since the last check
)

// checkHeap measures the heap and collects when its budget is spent. enter
// runs it at the start of a top-level callback (never inside
// proxy_on_memory_allocate: see gc_wasip1.go for why) every gcCheckEvery
// callbacks, or once the overflow buffers add up to gcBigBytes.
func checkHeap() {
	gcBigSince = 0
	metrics.Read(gcSamples)
	gcHeap = gcSamples[2].Value.Uint64()
	allocs := gcSamples[0].Value.Uint64()
	if allocs-gcAllocsAtLast < max(gcMinBudget, gcLive) {
		return
	}
	Collect()
}

// Collect runs a full collection now and records the heap after it. Call it only from a
// top-level callback.
func Collect() {
	runtime.GC()
	metrics.Read(gcSamples)
	gcAllocsAtLast = gcSamples[0].Value.Uint64()
	gcLive = gcSamples[1].Value.Uint64()
	gcHeap = gcSamples[2].Value.Uint64()
	gcCycles++
}
