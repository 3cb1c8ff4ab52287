package dynmod

/*
#include <stdlib.h>
#include <string.h>
#include "envoy_abi.h"

void sl_log(int level, const char* msg, size_t len);
bool sl_get_header(void* filter, int type, const char* name, size_t name_len, const char** value, size_t* value_len);
sl_header* sl_get_headers(void* filter, int type, size_t* n);
bool sl_add_header(void* filter, int type, const char* name, size_t name_len, const char* value, size_t value_len);
void sl_send_response(void* filter, uint32_t status, const char* packed, uint16_t n, const char* body, size_t body_len, const char* details, size_t details_len);
sl_buf* sl_body(void* filter, bool response, size_t* n);
bool sl_attribute(void* filter, int id, const char** value, size_t* len);
bool sl_define_metric(void* config, int kind, const char* name, size_t len, size_t* id);
bool sl_add_metric(void* config, void* filter, int kind, size_t id, int64_t delta);
void sl_set_metadata(void* filter, const char* packed, uint16_t n);
*/
import "C"

import (
	"encoding/binary"
	"runtime/debug"
	"unsafe"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// theModule is the process's module: Envoy's calls reach it through the exports below.
var theModule = newModule(cEnvoy{})

// cEnvoy is envoy over the ABI's callbacks (hooks.c's helpers).
type cEnvoy struct{}

func f2c(f filterPtr) unsafe.Pointer { return unsafe.Pointer(f) }

func ptr(b []byte) *C.char {
	if len(b) == 0 {
		return nil
	}
	return (*C.char)(unsafe.Pointer(unsafe.SliceData(b)))
}

func sptr(s string) *C.char {
	if len(s) == 0 {
		return nil
	}
	return (*C.char)(unsafe.Pointer(unsafe.StringData(s)))
}

// cbytes is Envoy's memory at p, n bytes, as a slice: read it before the hook returns.
func cbytes(p *C.char, n C.size_t) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n))
}

// Envoy's log levels are Proxy-Wasm's (trace 0 … critical 5).
func (cEnvoy) log(level abi.LogLevel, msg string) {
	C.sl_log(C.int(level), sptr(msg), C.size_t(len(msg)))
}

func (cEnvoy) header(f filterPtr, k headerKind, name string, dst []byte) ([]byte, bool) {
	var v *C.char
	var n C.size_t
	if !C.sl_get_header(f2c(f), C.int(k), sptr(name), C.size_t(len(name)), &v, &n) {
		return dst, false
	}
	return append(dst, cbytes(v, n)...), true
}

func (cEnvoy) headerPairs(f filterPtr, k headerKind, dst []byte) ([]byte, bool) {
	var n C.size_t
	a := C.sl_get_headers(f2c(f), C.int(k), &n)
	if a == nil {
		return dst, false
	}
	hs := unsafe.Slice(a, int(n))
	// Proxy-Wasm's pairs (proxywasm.AppendHeaders, from Envoy's memory): the count, each
	// name's and value's length, then each name and value followed by a NUL.
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(hs)))
	for i := range hs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(hs[i].key_length))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(hs[i].value_length))
	}
	for i := range hs {
		dst = append(append(dst, cbytes(hs[i].key_ptr, hs[i].key_length)...), 0)
		dst = append(append(dst, cbytes(hs[i].value_ptr, hs[i].value_length)...), 0)
	}
	return dst, true
}

func (cEnvoy) addHeader(f filterPtr, k headerKind, name string, value []byte) bool {
	return bool(C.sl_add_header(f2c(f), C.int(k), sptr(name), C.size_t(len(name)), ptr(value), C.size_t(len(value))))
}

func (cEnvoy) sendResponse(f filterPtr, status int, packed []byte, n int, body []byte, details string) {
	C.sl_send_response(f2c(f), C.uint32_t(status), ptr(packed), C.uint16_t(n), ptr(body), C.size_t(len(body)), sptr(details), C.size_t(len(details)))
}

func (cEnvoy) setMetadata(f filterPtr, packed []byte, n int) {
	C.sl_set_metadata(f2c(f), ptr(packed), C.uint16_t(n))
}

func (cEnvoy) continueDecoding(f filterPtr) {
	C.envoy_dynamic_module_callback_http_filter_continue_decoding(f2c(f))
}

func (cEnvoy) attribute(f filterPtr, id attribute, dst []byte) ([]byte, bool) {
	var v *C.char
	var n C.size_t
	cid := C.int(id)
	if id == attrClusterName {
		cid = -1 // sl_attribute: the routed cluster's name
	}
	if !C.sl_attribute(f2c(f), cid, &v, &n) {
		return dst, false
	}
	return append(dst, cbytes(v, n)...), true
}

func (cEnvoy) body(f filterPtr, response bool, dst []byte) ([]byte, bool) {
	var n C.size_t
	a := C.sl_body(f2c(f), C.bool(response), &n)
	if a == nil {
		return dst, false
	}
	for _, c := range unsafe.Slice(a, int(n)) {
		dst = append(dst, cbytes(c.ptr, c.length)...)
	}
	return dst, true
}

func (cEnvoy) workerIndex(f filterPtr) int {
	return int(C.envoy_dynamic_module_callback_http_filter_get_worker_index(f2c(f)))
}

func (cEnvoy) concurrency() int { return int(C.envoy_dynamic_module_callback_get_concurrency()) }

func (cEnvoy) defineMetric(c configPtr, k metricKind, name string) (uint64, bool) {
	var id C.size_t
	ok := C.sl_define_metric(unsafe.Pointer(c), C.int(k), sptr(name), C.size_t(len(name)), &id)
	return uint64(id), bool(ok)
}

func (cEnvoy) addMetric(c configPtr, f filterPtr, k metricKind, id uint64, delta int64) bool {
	return bool(C.sl_add_metric(unsafe.Pointer(c), f2c(f), C.int(k), C.size_t(id), C.int64_t(delta)))
}

func (cEnvoy) newScheduler(f filterPtr) schedPtr {
	return schedPtr(C.envoy_dynamic_module_callback_http_filter_scheduler_new(f2c(f)))
}

func (cEnvoy) commit(s schedPtr, event uint64) {
	C.envoy_dynamic_module_callback_http_filter_scheduler_commit(unsafe.Pointer(s), C.uint64_t(event))
}

func (cEnvoy) deleteScheduler(s schedPtr) {
	C.envoy_dynamic_module_callback_http_filter_scheduler_delete(unsafe.Pointer(s))
}

// cPrepared writes the prepared response headers into the stream's C record.
type cPrepared struct{ s *C.sl_stream }

func (p cPrepared) set(packed []byte, n int) {
	s := p.s
	if len(packed) > C.SL_INLINE_HEADERS {
		m := C.malloc(C.size_t(len(packed)))
		if m == nil {
			return // the response goes without its rate-limit headers
		}
		s.hdrs = (*C.char)(m)
	}
	C.memcpy(unsafe.Pointer(s.hdrs), unsafe.Pointer(unsafe.SliceData(packed)), C.size_t(len(packed)))
	s.hdrs_len = C.uint32_t(len(packed))
	s.nhdrs = C.uint16_t(n)
}

// The exports hooks.c calls. Each recovers a panic (guard.go): Envoy never sees one.

//export sluiceConfigNew
func sluiceConfigNew(cfg unsafe.Pointer, name *C.char, nameLen C.size_t, data *C.char, dataLen C.size_t) (idx C.uint32_t) {
	defer func() {
		if r := recover(); r != nil {
			theModule.panicked(nil, r, debug.Stack())
			idx = 0
		}
	}()
	i, err := theModule.newConfig(configPtr(cfg), string(cbytes(name, nameLen)), cbytes(data, dataLen))
	if err != nil {
		if err != errRefused { // the VM logged its reasons already
			theModule.env.log(abi.LogCritical, err.Error())
		}
		return 0
	}
	return C.uint32_t(i)
}

//export sluiceConfigDestroy
func sluiceConfigDestroy(idx C.uint32_t) {
	defer func() {
		if r := recover(); r != nil {
			theModule.panicked(nil, r, debug.Stack())
		}
	}()
	theModule.destroyConfig(uint32(idx))
}

// streamOf returns the worker of a stream Go holds.
func streamOf(s *C.sl_stream) (*filterConfig, *worker) {
	c := theModule.config(uint32(s.config))
	if c == nil || int(s.worker) >= len(c.workers) {
		return nil, nil
	}
	return c, c.workers[s.worker]
}

//export sluiceRequestHeaders
func sluiceRequestHeaders(s *C.sl_stream, eos C.bool) (status C.int) {
	c := theModule.config(uint32(s.config))
	if c == nil {
		s.state = C.SL_ENDED
		return 0
	}
	s.state = C.SL_ENDED // until the VM holds it: a panic ends the stream for Go
	defer recoverHook(c, s, true, &status)
	f := filterPtr(s.envoy)
	panicHook(c, f)
	w, id, act, ended := c.requestHeaders(f, bool(eos), cPrepared{s})
	s.worker, s.id = C.uint32_t(w.index), C.uint32_t(id)
	if ended {
		s.state = C.SL_ENDED
	} else {
		s.state = C.SL_LIVE
	}
	// Continue, or StopIteration: the body still reaches the filter (a reservation read
	// from it), as Wasm's allow_on_headers_stop_iteration lets it.
	return C.int(act)
}

// recoverHook is deferred by the stream exports: a panic in the hook is handled by
// filterConfig.panicked (request: the hook decides the stream's request, whose status it
// then sets).
func recoverHook(c *filterConfig, s *C.sl_stream, request bool, status *C.int) {
	if r := recover(); r != nil {
		*status = C.int(c.panicked(filterPtr(s.envoy), request, r, debug.Stack()))
	}
}

//export sluiceRequestBody
func sluiceRequestBody(s *C.sl_stream, size C.size_t, eos C.bool) (status C.int) {
	c, w := streamOf(s)
	if w == nil {
		return 0
	}
	defer recoverHook(c, s, true, &status)
	// Pause is StopIterationAndBuffer (1) for a body.
	return C.int(w.requestBody(uint32(s.id), filterPtr(s.envoy), int(size), bool(eos)))
}

//export sluiceResponseHeaders
func sluiceResponseHeaders(s *C.sl_stream, eos C.bool) (status C.int) {
	c, w := streamOf(s)
	if w == nil {
		return 0
	}
	defer recoverHook(c, s, false, &status)
	return C.int(w.responseHeaders(uint32(s.id), filterPtr(s.envoy), bool(eos)))
}

//export sluiceResponseBody
func sluiceResponseBody(s *C.sl_stream, size C.size_t, eos C.bool) (status C.int) {
	c, w := streamOf(s)
	if w == nil {
		return 0
	}
	defer recoverHook(c, s, false, &status)
	return C.int(w.responseBody(uint32(s.id), filterPtr(s.envoy), int(size), bool(eos)))
}

//export sluiceResponseTrailers
func sluiceResponseTrailers(s *C.sl_stream) (status C.int) {
	c, w := streamOf(s)
	if w == nil {
		return 0
	}
	defer recoverHook(c, s, false, &status)
	return C.int(w.responseTrailers(uint32(s.id), filterPtr(s.envoy)))
}

//export sluiceDestroy
func sluiceDestroy(s *C.sl_stream) {
	s.state = C.SL_ENDED
	c, w := streamOf(s)
	if w == nil {
		return
	}
	var status C.int
	defer recoverHook(c, s, false, &status)
	w.destroy(uint32(s.id), filterPtr(s.envoy))
}

//export sluiceScheduled
func sluiceScheduled(s *C.sl_stream, event C.uint64_t) {
	c, w := streamOf(s)
	if w == nil {
		return
	}
	var status C.int
	defer recoverHook(c, s, false, &status)
	w.scheduled(uint32(s.id), filterPtr(s.envoy), uint64(event))
}
