// Package proxywasm holds the numbers and the one encoding of the Proxy-Wasm ABI 0.2.1
// that both sides use: the guest's ABI layer (filter/abi) and the embedded host (host).
// Each is defined here once. Standard library only — it is compiled into the module.
//
// Sources: the ABI specification (proxy-wasm/spec, abi-versions/v0.2.1) and
// proxy-wasm-cpp-host's include/proxy-wasm/wasm_api_impl.h / context.h for the values;
// buffer type 9 and the Redis calls are Higress's extension.
package proxywasm

import "strconv"

// Status is a WasmResult: what every host call returns.
type Status uint32

// The WasmResult values of ABI 0.2.1.
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

// String returns the ABI name of s ("STATUS_n" for a value the ABI does not name).
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
	return "STATUS_" + strconv.FormatUint(uint64(s), 10)
}

// LogLevel is a proxy_log / proxy_get_log_level level.
type LogLevel uint32

// Log levels.
const (
	LogTrace    LogLevel = 0
	LogDebug    LogLevel = 1
	LogInfo     LogLevel = 2
	LogWarn     LogLevel = 3
	LogError    LogLevel = 4
	LogCritical LogLevel = 5
)

// MapType selects a header map (proxy_*_header_map_*).
type MapType uint32

// Header maps.
const (
	MapRequestHeaders          MapType = 0
	MapRequestTrailers         MapType = 1
	MapResponseHeaders         MapType = 2
	MapResponseTrailers        MapType = 3
	MapGrpcInitialMetadata     MapType = 4
	MapGrpcTrailingMetadata    MapType = 5
	MapHTTPCallResponseHeaders MapType = 6
	MapHTTPCallResponseTrailer MapType = 7
)

// BufferType selects a buffer (proxy_get_buffer_bytes and friends).
type BufferType uint32

// Buffers.
const (
	BufferRequestBody         BufferType = 0
	BufferResponseBody        BufferType = 1
	BufferDownstreamData      BufferType = 2
	BufferUpstreamData        BufferType = 3
	BufferHTTPCallResponse    BufferType = 4
	BufferGrpcReceive         BufferType = 5
	BufferVMConfiguration     BufferType = 6
	BufferPluginConfiguration BufferType = 7
	BufferCallData            BufferType = 8
	// BufferRedisCallResponse is Higress's: the raw RESP reply during
	// proxy_on_redis_call_response.
	BufferRedisCallResponse BufferType = 9
)

// RedisStatus is the status argument of Higress's proxy_on_redis_call_response:
// zero with Redis's reply in buffer BufferRedisCallResponse (which may be an
// error reply such as NOSCRIPT); any other value is a failure with no reply,
// and a guest treats every nonzero value as one.
type RedisStatus uint32

// Redis callback statuses (Higress's).
const (
	RedisStatusOK           RedisStatus = 0
	RedisStatusNetworkError RedisStatus = 1 // connection refused or reset, cluster unreachable
	RedisStatusTimeout      RedisStatus = 2 // no reply within proxy_redis_init's timeout
)

// Action is what a stream callback returns.
type Action uint32

// Actions.
const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

// StreamType is proxy_continue_stream's argument.
type StreamType uint32

// Stream types.
const (
	StreamRequest  StreamType = 0
	StreamResponse StreamType = 1
)

// MetricType is the kind of a metric (proxy_define_metric).
type MetricType uint32

// Metric types.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)
