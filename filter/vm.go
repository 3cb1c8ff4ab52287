// Package filter is the sluice Proxy-Wasm plugin: contexts, rule matching,
// keys, the shared-data store and the rate-limit headers.
//
// It is ordinary Go: the host is reached only through abi.Host and the
// host's callbacks arrive through VM (an abi.Handler), so the whole plugin
// is tested natively against a fake host, and the same tests drive the
// compiled module (cmd/sluice-wasm) through the proxytest emulator and the
// embedded host.
//
// A request is decided in three phases inside proxy_on_request_headers
// (Plugin.onRequest): evaluate every applicable rule (load + decide, no
// write); if an enforcing rule denies, reject and charge nobody; otherwise
// charge every admitting rule (compare-and-swap, deciding again after a
// lost race). The per-rule scratch state lives in Plugin and is reused by
// the next request, which is correct because the local backend finishes
// within the callback.
//
// Pausing and resuming (the seam for a remote backend such as Redis, issue
// 5): a rule whose decision arrives later must copy its per-request state
// into the stream (streams are found by context id in VM.streams), dispatch
// its call and return ActionPause; the host's completion callback then runs
// the same verdict / charge / remember-headers steps for that stream and
// either sends the local response or resumes the request
// (proxy_continue_stream). Streams are released on proxy_on_log or
// proxy_on_delete, so a paused stream that is abandoned is freed too.
package filter

import (
	"runtime"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// maxFreeStreams bounds the pool of reusable stream records.
const maxFreeStreams = 1024

// VM is the module's state: root contexts (one Plugin each) and HTTP
// stream contexts. It implements abi.Handler. A VM is single-threaded, like
// a Proxy-Wasm VM.
type VM struct {
	host    abi.Host
	plugins map[uint32]*Plugin
	streams map[uint32]*stream
	free    []*stream
	nreq    uint32

	debugID, debugLast uint64 // sluice_debug builds only
}

// DebugAllocsMetric is the counter a sluice_debug build increments by the
// guest's heap allocations (runtime/metrics /gc/heap/allocs:objects),
// sampled at each request.
const DebugAllocsMetric = "sluice.debug.guest_allocs"

var _ abi.Handler = (*VM)(nil)

// NewVM returns a VM calling h.
func NewVM(h abi.Host) *VM {
	return &VM{
		host:    h,
		plugins: make(map[uint32]*Plugin),
		streams: make(map[uint32]*stream),
	}
}

// stream is the per-request state kept between request and response
// headers.
type stream struct {
	plugin     *Plugin
	denied     bool // a local response was sent
	hasHeaders bool // rate-limit headers to add to the response
	rule       *rule
	d          algorithms.Decision
}

// OnVMStart implements abi.Handler.
func (vm *VM) OnVMStart(rootID uint32, vmConfigSize int) bool { return true }

// OnContextCreate implements abi.Handler: parentID 0 creates a root context,
// anything else an HTTP stream of that root context.
func (vm *VM) OnContextCreate(id, parentID uint32) {
	if parentID == 0 {
		vm.plugins[id] = &Plugin{host: vm.host, id: id}
		return
	}
	p := vm.plugins[parentID]
	if p == nil {
		return
	}
	var s *stream
	if n := len(vm.free); n > 0 {
		s = vm.free[n-1]
		vm.free = vm.free[:n-1]
	} else {
		s = new(stream)
	}
	*s = stream{plugin: p}
	vm.streams[id] = s
}

// OnConfigure implements abi.Handler: it compiles the plugin configuration;
// a bad one is logged at critical level and refuses the start.
func (vm *VM) OnConfigure(rootID uint32, size int) bool {
	p := vm.plugins[rootID]
	if p == nil {
		p = &Plugin{host: vm.host, id: rootID}
		vm.plugins[rootID] = p
	}
	var data []byte
	if size > 0 {
		b, st := vm.host.GetBuffer(abi.BufferPluginConfiguration, 0, size)
		if st != abi.StatusOK {
			vm.host.Log(abi.LogCritical, "sluice: cannot read the plugin configuration: "+st.String())
			return false
		}
		data = append([]byte(nil), b...) // the host buffer is reused
	}
	if err := p.configure(data); err != nil {
		vm.host.Log(abi.LogCritical, "sluice: invalid plugin configuration:\n"+err.Error())
		return false
	}
	return true
}

// OnRequestHeaders implements abi.Handler.
func (vm *VM) OnRequestHeaders(id uint32, numHeaders int, endOfStream bool) abi.Action {
	vm.nreq++
	if vm.nreq%GoschedEvery == 0 {
		runtime.Gosched()
	}
	if debugAllocs {
		vm.reportAllocs()
	}
	s := vm.streams[id]
	if s == nil {
		return abi.ActionContinue
	}
	return s.plugin.guardedRequest(s)
}

// OnResponseHeaders implements abi.Handler.
func (vm *VM) OnResponseHeaders(id uint32, numHeaders int, endOfStream bool) abi.Action {
	s := vm.streams[id]
	if s == nil {
		return abi.ActionContinue
	}
	return s.plugin.guardedResponse(s)
}

// OnLog implements abi.Handler. The stream is released here already: the
// proxytest emulator never calls proxy_on_delete, and nothing after the
// access log needs it.
func (vm *VM) OnLog(id uint32) { vm.release(id) }

// OnDone implements abi.Handler.
func (vm *VM) OnDone(id uint32) bool { return true }

// OnDelete implements abi.Handler.
func (vm *VM) OnDelete(id uint32) {
	if _, ok := vm.plugins[id]; ok {
		delete(vm.plugins, id)
		return
	}
	vm.release(id)
}

// OnTick implements abi.Handler (sluice sets no tick period).
func (vm *VM) OnTick(rootID uint32) {}

func (vm *VM) release(id uint32) {
	s, ok := vm.streams[id]
	if !ok {
		return
	}
	delete(vm.streams, id)
	*s = stream{}
	if len(vm.free) < maxFreeStreams {
		vm.free = append(vm.free, s)
	}
}

// Streams returns the number of live stream contexts (for tests).
func (vm *VM) Streams() int { return len(vm.streams) }

// guardedRequest runs onRequest, turning a panic into a logged error and
// the failure_mode outcome.
func (p *Plugin) guardedRequest(s *stream) (act abi.Action) {
	defer func() {
		if r := recover(); r != nil {
			act = p.recovered(s, r)
		}
	}()
	return p.onRequest(s)
}

func (p *Plugin) guardedResponse(s *stream) (act abi.Action) {
	defer func() {
		if r := recover(); r != nil {
			p.recovered(nil, r)
			act = abi.ActionContinue
		}
	}()
	return p.onResponse(s)
}

func (p *Plugin) recovered(s *stream, r any) abi.Action {
	msg := "sluice: recovered from panic"
	switch v := r.(type) {
	case string:
		msg += ": " + v
	case error:
		msg += ": " + v.Error()
	}
	p.host.Log(abi.LogError, msg)
	p.host.IncrementMetric(p.errors, 1)
	if s != nil && !s.denied && p.cfg != nil && p.cfg.FailureMode == config.FailClosed {
		return p.sendFailure(s)
	}
	return abi.ActionContinue
}
