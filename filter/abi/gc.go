package abi

import (
	"runtime"
	"runtime/metrics"
)

// GC budget: a collection runs when the bytes allocated since the last one exceed
// max(gcMinBudget, live heap after the last one) — the growth GOGC=100 allows, with a floor
// so that a small heap is not collected on every check.
const (
	gcMinBudget = 4 << 20
	// gcCheckEvery callbacks the heap is measured (a runtime/metrics read, several µs in
	// wazero: at 32 it was about a tenth of an allowed request's guest time); sooner when
	// large host buffers were allocated meanwhile. A request allocates nothing on the Go
	// heap otherwise, so between two checks the heap grows by little beyond its budget.
	gcCheckEvery = 256 // gcChecks is a uint8 that wraps
	gcBigBytes   = 1 << 20
)

var (
	gcSamples = []metrics.Sample{
		{Name: "/gc/heap/allocs:bytes"},
		{Name: "/gc/heap/live:bytes"},
		{Name: "/memory/classes/heap/objects:bytes"},
	}
	gcAllocsAtLast uint64 // cumulative allocated bytes at the last collection
	gcLive         uint64 // live heap after the last collection
	gcCycles       uint64 // collections run by checkHeap
	gcChecks       uint8  // callbacks since the last periodic check, modulo gcCheckEvery
	gcBigSince     uint64 // bytes of overflow buffers since the last check
	gcHeap         uint64 // heap object bytes at the last check or collection
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

// GCCycles reports the collections Collect has run.
func GCCycles() uint64 { return gcCycles }

// HeapBytes reports the bytes of heap objects (live and not yet swept) as of the last heap
// check or collection — a few requests old at most, and read without measuring again.
func HeapBytes() uint64 { return gcHeap }
