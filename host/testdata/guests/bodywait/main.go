// Command bodywait is a test guest for Options.AllowOnHeadersStopIteration (Envoy's
// allow_on_headers_stop_iteration): proxy_on_request_headers pauses, and
// proxy_on_request_body buffers (returns StopIterationAndBuffer) until the body it has —
// read back with proxy_get_buffer_bytes — holds a marker or ends; then, by the request path:
//
//	/continue  adds x-bodywait-seen (the FNV-1a hash of the body it had, hex) and
//	           x-bodywait-len to the request headers and returns Continue (marker "END")
//	/tick      waits for the next proxy_on_tick, which continues the stream (marker "GO");
//	           a request without a body waits for the tick too
//	/local     answers 403 with a local reply (marker "STOP")
//	/forever   buffers for ever
//	/self      calls proxy_continue_stream itself from the body callback, and returns
//	           StopIterationAndBuffer all the same (marker "END")
//	/trap      traps in the body callback (marker "BOOM")
//	/gated     (the headers only) waits for a tick that finds the shared-data key
//	           "bodywait.go", then continues; its body callbacks return Continue
//	/nopause   does not pause at all
//	/victim    buffers for ever, and is the stream the next /quirk request answers
//	/quirk     (the headers only) sends a local reply 429 for the last /victim stream
//	           from its own proxy_on_request_headers and returns Continue — which
//	           cpp-host's VM-wide stop flag turns into StopAllIterationAndWatermark —, then
//	           waits for a tick that finds the shared-data key "bodywait.quirk"; its body
//	           callbacks return Continue
//
// Every proxy_on_request_body call is recorded as "<body_buffer_length>/<end_of_stream>"
// (with "!<n>" appended if proxy_get_buffer_bytes returned n bytes instead), and
// proxy_on_response_headers returns the record as x-bodywait-calls. Metrics (counters):
// bodywait_body_calls, bodywait_ticks, bodywait_deletes. The root ticks every 5 ms.
package main

import (
	"strconv"
	"strings"
	"unsafe"
)

func main() {}

//go:wasmimport env proxy_get_buffer_bytes
func hGetBuffer(t, start, max uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_value
func hGetHeader(t uint32, kp unsafe.Pointer, kn uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func hAddHeader(t uint32, kp unsafe.Pointer, kn uint32, vp unsafe.Pointer, vn uint32) uint32

//go:wasmimport env proxy_send_local_response
func hSendLocal(status uint32, dp unsafe.Pointer, dn uint32, bp unsafe.Pointer, bn uint32, hp unsafe.Pointer, hn uint32, grpc int32) uint32

//go:wasmimport env proxy_continue_stream
func hContinue(t uint32) uint32

//go:wasmimport env proxy_set_effective_context
func hSetEffective(id uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func hSetTick(ms uint32) uint32

//go:wasmimport env proxy_get_shared_data
func hGetShared(kp unsafe.Pointer, kn uint32, rp, rn, rcas unsafe.Pointer) uint32

//go:wasmimport env proxy_define_metric
func hDefineMetric(t uint32, np unsafe.Pointer, nn uint32, rid unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func hIncMetric(id uint32, off int64) uint32

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

var pinned [][]byte

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	b := make([]byte, size+1)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

func enter() { pinned = pinned[:0] }

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

const (
	reqHeaders  = 0
	respHeaders = 2
	bufReqBody  = 0
)

func getHeader(t uint32, k string) string {
	var p *byte
	var n uint32
	kp, kn := sp(k)
	if hGetHeader(t, kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n)) != 0 {
		return ""
	}
	return str(p, n)
}

func addHeader(t uint32, k, v string) {
	kp, kn := sp(k)
	vp, vn := sp(v)
	hAddHeader(t, kp, kn, vp, vn)
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

type httpCtx struct {
	mode     string
	calls    []string
	released bool // continued (or answered): later body callbacks return Continue
}

var (
	contexts = map[uint32]*httpCtx{}
	waiters  []uint32 // streams the next tick continues
	victim   uint32   // the last /victim stream
	// gates: the shared-data key the tick waits for, by mode
	gates = map[string]string{"/gated": "bodywait.go", "/quirk": "bodywait.quirk"}
)

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	if parent != 0 {
		contexts[id] = &httpCtx{}
	}
}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	hSetTick(5)
	return 1
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) {
	enter()
	inc("bodywait_ticks")
	var keep []uint32
	for _, id := range waiters {
		c := contexts[id]
		if c == nil || hSetEffective(id) != 0 {
			continue
		}
		if key := gates[c.mode]; key != "" {
			var p *byte
			var n, cas uint32
			kp, kn := sp(key)
			if hGetShared(kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n), unsafe.Pointer(&cas)) != 0 {
				keep = append(keep, id)
				continue
			}
		}
		c.released = true
		addHeader(reqHeaders, "x-resumed-by", "tick")
		hContinue(0)
	}
	waiters = keep
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	enter()
	c := contexts[id]
	path := getHeader(reqHeaders, ":path")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	c.mode = path
	switch path {
	case "/nopause":
		return 0
	case "/gated":
		waiters = append(waiters, id)
	case "/victim":
		victim = id
	case "/quirk":
		waiters = append(waiters, id)
		if victim != 0 && hSetEffective(victim) == 0 {
			if v := contexts[victim]; v != nil {
				v.released = true
			}
			dp, dn := sp("bodywait_quirk")
			bp, bn := sp("answered by another stream")
			hSendLocal(429, dp, dn, bp, bn, nil, 0, -1)
			hSetEffective(id)
		}
		return 0
	case "/tick":
		if eos != 0 {
			waiters = append(waiters, id)
		}
	}
	return 1
}

// fnv is FNV-1a, 32 bits.
func fnv(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	enter()
	inc("bodywait_body_calls")
	c := contexts[id]
	var p *byte
	var n uint32
	hGetBuffer(bufReqBody, 0, size, unsafe.Pointer(&p), unsafe.Pointer(&n))
	body := str(p, n)
	rec := strconv.Itoa(int(size)) + "/" + strconv.Itoa(int(eos))
	if n != size {
		rec += "!" + strconv.Itoa(int(n))
	}
	c.calls = append(c.calls, rec)
	if c.released || gates[c.mode] != "" || c.mode == "/nopause" {
		return 0
	}
	switch c.mode {
	case "/continue":
		if strings.Contains(body, "END") || eos != 0 {
			c.released = true
			addHeader(reqHeaders, "x-bodywait-seen", strconv.FormatUint(uint64(fnv(body)), 16))
			addHeader(reqHeaders, "x-bodywait-len", strconv.Itoa(len(body)))
			return 0
		}
	case "/tick":
		if strings.Contains(body, "GO") || eos != 0 {
			waiters = append(waiters, id)
		}
	case "/self":
		if strings.Contains(body, "END") {
			c.released = true
			hContinue(0)
		}
	case "/trap":
		if strings.Contains(body, "BOOM") {
			panic("bodywait: trap requested")
		}
	case "/local":
		if strings.Contains(body, "STOP") || eos != 0 {
			c.released = true
			msg := "stopped after " + strconv.Itoa(len(body)) + " bytes"
			h := pairs([][2]string{{"x-bodywait-local", "yes"}})
			dp, dn := sp("bodywait_stop")
			bp, bn := sp(msg)
			hSendLocal(403, dp, dn, bp, bn, unsafe.Pointer(&h[0]), uint32(len(h)), -1)
		}
	}
	return 1
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	enter()
	if c := contexts[id]; c != nil {
		addHeader(respHeaders, "x-bodywait-calls", strings.Join(c.calls, ","))
	}
	return 0
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	if _, ok := contexts[id]; ok {
		delete(contexts, id)
		inc("bodywait_deletes")
	}
}
