// Command kitchen is a test guest for the host package: a Proxy-Wasm 0.2.1 HTTP filter in
// standard Go (GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared) that exercises one host
// feature per request path. It is test code: small, explicit, no SDK.
package main

import (
	"encoding/binary"
	"strconv"
	"strings"
	"unsafe"
)

func main() {}

// ---- host calls ----

//go:wasmimport env proxy_log
func hLog(level uint32, p unsafe.Pointer, n uint32) uint32

//go:wasmimport env proxy_get_log_level
func hGetLogLevel(ret unsafe.Pointer) uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func hTime(ret unsafe.Pointer) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func hSetTick(ms uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hGetBuffer(t, start, max uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_set_buffer_bytes
func hSetBuffer(t, start, size uint32, p unsafe.Pointer, n uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func hGetPairs(t uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_set_header_map_pairs
func hSetPairs(t uint32, p unsafe.Pointer, n uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func hGetHeader(t uint32, kp unsafe.Pointer, kn uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_add_header_map_value
func hAddHeader(t uint32, kp unsafe.Pointer, kn uint32, vp unsafe.Pointer, vn uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func hReplaceHeader(t uint32, kp unsafe.Pointer, kn uint32, vp unsafe.Pointer, vn uint32) uint32

//go:wasmimport env proxy_remove_header_map_value
func hRemoveHeader(t uint32, kp unsafe.Pointer, kn uint32) uint32

//go:wasmimport env proxy_get_property
func hGetProperty(pp unsafe.Pointer, pn uint32, rp, rn unsafe.Pointer) uint32

//go:wasmimport env proxy_set_property
func hSetProperty(pp unsafe.Pointer, pn uint32, vp unsafe.Pointer, vn uint32) uint32

//go:wasmimport env proxy_send_local_response
func hSendLocal(status uint32, dp unsafe.Pointer, dn uint32, bp unsafe.Pointer, bn uint32, hp unsafe.Pointer, hn uint32, grpc int32) uint32

//go:wasmimport env proxy_continue_stream
func hContinue(t uint32) uint32

//go:wasmimport env proxy_set_effective_context
func hSetEffective(id uint32) uint32

//go:wasmimport env proxy_get_shared_data
func hGetShared(kp unsafe.Pointer, kn uint32, rp, rn, rcas unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func hSetShared(kp unsafe.Pointer, kn uint32, vp unsafe.Pointer, vn uint32, cas uint32) uint32

//go:wasmimport env proxy_define_metric
func hDefineMetric(t uint32, np unsafe.Pointer, nn uint32, rid unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func hIncMetric(id uint32, off int64) uint32

//go:wasmimport env proxy_record_metric
func hRecordMetric(id uint32, v uint64) uint32

//go:wasmimport env proxy_get_metric
func hGetMetric(id uint32, rv unsafe.Pointer) uint32

//go:wasmimport env proxy_http_call
func hHTTPCall(up unsafe.Pointer, un uint32, hp unsafe.Pointer, hn uint32, bp unsafe.Pointer, bn uint32, tp unsafe.Pointer, tn uint32, timeout uint32, rid unsafe.Pointer) uint32

// Not implemented by the host: must answer UNIMPLEMENTED (12).
//
//go:wasmimport env proxy_register_shared_queue
func hRegisterQueue(np unsafe.Pointer, nn uint32, rid unsafe.Pointer) uint32

// An extension host call (see host.Extension); without the extension the host links an
// UNIMPLEMENTED stub.
//
//go:wasmimport env proxy_test_async
func hTestAsync(p unsafe.Pointer, n uint32, rtoken unsafe.Pointer) uint32

// ---- memory ----

// pinned keeps host-written buffers alive until the next callback has copied them.
var pinned [][]byte

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	if size == 0 {
		size = 1
	}
	b := make([]byte, size)
	pinned = append(pinned, b)
	return uint32(uintptr(unsafe.Pointer(&b[0])))
}

func enter() { pinned = pinned[:0] }

func sp(s string) (unsafe.Pointer, uint32) {
	if len(s) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(unsafe.StringData(s)), uint32(len(s))
}

func bp(b []byte) (unsafe.Pointer, uint32) {
	if len(b) == 0 {
		return nil, 0
	}
	return unsafe.Pointer(&b[0]), uint32(len(b))
}

func str(p *byte, n uint32) string {
	if p == nil || n == 0 {
		return ""
	}
	return string(unsafe.Slice(p, n))
}

// ---- helpers ----

func logf(level uint32, msg string) { p, n := sp(msg); hLog(level, p, n) }

func getHeader(t uint32, k string) (string, uint32) {
	var p *byte
	var n uint32
	kp, kn := sp(k)
	st := hGetHeader(t, kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return str(p, n), st
}

func addHeader(t uint32, k, v string) uint32 {
	kp, kn := sp(k)
	vp, vn := sp(v)
	return hAddHeader(t, kp, kn, vp, vn)
}

func replaceHeader(t uint32, k, v string) uint32 {
	kp, kn := sp(k)
	vp, vn := sp(v)
	return hReplaceHeader(t, kp, kn, vp, vn)
}

func removeHeader(t uint32, k string) uint32 {
	kp, kn := sp(k)
	return hRemoveHeader(t, kp, kn)
}

func getBuffer(t, start, max uint32) (string, uint32) {
	var p *byte
	var n uint32
	st := hGetBuffer(t, start, max, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return str(p, n), st
}

func setBuffer(t, start, size uint32, data string) uint32 {
	p, n := sp(data)
	return hSetBuffer(t, start, size, p, n)
}

func getProperty(path ...string) (string, uint32) {
	full := strings.Join(path, "\x00")
	pp, pn := sp(full)
	var p *byte
	var n uint32
	st := hGetProperty(pp, pn, unsafe.Pointer(&p), unsafe.Pointer(&n))
	return str(p, n), st
}

func getPairs(t uint32) ([][2]string, uint32) {
	var p *byte
	var n uint32
	st := hGetPairs(t, unsafe.Pointer(&p), unsafe.Pointer(&n))
	if st != 0 {
		return nil, st
	}
	return parsePairs([]byte(str(p, n))), 0
}

func serialize(kv [][2]string) []byte {
	size := 4
	for _, p := range kv {
		size += 8 + len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, size)
	binary.LittleEndian.PutUint32(b, uint32(len(kv)))
	o := 4
	for _, p := range kv {
		binary.LittleEndian.PutUint32(b[o:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(b[o+4:], uint32(len(p[1])))
		o += 8
	}
	for _, p := range kv {
		o += copy(b[o:], p[0]) + 1
		o += copy(b[o:], p[1]) + 1
	}
	return b
}

func parsePairs(b []byte) [][2]string {
	if len(b) < 4 {
		return nil
	}
	n := int(binary.LittleEndian.Uint32(b))
	d := 4 + 8*n
	var out [][2]string
	for i := 0; i < n; i++ {
		ks := int(binary.LittleEndian.Uint32(b[4+8*i:]))
		vs := int(binary.LittleEndian.Uint32(b[8+8*i:]))
		k := string(b[d : d+ks])
		d += ks + 1
		v := string(b[d : d+vs])
		d += vs + 1
		out = append(out, [2]string{k, v})
	}
	return out
}

func sendLocal(status uint32, details, body string, headers [][2]string) uint32 {
	dp, dn := sp(details)
	b, bn := sp(body)
	h, hn := bp(serialize(headers))
	return hSendLocal(status, dp, dn, b, bn, h, hn, -1)
}

func getShared(key string) (string, uint32, uint32) {
	kp, kn := sp(key)
	var p *byte
	var n, cas uint32
	st := hGetShared(kp, kn, unsafe.Pointer(&p), unsafe.Pointer(&n), unsafe.Pointer(&cas))
	return str(p, n), cas, st
}

func setShared(key, value string, cas uint32) uint32 {
	kp, kn := sp(key)
	vp, vn := sp(value)
	return hSetShared(kp, kn, vp, vn, cas)
}

func defineMetric(t uint32, name string) uint32 {
	np, nn := sp(name)
	var id uint32
	if st := hDefineMetric(t, np, nn, unsafe.Pointer(&id)); st != 0 {
		logf(4, "define metric failed: "+name)
	}
	return id
}

func query(path, name string) string {
	i := strings.IndexByte(path, '?')
	if i < 0 {
		return ""
	}
	for _, kv := range strings.Split(path[i+1:], "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k == name {
			return v
		}
	}
	return ""
}

// ---- plugin state ----

const (
	reqHeaders  = 0
	respHeaders = 2
	callHeaders = 6
	bufReqBody  = 0
	bufRespBody = 1
	bufCallBody = 4
	bufVMConfig = 6
	bufPlugin   = 7
)

var (
	mRequests, mGauge, mHist, mTicks, mLogs, mDeletes, mC uint32
	tickWaiters                                           []uint32
	callouts                                              = map[uint32]uint32{} // callout -> context
	contexts                                              = map[uint32]*httpCtx{}
	roots                                                 = map[uint32]*rootState{}
)

// rootState is one root context (one plugin configuration). Its configuration is stored
// only when on_configure accepts it.
type rootState struct {
	config     string
	configured bool
	tickMetric uint32 // kitchen_ticks_root_<id>, defined at its first tick
}

type httpCtx struct {
	path   string
	parent uint32
	// /shared/race: the value and cas read in on_request_headers, written on the next tick.
	raceKey, raceValue string
	raceCAS            uint32
}

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {
	enter()
	if parent != 0 {
		contexts[id] = &httpCtx{parent: parent}
		return
	}
	roots[id] = &rootState{}
	logf(2, "root created "+strconv.Itoa(int(id)))
}

//go:wasmexport proxy_on_vm_start
func onVMStart(root, size uint32) uint32 {
	enter()
	vmc, _ := getBuffer(bufVMConfig, 0, size)
	logf(2, "vm start, vm config: "+vmc+", root "+strconv.Itoa(int(root)))
	return 1
}

//go:wasmexport proxy_on_configure
func onConfigure(root, size uint32) uint32 {
	enter()
	config, _ := getBuffer(bufPlugin, 0, size)
	if strings.Contains(config, "trap-configure") {
		panic("kitchen: trap in on_configure")
	}
	if strings.Contains(config, "reject") {
		logf(3, "rejecting configuration of root "+strconv.Itoa(int(root))+": "+config)
		return 0
	}
	r := roots[root]
	if r == nil {
		logf(4, "on_configure for an unknown root "+strconv.Itoa(int(root)))
		return 0
	}
	r.config, r.configured = config, true
	mRequests = defineMetric(0, "kitchen_requests_total")
	mGauge = defineMetric(1, "kitchen_gauge")
	mHist = defineMetric(2, "kitchen_latency_ms")
	mTicks = defineMetric(0, "kitchen_ticks_total")
	mLogs = defineMetric(0, "kitchen_logs_total")
	mDeletes = defineMetric(0, "kitchen_deletes_total")
	mC = defineMetric(0, `kitchen_labelled_total{rule="a b"}`)
	if v := query("?"+config, "tick"); v != "" {
		ms, _ := strconv.Atoi(v)
		hSetTick(uint32(ms))
	}
	logf(2, "configured root "+strconv.Itoa(int(root))+": "+config)
	return 1
}

//go:wasmexport proxy_on_tick
func onTick(root uint32) {
	enter()
	hIncMetric(mTicks, 1)
	if r := roots[root]; r != nil {
		if r.tickMetric == 0 {
			r.tickMetric = defineMetric(0, "kitchen_ticks_root_"+strconv.Itoa(int(root)))
		}
		hIncMetric(r.tickMetric, 1)
	} else {
		logf(4, "tick for an unknown root "+strconv.Itoa(int(root)))
	}
	w := tickWaiters
	tickWaiters = nil
	for _, id := range w {
		if hSetEffective(id) != 0 {
			continue
		}
		if c := contexts[id]; c != nil && c.raceKey != "" {
			st := setShared(c.raceKey, c.raceValue+"+", c.raceCAS)
			addHeader(reqHeaders, "x-race-set", strconv.Itoa(int(st)))
		}
		addHeader(reqHeaders, "x-resumed-by", "tick")
		hContinue(0)
	}
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, n, eos uint32) uint32 {
	enter()
	hIncMetric(mRequests, 1)
	path, _ := getHeader(reqHeaders, ":path")
	c := contexts[id]
	c.path = path
	route := path
	if i := strings.IndexByte(route, '?'); i >= 0 {
		route = route[:i]
	}
	switch route {
	case "/echo-headers":
		addHeader(reqHeaders, "x-added", "1")
		replaceHeader(reqHeaders, "x-replace", "replaced")
		removeHeader(reqHeaders, "x-remove")
		v, st := getHeader(reqHeaders, "X-Mixed-Case")
		addHeader(reqHeaders, "x-mixed-seen", v+"/"+strconv.Itoa(int(st)))
		_, st = getHeader(reqHeaders, "x-absent")
		addHeader(reqHeaders, "x-absent-status", strconv.Itoa(int(st)))
		_, st = getHeader(respHeaders, "x-anything")
		addHeader(reqHeaders, "x-resp-map-status", strconv.Itoa(int(st)))
		return 0
	case "/set-pairs":
		kv, _ := getPairs(reqHeaders)
		var out [][2]string
		for _, p := range kv {
			if p[0] == "x-drop" {
				continue
			}
			out = append(out, p)
		}
		out = append(out, [2]string{"x-set-pairs", strconv.Itoa(len(kv))})
		b, bn := bp(serialize(out))
		hSetPairs(reqHeaders, b, bn)
		return 0
	case "/local":
		sendLocal(403, "denied_by_kitchen", "nope\n", [][2]string{{"x-local", "yes"}})
		return 1
	case "/local-grpc":
		// A local reply shaped by the request: x-code (default 429), x-grpc-status
		// (the grpc_status argument, default -1), x-body, x-add-grpc-status (a grpc-status
		// header among the reply's own).
		code, grpc := 429, int32(-1)
		if v, st := getHeader(reqHeaders, "x-code"); st == 0 && v != "" {
			code, _ = strconv.Atoi(v)
		}
		if v, st := getHeader(reqHeaders, "x-grpc-status"); st == 0 && v != "" {
			n, _ := strconv.Atoi(v)
			grpc = int32(n)
		}
		body, _ := getHeader(reqHeaders, "x-body")
		hdrs := [][2]string{{"x-local", "yes"}, {"content-type", "text/plain"}, {"content-length", "99"}}
		if v, st := getHeader(reqHeaders, "x-add-grpc-status"); st == 0 && v != "" {
			hdrs = append(hdrs, [2]string{"grpc-status", v})
		}
		dp, dn := sp("grpc_local")
		b, bn := sp(body)
		h, hn := bp(serialize(hdrs))
		hSendLocal(uint32(code), dp, dn, b, bn, h, hn, grpc)
		return 1
	case "/props":
		var b strings.Builder
		for _, p := range [][]string{
			{"source", "address"}, {"destination", "address"}, {"request", "path"}, {"request", "url_path"},
			{"request", "method"}, {"request", "host"}, {"request", "scheme"}, {"plugin_name"},
			{"plugin_root_id"}, {"plugin_vm_id"}, {"no", "such"}, {"response", "code"},
			{"xds", "route_name"}, {"xds", "cluster_name"}, {"route_name"}, {"cluster_name"}, {"request", "protocol"},
		} {
			v, st := getProperty(p...)
			b.WriteString(strings.Join(p, ".") + "=" + v + ";" + strconv.Itoa(int(st)) + "\n")
		}
		port, _ := getProperty("source", "port")
		if len(port) == 8 {
			b.WriteString("source.port=" + strconv.FormatUint(binary.LittleEndian.Uint64([]byte(port)), 10) + "\n")
		}
		hdrs, _ := getProperty("request", "headers")
		b.WriteString("request.headers=" + strconv.Itoa(len(parsePairs([]byte(hdrs)))) + "\n")
		sendLocal(200, "props", b.String(), nil)
		return 1
	case "/shared/get":
		v, cas, st := getShared(query(path, "key"))
		sendLocal(200, "", "value="+v+";cas="+strconv.FormatUint(uint64(cas), 10)+";status="+strconv.Itoa(int(st)), nil)
		return 1
	case "/shared/set":
		cas, _ := strconv.ParseUint(query(path, "cas"), 10, 32)
		st := setShared(query(path, "key"), query(path, "value"), uint32(cas))
		sendLocal(200, "", "status="+strconv.Itoa(int(st)), nil)
		return 1
	case "/shared/incr":
		key := query(path, "key")
		for tries := 1; tries <= 1000; tries++ {
			v, cas, st := getShared(key)
			n := 0
			if st == 0 {
				n, _ = strconv.Atoi(v)
			}
			if setShared(key, strconv.Itoa(n+1), cas) == 0 {
				addHeader(reqHeaders, "x-tries", strconv.Itoa(tries))
				return 0
			}
		}
		sendLocal(503, "", "too many cas retries", nil)
		return 1
	case "/metrics":
		hIncMetric(mGauge, 5)
		hIncMetric(mGauge, -2)
		hRecordMetric(mHist, 7)
		hRecordMetric(mHist, 700)
		hIncMetric(mC, 2)
		bad := hIncMetric(mRequests, -1)
		var v uint64
		hGetMetric(mGauge, unsafe.Pointer(&v))
		var hv uint64
		hst := hGetMetric(mHist, unsafe.Pointer(&hv))
		sendLocal(200, "", "gauge="+strconv.FormatUint(v, 10)+";negcounter="+strconv.Itoa(int(bad))+";histget="+strconv.Itoa(int(hst)), nil)
		return 1
	case "/time":
		var ns uint64
		hTime(unsafe.Pointer(&ns))
		var lvl uint32
		hGetLogLevel(unsafe.Pointer(&lvl))
		sendLocal(200, "", strconv.FormatUint(ns, 10)+" "+strconv.Itoa(int(lvl)), nil)
		return 1
	case "/unimpl":
		name := "q"
		np, nn := sp(name)
		var qid uint32
		st := hRegisterQueue(np, nn, unsafe.Pointer(&qid))
		sendLocal(200, "", "status="+strconv.Itoa(int(st)), nil)
		return 1
	case "/shared/race":
		// Read now, write on the next tick: two requests on two workers interleave for sure.
		c.raceKey = query(path, "key")
		v, cas, st := getShared(c.raceKey)
		c.raceValue, c.raceCAS = v, cas
		addHeader(reqHeaders, "x-race-get", strconv.Itoa(int(st))+"/"+strconv.FormatUint(uint64(cas), 10))
		tickWaiters = append(tickWaiters, id)
		return 1
	case "/pause-tick":
		addHeader(reqHeaders, "x-kitchen-root", strconv.Itoa(int(c.parent)))
		if r := roots[c.parent]; r != nil {
			addHeader(reqHeaders, "x-kitchen-config", r.config)
		}
		tickWaiters = append(tickWaiters, id)
		return 1
	case "/whoami":
		// The stream's parent and what the guest stored for it in on_configure.
		r := roots[c.parent]
		if r == nil || !r.configured {
			sendLocal(500, "", "parent "+strconv.Itoa(int(c.parent))+" is not a configured root", nil)
			return 1
		}
		sendLocal(200, "", "root="+strconv.Itoa(int(c.parent))+";config="+r.config, nil)
		return 1
	case "/set-tick":
		// From a stream: the period applies to the stream's root.
		ms, _ := strconv.Atoi(query(path, "ms"))
		st := hSetTick(uint32(ms))
		sendLocal(200, "", "status="+strconv.Itoa(int(st)), nil)
		return 1
	case "/trap":
		panic("kitchen: trap requested")
	case "/set-property":
		// Set, replace and read back filter state; from the root context, NOT_FOUND.
		var b strings.Builder
		for _, kv := range [][2]string{{"test.a", "1"}, {"test.a", "2"}, {"test.b", "x"}} {
			pp, pn := sp(kv[0])
			vp, vn := sp(kv[1])
			b.WriteString("set " + kv[0] + "=" + strconv.Itoa(int(hSetProperty(pp, pn, vp, vn))) + ";")
		}
		for _, p := range [][]string{{"test.a"}, {"test.b"}, {"test.c"}, {"test", "a"}} {
			v, st := getProperty(p...)
			b.WriteString("get " + strings.Join(p, ".") + "=" + v + "/" + strconv.Itoa(int(st)) + ";")
		}
		hSetEffective(c.parent)
		pp, pn := sp("test.root")
		b.WriteString("root=" + strconv.Itoa(int(hSetProperty(pp, pn, pp, pn))))
		hSetEffective(id)
		addHeader(reqHeaders, "x-set-property", b.String())
		return 0
	case "/get-property":
		v, st := getProperty("test.a")
		sendLocal(200, "", "test.a="+v+"/"+strconv.Itoa(int(st)), nil)
		return 1
	case "/set-effective":
		n, _ := strconv.Atoi(query(path, "id"))
		st := hSetEffective(uint32(n))
		hSetEffective(id)
		sendLocal(200, "", "status="+strconv.Itoa(int(st)), nil)
		return 1
	case "/pause-call", "/pause-call-local":
		up := query(path, "cluster")
		if up == "" {
			up = "backend"
		}
		upp, upn := sp(up)
		h, hn := bp(serialize([][2]string{{":method", "GET"}, {":path", "/callout?from=" + strconv.Itoa(int(id))}, {":authority", "backend"}, {"x-from", "kitchen"}}))
		var cid uint32
		st := hHTTPCall(upp, upn, h, hn, nil, 0, nil, 0, 2000, unsafe.Pointer(&cid))
		if st != 0 {
			sendLocal(502, "", "http call refused: "+strconv.Itoa(int(st)), nil)
			return 1
		}
		callouts[cid] = id
		return 1
	case "/body":
		return 0
	case "/ext":
		arg := query(path, "arg")
		ap, an := sp(arg)
		var token uint32
		if st := hTestAsync(ap, an, unsafe.Pointer(&token)); st != 0 {
			sendLocal(200, "", "ext status="+strconv.Itoa(int(st)), nil)
			return 1
		}
		addHeader(reqHeaders, "x-ext-token", strconv.Itoa(int(token)))
		return 1
	case "/log-levels":
		for l := uint32(0); l <= 5; l++ {
			logf(l, "level "+strconv.Itoa(int(l)))
		}
		return 0
	}
	return 0
}

// As in Envoy, the reply comes to the root context; the guest switches to the stream.
//
//go:wasmexport proxy_on_http_call_response
func onHTTPCallResponse(root, cid, nh, bodySize, nt uint32) {
	enter()
	id, ok := callouts[cid]
	delete(callouts, cid)
	if !ok || contexts[root] != nil {
		logf(4, "callout reply for an unknown callout or to a non-root context")
		return
	}
	// Read the reply while the root is effective, then switch to the stream.
	status, _ := getHeader(callHeaders, ":status")
	body, _ := getBuffer(bufCallBody, 0, bodySize)
	if hSetEffective(id) != 0 {
		return // the stream has ended
	}
	c := contexts[id]
	if nh == 0 {
		sendLocal(503, "", "callout failed", nil)
		return
	}
	if strings.HasPrefix(c.path, "/pause-call-local") {
		sendLocal(429, "from_callout", "callout said "+status+": "+body, nil)
		return
	}
	addHeader(reqHeaders, "x-callout-root", strconv.Itoa(int(root)))
	addHeader(reqHeaders, "x-callout-status", status)
	addHeader(reqHeaders, "x-callout-body", body)
	hContinue(0)
}

// proxy_on_test_async_response delivers the extension's reply, readable as buffer type 9.
//
//go:wasmexport proxy_on_test_async_response
func onTestAsyncResponse(id, token, size uint32) {
	enter()
	reply, st := getBuffer(9, 0, size)
	addHeader(reqHeaders, "x-ext-reply", reply+"/"+strconv.Itoa(int(st)))
	hContinue(0)
}

//go:wasmexport proxy_on_request_body
func onRequestBody(id, size, eos uint32) uint32 {
	enter()
	if !strings.HasPrefix(contexts[id].path, "/body") {
		return 0
	}
	if eos == 0 {
		return 1 // buffer until the end
	}
	b, _ := getBuffer(bufReqBody, 0, size)
	setBuffer(bufReqBody, 0, size, strings.ToUpper(b))
	return 0
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, n, eos uint32) uint32 {
	enter()
	c := contexts[id]
	addHeader(respHeaders, "x-kitchen-response", strconv.Itoa(int(id)))
	if strings.HasPrefix(c.path, "/local-grpc") { // what the encoder side sees of a gRPC local reply
		st, _ := getHeader(respHeaders, ":status")
		gs, _ := getHeader(respHeaders, "grpc-status")
		addHeader(respHeaders, "x-seen", st+" "+gs+" eos="+strconv.Itoa(int(eos)))
	}
	if strings.HasPrefix(c.path, "/resp-status") {
		replaceHeader(respHeaders, ":status", "201")
	}
	if strings.HasPrefix(c.path, "/resp-local") {
		sendLocal(418, "", "teapot\n", nil)
		return 1
	}
	code, st := getProperty("response", "code")
	if st == 0 && len(code) == 8 {
		addHeader(respHeaders, "x-response-code", strconv.FormatUint(binary.LittleEndian.Uint64([]byte(code)), 10))
	}
	return 0
}

//go:wasmexport proxy_on_response_body
func onResponseBody(id, size, eos uint32) uint32 {
	enter()
	if !strings.HasPrefix(contexts[id].path, "/body") {
		return 0
	}
	if eos == 0 {
		return 1
	}
	b, _ := getBuffer(bufRespBody, 0, size)
	setBuffer(bufRespBody, 0, size, "["+b+"]")
	return 0
}

//go:wasmexport proxy_on_log
func onLog(id uint32) {
	enter()
	hIncMetric(mLogs, 1)
}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 {
	enter()
	if roots[id] != nil {
		logf(2, "root done "+strconv.Itoa(int(id)))
	}
	return 1
}

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {
	enter()
	if roots[id] != nil {
		logf(2, "root delete "+strconv.Itoa(int(id)))
		delete(roots, id)
		return
	}
	delete(contexts, id)
	hIncMetric(mDeletes, 1)
}
