//go:build wasip1

package abi

import (
	"unsafe"

	"github.com/sluice-proxy/sluice/proxywasm"
)

// The host calls sluice.wasm imports. Each is provided by Envoy ≥ 1.33 and by
// the tetratelabs proxytest emulator; the imports test pins this list.
// Pointer parameters are unsafe.Pointer (an i32 address in linear memory).

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(bt, start, max uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mt uint32, key unsafe.Pointer, keySize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mt uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mt uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path unsafe.Pointer, pathSize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key unsafe.Pointer, keySize uint32, retPtr, retSize, retCAS unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(mt uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

//go:wasmimport env proxy_record_metric
func proxyRecordMetric(id uint32, value uint64) uint32

// Out-slots the host writes results into. The guest is single-threaded and
// the host writes them only at the end of a host call, so one set suffices
// (and taking their address allocates nothing). outPtr is typed *byte so the
// garbage collector sees the buffer address (the buffer itself is kept
// reachable by the allocator until the next top-level callback).
var (
	outPtr  *byte
	outSize uint32
	outCAS  uint32
	outID   uint32
)

func resetOut() {
	outPtr = nil
	outSize = 0
	outCAS = 0
	outID = 0
}

// outBytes returns the buffer the host returned through outPtr/outSize. It
// slices a pointer to a maximal array rather than calling unsafe.Slice, whose
// overflow check is a runtime call (internal/runtime/math.MulUintptr) in
// wasm: two guest calls per request. The host wrote outSize bytes at outPtr,
// inside the 32-bit linear memory, so the bound cannot overflow.
func outBytes() []byte {
	if outPtr == nil || outSize == 0 {
		return nil
	}
	return (*[1 << 31]byte)(unsafe.Pointer(outPtr))[:outSize:outSize]
}

func strPtr(s string) unsafe.Pointer { return unsafe.Pointer(unsafe.StringData(s)) }

func bytesPtr(b []byte) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(b)) }

// Imports implements Host with the wasm imports. The zero value is ready to
// use; it is not safe for concurrent use (nor is a Proxy-Wasm VM).
type Imports struct {
	scratch []byte // serialized local-response headers
}

var _ Host = (*Imports)(nil)

// Log implements Host.
func (*Imports) Log(level LogLevel, msg string) {
	proxyLog(uint32(level), strPtr(msg), uint32(len(msg)))
}

// GetBuffer implements Host.
func (*Imports) GetBuffer(bt BufferType, start, max int) ([]byte, Status) {
	resetOut()
	st := Status(proxyGetBufferBytes(uint32(bt), uint32(start), uint32(max), unsafe.Pointer(&outPtr), unsafe.Pointer(&outSize)))
	return outBytes(), st
}

// GetHeader implements Host.
func (*Imports) GetHeader(mt MapType, name string) ([]byte, Status) {
	resetOut()
	st := Status(proxyGetHeaderMapValue(uint32(mt), strPtr(name), uint32(len(name)), unsafe.Pointer(&outPtr), unsafe.Pointer(&outSize)))
	return outBytes(), st
}

// GetHeaderPairs implements Host.
func (*Imports) GetHeaderPairs(mt MapType) ([]byte, Status) {
	resetOut()
	st := Status(proxyGetHeaderMapPairs(uint32(mt), unsafe.Pointer(&outPtr), unsafe.Pointer(&outSize)))
	return outBytes(), st
}

// AddHeader implements Host.
func (*Imports) AddHeader(mt MapType, name string, value []byte) Status {
	return Status(proxyAddHeaderMapValue(uint32(mt), strPtr(name), uint32(len(name)), bytesPtr(value), uint32(len(value))))
}

// AddHeaders implements HeadersAdder: one guest call for the response's
// rate-limit headers, each still its own proxy_add_header_map_value.
func (*Imports) AddHeaders(mt MapType, hdrs []Header) Status {
	st := StatusOK
	for i := range hdrs {
		h := &hdrs[i]
		if r := Status(proxyAddHeaderMapValue(uint32(mt), strPtr(h.Name), uint32(len(h.Name)), bytesPtr(h.Value), uint32(len(h.Value)))); r != StatusOK && st == StatusOK {
			st = r
		}
	}
	return st
}

// GetProperty implements Host.
func (*Imports) GetProperty(path string) ([]byte, Status) {
	resetOut()
	st := Status(proxyGetProperty(strPtr(path), uint32(len(path)), unsafe.Pointer(&outPtr), unsafe.Pointer(&outSize)))
	return outBytes(), st
}

// SendLocalResponse implements Host.
func (im *Imports) SendLocalResponse(status int, details string, body []byte, headers []Header, grpcStatus int32) Status {
	im.scratch = proxywasm.AppendHeaders(im.scratch[:0], headers)
	return Status(proxySendLocalResponse(uint32(status), strPtr(details), uint32(len(details)),
		bytesPtr(body), uint32(len(body)), bytesPtr(im.scratch), uint32(len(im.scratch)), grpcStatus))
}

// GetSharedData implements Host.
func (*Imports) GetSharedData(key []byte) ([]byte, uint32, Status) {
	resetOut()
	st := Status(proxyGetSharedData(bytesPtr(key), uint32(len(key)), unsafe.Pointer(&outPtr), unsafe.Pointer(&outSize), unsafe.Pointer(&outCAS)))
	return outBytes(), outCAS, st
}

// SetSharedData implements Host.
func (*Imports) SetSharedData(key, value []byte, cas uint32) Status {
	return Status(proxySetSharedData(bytesPtr(key), uint32(len(key)), bytesPtr(value), uint32(len(value)), cas))
}

// DefineMetric implements Host.
func (*Imports) DefineMetric(mt MetricType, name string) (uint32, Status) {
	resetOut()
	st := Status(proxyDefineMetric(uint32(mt), strPtr(name), uint32(len(name)), unsafe.Pointer(&outID)))
	return outID, st
}

// RecordMetric implements MetricRecorder (proxy_record_metric).
func (*Imports) RecordMetric(id uint32, value uint64) Status {
	return Status(proxyRecordMetric(id, value))
}

// IncrementMetric implements Host.
func (*Imports) IncrementMetric(id uint32, delta int64) Status {
	return Status(proxyIncrementMetric(id, delta))
}
