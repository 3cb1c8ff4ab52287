// Package filtertest has what the filter's tests share: a native fake
// Proxy-Wasm host with Envoy's shared-data semantics, a builder for the
// compiled module, and the _start alias the proxytest emulator needs.
package filtertest

import (
	"strings"
	"sync"

	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/shareddata"
	"github.com/sluice-proxy/sluice/proxywasm"
)

// SharedData is shared data as Envoy implements it, with the map the
// embedded host uses (internal/shareddata): one map for all workers; get
// returns (value, cas); set with cas 0 is unconditional; a nonzero cas must
// equal the key's current cas, unless the key does not exist (then the cas
// is ignored and the key is created); every successful set gives the key a
// fresh cas from a process-wide counter that skips 0. It is safe for
// concurrent use.
type SharedData struct {
	// ProxytestSemantics switches to the tetratelabs emulator's rules
	// instead of Envoy's: a created key gets cas+1 (the cas passed), and
	// cas 0 on an existing key is a mismatch unless its cas is 0. The values
	// stay in the one map; the emulator's cas of the keys written in this
	// mode are kept beside it. Set it before the store is used concurrently.
	ProxytestSemantics bool

	m *shareddata.Map

	mu       sync.Mutex        // makes the emulator's check and set one step
	emulated map[string]uint32 // the emulator's cas of the keys it wrote
}

// NewSharedData returns an empty store.
func NewSharedData() *SharedData {
	return &SharedData{m: shareddata.New(), emulated: map[string]uint32{}}
}

// Get returns a copy of the value of key and its cas.
func (s *SharedData) Get(key string) ([]byte, uint32, bool) {
	if !s.ProxytestSemantics {
		return s.m.Get(key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxytestGet(key)
}

func (s *SharedData) proxytestGet(key string) ([]byte, uint32, bool) {
	v, cas, ok := s.m.Get(key)
	if c, written := s.emulated[key]; ok && written {
		cas = c
	}
	return v, cas, ok
}

// Set stores value under key with Envoy's CAS rules (or the emulator's,
// with ProxytestSemantics).
func (s *SharedData) Set(key string, value []byte, cas uint32) abi.Status {
	if !s.ProxytestSemantics {
		return s.m.Set(key, value, cas)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, cur, ok := s.proxytestGet(key); ok && cur != cas {
		return abi.StatusCASMismatch
	}
	s.m.Set(key, value, 0)
	s.emulated[key] = cas + 1
	return abi.StatusOK
}

// Len returns the number of keys.
func (s *SharedData) Len() int { return s.m.Len() }

// Keys returns the keys with the given prefix, sorted.
func (s *SharedData) Keys(prefix string) []string {
	var ks []string
	for _, k := range s.m.Keys() {
		if strings.HasPrefix(k, prefix) {
			ks = append(ks, k)
		}
	}
	return ks
}

// Metrics is a process-wide metric registry (names → values).
type Metrics struct {
	mu     sync.Mutex
	ids    map[string]uint32
	values []int64
}

// NewMetrics returns an empty registry.
func NewMetrics() *Metrics { return &Metrics{ids: map[string]uint32{}} }

func (m *Metrics) define(name string) uint32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok := m.ids[name]; ok {
		return id
	}
	id := uint32(len(m.values))
	m.ids[name] = id
	m.values = append(m.values, 0)
	return id
}

func (m *Metrics) add(id uint32, d int64) abi.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	if int(id) >= len(m.values) {
		return abi.StatusNotFound
	}
	m.values[id] += d
	return abi.StatusOK
}

// Get returns the value of a metric (0, false if undefined).
func (m *Metrics) Get(name string) (int64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.ids[name]
	if !ok {
		return 0, false
	}
	return m.values[id], true
}

// Log is one proxy_log call.
type Log struct {
	Level abi.LogLevel
	Msg   string
}

// LocalResponse is one proxy_send_local_response call.
type LocalResponse struct {
	Status  int
	Details string
	Body    string
	Headers [][2]string
	// GRPCStatus is the grpc_status argument (abi.NoGRPCStatus: none).
	GRPCStatus int32
}

// Host is one worker's fake host: it implements abi.Host for the context
// being called, with the request's headers and properties, and records
// what the guest does. Time is Now (Unix ns), advanced by the test. A Host
// is used by one goroutine at a time; Shared and Metrics may be shared by
// several Hosts (workers).
type Host struct {
	Shared  *SharedData
	Metrics *Metrics
	Now_    int64
	Config  []byte

	// Per request, set by the driver.
	Properties map[string]string // serialized path → value
	ReqHeaders [][2]string
	// MissingHeaderOK makes absent headers return OK with an empty value
	// (as some Envoy versions do) instead of NOT_FOUND.
	MissingHeaderOK bool

	// Recorded.
	RespHeaders [][2]string
	Local       *LocalResponse
	// Attributes set by the current request (abi.AttributeSetter), by name.
	Attributes map[string]string
	Logs       []Log
	// FailShared makes every shared-data call fail with this status.
	FailShared abi.Status
	// SetHook, when set, runs before every shared-data set (to inject
	// races).
	SetHook func(key string)
}

var _ abi.Host = (*Host)(nil)

// NewHost returns a worker host with its own shared data and metrics.
func NewHost() *Host { return &Host{Shared: NewSharedData(), Metrics: NewMetrics()} }

// Log implements abi.Host.
func (h *Host) Log(level abi.LogLevel, msg string) { h.Logs = append(h.Logs, Log{level, msg}) }

// GetBuffer implements abi.Host.
func (h *Host) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	if bt != abi.BufferPluginConfiguration {
		return nil, abi.StatusNotFound
	}
	if start < 0 || start > len(h.Config) {
		return nil, abi.StatusBadArgument
	}
	b := h.Config[start:]
	if max < len(b) {
		b = b[:max]
	}
	return append([]byte(nil), b...), abi.StatusOK
}

// GetHeader implements abi.Host.
func (h *Host) GetHeader(mt abi.MapType, name string) ([]byte, abi.Status) {
	var m [][2]string
	switch mt {
	case abi.MapRequestHeaders:
		m = h.ReqHeaders
	case abi.MapResponseHeaders:
		m = h.RespHeaders
	default:
		return nil, abi.StatusNotFound
	}
	var vals []string
	for _, kv := range m {
		if strings.EqualFold(kv[0], name) {
			vals = append(vals, kv[1])
		}
	}
	if len(vals) == 0 {
		if h.MissingHeaderOK {
			return nil, abi.StatusOK
		}
		return nil, abi.StatusNotFound
	}
	return []byte(strings.Join(vals, ",")), abi.StatusOK
}

// GetHeaderPairs implements abi.Host: one pair per header value, repeated
// names as separate pairs (as the embedded host and Envoy's pairs call do).
func (h *Host) GetHeaderPairs(mt abi.MapType) ([]byte, abi.Status) {
	switch mt {
	case abi.MapRequestHeaders:
		return proxywasm.AppendPairs(nil, h.ReqHeaders), abi.StatusOK
	case abi.MapResponseHeaders:
		return proxywasm.AppendPairs(nil, h.RespHeaders), abi.StatusOK
	}
	return nil, abi.StatusNotFound
}

// AddHeader implements abi.Host.
func (h *Host) AddHeader(mt abi.MapType, name string, value []byte) abi.Status {
	if mt != abi.MapResponseHeaders {
		return abi.StatusBadArgument
	}
	h.RespHeaders = append(h.RespHeaders, [2]string{strings.ToLower(name), string(value)})
	return abi.StatusOK
}

// GetProperty implements abi.Host.
func (h *Host) GetProperty(path string) ([]byte, abi.Status) {
	v, ok := h.Properties[path]
	if !ok {
		return nil, abi.StatusNotFound
	}
	return []byte(v), abi.StatusOK
}

// SendLocalResponse implements abi.Host. Like the proxytest emulator and
// Envoy it accepts the call once per request.
func (h *Host) SendLocalResponse(status int, details string, body []byte, headers []abi.Header, grpcStatus int32) abi.Status {
	if h.Local != nil {
		return abi.StatusBadArgument
	}
	lr := &LocalResponse{Status: status, Details: details, Body: string(body), GRPCStatus: grpcStatus}
	for _, hd := range headers {
		lr.Headers = append(lr.Headers, [2]string{hd.Name, string(hd.Value)})
	}
	h.Local = lr
	return abi.StatusOK
}

// GetSharedData implements abi.Host.
func (h *Host) GetSharedData(key []byte) ([]byte, uint32, abi.Status) {
	if h.FailShared != 0 {
		return nil, 0, h.FailShared
	}
	v, cas, ok := h.Shared.Get(string(key))
	if !ok {
		return nil, 0, abi.StatusNotFound
	}
	return v, cas, abi.StatusOK
}

// SetSharedData implements abi.Host.
func (h *Host) SetSharedData(key, value []byte, cas uint32) abi.Status {
	if h.FailShared != 0 {
		return h.FailShared
	}
	if h.SetHook != nil {
		h.SetHook(string(key))
	}
	return h.Shared.Set(string(key), value, cas)
}

// DefineMetric implements abi.Host.
func (h *Host) DefineMetric(mt abi.MetricType, name string) (uint32, abi.Status) {
	if mt > abi.MetricHistogram {
		return 0, abi.StatusBadArgument
	}
	return h.Metrics.define(name), abi.StatusOK
}

// IncrementMetric implements abi.Host.
func (h *Host) IncrementMetric(id uint32, delta int64) abi.Status { return h.Metrics.add(id, delta) }

// Now implements abi.Host.
func (h *Host) Now() int64 { return h.Now_ }

// Request is one HTTP request for Worker.Do.
type Request struct {
	Method  string // default GET
	Path    string // default /
	Headers [][2]string
	// Source is source.address ("ip:port"); empty: property absent.
	Source string
	// Authority is the :authority header (default "example.test").
	Authority string
	// Properties are further properties of the request by serialized path
	// (segments separated by NUL), e.g. "xds\x00route_name".
	Properties map[string]string
}

// Response is what the filter made of a request.
type Response struct {
	// Status is the local response status, or 200 when the request went
	// upstream.
	Status  int
	Local   bool
	Body    string
	Headers [][2]string // local response headers, or headers added to the upstream response
	Action  abi.Action
	// GRPCStatus is a local response's grpc_status argument
	// (abi.NoGRPCStatus: none); 0 when the request went upstream.
	GRPCStatus int32
	// Attributes are what the request set for the access log (abi.AttributeSetter).
	Attributes map[string]string
}

// Header returns the first value of a header (case-insensitive) or "".
func (r *Response) Header(name string) string {
	for _, kv := range r.Headers {
		if strings.EqualFold(kv[0], name) {
			return kv[1]
		}
	}
	return ""
}

// Has reports whether the header is present.
func (r *Response) Has(name string) bool {
	for _, kv := range r.Headers {
		if strings.EqualFold(kv[0], name) {
			return true
		}
	}
	return false
}

// Worker drives a Handler (a VM) over a Host as Envoy's worker would.
type Worker struct {
	Host    *Host
	Handler abi.Handler
	root    uint32
	next    uint32
}

// NewWorker returns a worker for handler over host.
func NewWorker(host *Host, handler abi.Handler) *Worker {
	return &Worker{Host: host, Handler: handler, root: 1, next: 2}
}

// Start creates the root context and configures it with config; false is
// the plugin refusing to start.
func (w *Worker) Start(config string) bool {
	w.Host.Config = []byte(config)
	w.Handler.OnContextCreate(w.root, 0)
	if !w.Handler.OnVMStart(w.root, 0) {
		return false
	}
	return w.Handler.OnConfigure(w.root, len(config))
}

// Do runs one request: context create, request headers, (upstream 200 |
// local response), response headers, log, done, delete.
func (w *Worker) Do(r Request) Response {
	h := w.Host
	id := w.next
	w.next++
	method, path := r.Method, r.Path
	if method == "" {
		method = "GET"
	}
	if path == "" {
		path = "/"
	}
	authority := r.Authority
	if authority == "" {
		authority = "example.test"
	}
	h.ReqHeaders = append([][2]string{{":method", method}, {":path", path}, {":authority", authority}}, r.Headers...)
	h.Properties = map[string]string{}
	if r.Source != "" {
		h.Properties["source\x00address"] = r.Source
	}
	for k, v := range r.Properties {
		h.Properties[k] = v
	}
	h.RespHeaders = nil
	h.Local = nil
	h.Attributes = nil
	ContextCreate(w.Handler, id, w.root)
	act := w.Handler.OnRequestHeaders(id, len(h.ReqHeaders), true)
	var resp Response
	resp.Action = act
	if h.Local != nil {
		resp.Status, resp.Local, resp.Body, resp.GRPCStatus = h.Local.Status, true, h.Local.Body, h.Local.GRPCStatus
		resp.Headers = h.Local.Headers
		// Envoy runs the encoder filters on a local reply.
		h.RespHeaders = append([][2]string{{":status", itoa(h.Local.Status)}}, h.Local.Headers...)
		ResponseHeaders(w.Handler, id, len(h.RespHeaders), false)
		if len(h.RespHeaders) != 1+len(h.Local.Headers) {
			resp.Headers = append(resp.Headers, [2]string{"x-test-error", "headers added to a local reply"})
		}
	} else {
		h.RespHeaders = [][2]string{{":status", "200"}, {"content-type", "text/plain"}}
		ResponseHeaders(w.Handler, id, len(h.RespHeaders), false)
		resp.Status = 200
		resp.Headers = h.RespHeaders[2:]
	}
	resp.Attributes = h.Attributes
	EndStream(w.Handler, id)
	return resp
}

// ContextCreate, ResponseHeaders, ResponseBody and EndStream dispatch a stream's callbacks
// as sluice.wasm's exports do (filter/abi/exports_wasip1.go): the abi.QuickHandler method
// first, the Handler's when it declines. EndStream ends a stream with proxy_on_done and
// proxy_on_delete: the module exports no proxy_on_log.
func ContextCreate(h abi.Handler, id, parent uint32) {
	if q, ok := h.(abi.QuickHandler); !ok || !q.QuickContextCreate(id, parent) {
		h.OnContextCreate(id, parent)
	}
}

func ResponseHeaders(h abi.Handler, id uint32, n int, endOfStream bool) {
	if q, ok := h.(abi.QuickHandler); !ok || !q.QuickResponseHeaders(id) {
		h.OnResponseHeaders(id, n, endOfStream)
	}
}

func ResponseBody(h abi.BodyHandler, id uint32, size int, endOfStream bool) {
	if q, ok := h.(abi.QuickHandler); !ok || !q.QuickResponseBody(id) {
		h.OnResponseBody(id, size, endOfStream)
	}
}

func EndStream(h abi.Handler, id uint32) {
	q, quick := h.(abi.QuickHandler)
	if !quick || !q.QuickDone(id) {
		h.OnDone(id)
	}
	if !quick || !q.QuickDelete(id) {
		h.OnDelete(id)
	}
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	neg := v < 0
	if neg {
		v = -v
	}
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}
