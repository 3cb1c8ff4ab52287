//go:build wasip1

// Command guest is the Proxy-Wasm module bench/cmd/envoy-calls loads once per variant: its
// plugin configuration "<call> <n>" names one host call, which proxy_on_request_headers
// makes n times before it lets the request through. With "none" it makes none: the cost
// of the module itself, which is the no-op module's (host/testdata/guests/minimal): the
// same per-request exports, no host call, no allocation. The one export the no-op module
// lacks, proxy_on_configure, runs once per VM, never per request.
//
// Calls: get_header (proxy_get_header_map_value of the request header x-key; its value
// comes back through proxy_on_memory_allocate), header_size (proxy_get_header_map_size of
// the request headers, answered through a pointer only), get_shared (proxy_get_shared_data
// of a 25-byte value set at configure, like sluice's slot; through the allocation
// callback), set_shared (proxy_set_shared_data of that key, cas 0), now
// (proxy_get_current_time_nanoseconds) and metric (proxy_increment_metric on a counter
// defined at configure).
//
// proxy_on_memory_allocate is a bump allocator over a fixed buffer, reset at each
// proxy_on_request_headers: the guest's side of an allocation is a few instructions.
//
// Each answer is checked (status OK; the value where there is one: x-key's is one of
// sluice-load's "k<i>", the shared value the 25 bytes set) and counted: failures at once in
// the counter envoy_calls.<call>.failed, calls that succeeded and the requests seen in
// envoy_calls.<call>.ok and envoy_calls.<call>.requests every flushEvery requests (two
// proxy_increment_metric calls per flushEvery requests, in every variant, "none" included,
// so they cancel out of the differences). The command reads the three counters.
//
// Build: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared, then internal/wasmpatch.
package main

import "unsafe"

func main() {}

//go:wasmimport env proxy_get_buffer_bytes
func getBufferBytes(bt, start, max uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_value
func getHeaderMapValue(mt uint32, key unsafe.Pointer, keySize uint32, retPtr, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_header_map_size
func getHeaderMapSize(mt uint32, retSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_shared_data
func getSharedData(key unsafe.Pointer, keySize uint32, retPtr, retSize, retCAS unsafe.Pointer) uint32

//go:wasmimport env proxy_set_shared_data
func setSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize, cas uint32) uint32

//go:wasmimport env proxy_get_current_time_nanoseconds
func getCurrentTimeNanoseconds(ret unsafe.Pointer) uint32

//go:wasmimport env proxy_define_metric
func defineMetric(mt uint32, name unsafe.Pointer, nameSize uint32, retID unsafe.Pointer) uint32

//go:wasmimport env proxy_increment_metric
func incrementMetric(id uint32, delta int64) uint32

// ABI constants (Proxy-Wasm 0.2.1).
const (
	statusOK                  = 0
	mapRequestHeaders         = 0
	bufferPluginConfiguration = 7
	metricCounter             = 0
	actionContinue            = 0
)

// flushEvery is how many requests the ok and requests counts gather before they go to
// their counters.
const flushEvery = 256

// Calls, as the configuration names them.
const (
	callNone = iota
	callGetHeader
	callHeaderSize
	callGetShared
	callSetShared
	callNow
	callMetric
)

var callNames = [...]string{"none", "get_header", "header_size", "get_shared", "set_shared", "now", "metric"}

// The configured variant (one plugin per VM).
var (
	call int
	n    int
)

// Counters (metric ids) and what is still to be added to them.
var (
	requestsID, okID, failedID, targetID uint32
	pendingRequests, pendingOK           int64
)

var (
	keyHeader = []byte("x-key")
	slotKey   = []byte("envoy-calls.slot")
	slotValue = []byte("0123456789abcdefghijklmno") // 25 bytes
)

// Where the host writes its answers. The guest is single-threaded; the host writes them
// during a host call only.
var (
	retPtr, retSize, retCAS uint32
	retU32                  uint32
	retNanos                uint64
)

// The bump allocator: arena, its next free offset, and the last block it handed out
// (the value the host wrote, once the host call returns). A request larger than the arena
// gets a heap block, kept in last until the next one.
var (
	arena [64 << 10]byte
	top   uint32
	last  []byte
)

//go:wasmexport proxy_abi_version_0_2_1
func abiVersion() {}

//go:wasmexport proxy_on_memory_allocate
func onAlloc(size uint32) uint32 {
	if size > uint32(len(arena)) {
		last = make([]byte, size, size+1)
		return addr(&last[:1][0])
	}
	if top+size >= uint32(len(arena)) {
		top = 0 // a block is read before the next host call: the old ones are dead
	}
	last = arena[top : top+size]
	p := &arena[top]
	top = (top + size + 7) &^ 7
	return addr(p)
}

func addr(p *byte) uint32 { return uint32(uintptr(unsafe.Pointer(p))) }

// answer is the block the host's last answer went into (nil when retPtr is not it).
func answer() []byte {
	if retSize == 0 || cap(last) == 0 || retPtr != addr(&last[:1][0]) || int(retSize) > len(last) {
		return nil
	}
	return last[:retSize]
}

//go:wasmexport proxy_on_context_create
func onContextCreate(id, parent uint32) {}

//go:wasmexport proxy_on_configure
func onConfigure(id, size uint32) uint32 {
	retPtr, retSize = 0, 0
	if getBufferBytes(bufferPluginConfiguration, 0, size, unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)) != statusOK {
		return 0
	}
	c, k, ok := parseConfig(string(answer()))
	if !ok {
		return 0
	}
	call, n = c, k
	prefix := "envoy_calls." + callNames[call] + "."
	for _, m := range []struct {
		id   *uint32
		name string
	}{{&requestsID, "requests"}, {&okID, "ok"}, {&failedID, "failed"}, {&targetID, "target"}} {
		if m.name == "target" && call != callMetric {
			continue
		}
		b := []byte(prefix + m.name)
		if defineMetric(metricCounter, unsafe.Pointer(&b[0]), uint32(len(b)), unsafe.Pointer(m.id)) != statusOK {
			return 0
		}
	}
	if call == callGetShared || call == callSetShared {
		if setSharedData(unsafe.Pointer(&slotKey[0]), uint32(len(slotKey)), unsafe.Pointer(&slotValue[0]), uint32(len(slotValue)), 0) != statusOK {
			return 0
		}
	}
	return 1
}

// parseConfig reads "<call> <n>": a name of callNames and a decimal count, 1 to 1,000,000
// (any for none, which makes no call).
func parseConfig(s string) (c, k int, ok bool) {
	name, num := s, ""
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			name, num = s[:i], s[i+1:]
			break
		}
	}
	c = -1
	for i, cn := range callNames {
		if cn == name {
			c = i
		}
	}
	if c < 0 || num == "" || len(num) > 7 {
		return 0, 0, false
	}
	for i := 0; i < len(num); i++ {
		if num[i] < '0' || num[i] > '9' {
			return 0, 0, false
		}
		k = k*10 + int(num[i]-'0')
	}
	if c == callNone {
		return c, 0, true
	}
	if k < 1 || k > 1_000_000 {
		return 0, 0, false
	}
	return c, k, true
}

//go:wasmexport proxy_on_request_headers
func onRequestHeaders(id, headers, eos uint32) uint32 {
	top = 0
	var good int
	switch call {
	case callGetHeader:
		good = getHeaders()
	case callHeaderSize:
		good = headerSizes()
	case callGetShared:
		good = getShareds()
	case callSetShared:
		good = setShareds()
	case callNow:
		good = nows()
	case callMetric:
		good = metrics()
	}
	if bad := n - good; bad > 0 {
		incrementMetric(failedID, int64(bad))
	}
	pendingOK += int64(good)
	pendingRequests++
	if pendingRequests == flushEvery {
		incrementMetric(requestsID, pendingRequests)
		incrementMetric(okID, pendingOK)
		pendingRequests, pendingOK = 0, 0
	}
	return actionContinue
}

// Each of these makes the variant's call n times and returns how many answered as they
// should.

func getHeaders() (good int) {
	for range n {
		retPtr, retSize = 0, 0
		if getHeaderMapValue(mapRequestHeaders, unsafe.Pointer(&keyHeader[0]), uint32(len(keyHeader)),
			unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize)) != statusOK {
			continue
		}
		if v := answer(); len(v) >= 2 && len(v) <= 8 && v[0] == 'k' {
			good++
		}
	}
	return good
}

func headerSizes() (good int) {
	for range n {
		retU32 = 0
		if getHeaderMapSize(mapRequestHeaders, unsafe.Pointer(&retU32)) == statusOK && retU32 > 0 {
			good++
		}
	}
	return good
}

func getShareds() (good int) {
	for range n {
		retPtr, retSize, retCAS = 0, 0, 0
		if getSharedData(unsafe.Pointer(&slotKey[0]), uint32(len(slotKey)),
			unsafe.Pointer(&retPtr), unsafe.Pointer(&retSize), unsafe.Pointer(&retCAS)) != statusOK {
			continue
		}
		if v := answer(); string(v) == string(slotValue) && retCAS != 0 {
			good++
		}
	}
	return good
}

func setShareds() (good int) {
	for range n {
		if setSharedData(unsafe.Pointer(&slotKey[0]), uint32(len(slotKey)), unsafe.Pointer(&slotValue[0]), uint32(len(slotValue)), 0) == statusOK {
			good++
		}
	}
	return good
}

func nows() (good int) {
	for range n {
		retNanos = 0
		if getCurrentTimeNanoseconds(unsafe.Pointer(&retNanos)) == statusOK && retNanos > 0 {
			good++
		}
	}
	return good
}

func metrics() (good int) {
	for range n {
		if incrementMetric(targetID, 1) == statusOK {
			good++
		}
	}
	return good
}

//go:wasmexport proxy_on_response_headers
func onResponseHeaders(id, headers, eos uint32) uint32 { return actionContinue }

//go:wasmexport proxy_on_log
func onLog(id uint32) {}

//go:wasmexport proxy_on_done
func onDone(id uint32) uint32 { return 1 }

//go:wasmexport proxy_on_delete
func onDelete(id uint32) {}
