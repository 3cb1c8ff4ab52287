// Command stopper is a test guest for the end of a root context (host.Close,
// Reconfigure's retire): its plugin configuration says what proxy_on_done does for a root.
//
//	"http"     an HTTP call to cluster "backend" (GET /done/<root>), answer false; the reply
//	           calls proxy_done
//	"ext"      an extension call (proxy_test_async), answer false; the reply
//	           (proxy_on_test_reply) calls proxy_done
//	"ext-true" an extension call, answer true (as the sluice filter returns its leases)
//	"never"    answer false and never call proxy_done
//	other      answer true
//
// Metrics (counters): stopper.done (proxy_on_done on a root), stopper.replies (replies that
// reached a root), stopper.done_ok (proxy_done answered OK), stopper.deleted (proxy_on_delete
// on a root), stopper.deleted_after_reply (deleted roots that had their reply first),
// stopper.calls_refused (the call of on_done was refused). A request answers 200 with the
// status proxy_done gave when called from the stream's context (x-done-status).
package main

import (
	"strconv"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_done
func hDone() uint32

//go:wasmimport env proxy_http_call
func hHTTPCall(up unsafe.Pointer, un uint32, hp unsafe.Pointer, hn uint32, bp unsafe.Pointer, bn uint32, tp unsafe.Pointer, tn uint32, timeout uint32, rid unsafe.Pointer) uint32

//go:wasmimport env proxy_test_async
func hTestAsync(p unsafe.Pointer, n uint32, rtoken unsafe.Pointer) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hGetBuffer(t, start, max uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_define_metric
func hDefineMetric(t uint32, np unsafe.Pointer, nn uint32, rid unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func hIncMetric(id uint32, off int64) uint32

//go:wasmimport env proxy_send_local_response
func hSendLocal(status uint32, dp unsafe.Pointer, dn uint32, bp unsafe.Pointer, bn uint32, hp unsafe.Pointer, hn uint32, grpc int32) uint32

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

var metrics = map[string]uint32{}

func inc(name string) {
	id, ok := metrics[name]
	if !ok {
		np, nn := sp(name)
		hDefineMetric(0, np, nn, unsafe.Pointer(&id))
		metrics[name] = id
	}
	hIncMetric(id, 1)
}

type root struct {
	mode  string
	reply bool // the reply of its on_done call arrived
}

var roots = map[uint32]*root{}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	if parent == 0 {
		roots[id] = &root{}
	}
}

//go:wasmexport proxy_on_configure
func onConfigure(id, size uint32) uint32 {
	var p *byte
	var n uint32
	hGetBuffer(7, 0, size, unsafe.Pointer(&p), unsafe.Pointer(&n))
	if r := roots[id]; r != nil && p != nil {
		r.mode = string(unsafe.Slice(p, n))
	}
	return 1
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	pinned = pinned[:0]
	st := hDone()
	body := strconv.Itoa(int(st))
	bp, bn := sp(body)
	hSendLocal(200, nil, 0, bp, bn, nil, 0, -1)
	return 1
}

func pairs(kv [][2]string) []byte {
	var b []byte
	le := func(v uint32) { b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
	le(uint32(len(kv)))
	for _, p := range kv {
		le(uint32(len(p[0])))
		le(uint32(len(p[1])))
	}
	for _, p := range kv {
		b = append(append(append(append(b, p[0]...), 0), p[1]...), 0)
	}
	return b
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 {
	r := roots[id]
	if r == nil {
		return 1
	}
	inc("stopper.done")
	var token uint32
	switch r.mode {
	case "http":
		h := pairs([][2]string{{":method", "GET"}, {":path", "/done/" + strconv.Itoa(int(id))}, {":authority", "backend"}})
		cp, cn := sp("backend")
		if hHTTPCall(cp, cn, unsafe.Pointer(&h[0]), uint32(len(h)), nil, 0, nil, 0, 30000, unsafe.Pointer(&token)) != 0 {
			inc("stopper.calls_refused")
			return 1
		}
		return 0
	case "ext", "ext-true":
		a, an := sp(strconv.Itoa(int(id)))
		if hTestAsync(a, an, unsafe.Pointer(&token)) != 0 {
			inc("stopper.calls_refused")
			return 1
		}
		if r.mode == "ext-true" {
			return 1
		}
		return 0
	case "never":
		return 0
	}
	return 1
}

func reply(id uint32) {
	r := roots[id]
	if r == nil {
		return
	}
	inc("stopper.replies")
	r.reply = true
	if hDone() == 0 {
		inc("stopper.done_ok")
	}
}

//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(id, token, nh, size, nt uint32) { reply(id) }

//go:wasmexport proxy_on_test_reply
func onTestReply(id, token uint32) { reply(id) }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	r := roots[id]
	if r == nil {
		return
	}
	inc("stopper.deleted")
	if r.reply {
		inc("stopper.deleted_after_reply")
	}
	delete(roots, id)
}
