// Command rootprobe is a Proxy-Wasm module for TestEnvoyReload: it logs, at warn, every
// root context's lifecycle callback (context create, vm start, configure with its
// configuration, done, delete) and lets every request through, so the test can read from
// Envoy's log what happens to the root contexts of a configuration an update replaced.
// Each line: "rootprobe: <event> root=<id> config=<configuration>".
package main

import (
	"strconv"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_log
func hLog(level uint32, p unsafe.Pointer, n uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hGetBuffer(t, start, max uint32, rp, rn unsafe.Pointer) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

// pinned keeps what the host was given until it has been read (a module this small never
// frees it: the test runs a few dozen callbacks).
var pinned [][]byte

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	b := make([]byte, size+1)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

// roots are the root contexts and their configurations.
var roots = map[uint32]string{}

func logf(event string, id uint32) {
	s := "rootprobe: " + event + " root=" + strconv.FormatUint(uint64(id), 10) + " config=" + roots[id]
	b := []byte(s)
	hLog(3, unsafe.Pointer(&b[0]), uint32(len(b)))
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	if parent == 0 {
		roots[id] = ""
		logf("create", id)
	}
}

//go:wasmexport proxy_on_vm_start
func onVMStart(id, n uint32) uint32 {
	logf("vm_start", id)
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(id, n uint32) uint32 {
	var p unsafe.Pointer
	var l uint32
	if n > 0 && hGetBuffer(7, 0, n, unsafe.Pointer(&p), unsafe.Pointer(&l)) == 0 && l > 0 {
		roots[id] = string(unsafe.Slice((*byte)(p), l))
	}
	logf("configure", id)
	return 1
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_log
func onLog(id uint32) {}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 {
	if _, ok := roots[id]; ok {
		logf("done", id)
	}
	return 1
}

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	if _, ok := roots[id]; ok {
		logf("delete", id)
		delete(roots, id)
	}
}
