//go:build wasip1

package abi

import (
	"errors"
	"unsafe"
)

// handler receives the exported callbacks (see SetHandler); bodies, the
// body callbacks when it has them.
var (
	handler Handler
	bodies  BodyHandler
	quick   QuickHandler
)

// SetHandler installs the Handler the exported proxy_on_* callbacks dispatch
// to. The wasm main package calls it from init (a c-shared module runs
// package initialisers from _initialize and never runs main).
func SetHandler(h Handler) {
	handler = h
	bodies, _ = h.(BodyHandler)
	quick, _ = h.(QuickHandler)
}

// The callbacks the host makes into the module. Each one is a thin wrapper:
// enter (arena bookkeeping), dispatch to the Handler, and recover from any
// panic (logged at critical level; the callback then returns its safe value:
// Continue for stream callbacks, false for configure/vm_start, true for
// on_done). A panic never crosses into the host as a trap.
//
// The request trailer callback (proxy_on_request_trailers) is not exported: the filter
// would only answer Continue, which is what a host does for a callback the module lacks
// (proxy-wasm-cpp-host checks for each export before calling it, as the embedded host
// does); exported, it would cost a call into the guest. Nor is proxy_on_log: a stream is
// released at proxy_on_done, which every host sends at its end (Envoy: the filter's
// onDestroy), and proxy_on_delete; a call into the guest per request saved. The build
// for the proxytest emulator, which calls proxy_on_log and proxy_on_delete but never a
// stream's proxy_on_done and requires every export it calls, adds it
// (exports_log_wasip1.go). The body callbacks are exported for token budgets: the
// request body for a reservation read from it (filter/bodycost.go), the response body and
// trailers for a cost read from the response (filter/cost.go); a stream that reads neither
// returns at once — one call into the guest per body chunk.

//go:wasmexport proxy_abi_version_0_2_1
func proxyABIVersion() {}

//go:wasmexport proxy_on_memory_allocate
func proxyOnMemoryAllocate(size uint32) uint32 { return allocate(size) }

//go:wasmexport proxy_on_vm_start
func proxyOnVMStart(rootID, vmConfigSize uint32) (ret uint32) {
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = 0
			recovered(r)
		}
	}()
	return b2u(handler.OnVMStart(rootID, int(vmConfigSize)))
}

//go:wasmexport proxy_on_configure
func proxyOnConfigure(rootID, pluginConfigSize uint32) (ret uint32) {
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = 0
			recovered(r)
		}
	}()
	return b2u(handler.OnConfigure(rootID, int(pluginConfigSize)))
}

//go:wasmexport proxy_on_context_create
func proxyOnContextCreate(id, parentID uint32) {
	if quick != nil && quick.QuickContextCreate(id, parentID) {
		return
	}
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			recovered(r)
		}
	}()
	handler.OnContextCreate(id, parentID)
}

//go:wasmexport proxy_on_request_headers
func proxyOnRequestHeaders(id, numHeaders, endOfStream uint32) (ret uint32) {
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = uint32(ActionContinue)
			recovered(r)
		}
	}()
	return uint32(handler.OnRequestHeaders(id, int(numHeaders), endOfStream != 0))
}

//go:wasmexport proxy_on_response_headers
func proxyOnResponseHeaders(id, numHeaders, endOfStream uint32) (ret uint32) {
	if quick != nil && quick.QuickResponseHeaders(id) {
		return uint32(ActionContinue)
	}
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = uint32(ActionContinue)
			recovered(r)
		}
	}()
	return uint32(handler.OnResponseHeaders(id, int(numHeaders), endOfStream != 0))
}

//go:wasmexport proxy_on_request_body
func proxyOnRequestBody(id, bodySize, endOfStream uint32) (ret uint32) {
	if bodies == nil {
		return uint32(ActionContinue)
	}
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = uint32(ActionContinue)
			recovered(r)
		}
	}()
	return uint32(bodies.OnRequestBody(id, int(bodySize), endOfStream != 0))
}

//go:wasmexport proxy_on_response_body
func proxyOnResponseBody(id, bodySize, endOfStream uint32) (ret uint32) {
	if bodies == nil || quick != nil && quick.QuickResponseBody(id) {
		return uint32(ActionContinue)
	}
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = uint32(ActionContinue)
			recovered(r)
		}
	}()
	return uint32(bodies.OnResponseBody(id, int(bodySize), endOfStream != 0))
}

//go:wasmexport proxy_on_response_trailers
func proxyOnResponseTrailers(id, numTrailers uint32) (ret uint32) {
	if bodies == nil {
		return uint32(ActionContinue)
	}
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = uint32(ActionContinue)
			recovered(r)
		}
	}()
	return uint32(bodies.OnResponseTrailers(id, int(numTrailers)))
}

//go:wasmexport proxy_on_done
func proxyOnDone(id uint32) (ret uint32) {
	if quick != nil && quick.QuickDone(id) {
		return 1
	}
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			ret = 1
			recovered(r)
		}
	}()
	return b2u(handler.OnDone(id))
}

//go:wasmexport proxy_on_delete
func proxyOnDelete(id uint32) {
	if quick != nil && quick.QuickDelete(id) {
		return
	}
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			recovered(r)
		}
	}()
	handler.OnDelete(id)
}

//go:wasmexport proxy_on_tick
func proxyOnTick(rootID uint32) {
	enter()
	defer func() {
		depth--
		if r := recover(); r != nil {
			recovered(r)
		}
	}()
	handler.OnTick(rootID)
}

//go:wasmexport proxy_on_queue_ready
func proxyOnQueueReady(rootID, queueID uint32) {}

//go:wasmexport proxy_on_http_call_response
func proxyOnHTTPCallResponse(id, token, numHeaders, bodySize, numTrailers uint32) {}

// depth counts nested callbacks (a host may call back into the module while
// a host call is in progress, e.g. response headers during a local reply).
var depth int

func enter() {
	depth++
	if depth == 1 {
		arenaOff = 0
		gcChecks++
		if gcChecks&(gcCheckEvery-1) == 0 || arenaOverflow {
			enterSlow()
		}
	}
}

// enterSlow is enter's rare part, out of line so that enter inlines into
// every callback: overflow buffers to drop (and perhaps a heap check, when
// they add up to gcBigBytes), or the periodic heap check.
func enterSlow() {
	due := gcChecks&(gcCheckEvery-1) == 0
	if arenaOverflow {
		arenaOverflow = false
		clear(arenaBig)
		arenaBig = arenaBig[:0]
	}
	if due || gcBigSince >= gcBigBytes {
		checkHeap()
	}
}

// recovered logs a panic recovered at a callback's end. Each callback ends
// in its own deferred literal (depth--, then recover, which only works
// called directly by the deferred function): a deferred call with arguments
// would cost two more guest function calls per callback (a wrapper and the
// helper), six callbacks a request.
func recovered(r any) {
	var im Imports
	im.Log(LogCritical, "sluice: recovered from panic: "+panicText(r))
}

// leave ends a callback that defers it directly (the rarely called ones):
// on a panic it logs and sets *ret to fallback.
func leave(ret *uint32, fallback uint32) {
	depth--
	if r := recover(); r != nil {
		*ret = fallback
		recovered(r)
	}
}

func panicText(r any) string {
	switch v := r.(type) {
	case string:
		return v
	case error:
		return v.Error()
	}
	return errors.New("non-error panic value").Error()
}

func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// The allocator behind proxy_on_memory_allocate. The host writes returned
// buffers (headers, properties, shared data, configuration) into memory it
// obtains here, then hands the address back to the guest. Buffers come from
// an arena reset when the next top-level callback starts, so a request
// allocates nothing on the Go heap for them and the garbage collector never
// frees a buffer the host is writing into (the arena and any overflow
// buffers stay reachable from these globals). Callers copy what they keep
// across callbacks.
const arenaChunk = 64 << 10

var (
	arena         = make([]byte, arenaChunk)
	arenaOff      int
	arenaBig      [][]byte // overflow allocations, dropped at reset
	arenaOverflow bool     // arenaBig is not empty
	zeroAlloc     [8]byte  // returned for size 0: a valid, non-nil address
)

func allocate(size uint32) uint32 {
	if size == 0 {
		return addr(&zeroAlloc[0])
	}
	n := int(size)
	off := (arenaOff + 7) &^ 7
	if !heapAllocOnly && off+n <= len(arena) {
		arenaOff = off + n
		return addr(&arena[off])
	}
	b := make([]byte, n) // never starts a collection: see gc_wasip1.go
	arenaBig = append(arenaBig, b)
	arenaOverflow = true
	gcBigSince += uint64(n)
	return addr(&b[0])
}

func addr(p *byte) uint32 { return uint32(uintptr(unsafe.Pointer(p))) }
