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
	// gcCheckEvery callbacks the heap is measured (a runtime/metrics read); sooner when
	// large host buffers were allocated meanwhile.
	gcCheckEvery = 32
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
	gcCycles       uint64 // collections run by collectIfDue
	gcChecks       uint32
	gcBigSince     uint64 // bytes of overflow buffers since the last check
	gcHeap         uint64 // heap object bytes at the last check or collection
)

// collectIfDue runs at the start of every top-level callback (never inside
// proxy_on_memory_allocate). See gc_wasip1.go for why.
func collectIfDue() {
	gcChecks++
	if gcChecks%gcCheckEvery != 0 && gcBigSince < gcBigBytes {
		return
	}
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
