// Command denier is a Proxy-Wasm filter that refuses every request with a 429 and the two
// headers sluice's rejection carries with response headers "none" (content-type,
// retry-after), and does nothing else: the least a standard-Go Proxy-Wasm filter's denial
// costs in a host. bench/envoy measures it next to Envoy's native local_ratelimit and
// sluice's denials (family deny-floor).
package main

import (
	"encoding/binary"
	"unsafe"
)

func main() {}

var (
	details = []byte("denier")
	body    = []byte("rate limited\n")
	headers = pairs([2]string{"content-type", "text/plain; charset=utf-8"}, [2]string{"retry-after", "3600"})
)

// pairs serializes header pairs as proxy_send_local_response takes them: the count, each
// name and value length, then each name and value followed by a NUL.
func pairs(hs ...[2]string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(hs)))
	for _, h := range hs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h[1])))
	}
	for _, h := range hs {
		b = append(append(append(append(b, h[0]...), 0), h[1]...), 0)
	}
	return b
}

//go:wasmimport env proxy_send_local_response
func sendLocalResponse(status uint32, detailsPtr unsafe.Pointer, detailsLen uint32, bodyPtr unsafe.Pointer, bodyLen uint32,
	headersPtr unsafe.Pointer, headersLen uint32, grpcStatus int32) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	b := make([]byte, size+1)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	if sendLocalResponse(429, unsafe.Pointer(&details[0]), uint32(len(details)), unsafe.Pointer(&body[0]), uint32(len(body)),
		unsafe.Pointer(&headers[0]), uint32(len(headers)), -1) != 0 {
		return 0 // refused: let it through rather than hang
	}
	return 1
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 { return 0 }

//go:wasmexport proxy_on_log
func onLog(id uint32) {}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
