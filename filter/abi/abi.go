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
// The host calls imported are exactly those in the Host interface; every one
// of them is provided by Envoy (≥ 1.33) and by the tetratelabs proxytest
// emulator. Time is read through WASI (time.Now), never through
// proxy_get_current_time_nanoseconds (the emulator lacks it).
//
// Extending (the seam for sluice-redis.wasm, build tag "redis"): a tagged
// file adds the extra imports (proxy_redis_init, proxy_redis_call,
// proxy_continue_stream) as methods of Imports behind an interface of their
// own, and the extra export (proxy_on_redis_call_response) dispatches to an
// optional interface the Handler implements, found by type assertion. The
// untagged module never references them, so sluice.wasm does not import
// them (the imports test pins that).
package abi

// Status is a Proxy-Wasm WasmResult.
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
	StatusCasMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusUnimplemented        Status = 12
)

// String returns the ABI name of s.
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
	case StatusCasMismatch:
		return "CAS_MISMATCH"
	case StatusInternalFailure:
		return "INTERNAL_FAILURE"
	case StatusUnimplemented:
		return "UNIMPLEMENTED"
	}
	return "STATUS_" + itoa(uint32(s))
}

// LogLevel is a proxy_log level.
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

// MapType selects a header map.
type MapType uint32

// Header maps.
const (
	MapRequestHeaders   MapType = 0
	MapRequestTrailers  MapType = 1
	MapResponseHeaders  MapType = 2
	MapResponseTrailers MapType = 3
)

// BufferType selects a buffer for proxy_get_buffer_bytes.
type BufferType uint32

// Buffers.
const (
	BufferRequestBody         BufferType = 0
	BufferResponseBody        BufferType = 1
	BufferVMConfiguration     BufferType = 6
	BufferPluginConfiguration BufferType = 7
	// BufferRedisCallResponse is Higress's buffer holding a raw RESP reply
	// (only hosts with the Redis extension).
	BufferRedisCallResponse BufferType = 9
)

// Action is what a stream callback returns.
type Action uint32

// Actions.
const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

// MetricType is the kind of a metric defined with proxy_define_metric.
type MetricType uint32

// Metric types.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// Header is one header of a local response. Value is a byte slice so
// callers can format values into reusable buffers without allocating.
type Header struct {
	Name  string
	Value []byte
}

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
	// AddHeader appends a header to map mt (proxy_add_header_map_value).
	AddHeader(mt MapType, name string, value []byte) Status
	// GetProperty returns a property; path is the serialized form with
	// segments separated by NUL ("source\x00address").
	GetProperty(path string) ([]byte, Status)
	// SendLocalResponse answers the current request without forwarding it
	// (proxy_send_local_response, grpc status -1).
	SendLocalResponse(status int, details string, body []byte, headers []Header) Status
	// GetSharedData returns a shared-data value and its CAS token
	// (proxy_get_shared_data).
	GetSharedData(key []byte) (value []byte, cas uint32, st Status)
	// SetSharedData stores a shared-data value (proxy_set_shared_data): cas
	// 0 is unconditional; a nonzero cas must match the key's current token
	// (StatusCasMismatch otherwise) unless the key does not exist yet.
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

// SerializeHeaders appends the Proxy-Wasm serialization of headers to dst:
// a u32 count, then a u32 name size and u32 value size per pair, then each
// name and value followed by NUL (all little-endian).
func SerializeHeaders(dst []byte, headers []Header) []byte {
	dst = appendU32(dst, uint32(len(headers)))
	for i := range headers {
		dst = appendU32(dst, uint32(len(headers[i].Name)))
		dst = appendU32(dst, uint32(len(headers[i].Value)))
	}
	for i := range headers {
		dst = append(dst, headers[i].Name...)
		dst = append(dst, 0)
		dst = append(dst, headers[i].Value...)
		dst = append(dst, 0)
	}
	return dst
}

// DeserializeHeaders parses the serialization SerializeHeaders produces. It
// returns nil, false for malformed input (never panics).
func DeserializeHeaders(b []byte) ([][2]string, bool) {
	if len(b) < 4 {
		return nil, len(b) == 0
	}
	n := int(readU32(b))
	if n < 0 || n > (len(b)-4)/8 {
		return nil, false
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	out := make([][2]string, n)
	for i := 0; i < n; i++ {
		ks, vs := int(readU32(sizes[8*i:])), int(readU32(sizes[8*i+4:]))
		if ks < 0 || vs < 0 || ks+1 > len(data) {
			return nil, false
		}
		out[i][0] = string(data[:ks])
		data = data[ks+1:]
		if vs+1 > len(data) {
			return nil, false
		}
		out[i][1] = string(data[:vs])
		data = data[vs+1:]
	}
	return out, true
}

func appendU32(b []byte, v uint32) []byte {
	return append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
}

func readU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func itoa(v uint32) string {
	var b [10]byte
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

// handler receives the exported callbacks (see SetHandler).
var handler Handler

// SetHandler installs the Handler the exported proxy_on_* callbacks dispatch
// to. The wasm main package calls it from init (a c-shared module runs
// package initialisers from _initialize and never runs main).
func SetHandler(h Handler) { handler = h }
