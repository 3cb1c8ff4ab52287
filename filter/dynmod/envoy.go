package dynmod

import (
	"unsafe"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// The pointers Envoy hands the module: opaque, never dereferenced in Go.
type (
	// filterPtr is envoy_dynamic_module_type_http_filter_envoy_ptr: one filter instance
	// (one HTTP stream), valid from the filter's creation to its destroy hook.
	filterPtr unsafe.Pointer
	// configPtr is envoy_dynamic_module_type_http_filter_config_envoy_ptr: one filter
	// configuration, valid from its config_new hook to its config_destroy hook.
	configPtr unsafe.Pointer
	// schedPtr is envoy_dynamic_module_type_http_filter_scheduler_module_ptr: a scheduler
	// that posts events to the worker thread of the stream it was made for.
	schedPtr unsafe.Pointer
)

// headerKind is envoy_dynamic_module_type_http_header_type.
type headerKind uint32

const (
	requestHeaders headerKind = iota
	requestTrailers
	responseHeaders
	responseTrailers
)

// attribute is envoy_dynamic_module_type_attribute_id: the attributes the filter reads as
// Proxy-Wasm properties.
type attribute uint32

// metricKind is which of Envoy's three metric families a metric is in; each has its own
// ids.
type metricKind uint8

const (
	metricCounter metricKind = iota
	metricGauge
	metricHistogram
)

// envoy is what the shell calls in Envoy. cgo.go implements it over the dynamic-module ABI;
// the tests implement it in Go. Every method is called on the thread Envoy allows for it:
// the stream's methods on its worker thread inside one of its hooks (or a scheduled event),
// the configuration's on the main thread inside config_new, commit from any thread.
// Values returned are appended to dst (the shell's per-worker arena): Envoy's memory is
// never kept past the call.
type envoy interface {
	log(level abi.LogLevel, msg string)
	// header appends the first value of header name (lower case) of kind k to dst; false
	// when there is none.
	header(f filterPtr, k headerKind, name string, dst []byte) ([]byte, bool)
	// headerPairs appends every header of kind k to dst in Proxy-Wasm's pairs encoding
	// (proxywasm.ParsePairs reads it), one pair per value.
	headerPairs(f filterPtr, k headerKind, dst []byte) ([]byte, bool)
	addHeader(f filterPtr, k headerKind, name string, value []byte) bool
	// sendResponse answers the stream locally with n headers packed by packHeaders (a
	// grpc-status among them makes it a gRPC status).
	sendResponse(f filterPtr, status int, packed []byte, n int, body []byte, details string)
	continueDecoding(f filterPtr)
	// attribute appends attribute id of the stream as a string to dst.
	attribute(f filterPtr, id attribute, dst []byte) ([]byte, bool)
	// body appends the stream's request (or response) body Envoy holds so far to dst.
	body(f filterPtr, response bool, dst []byte) ([]byte, bool)
	workerIndex(f filterPtr) int
	concurrency() int
	// defineMetric defines a metric of the configuration (config_new only).
	defineMetric(c configPtr, k metricKind, name string) (uint64, bool)
	// addMetric adds delta to a counter or gauge, or records a histogram value: through
	// stream f, the one whose hook is running, or, when f is nil, through the configuration
	// (Envoy 1.38 has only the stream's form: false, the update dropped).
	addMetric(c configPtr, f filterPtr, k metricKind, id uint64, delta int64) bool
	newScheduler(f filterPtr) schedPtr
	commit(s schedPtr, event uint64)
	deleteScheduler(s schedPtr)
	// setMetadata sets n attributes packed by packHeaders, each NAMESPACE.FIELD, as string
	// fields of stream f's dynamic metadata.
	setMetadata(f filterPtr, packed []byte, n int)
}
