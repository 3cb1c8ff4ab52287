package host

// Status is a Proxy-Wasm result code (WasmResult), returned by every host call.
type Status uint32

// Proxy-Wasm 0.2.1 result codes.
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCASMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusUnimplemented        Status = 12
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusNotFound:
		return "NOT_FOUND"
	case StatusBadArgument:
		return "BAD_ARGUMENT"
	case StatusSerializationFailure:
		return "SERIALIZATION_FAILURE"
	case StatusParseFailure:
		return "PARSE_FAILURE"
	case StatusInvalidMemoryAccess:
		return "INVALID_MEMORY_ACCESS"
	case StatusEmpty:
		return "EMPTY"
	case StatusCASMismatch:
		return "CAS_MISMATCH"
	case StatusInternalFailure:
		return "INTERNAL_FAILURE"
	case StatusUnimplemented:
		return "UNIMPLEMENTED"
	}
	return "STATUS_" + itoa(uint64(s))
}

// Header map types (proxy_*_header_map_*).
const (
	mapRequestHeaders          = 0
	mapRequestTrailers         = 1
	mapResponseHeaders         = 2
	mapResponseTrailers        = 3
	mapGrpcInitialMetadata     = 4
	mapGrpcTrailingMetadata    = 5
	mapHTTPCallResponseHeaders = 6
	mapHTTPCallResponseTrailer = 7
)

// Buffer types (proxy_get_buffer_bytes and friends).
const (
	bufferRequestBody         = 0
	bufferResponseBody        = 1
	bufferDownstreamData      = 2
	bufferUpstreamData        = 3
	bufferHTTPCallResponse    = 4
	bufferGrpcReceive         = 5
	bufferVMConfiguration     = 6
	bufferPluginConfiguration = 7
	bufferCallData            = 8
)

// MetricType is a Proxy-Wasm metric type (proxy_define_metric).
type MetricType uint32

// Metric types.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// Stream types (proxy_continue_stream).
const (
	streamHTTPRequest  = 0
	streamHTTPResponse = 1
)

// Filter actions returned by proxy_on_*_headers / _body.
const (
	actionContinue = 0
	actionPause    = 1
)

// Log levels of proxy_log / proxy_get_log_level.
const (
	logTrace    = 0
	logDebug    = 1
	logInfo     = 2
	logWarn     = 3
	logError    = 4
	logCritical = 5
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
