// Command grpccaller is a test guest for proxy_grpc_call: a request to /call pauses and
// makes one unary call — service x-service (default "backend"), method x-method, message
// x-msg, timeout x-timeout-ms, initial metadata x-md ("k=v") — then resumes when the reply
// arrives at the root context, with what arrived in request headers: x-grpc-root,
// x-grpc-token, x-grpc-reply (proxy_on_grpc_receive) or x-grpc-close (the status of
// proxy_on_grpc_close). A refused call answers 502 with the status. /cancel makes a call
// and cancels it at once; /statuses answers with what grpc_send/stream/cancel/close return.
package main

import (
	"encoding/binary"
	"strconv"
	"strings"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_grpc_call
func hGrpcCall(sp unsafe.Pointer, sn uint32, np unsafe.Pointer, nn uint32, mp unsafe.Pointer, mn uint32, hp unsafe.Pointer, hn uint32, bp unsafe.Pointer, bn uint32, timeout uint32, rtoken unsafe.Pointer) uint32

//go:wasmimport env proxy_grpc_stream
func hGrpcStream(sp unsafe.Pointer, sn uint32, np unsafe.Pointer, nn uint32, mp unsafe.Pointer, mn uint32, hp unsafe.Pointer, hn uint32, rtoken unsafe.Pointer) uint32

//go:wasmimport env proxy_grpc_send
func hGrpcSend(token uint32, p unsafe.Pointer, n uint32, end uint32) uint32

//go:wasmimport env proxy_grpc_cancel
func hGrpcCancel(token uint32) uint32

//go:wasmimport env proxy_grpc_close
func hGrpcClose(token uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func hGetHeader(t uint32, kp unsafe.Pointer, kn uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func hAddHeader(t uint32, kp unsafe.Pointer, kn uint32, vp unsafe.Pointer, vn uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hGetBuffer(t, start, max uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_send_local_response
func hSendLocal(status uint32, dp unsafe.Pointer, dn uint32, bp unsafe.Pointer, bn uint32, hp unsafe.Pointer, hn uint32, grpc int32) uint32

//go:wasmimport env proxy_continue_stream
func hContinue(t uint32) uint32

//go:wasmimport env proxy_set_effective_context
func hSetEffective(id uint32) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

var pinned [][]byte

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	b := make([]byte, size+1)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

func sp(s string) (unsafe.Pointer, uint32) {
	if s == "" {
		return nil, 0
	}
	return unsafe.Pointer(unsafe.StringData(s)), uint32(len(s))
}

func str(p *byte, n uint32) string {
	if p == nil || n == 0 {
		return ""
	}
	return string(unsafe.Slice(p, n))
}

func header(k string) string {
	var p *byte
	var n uint32
	kp, kn := sp(k)
	hGetHeader(0, kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return str(p, n)
}

func addHeader(k, v string) {
	kp, kn := sp(k)
	vp, vn := sp(v)
	hAddHeader(0, kp, kn, vp, vn)
}

func local(status uint32, body string) {
	b, bn := sp(body)
	h := make([]byte, 4)
	hSendLocal(status, nil, 0, b, bn, unsafe.Pointer(&h[0]), 4, -1)
}

func pairs(kv [][2]string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(kv)))
	for _, p := range kv {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range kv {
		b = append(append(append(append(b, p[0]...), 0), p[1]...), 0)
	}
	return b
}

var (
	roots   = map[uint32]bool{}
	streams = map[uint32]string{} // stream -> path
	calls   = map[uint32]uint32{} // token -> stream
)

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	if parent == 0 {
		roots[id] = true
	}
}

func call() (uint32, uint32) {
	svc := header("x-service")
	if svc == "" {
		svc = "backend"
	}
	service, method, msg := "sluice.test.Echo", header("x-method"), header("x-msg")
	timeout, _ := strconv.Atoi(header("x-timeout-ms"))
	var md []byte
	if kv := header("x-md"); kv != "" {
		k, v, _ := strings.Cut(kv, "=")
		md = pairs([][2]string{{k, v}})
	}
	a, an := sp(svc)
	b, bn := sp(service)
	c, cn := sp(method)
	d, dn := sp(msg)
	var mp unsafe.Pointer
	if len(md) > 0 {
		mp = unsafe.Pointer(&md[0])
	}
	var token uint32
	st := hGrpcCall(a, an, b, bn, c, cn, mp, uint32(len(md)), d, dn, uint32(timeout), unsafe.Pointer(&token))
	return token, st
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	pinned = pinned[:0]
	path := header(":path")
	switch path {
	case "/call":
		token, st := call()
		if st != 0 {
			local(502, "refused "+strconv.Itoa(int(st)))
			return 1
		}
		calls[token] = id
		streams[id] = path
		return 1
	case "/cancel":
		token, st := call()
		c1 := hGrpcCancel(token)
		c2 := hGrpcCancel(token)
		local(200, "call "+strconv.Itoa(int(st))+" token "+strconv.Itoa(int(token))+" cancel "+strconv.Itoa(int(c1))+" again "+strconv.Itoa(int(c2)))
		return 1
	case "/statuses":
		var t uint32
		s1 := hGrpcStream(nil, 0, nil, 0, nil, 0, nil, 0, unsafe.Pointer(&t))
		local(200, "stream "+strconv.Itoa(int(s1))+
			" send(call id) "+strconv.Itoa(int(hGrpcSend(5, nil, 0, 1)))+
			" send(stream id) "+strconv.Itoa(int(hGrpcSend(6, nil, 0, 1)))+
			" cancel(http id) "+strconv.Itoa(int(hGrpcCancel(4)))+
			" close(unknown call) "+strconv.Itoa(int(hGrpcClose(1001))))
		return 1
	}
	return 0
}

func resume(root, token uint32, k, v string) {
	id, ok := calls[token]
	delete(calls, token)
	if !ok || !roots[root] {
		return
	}
	if hSetEffective(id) != 0 {
		return
	}
	addHeader("x-grpc-root", strconv.Itoa(int(root)))
	addHeader("x-grpc-token", strconv.Itoa(int(token)))
	addHeader(k, v)
	hContinue(0)
}

//go:wasmexport proxy_on_grpc_receive
func onGrpcReceive(root, token, size uint32) {
	pinned = pinned[:0]
	var p *byte
	var n uint32
	hGetBuffer(5, 0, size, unsafe.Pointer(&p), unsafe.Pointer(&n))
	resume(root, token, "x-grpc-reply", str(p, n))
}

//go:wasmexport proxy_on_grpc_close
func onGrpcClose(root, token, status uint32) {
	pinned = pinned[:0]
	resume(root, token, "x-grpc-close", strconv.Itoa(int(status)))
}

//go:wasmexport proxy_on_grpc_receive_initial_metadata
func onGrpcInitialMetadata(root, token, n uint32) {
	resume(root, token, "x-grpc-unexpected", "initial metadata")
}

//go:wasmexport proxy_on_grpc_receive_trailing_metadata
func onGrpcTrailingMetadata(root, token, n uint32) {
	resume(root, token, "x-grpc-unexpected", "trailing metadata")
}

//go:wasmexport proxy_on_log
func onLog(id uint32) { delete(streams, id) }

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
