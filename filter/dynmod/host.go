package dynmod

import (
	"strconv"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// host is the filter's host inside one worker: abi.Host over Envoy's dynamic-module ABI.
// Proxy-Wasm calls act on the context the host is calling into; here that is the stream
// whose hook is running (enter), or the one SetEffectiveContext names.
type host struct {
	w     *worker
	curID uint32
	cur   filterPtr
	// hook is the stream whose hook is running (nil: none, e.g. the main thread): metrics
	// go through it, whatever context SetEffectiveContext makes current.
	hook filterPtr
	buf  []byte // what the calls of the current hook return (reset by enter)
	// replied: the current hook answered its stream locally (a paused request that was
	// answered waits for nothing).
	replied bool
	scratch [8]byte
	attrs   []byte // packed attributes (attributes.go)
}

var (
	_ abi.Host                                      = (*host)(nil)
	_ abi.HeadersAdder                              = (*host)(nil)
	_ abi.MetricRecorder                            = (*host)(nil)
	_ filter.BuildHost                              = (*host)(nil)
	_ interface{ SetTickPeriod(uint32) abi.Status } = (*host)(nil)
)

// enter starts a hook of stream id (0: the root context).
func (h *host) enter(id uint32, f filterPtr) {
	h.curID, h.cur, h.hook = id, f, f
	h.buf = h.buf[:0]
	h.replied = false
}

func (h *host) env() envoy { return h.w.cfg.m.env }

// Build implements filter.BuildHost: configurations are validated as libsluice.so's.
func (h *host) Build() config.Build { return config.BuildDynamic }

func (h *host) Log(level abi.LogLevel, msg string) { h.env().log(level, msg) }

// GetBuffer implements abi.Host: the plugin configuration, and the bodies Envoy holds.
func (h *host) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	var b []byte
	switch bt {
	case abi.BufferPluginConfiguration:
		b = h.w.cfg.data
	case abi.BufferVMConfiguration:
		b = nil
	case abi.BufferRequestBody, abi.BufferResponseBody:
		if h.cur == nil {
			return nil, abi.StatusNotFound
		}
		n := len(h.buf)
		var ok bool
		h.buf, ok = h.env().body(h.cur, bt == abi.BufferResponseBody, h.buf)
		if !ok {
			return nil, abi.StatusNotFound
		}
		b = h.buf[n:]
	default:
		return nil, abi.StatusNotFound
	}
	if start < 0 || max < 0 || start > len(b) {
		return nil, abi.StatusBadArgument
	}
	b = b[start:]
	if len(b) > max {
		b = b[:max]
	}
	return b, abi.StatusOK
}

func kindOf(mt abi.MapType) (headerKind, bool) {
	switch mt {
	case abi.MapRequestHeaders:
		return requestHeaders, true
	case abi.MapRequestTrailers:
		return requestTrailers, true
	case abi.MapResponseHeaders:
		return responseHeaders, true
	case abi.MapResponseTrailers:
		return responseTrailers, true
	}
	return 0, false
}

func (h *host) GetHeader(mt abi.MapType, name string) ([]byte, abi.Status) {
	k, ok := kindOf(mt)
	if !ok || h.cur == nil {
		return nil, abi.StatusBadArgument
	}
	n := len(h.buf)
	var found bool
	h.buf, found = h.env().header(h.cur, k, name, h.buf)
	if !found {
		return nil, abi.StatusNotFound
	}
	h.panicValue(h.buf[n:])
	return h.buf[n:len(h.buf):len(h.buf)], abi.StatusOK
}

func (h *host) GetHeaderPairs(mt abi.MapType) ([]byte, abi.Status) {
	k, ok := kindOf(mt)
	if !ok || h.cur == nil {
		return nil, abi.StatusBadArgument
	}
	n := len(h.buf)
	h.buf, ok = h.env().headerPairs(h.cur, k, h.buf)
	if !ok {
		return nil, abi.StatusNotFound
	}
	return h.buf[n:len(h.buf):len(h.buf)], abi.StatusOK
}

func (h *host) AddHeader(mt abi.MapType, name string, value []byte) abi.Status {
	k, ok := kindOf(mt)
	if !ok || h.cur == nil {
		return abi.StatusBadArgument
	}
	if !h.env().addHeader(h.cur, k, name, value) {
		return abi.StatusBadArgument
	}
	return abi.StatusOK
}

// AddHeaders implements abi.HeadersAdder.
func (h *host) AddHeaders(mt abi.MapType, hdrs []abi.Header) abi.Status {
	for i := range hdrs {
		if st := h.AddHeader(mt, hdrs[i].Name, hdrs[i].Value); st != abi.StatusOK {
			return st
		}
	}
	return abi.StatusOK
}

// The Proxy-Wasm properties the filter reads, and the attributes that answer them.
const (
	propSourceAddress  = "source\x00address"
	propPluginName     = "plugin_name"
	propRouteName      = "route_name"
	propXDSRouteName   = "xds\x00route_name"
	propClusterName    = "cluster_name"
	propXDSClusterName = "xds\x00cluster_name"
)

func (h *host) GetProperty(path string) ([]byte, abi.Status) {
	var id attribute
	switch path {
	case propPluginName:
		return []byte(h.w.cfg.name), abi.StatusOK
	case propSourceAddress:
		id = attrSourceAddress
	case propRouteName, propXDSRouteName:
		id = attrRouteName
	case propClusterName, propXDSClusterName:
		id = attrClusterName
	default:
		return nil, abi.StatusNotFound
	}
	if h.cur == nil {
		return nil, abi.StatusNotFound
	}
	n := len(h.buf)
	var ok bool
	h.buf, ok = h.env().attribute(h.cur, id, h.buf)
	if !ok {
		return nil, abi.StatusNotFound
	}
	return h.buf[n:len(h.buf):len(h.buf)], abi.StatusOK
}

// SendLocalResponse implements abi.Host. The ABI's local reply has no gRPC status: a
// grpc-status header carries it (Envoy keeps it when it turns the reply into a gRPC one).
// The reply is sent when the hook's work in Go is over (effects): Envoy may run other hooks
// within the call, and end the stream.
func (h *host) SendLocalResponse(status int, details string, body []byte, headers []abi.Header, grpcStatus int32) abi.Status {
	if h.cur == nil || h.replied {
		return abi.StatusBadArgument
	}
	var gs []byte
	if grpcStatus >= 0 && grpcStatus <= 16 {
		gs = strconv.AppendInt(h.scratch[:0], int64(grpcStatus), 10)
	}
	h.w.fx.reply(h.cur, status, headers, gs, body, details)
	h.replied = true
	if s := h.w.live[h.curID]; s != nil {
		h.w.unpause(s)
	}
	return abi.StatusOK
}

func (h *host) GetSharedData(key []byte) ([]byte, uint32, abi.Status) {
	n := len(h.buf)
	var cas uint32
	var ok bool
	h.buf, cas, ok = h.w.cfg.m.shared.GetInto(key, h.buf)
	if !ok {
		return nil, 0, abi.StatusNotFound
	}
	return h.buf[n:len(h.buf):len(h.buf)], cas, abi.StatusOK
}

func (h *host) SetSharedData(key, value []byte, cas uint32) abi.Status {
	return h.w.cfg.m.shared.SetBytes(key, value, cas)
}

// DefineMetric implements abi.Host. Envoy defines a module's metrics with its configuration:
// a metric is defined then (once for every worker's VM, which all ask for the same names),
// and looked up by name afterwards; one that was not defined then is StatusUnimplemented.
func (h *host) DefineMetric(mt abi.MetricType, name string) (uint32, abi.Status) {
	var k metricKind
	switch mt {
	case abi.MetricCounter:
		k = metricCounter
	case abi.MetricGauge:
		k = metricGauge
	case abi.MetricHistogram:
		k = metricHistogram
	default:
		return 0, abi.StatusBadArgument
	}
	c := h.w.cfg
	key := metricKey{k, name}
	if id, ok := c.byName[key]; ok {
		return id, abi.StatusOK
	}
	if !c.defining {
		return 0, abi.StatusUnimplemented
	}
	eid, ok := c.m.env.defineMetric(c.ptr, k, name)
	if !ok {
		return 0, abi.StatusInternalFailure
	}
	c.metrics = append(c.metrics, metric{kind: k, id: eid})
	id := uint32(len(c.metrics)) // ids from 1: 0 is never a metric
	c.byName[key] = id
	return id, abi.StatusOK
}

func (h *host) metric(id uint32) (metric, bool) { return metricAt(h.w.cfg.metrics, id) }

// IncrementMetric implements abi.Host: a counter refuses a delta ≤ 0, as Envoy's Wasm does.
func (h *host) IncrementMetric(id uint32, delta int64) abi.Status {
	m, ok := h.metric(id)
	if !ok || m.kind == metricHistogram || (m.kind == metricCounter && delta <= 0) {
		return abi.StatusBadArgument
	}
	if !h.env().addMetric(h.w.cfg.ptr, h.hook, m.kind, m.id, delta) {
		return abi.StatusNotFound
	}
	return abi.StatusOK
}

// RecordMetric implements abi.MetricRecorder.
func (h *host) RecordMetric(id uint32, value uint64) abi.Status {
	m, ok := h.metric(id)
	if !ok || m.kind != metricHistogram {
		return abi.StatusBadArgument
	}
	if !h.env().addMetric(h.w.cfg.ptr, h.hook, m.kind, m.id, int64(min(value, 1<<63-1))) {
		return abi.StatusNotFound
	}
	return abi.StatusOK
}

func (h *host) Now() int64 { return h.w.cfg.m.now() }

// SetEffectiveContext makes stream id (or the root context) the one later calls act on.
func (h *host) SetEffectiveContext(id uint32) abi.Status {
	if id == rootID {
		h.curID, h.cur = id, nil
		return abi.StatusOK
	}
	s := h.w.live[id]
	if s == nil {
		return abi.StatusBadArgument
	}
	h.curID, h.cur = id, s.f
	return abi.StatusOK
}

// ContinueStream resumes the effective stream's paused request, once the hook's work in Go is
// over (effects).
func (h *host) ContinueStream() abi.Status {
	s := h.w.live[h.curID]
	if s == nil || h.cur == nil {
		return abi.StatusBadArgument
	}
	h.w.unpause(s)
	h.w.fx.resume(h.cur)
	return abi.StatusOK
}

// SetTickPeriod sets the period of the VM's tick (0 stops it).
func (h *host) SetTickPeriod(ms uint32) abi.Status {
	h.w.tickMS = ms
	h.w.arm()
	return abi.StatusOK
}
