//go:build wasip1

// Command sleeper is a minimal Proxy-Wasm guest whose request callback sleeps, so that Go's
// scheduler waits in netpoll — a WASI poll_oneoff call — on every request. Used by
// wasmpatch's tests.
package main

import (
	"time"
	"unsafe"
)

func main() {}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

var heap [][]byte

//go:wasmexport proxy_on_memory_allocate
func allocate(n uint32) uint32 {
	b := make([]byte, n+1)
	heap = append(heap, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

//go:wasmexport proxy_on_context_create
func contextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_request_headers
func requestHeaders(id, n, eos uint32) uint32 {
	time.Sleep(100 * time.Microsecond)
	return 0
}
