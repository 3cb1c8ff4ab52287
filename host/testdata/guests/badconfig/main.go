// Command badconfig is a test guest whose proxy_on_configure logs why and returns false
// unless the plugin configuration is exactly "ok".
package main

import "unsafe"

func main() {}

//go:wasmimport env proxy_log
func hLog(level uint32, p unsafe.Pointer, n uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hGetBuffer(t, start, max uint32, rp, rn unsafe.Pointer) uint32

var pinned [][]byte

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	if size == 0 {
		size = 1
	}
	b := make([]byte, size)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	var p *byte
	var n uint32
	hGetBuffer(7, 0, size, unsafe.Pointer(&p), unsafe.Pointer(&n))
	cfg := ""
	if p != nil {
		cfg = string(unsafe.Slice(p, n))
	}
	if cfg == "ok" {
		return 1
	}
	msg := "badconfig: rules[0].window: \"" + cfg + "\" is not a duration"
	hLog(5, unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
	return 0
}
