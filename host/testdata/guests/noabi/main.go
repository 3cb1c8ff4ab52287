// Command noabi is a test guest that looks like a filter but does not export
// proxy_abi_version_*: the host must refuse it.
package main

import "unsafe"

func main() {}

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	b := make([]byte, size+1)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 { return 0 }
