//go:build wasip1 && sluice_heapalloc

package abi

// heapAllocOnly: every buffer the host returns is a fresh Go heap
// allocation (experiment build, see arena_on_wasip1.go).
const heapAllocOnly = true
