package host

import (
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/proxywasm"
	"github.com/tetratelabs/wazero/api"
)

type hostCall struct {
	params, results []api.ValueType
	fn              func(v *vm, stack []uint64) Status
}

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

func sig(n int) []api.ValueType {
	p := make([]api.ValueType, n)
	for i := range p {
		p[i] = i32
	}
	return p
}

// builtinHostCalls are the Proxy-Wasm host calls this host implements.
var builtinHostCalls map[string]hostCall

func init() {
	r := []api.ValueType{i32}
	builtinHostCalls = map[string]hostCall{
		"proxy_log":                          {sig(3), r, hcLog},
		"proxy_get_log_level":                {sig(1), r, hcGetLogLevel},
		"proxy_get_current_time_nanoseconds": {sig(1), r, hcGetTime},
		"proxy_set_tick_period_milliseconds": {sig(1), r, hcSetTickPeriod},
		"proxy_get_buffer_bytes":             {sig(5), r, hcGetBufferBytes},
		"proxy_get_buffer_status":            {sig(3), r, hcGetBufferStatus},
		"proxy_set_buffer_bytes":             {sig(5), r, hcSetBufferBytes},
		"proxy_get_header_map_pairs":         {sig(3), r, hcGetHeaderMapPairs},
		"proxy_set_header_map_pairs":         {sig(3), r, hcSetHeaderMapPairs},
		"proxy_get_header_map_value":         {sig(5), r, hcGetHeaderMapValue},
		"proxy_add_header_map_value":         {sig(5), r, hcAddHeaderMapValue},
		"proxy_replace_header_map_value":     {sig(5), r, hcReplaceHeaderMapValue},
		"proxy_remove_header_map_value":      {sig(3), r, hcRemoveHeaderMapValue},
		"proxy_get_header_map_size":          {sig(2), r, hcGetHeaderMapSize},
		"proxy_get_property":                 {sig(4), r, hcGetProperty},
		"proxy_send_local_response":          {sig(8), r, hcSendLocalResponse},
		"proxy_continue_stream":              {sig(1), r, hcContinueStream},
		"proxy_continue_request":             {sig(0), r, func(v *vm, _ []uint64) Status { return v.continueStream(streamHTTPRequest) }},
		"proxy_continue_response":            {sig(0), r, func(v *vm, _ []uint64) Status { return v.continueStream(streamHTTPResponse) }},
		"proxy_set_effective_context":        {sig(1), r, hcSetEffectiveContext},
		"proxy_get_shared_data":              {sig(5), r, hcGetSharedData},
		"proxy_set_shared_data":              {sig(5), r, hcSetSharedData},
		"proxy_define_metric":                {sig(4), r, hcDefineMetric},
		"proxy_increment_metric":             {[]api.ValueType{i32, i64}, r, hcIncrementMetric},
		"proxy_record_metric":                {[]api.ValueType{i32, i64}, r, hcRecordMetric},
		"proxy_get_metric":                   {sig(2), r, hcGetMetric},
		"proxy_http_call":                    {sig(10), r, hcHTTPCall},
		"proxy_grpc_call":                    {sig(12), r, hcGrpcCall},
		"proxy_grpc_stream":                  {sig(9), r, hcGrpcStream},
		"proxy_grpc_send":                    {sig(4), r, hcGrpcSend},
		"proxy_grpc_cancel":                  {sig(1), r, hcGrpcCancel},
		"proxy_grpc_close":                   {sig(1), r, hcGrpcClose},
		"proxy_done":                         {sig(0), r, hcDone},
	}
}

func u32(x uint64) uint32 { return uint32(x) }

func guestLevel(l uint32) slog.Level {
	switch l {
	case logTrace:
		return slog.LevelDebug - 4
	case logDebug:
		return slog.LevelDebug
	case logInfo:
		return slog.LevelInfo
	case logWarn:
		return slog.LevelWarn
	case logError:
		return slog.LevelError
	}
	return slog.LevelError + 4
}

func hcLog(v *vm, s []uint64) Status {
	lvl := guestLevel(u32(s[0]))
	msg, ok := v.read(u32(s[1]), u32(s[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if lvl >= v.h.opts.LogLevel && v.log.Enabled(context.Background(), lvl) {
		v.log.Log(context.Background(), lvl, string(msg), "context", v.curID)
	}
	return StatusOK
}

func hcGetLogLevel(v *vm, s []uint64) Status {
	l := v.h.opts.LogLevel
	var p uint32
	switch {
	case l < slog.LevelDebug:
		p = logTrace
	case l < slog.LevelInfo:
		p = logDebug
	case l < slog.LevelWarn:
		p = logInfo
	case l < slog.LevelError:
		p = logWarn
	case l < slog.LevelError+4:
		p = logError
	default:
		p = logCritical
	}
	if !v.writeU32(u32(s[0]), p) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func hcGetTime(v *vm, s []uint64) Status {
	if !v.writeU64(u32(s[0]), uint64(v.h.clock.Now().UnixNano())) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hcSetTickPeriod sets the tick period of the effective context's root context (the
// stream's parent when called from a stream, as cpp-host passes the context's
// root_context_id to Envoy's Wasm::setTickPeriod); 0 stops that root's ticks. The first
// tick comes one period later. Before any root exists (_initialize) → BAD_ARGUMENT.
func hcSetTickPeriod(v *vm, s []uint64) Status {
	r := v.curRoot
	if r == nil {
		return StatusBadArgument
	}
	r.tickMS = u32(s[0])
	if r.tickMS > 0 {
		r.nextTick = v.h.clock.Now().Add(time.Duration(r.tickMS) * time.Millisecond)
	}
	v.tickChanged = true
	return StatusOK
}

// buffer returns the buffer of type t for the effective context; nil, false when it is not
// available now.
func (v *vm) buffer(t uint32) (*[]byte, bool) {
	if b, ok := v.extBuffers[t]; ok {
		return &b, true
	}
	switch t {
	case bufferPluginConfiguration:
		if r := v.curRoot; r != nil {
			return &r.config, true // the configuration of the effective context's root
		}
	case bufferVMConfiguration:
		return &v.h.opts.VMConfig, true
	case bufferHTTPCallResponse:
		if v.callResp != nil {
			return &v.callResp.body, true
		}
	case bufferRequestBody:
		if v.cur != nil {
			return &v.cur.reqBody, true
		}
	case bufferResponseBody:
		if v.cur != nil {
			return &v.cur.respBody, true
		}
	}
	return nil, false
}

func hcGetBufferBytes(v *vm, s []uint64) Status {
	b, ok := v.buffer(u32(s[0]))
	if !ok {
		return StatusNotFound
	}
	start, max := uint64(u32(s[1])), uint64(u32(s[2]))
	data := *b
	if start > uint64(len(data)) {
		return StatusBadArgument
	}
	end := start + max
	if end > uint64(len(data)) {
		end = uint64(len(data))
	}
	return v.returnBytes(data[start:end], u32(s[3]), u32(s[4]))
}

func hcGetBufferStatus(v *vm, s []uint64) Status {
	b, ok := v.buffer(u32(s[0]))
	if !ok {
		return StatusNotFound
	}
	var flags uint32
	if c := v.cur; c != nil {
		switch u32(s[0]) {
		case bufferRequestBody:
			flags = uint32(b2u(c.reqBodyEOS))
		case bufferResponseBody:
			flags = uint32(b2u(c.respBodyEOS))
		}
	}
	if !v.writeU32(u32(s[1]), uint32(len(*b))) || !v.writeU32(u32(s[2]), flags) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// hcSetBufferBytes follows Envoy: start 0 and size 0 prepends; start 0 and size >= length
// replaces everything; start >= length appends; anything else is BAD_ARGUMENT.
func hcSetBufferBytes(v *vm, s []uint64) Status {
	t := u32(s[0])
	if t != bufferRequestBody && t != bufferResponseBody {
		if _, ok := v.extBuffers[t]; !ok {
			return StatusBadArgument
		}
	}
	b, ok := v.buffer(t)
	if !ok {
		return StatusNotFound
	}
	data, ok := v.read(u32(s[3]), u32(s[4]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	start, size := int(u32(s[1])), int(u32(s[2]))
	cur := *b
	var out []byte
	switch {
	case start == 0 && size == 0:
		out = append(append(make([]byte, 0, len(data)+len(cur)), data...), cur...)
	case start == 0 && size >= len(cur):
		out = append([]byte(nil), data...)
	case start >= len(cur):
		out = append(cur, data...)
	default:
		return StatusBadArgument
	}
	switch t {
	case bufferRequestBody:
		v.cur.reqBody = out
	case bufferResponseBody:
		v.cur.respBody = out
	default:
		v.extBuffers[t] = out
	}
	return StatusOK
}

// headerMap returns the map of type t for the effective context.
func (v *vm) headerMap(t uint32) (*headerMap, Status) {
	switch t {
	case mapHTTPCallResponseHeaders:
		if v.callResp != nil {
			return &v.callResp.headers, StatusOK
		}
		return nil, StatusBadArgument
	case mapHTTPCallResponseTrailer:
		if v.callResp != nil {
			return &v.callResp.trailers, StatusOK
		}
		return nil, StatusBadArgument
	}
	c := v.cur
	if c == nil {
		return nil, StatusBadArgument
	}
	switch t {
	case mapRequestHeaders:
		return &c.reqHeaders, StatusOK
	case mapRequestTrailers:
		return &c.reqTrailers, StatusOK
	case mapResponseHeaders:
		if c.respPhase {
			return &c.respHeaders, StatusOK
		}
	case mapResponseTrailers:
		if c.respPhase {
			return &c.respTrailers, StatusOK
		}
	}
	return nil, StatusBadArgument
}

func hcGetHeaderMapPairs(v *vm, s []uint64) Status {
	m, st := v.headerMap(u32(s[0]))
	if st != StatusOK {
		return st
	}
	n := uint32(proxywasm.PairsSize(m.kv))
	p := v.alloc(n)
	if p == 0 {
		return StatusInternalFailure
	}
	dst, ok := v.read(p, n)
	if !ok {
		return StatusInvalidMemoryAccess
	}
	proxywasm.PutPairs(dst, m.kv)
	if !v.writeU32(u32(s[1]), p) || !v.writeU32(u32(s[2]), n) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// headerMapAndBytes reads a host call's first three arguments: a header map type and the
// guest memory (pointer, size) that the call gives with it.
func (v *vm) headerMapAndBytes(s []uint64) (*headerMap, []byte, Status) {
	m, st := v.headerMap(u32(s[0]))
	if st != StatusOK {
		return nil, nil, st
	}
	b, ok := v.read(u32(s[1]), u32(s[2]))
	if !ok {
		return nil, nil, StatusInvalidMemoryAccess
	}
	return m, b, StatusOK
}

func hcSetHeaderMapPairs(v *vm, s []uint64) Status {
	m, b, st := v.headerMapAndBytes(s)
	if st != StatusOK {
		return st
	}
	kv, ok := proxywasm.ParsePairs(b)
	if !ok {
		return StatusBadArgument
	}
	for i := range kv {
		kv[i][0] = lower(kv[i][0])
	}
	m.kv = kv
	m.edited = true
	return StatusOK
}

func hcGetHeaderMapValue(v *vm, s []uint64) Status {
	m, key, st := v.headerMapAndBytes(s)
	if st != StatusOK {
		return st
	}
	val, found := m.getBytes(key)
	if !found {
		return StatusNotFound
	}
	return v.returnString(val, u32(s[3]), u32(s[4]))
}

func (v *vm) readKV(s []uint64) (string, string, Status) {
	k, ok := v.read(u32(s[1]), u32(s[2]))
	if !ok {
		return "", "", StatusInvalidMemoryAccess
	}
	val, ok := v.read(u32(s[3]), u32(s[4]))
	if !ok {
		return "", "", StatusInvalidMemoryAccess
	}
	return v.headerName(k), string(val), StatusOK
}

// maxInternedNames bounds the header names a VM keeps interned.
const maxInternedNames = 256

// headerName returns the lower-cased header name k, interned per VM: a filter adds the
// same few names to every response, and each would otherwise be a new string.
func (v *vm) headerName(k []byte) string {
	if s, ok := v.names[string(k)]; ok {
		return s
	}
	s := lowerBytes(k)
	if len(v.names) < maxInternedNames {
		if v.names == nil {
			v.names = make(map[string]string)
		}
		v.names[string(k)] = s
	}
	return s
}

func hcAddHeaderMapValue(v *vm, s []uint64) Status {
	m, st := v.headerMap(u32(s[0]))
	if st != StatusOK {
		return st
	}
	k, val, st := v.readKV(s)
	if st == StatusOK {
		m.kv = append(m.kv, [2]string{k, val})
	}
	return st
}

func hcReplaceHeaderMapValue(v *vm, s []uint64) Status {
	m, st := v.headerMap(u32(s[0]))
	if st != StatusOK {
		return st
	}
	k, val, st := v.readKV(s)
	if st == StatusOK {
		m.replace(k, val)
	}
	return st
}

func hcRemoveHeaderMapValue(v *vm, s []uint64) Status {
	m, key, st := v.headerMapAndBytes(s)
	if st != StatusOK {
		return st
	}
	m.removeBytes(key)
	return StatusOK
}

func hcGetHeaderMapSize(v *vm, s []uint64) Status {
	m, st := v.headerMap(u32(s[0]))
	if st != StatusOK {
		return st
	}
	if !v.writeU32(u32(s[1]), uint32(proxywasm.PairsSize(m.kv))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func int64LE(n int64) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(n))
	return b[:]
}

func portOf(addr string) ([]byte, bool) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, false
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		return nil, false
	}
	return int64LE(int64(n)), true
}

// property resolves a property path (segments separated by NUL) for the effective context.
// A value is either a string (str) or bytes (b); strings are returned without a copy.
func (v *vm) property(path []byte) (str string, b []byte, ok bool) {
	if n := len(path); n > 0 && path[n-1] == 0 {
		path = path[:n-1]
	}
	c := v.cur
	strv := func(s string) (string, []byte, bool) { return s, nil, true }
	bytesv := func(b []byte, ok bool) (string, []byte, bool) { return "", b, ok }
	switch string(path) {
	case "plugin_name":
		return strv(v.h.opts.PluginName)
	case "plugin_root_id":
		return strv(v.h.opts.RootID)
	case "plugin_vm_id":
		return strv(v.h.opts.VMID)
	}
	if c == nil {
		return "", nil, false
	}
	hdr := func(name string) (string, []byte, bool) {
		val, ok := c.reqHeaders.get(name)
		return val, nil, ok
	}
	switch string(path) {
	case "source\x00address":
		if c.remoteAddr == "" {
			return "", nil, false
		}
		return strv(c.remoteAddr)
	case "source\x00port":
		return bytesv(portOf(c.remoteAddr))
	case "destination\x00address":
		if c.localAddr == "" {
			return "", nil, false
		}
		return strv(c.localAddr)
	case "destination\x00port":
		return bytesv(portOf(c.localAddr))
	case "request\x00path":
		return hdr(":path")
	case "request\x00url_path":
		p, ok := c.reqHeaders.get(":path")
		if !ok {
			return "", nil, false
		}
		if i := strings.IndexByte(p, '?'); i >= 0 {
			p = p[:i]
		}
		return strv(p)
	case "request\x00method":
		return hdr(":method")
	case "request\x00host":
		return hdr(":authority")
	case "request\x00scheme":
		return hdr(":scheme")
	case "request\x00id":
		return hdr("x-request-id")
	case "request\x00protocol":
		return strv(c.protocol)
	case "xds\x00route_name":
		return c.routeName, nil, c.routeName != ""
	case "xds\x00cluster_name":
		return c.clusterName, nil, c.clusterName != ""
	case "route_name":
		return c.routeName, nil, c.routeName != "" && v.h.profile.LegacyWasmAttributes
	case "cluster_name":
		return c.clusterName, nil, c.clusterName != "" && v.h.profile.LegacyWasmAttributes
	case "request\x00headers":
		return "", proxywasm.AppendPairs(nil, c.reqHeaders.kv), true
	case "response\x00code":
		if !c.respPhase {
			return "", nil, false
		}
		st, ok := c.respHeaders.get(":status")
		if !ok {
			return "", nil, false
		}
		n, err := strconv.Atoi(st)
		if err != nil {
			return "", nil, false
		}
		return "", int64LE(int64(n)), true
	case "response\x00headers":
		if !c.respPhase {
			return "", nil, false
		}
		return "", proxywasm.AppendPairs(nil, c.respHeaders.kv), true
	}
	return "", nil, false
}

func hcGetProperty(v *vm, s []uint64) Status {
	path, ok := v.read(u32(s[0]), u32(s[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	str, b, found := v.property(path)
	if !found {
		return StatusNotFound
	}
	if b != nil {
		return v.returnBytes(b, u32(s[2]), u32(s[3]))
	}
	return v.returnString(str, u32(s[2]), u32(s[3]))
}

func hcSendLocalResponse(v *vm, s []uint64) Status {
	c := v.cur
	if c == nil {
		return StatusBadArgument
	}
	details, ok1 := v.read(u32(s[1]), u32(s[2]))
	body, ok2 := v.read(u32(s[3]), u32(s[4]))
	hdrs, ok3 := v.read(u32(s[5]), u32(s[6]))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	kv, ok := proxywasm.ParsePairs(hdrs)
	if !ok {
		return StatusBadArgument
	}
	status := int(u32(s[0]))
	if status < 100 || status > 999 {
		return StatusBadArgument
	}
	for i := range kv {
		kv[i][0] = lower(kv[i][0])
	}
	m := headerMap{kv: kv}
	if _, has := m.get("content-type"); !has && len(body) > 0 && !c.grpc {
		m.add("content-type", "text/plain")
	}
	c.local = &localReply{status: status, grpcStatus: int32(u32(s[7])), details: string(details), body: append([]byte(nil), body...), headers: m.kv}
	if c.grpc {
		c.local = grpcLocalReply(c.local, c.head)
	}
	if v.h.profile.StopIterationVMWide {
		v.stopIteration = true
	}
	if c.paused {
		c.paused, c.held = false, false
		if c != v.w.advancing { // a held stream in its own body callback: advance goes on
			v.w.wake(c)
		}
	}
	return StatusOK
}

func hcContinueStream(v *vm, s []uint64) Status {
	return v.continueStream(int(u32(s[0])))
}

func (v *vm) continueStream(t int) Status {
	c := v.cur
	if c == nil {
		return StatusBadArgument
	}
	if t != streamHTTPRequest && t != streamHTTPResponse {
		return StatusBadArgument
	}
	if c.paused && c.pauseOn == t {
		c.paused, c.held = false, false
		if c != v.w.advancing { // a held stream in its own body callback: advance goes on
			v.w.wake(c)
		}
	}
	return StatusOK
}

// hcDone is proxy_done: the root of the effective context, which answered false from
// proxy_on_done, has finished. It gets proxy_on_delete once the current guest call has
// returned (worker.deleteDone). NOT_FOUND when that root is not waiting for it — it has not
// had proxy_on_done, answered true, or called proxy_done already (cpp-host's WasmBase::done,
// src/wasm.cc, finds no pending_done_ entry for the plugin).
func hcDone(v *vm, s []uint64) Status {
	r := v.curRoot
	if r == nil || !r.pendingDone {
		return StatusNotFound
	}
	r.pendingDone = false
	v.doneRoots = append(v.doneRoots, r)
	return StatusOK
}

func hcSetEffectiveContext(v *vm, s []uint64) Status {
	if !v.setCurrent(u32(s[0])) {
		return StatusBadArgument
	}
	return StatusOK
}

func hcGetSharedData(v *vm, s []uint64) Status {
	key, ok := v.read(u32(s[0]), u32(s[1]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	val, cas, found := v.h.shared.GetInto(key, v.scratch[:0])
	v.scratch = val[:0]
	if !found {
		return StatusNotFound
	}
	st := v.returnBytes(val, u32(s[2]), u32(s[3]))
	if st == StatusOK && !v.writeU32(u32(s[4]), cas) {
		st = StatusInvalidMemoryAccess
	}
	return st
}

func hcSetSharedData(v *vm, s []uint64) Status {
	key, ok1 := v.read(u32(s[0]), u32(s[1]))
	val, ok2 := v.read(u32(s[2]), u32(s[3]))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	return v.h.shared.SetBytes(key, val, u32(s[4]))
}

func hcDefineMetric(v *vm, s []uint64) Status {
	name, ok := v.read(u32(s[1]), u32(s[2]))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	id, st := v.h.metrics.define(MetricType(u32(s[0])), string(name))
	if st == StatusOK && !v.writeU32(u32(s[3]), id) {
		st = StatusInvalidMemoryAccess
	}
	return st
}

func hcIncrementMetric(v *vm, s []uint64) Status {
	return v.h.metrics.increment(u32(s[0]), int64(s[1]))
}

func hcRecordMetric(v *vm, s []uint64) Status {
	return v.h.metrics.record(u32(s[0]), s[1])
}

func hcGetMetric(v *vm, s []uint64) Status {
	val, st := v.h.metrics.value(u32(s[0]))
	if st == StatusOK && !v.writeU64(u32(s[1]), val) {
		st = StatusInvalidMemoryAccess
	}
	return st
}
