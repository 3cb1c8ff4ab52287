// Package abi is sluice's own Proxy-Wasm ABI 0.2.1 layer for a guest built
// with standard Go (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared).
//
// It has two halves:
//
//   - this file (every platform): the ABI's constants, the narrow Host
//     interface the plugin calls (one method per host call sluice uses), and
//     the Handler interface the exported proxy_on_* callbacks dispatch to.
//     A native fake implements Host, so everything above this package is
//     ordinary Go tested with `go test` on linux/amd64.
//   - the wasip1 files: the //go:wasmimport declarations of the host calls,
//     the //go:wasmexport callbacks, and the memory allocator the host writes
//     returned buffers into.
//
// The host calls imported are those in the Host interface plus the calls of
// grpc_wasip1.go and resume_wasip1.go (the rls backend's gRPC call, and
// resuming a paused stream); every one of them is provided by Envoy (≥ 1.33),
// and all but proxy_grpc_call, proxy_grpc_cancel and proxy_done by the tetratelabs
// proxytest emulator, whose tests build with the tag nogrpc. Time is read
// through WASI (time.Now), never through proxy_get_current_time_nanoseconds
// (the emulator lacks it).
//
// Extending (the seam for sluice-redis.wasm, build tag "redis"): a tagged
// file adds the extra imports (proxy_redis_init, proxy_redis_call) as
// methods of Imports behind an interface of their own (filter.RedisHost), and the extra export (proxy_on_redis_call_response) dispatches to an
// optional interface the Handler implements, found by type assertion. The
// untagged module never references them, so sluice.wasm does not import
// them (the imports test pins that).
package abi

import "github.com/sluice-proxy/sluice/proxywasm"

// The ABI's numbers and the header-pair encoding are defined once, in package proxywasm,
// for this layer and the embedded host alike; these are their names here.
type (
	Status     = proxywasm.Status
	LogLevel   = proxywasm.LogLevel
	MapType    = proxywasm.MapType
	BufferType = proxywasm.BufferType
	// RedisStatus is proxy_on_redis_call_response's status (Higress).
	RedisStatus = proxywasm.RedisStatus
	Action      = proxywasm.Action
	MetricType  = proxywasm.MetricType
	// Header is one header of a local response.
	Header = proxywasm.Header
)

// The values sluice uses.
const (
	StatusOK                  = proxywasm.StatusOK
	StatusNotFound            = proxywasm.StatusNotFound
	StatusBadArgument         = proxywasm.StatusBadArgument
	StatusInvalidMemoryAccess = proxywasm.StatusInvalidMemoryAccess
	StatusEmpty               = proxywasm.StatusEmpty
	StatusCASMismatch         = proxywasm.StatusCASMismatch
	StatusInternalFailure     = proxywasm.StatusInternalFailure
	StatusUnimplemented       = proxywasm.StatusUnimplemented

	LogTrace    = proxywasm.LogTrace
	LogDebug    = proxywasm.LogDebug
	LogInfo     = proxywasm.LogInfo
	LogWarn     = proxywasm.LogWarn
	LogError    = proxywasm.LogError
	LogCritical = proxywasm.LogCritical

	MapRequestHeaders   = proxywasm.MapRequestHeaders
	MapRequestTrailers  = proxywasm.MapRequestTrailers
	MapResponseHeaders  = proxywasm.MapResponseHeaders
	MapResponseTrailers = proxywasm.MapResponseTrailers

	BufferRequestBody         = proxywasm.BufferRequestBody
	BufferResponseBody        = proxywasm.BufferResponseBody
	BufferVMConfiguration     = proxywasm.BufferVMConfiguration
	BufferPluginConfiguration = proxywasm.BufferPluginConfiguration
	BufferRedisCallResponse   = proxywasm.BufferRedisCallResponse

	RedisStatusOK           = proxywasm.RedisStatusOK
	RedisStatusNetworkError = proxywasm.RedisStatusNetworkError
	RedisStatusTimeout      = proxywasm.RedisStatusTimeout

	ActionContinue = proxywasm.ActionContinue
	ActionPause    = proxywasm.ActionPause

	MetricCounter   = proxywasm.MetricCounter
	MetricGauge     = proxywasm.MetricGauge
	MetricHistogram = proxywasm.MetricHistogram
)

// NoGRPCStatus is proxy_send_local_response's grpc_status for "none" (the
// SDKs' default, -1): Envoy treats every value outside 0..16 so
// (Context::sendLocalResponse, source/extensions/common/wasm/context.cc).
const NoGRPCStatus int32 = -1

// Host is the set of host calls sluice makes, relative to the context the
// host is currently calling into (Proxy-Wasm has no explicit context
// argument). Byte slices returned by Host are valid until the next top-level
// callback starts: callers copy what they keep. Methods never panic.
//
// On wasip1 it is implemented by Imports; natively by fakes in tests.
type Host interface {
	// Log writes msg at level (proxy_log).
	Log(level LogLevel, msg string)
	// GetBuffer returns up to max bytes of buffer bt from start
	// (proxy_get_buffer_bytes).
	GetBuffer(bt BufferType, start, max int) ([]byte, Status)
	// GetHeader returns the value of header name (lower case) in map mt
	// (proxy_get_header_map_value). A missing header is StatusNotFound or,
	// on some hosts, StatusOK with an empty value.
	GetHeader(mt MapType, name string) ([]byte, Status)
	// GetHeaderPairs returns every header of map mt, serialized as
	// proxy_get_header_map_pairs returns them (proxywasm.ParsePairs reads
	// it): one pair per value, repeated names included.
	GetHeaderPairs(mt MapType) ([]byte, Status)
	// AddHeader appends a header to map mt (proxy_add_header_map_value).
	AddHeader(mt MapType, name string, value []byte) Status
	// GetProperty returns a property; path is the serialized form with
	// segments separated by NUL ("source\x00address").
	GetProperty(path string) ([]byte, Status)
	// SendLocalResponse answers the current request without forwarding it
	// (proxy_send_local_response). grpcStatus is the gRPC status for a
	// gRPC request (0..16), or NoGRPCStatus: Envoy then derives it from
	// status when it turns the reply into a gRPC response.
	SendLocalResponse(status int, details string, body []byte, headers []Header, grpcStatus int32) Status
	// GetSharedData returns a shared-data value and its CAS token
	// (proxy_get_shared_data).
	GetSharedData(key []byte) (value []byte, cas uint32, st Status)
	// SetSharedData stores a shared-data value (proxy_set_shared_data): cas
	// 0 is unconditional; a nonzero cas must match the key's current token
	// (StatusCASMismatch otherwise) unless the key does not exist yet.
	SetSharedData(key, value []byte, cas uint32) Status
	// DefineMetric defines (or looks up) a metric (proxy_define_metric).
	DefineMetric(mt MetricType, name string) (id uint32, st Status)
	// IncrementMetric adds delta to a metric (proxy_increment_metric).
	IncrementMetric(id uint32, delta int64) Status
	// Now returns the current time in Unix nanoseconds. The wasip1
	// implementation reads WASI's clock (time.Now); fakes return a
	// controlled time.
	Now() int64
}

// HeadersAdder is implemented by a Host that adds several headers in one
// call (Imports: one guest call instead of one per header; the host still
// gets one proxy_add_header_map_value per header). AddHeaders adds every
// header of hdrs to map mt in order and returns the first failure, if any.
type HeadersAdder interface {
	AddHeaders(mt MapType, hdrs []Header) Status
}

// MetricRecorder is implemented by a Host that records histogram values
// (proxy_record_metric; Imports has it).
type MetricRecorder interface {
	RecordMetric(id uint32, value uint64) Status
}

// BodyHandler is implemented by a Handler that reads request bodies, response bodies and
// trailers (proxy_on_request_body, proxy_on_response_body, proxy_on_response_trailers).
// For a body callback ActionPause is StopIterationAndBuffer.
type BodyHandler interface {
	OnRequestBody(id uint32, bodySize int, endOfStream bool) Action
	OnResponseBody(id uint32, bodySize int, endOfStream bool) Action
	OnResponseTrailers(id uint32, numTrailers int) Action
}

// QuickHandler is implemented by a Handler that can answer a stream's routine callbacks
// without the panic guard: each method does only what cannot panic (a table lookup, a few
// field tests, a free-list push or pop; no host call, no configuration) and reports
// whether it handled the callback. The export tries it first and calls the guarded
// Handler method when it declines. The guard (a deferred recover) costs two guest
// function calls per callback, which V8 makes dear; an admitted request makes five of
// these callbacks.
type QuickHandler interface {
	// QuickContextCreate creates stream id of root parentID, or ignores it when that root
	// is unknown (false for a root context: OnContextCreate creates it).
	QuickContextCreate(id, parentID uint32) bool
	// QuickResponseHeaders is true when stream id's response headers need nothing (the
	// callback answers Continue), QuickResponseBody likewise for a response body chunk.
	QuickResponseHeaders(id uint32) bool
	QuickResponseBody(id uint32) bool
	// QuickDone and QuickDelete end stream id when its end needs no work (nothing held,
	// read or billed), or it has ended already: true, and proxy_on_done answers true.
	QuickDone(id uint32) bool
	QuickDelete(id uint32) bool
}

// Handler receives the callbacks the host makes into the module. The wasip1
// exports translate each proxy_on_* call into one Handler call, after
// recovering from any panic (a panic is logged at critical level and the
// callback returns the value documented on the export).
type Handler interface {
	OnVMStart(rootID uint32, vmConfigSize int) bool
	OnContextCreate(id, parentID uint32)
	OnConfigure(rootID uint32, pluginConfigSize int) bool
	OnRequestHeaders(id uint32, numHeaders int, endOfStream bool) Action
	OnResponseHeaders(id uint32, numHeaders int, endOfStream bool) Action
	OnLog(id uint32)
	OnDone(id uint32) bool
	OnDelete(id uint32)
	OnTick(rootID uint32)
}
