//go:build wasip1 && !sluice_heapalloc

package abi

// heapAllocOnly disables the arena (build tag sluice_heapalloc: an
// experiment showing why the guest yields; never in a shipped build).
const heapAllocOnly = false
