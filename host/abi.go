package host

import "github.com/sluice-proxy/sluice/proxywasm"

// The ABI's numbers are defined once, in package proxywasm, for the guest's ABI layer and
// this host alike; these are their names here.

// Status is a Proxy-Wasm result code (WasmResult), returned by every host call.
type Status = proxywasm.Status

// Proxy-Wasm 0.2.1 result codes.
const (
	StatusOK                   = proxywasm.StatusOK
	StatusNotFound             = proxywasm.StatusNotFound
	StatusBadArgument          = proxywasm.StatusBadArgument
	StatusSerializationFailure = proxywasm.StatusSerializationFailure
	StatusParseFailure         = proxywasm.StatusParseFailure
	StatusInvalidMemoryAccess  = proxywasm.StatusInvalidMemoryAccess
	StatusEmpty                = proxywasm.StatusEmpty
	StatusCASMismatch          = proxywasm.StatusCASMismatch
	StatusInternalFailure      = proxywasm.StatusInternalFailure
	StatusUnimplemented        = proxywasm.StatusUnimplemented
)

// MetricType is a Proxy-Wasm metric type (proxy_define_metric).
type MetricType = proxywasm.MetricType

// Metric types.
const (
	MetricCounter   = proxywasm.MetricCounter
	MetricGauge     = proxywasm.MetricGauge
	MetricHistogram = proxywasm.MetricHistogram
)

// Header map and buffer types as the host calls receive them (u32 arguments).
const (
	mapRequestHeaders          = uint32(proxywasm.MapRequestHeaders)
	mapRequestTrailers         = uint32(proxywasm.MapRequestTrailers)
	mapResponseHeaders         = uint32(proxywasm.MapResponseHeaders)
	mapResponseTrailers        = uint32(proxywasm.MapResponseTrailers)
	mapHTTPCallResponseHeaders = uint32(proxywasm.MapHTTPCallResponseHeaders)
	mapHTTPCallResponseTrailer = uint32(proxywasm.MapHTTPCallResponseTrailer)

	bufferRequestBody         = uint32(proxywasm.BufferRequestBody)
	bufferResponseBody        = uint32(proxywasm.BufferResponseBody)
	bufferHTTPCallResponse    = uint32(proxywasm.BufferHTTPCallResponse)
	bufferVMConfiguration     = uint32(proxywasm.BufferVMConfiguration)
	bufferPluginConfiguration = uint32(proxywasm.BufferPluginConfiguration)
)

// Stream types (proxy_continue_stream), as the host call receives them.
const (
	streamHTTPRequest  = int(proxywasm.StreamRequest)
	streamHTTPResponse = int(proxywasm.StreamResponse)
)

// Filter actions returned by proxy_on_*_headers / _body.
const (
	actionContinue = uint64(proxywasm.ActionContinue)
	actionPause    = uint64(proxywasm.ActionPause)
)

// Log levels of proxy_log / proxy_get_log_level.
const (
	logTrace    = uint32(proxywasm.LogTrace)
	logDebug    = uint32(proxywasm.LogDebug)
	logInfo     = uint32(proxywasm.LogInfo)
	logWarn     = uint32(proxywasm.LogWarn)
	logError    = uint32(proxywasm.LogError)
	logCritical = uint32(proxywasm.LogCritical)
)

func itoa(v uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
		if v == 0 {
			break
		}
	}
	return string(b[i:])
}
