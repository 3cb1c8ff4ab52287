package abi

// gcCycles counts the collections Collect has run; gcHeap is the bytes of heap objects at the
// last check or collection. Both stay zero outside the Wasm guest (gc_wasip1.go).
var gcCycles, gcHeap uint64

// GCCycles reports the collections Collect has run.
func GCCycles() uint64 { return gcCycles }

// HeapBytes reports the bytes of heap objects (live and not yet swept) as of the last heap
// check or collection — at most 4096 callbacks (some hundreds of requests) old
// unless overflow buffers forced a check sooner, and read without measuring again.
func HeapBytes() uint64 { return gcHeap }
