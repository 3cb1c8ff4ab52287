// Command trapper is a test guest that traps on demand: the request header x-trap names how
// (panic, oob, oom, exit, loop) and x-trap-phase when (request, the default, or response).
package main

import (
	"os"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_get_header_map_value
func hGetHeader(t uint32, kp unsafe.Pointer, kn uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func hAddHeader(t uint32, kp unsafe.Pointer, kn uint32, vp unsafe.Pointer, vn uint32) uint32

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
func onContextCreate(id, parent uint32) { pinned = pinned[:0] }

func header(t uint32, k string) string {
	var p *byte
	var n uint32
	if hGetHeader(t, unsafe.Pointer(unsafe.StringData(k)), uint32(len(k)), unsafe.Pointer(&p), unsafe.Pointer(&n)) != 0 || n == 0 {
		return ""
	}
	return string(unsafe.Slice(p, n))
}

var (
	hog         [][]byte
	loopForever = true
	spins       int
)

func trap(kind string) {
	switch kind {
	case "panic":
		panic("trapper: asked to panic")
	case "oob":
		p := (*uint64)(unsafe.Pointer(uintptr(0xFFFFFFF0)))
		*p = 1
	case "oom":
		for {
			hog = append(hog, make([]byte, 8<<20))
		}
	case "exit":
		os.Exit(3)
	case "loop":
		for loopForever {
			spins++
		}
	}
}

var served int

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	pinned = pinned[:0]
	served++
	if header(0, "x-trap-phase") != "response" {
		trap(header(0, "x-trap"))
	}
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	pinned = pinned[:0]
	if header(0, "x-trap-phase") == "response" {
		trap(header(0, "x-trap"))
	}
	// How many requests this VM instance has served: a fresh VM starts again at 1.
	k, v := "x-vm-served", itoa(served)
	hAddHeader(2, unsafe.Pointer(unsafe.StringData(k)), uint32(len(k)), unsafe.Pointer(unsafe.StringData(v)), uint32(len(v)))
	return 0
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}
