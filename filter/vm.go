// Package filter is the sluice Proxy-Wasm plugin: contexts, rule matching,
// keys, the shared-data store and the rate-limit headers.
//
// It is ordinary Go: the host is reached only through abi.Host and the
// host's callbacks arrive through VM (an abi.Handler), so the whole plugin
// is tested natively against a fake host, and the same tests drive the
// compiled module (cmd/sluice-wasm) through the proxytest emulator and the
// embedded host.
//
// One orchestration decides every request, in proxy_on_request_headers
// (Plugin.onRequest): select the configuration scope ("_rules_", scope.go),
// match the rules and build their keys (keyFor), decide each applying rule
// without writing — a local rule on its shared-data slot; a Redis rule's
// decision arrives later — and, once every decision is in (Plugin.resume),
// give the verdict: if an enforcing rule denies, reject, refund the Redis
// admissions and charge no local rule; otherwise charge the admitting local
// rules (Plugin.charge: compare-and-swap, deciding again after a lost race)
// and set the response headers from the most restrictive rule. The per-rule
// scratch state lives in Plugin and is reused by the next request; a request
// that waits for Redis keeps a copy of it in its stream.
//
// The remote backends — Redis (redis_backend.go) and the rate-limit
// service (rls_backend.go) — are codecs of one remote-call engine
// (remote.go), which plugs in at four points: dispatch the calls and pause;
// take each reply (or the failure_mode outcome); refund; release. Replies
// and the guard arrive on root-context callbacks, which answer or resume
// the waiting stream (proxy_continue_stream). Streams are
// released on proxy_on_done (or proxy_on_log, proxy_on_delete: whichever
// comes first), so a paused stream that is abandoned is freed too.
package filter

import (
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
	streams streamTable
	free    []*stream
	nreq    uint32

	// The root context looked up last (streams are created under one root
	// context, nearly always the same one).
	lastRootID uint32
	lastRoot   *Plugin
	endedID    uint32 // the stream released last at its proxy_on_done or proxy_on_log

	debugID, debugLast uint64 // sluice_debug builds only

	// Root contexts that answered false from proxy_on_done: their rls
	// calls (lease returns, refunds) are still in flight (see OnDone).
	donePending []uint32

	// The guest's own heap, reported as GCCyclesMetric and HeapBytesMetric.
	gcID, heapID          uint32
	metricsDefined        bool
	metricsOK             bool
	gcReported, heapShown uint64
}

// The module's heap metrics: collections it has run (a counter) and the bytes of heap
// objects (a gauge), updated every heapReportEvery requests and after each collection.
const (
	GCCyclesMetric  = "sluice.guest.gc_cycles"
	HeapBytesMetric = "sluice.guest.heap_bytes"
	heapReportEvery = 64
)

func (vm *VM) reportHeap() {
	if !vm.metricsDefined {
		vm.metricsDefined = true
		var st1, st2 abi.Status
		vm.gcID, st1 = vm.host.DefineMetric(abi.MetricCounter, GCCyclesMetric)
		vm.heapID, st2 = vm.host.DefineMetric(abi.MetricGauge, HeapBytesMetric)
		vm.metricsOK = st1 == abi.StatusOK && st2 == abi.StatusOK
	}
	cycles, heap := abi.GCCycles(), abi.HeapBytes()
	if vm.metricsOK {
		// Envoy refuses a counter increment ≤ 0 (BadArgument, Context::incrementMetric),
		// and most reports come with no collection since the last one: only real ones.
		if cycles > vm.gcReported {
			vm.host.IncrementMetric(vm.gcID, int64(cycles-vm.gcReported))
		}
		if d := int64(heap) - int64(vm.heapShown); d != 0 {
			vm.host.IncrementMetric(vm.heapID, d)
		}
	}
	vm.gcReported, vm.heapShown = cycles, heap
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
	}
}

// plugin returns the root context id (nil if unknown).
func (vm *VM) plugin(id uint32) *Plugin {
	if id == vm.lastRootID && vm.lastRoot != nil {
		return vm.lastRoot
	}
	p := vm.plugins[id]
	if p != nil {
		vm.lastRootID, vm.lastRoot = id, p
	}
	return p
}

// streamSlots is the size of streamTable's direct-mapped array.
const streamSlots = 256

// streamTable maps context ids to live streams. Hosts number contexts
// sequentially, so an array indexed by the id's low bits holds nearly every
// live stream without hashing (a Go map costs several calls per operation in
// wasm); ids whose slot is taken go to a map.
type streamTable struct {
	slots [streamSlots]*stream
	n     int // streams in slots
	more  map[uint32]*stream
}

func (t *streamTable) get(id uint32) *stream {
	if s := t.slots[id%streamSlots]; s != nil && s.id == id {
		return s
	}
	if len(t.more) == 0 {
		return nil
	}
	return t.more[id]
}

// put adds s under id, replacing a stream with the same id.
func (t *streamTable) put(id uint32, s *stream) {
	s.id = id
	i := id % streamSlots
	if cur := t.slots[i]; cur == nil || cur.id == id {
		if cur == nil {
			t.n++
		}
		t.slots[i] = s
		if len(t.more) > 0 {
			delete(t.more, id)
		}
		return
	}
	if t.more == nil {
		t.more = make(map[uint32]*stream)
	}
	t.more[id] = s
}

// remove removes and returns the stream with id (nil if none).
func (t *streamTable) remove(id uint32) *stream {
	i := id % streamSlots
	if s := t.slots[i]; s != nil && s.id == id {
		t.slots[i] = nil
		t.n--
		return s
	}
	if len(t.more) == 0 {
		return nil
	}
	s, ok := t.more[id]
	if ok {
		delete(t.more, id)
	}
	return s
}

func (t *streamTable) len() int { return t.n + len(t.more) }

// stream is the per-request state kept between request and response
// headers.
type stream struct {
	id         uint32 // context id (set by streamTable.put)
	plugin     *Plugin
	rwait      *remoteWait // the remote decisions this request waits for (nil: none)
	hold       *heldReq    // held until its slot (hold.go; nil: not held)
	heldMS     int64       // released after being held this long (ms, rounded up; 0: not held)
	bill       *bill       // settlements due when the stream ends (cost.go; nil: none)
	conc       *concAcqs   // the concurrency slots it holds, given back when it ends (concurrency.go; nil: none)
	cwait      *concWait   // queued for a concurrency slot (concurrency.go; nil: not)
	cqSince    int64       // when it was first queued for a concurrency slot (0: never)
	body       *bodyWait   // its body is read for a reservation (bodycost.go; nil: not)
	reqEnd     bool        // the request ended with its headers (no body)
	denied     bool        // a local response was sent
	hasHeaders bool        // rate-limit headers to add to the response
	rule       *rule
	d          algorithms.Decision
	plan       *config.PlanEntry // rule's plan (plans.go)
}

// OnVMStart implements abi.Handler.
func (vm *VM) OnVMStart(rootID uint32, vmConfigSize int) bool { return true }

// OnContextCreate implements abi.Handler: parentID 0 creates a root context,
// anything else an HTTP stream of that root context.
func (vm *VM) OnContextCreate(id, parentID uint32) {
	if parentID == 0 {
		vm.plugins[id] = &Plugin{host: vm.host, id: id}
		if vm.lastRootID == id {
			vm.lastRootID, vm.lastRoot = 0, nil
		}
		return
	}
	p := vm.plugin(parentID)
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
	vm.streams.put(id, s)
}

// QuickContextCreate implements abi.QuickHandler: a stream of a known root context is
// created here, as OnContextCreate would (nothing in it can panic).
func (vm *VM) QuickContextCreate(id, parentID uint32) bool {
	if parentID == 0 {
		return false
	}
	vm.OnContextCreate(id, parentID)
	return true
}

// QuickResponseHeaders implements abi.QuickHandler: a stream with no headers to add and
// nothing to settle (headers "none", a denial, no rule applied) needs nothing.
func (vm *VM) QuickResponseHeaders(id uint32) bool {
	s := vm.streams.get(id)
	return s == nil || (!s.hasHeaders && s.bill == nil)
}

// QuickResponseBody implements abi.QuickHandler: only a stream that reads its response
// body for its cost needs the chunk.
func (vm *VM) QuickResponseBody(id uint32) bool {
	s := vm.streams.get(id)
	return s == nil || s.bill == nil || !s.bill.body
}

// QuickDone implements abi.QuickHandler: a stream whose end needs no work (nothing held,
// read for a reservation or billed) is released here; one released already (at
// proxy_on_log) is done.
func (vm *VM) QuickDone(id uint32) bool {
	if id != 0 && id == vm.endedID {
		return true
	}
	if !vm.quickRelease(id) {
		return false
	}
	vm.endedID = id
	return true
}

// QuickDelete implements abi.QuickHandler: the stream released at its proxy_on_done (or
// proxy_on_log), or one whose end needs no work.
func (vm *VM) QuickDelete(id uint32) bool {
	if id != 0 && id == vm.endedID {
		vm.endedID = 0
		return true
	}
	return vm.quickRelease(id)
}

// quickRelease releases stream id when that needs none of release's work.
func (vm *VM) quickRelease(id uint32) bool {
	s := vm.streams.get(id)
	if s == nil || s.hold != nil || s.body != nil || s.bill != nil || s.conc != nil || s.cwait != nil {
		return false
	}
	vm.streams.remove(id)
	vm.recycle(s)
	return true
}

// EndAtRequest ends stream id right after its request headers when nothing later needs the
// VM — no hold, body, bill or remote wait, and the request goes on (act is Continue) or
// was answered locally (denied): it
// returns the headers its response must get (valid until the next call into the VM) and
// true, and the stream is released as at its end; the caller adds those headers to the
// response itself. Otherwise it returns false and the stream lives on. A host whose calls
// into the module cost more than its own work (the dynamic module: one entry into the Go
// runtime per call) saves the response and end callbacks of most requests this way; the
// headers are the ones onResponse would add, computed from the same decision.
func (vm *VM) EndAtRequest(id uint32, act abi.Action) ([]abi.Header, bool) {
	s := vm.streams.get(id)
	if s == nil {
		return nil, act == abi.ActionContinue
	}
	if act != abi.ActionContinue && !s.denied {
		return nil, false
	}
	if s.hold != nil || s.body != nil || s.bill != nil || s.rwait != nil || s.conc != nil || s.cwait != nil {
		return nil, false
	}
	var hdrs []abi.Header
	if p := s.plugin; s.hasHeaders && !s.denied && p != nil && p.cfg != nil {
		p.responseHeaders(s)
		hdrs = p.hdrs
	}
	vm.streams.remove(id)
	vm.recycle(s)
	return hdrs, true
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
	if vm.nreq%heapReportEvery == 0 || abi.GCCycles() != vm.gcReported {
		vm.reportHeap()
	}
	if debugAllocs {
		vm.reportAllocs()
	}
	s := vm.streams.get(id)
	if s == nil {
		return abi.ActionContinue
	}
	s.reqEnd = endOfStream
	return s.plugin.guardedRequest(s)
}

// OnRequestBody implements abi.BodyHandler: a request whose reservation comes from its
// body is decided once it is in (bodycost.go); one still undecided (waiting for its
// remote decisions or its slot) keeps its body with its headers; every other chunk goes
// on as it is.
func (vm *VM) OnRequestBody(id uint32, size int, endOfStream bool) abi.Action {
	s := vm.streams.get(id)
	if s == nil {
		return abi.ActionContinue
	}
	if w := s.body; w != nil && w.reading {
		return s.plugin.guardedBody(s, size, endOfStream)
	}
	if s.rwait != nil || s.hold != nil || s.cwait != nil {
		return abi.ActionPause
	}
	return abi.ActionContinue
}

// OnResponseHeaders implements abi.Handler.
func (vm *VM) OnResponseHeaders(id uint32, numHeaders int, endOfStream bool) abi.Action {
	if vm.QuickResponseHeaders(id) {
		// Nothing to add and nothing to settle: onResponse would return
		// at once; skip its deferred recover.
		return abi.ActionContinue
	}
	s := vm.streams.get(id)
	return s.plugin.guardedResponse(s)
}

// OnResponseBody implements abi.BodyHandler: a settling stream's body is read for its
// cost (cost.go); every chunk goes on as it is.
func (vm *VM) OnResponseBody(id uint32, size int, endOfStream bool) abi.Action {
	if vm.QuickResponseBody(id) {
		return abi.ActionContinue
	}
	s := vm.streams.get(id)
	s.plugin.guarded(func() { s.plugin.billBody(s, size) })
	return abi.ActionContinue
}

// OnResponseTrailers implements abi.BodyHandler: a settling stream's cost may be a
// trailer.
func (vm *VM) OnResponseTrailers(id uint32, n int) abi.Action {
	s := vm.streams.get(id)
	if s == nil || s.bill == nil {
		return abi.ActionContinue
	}
	s.plugin.guarded(func() { s.plugin.billTrailers(s) })
	return abi.ActionContinue
}

// OnLog implements abi.Handler: the stream is released (as at proxy_on_done). The module
// make build ships does not export proxy_on_log (filter/abi/exports_wasip1.go); the one for
// the proxytest emulator, which never sends a stream's proxy_on_done, does.
func (vm *VM) OnLog(id uint32) {
	if vm.release(id) {
		vm.endedID = id
	}
}

// OnDone implements abi.Handler. A root context that ends (the proxy stops,
// or a new configuration replaced it and it drained) gives back the
// admissions its leases still hold (lease.go).
//
// Under backend "rls" those returns are gRPC calls, and a host deletes a
// root context's gRPC calls with it (Envoy's Context::~Context cancels
// them), so a root with rls calls in flight answers false and calls
// proxy_done once the last of them is answered, failed or given up by the
// guard (maybeDone) — as proxy-wasm-cpp-host's WasmBase::startShutdown
// expects of a root that still has work. Redis calls need no wait: a
// command sent cannot be unsent.
func (vm *VM) OnDone(id uint32) bool {
	if vm.release(id) {
		// A stream's proxy_on_done, once per request: it ends here, with no
		// map lookup (proxy_on_delete follows).
		vm.endedID = id
		return true
	}
	if id != 0 && id == vm.endedID {
		return true // a stream released at proxy_on_log already
	}
	root := vm.plugins[id]
	if root == nil {
		return true
	}
	for i := 0; i < root.configs(); i++ {
		if hs := root.configAt(i).holds; hs != nil {
			hs.refuseAll(vm.host.Now())
		}
		if bw := root.configAt(i).bodies; bw != nil {
			bw.expire(vm.host.Now(), true)
		}
		if cs := root.configAt(i).conc; cs != nil {
			cs.refuseAll(vm.host.Now())
		}
	}
	vm.returnLeases(root)
	if !rlsInFlight(root) {
		return true
	}
	vm.donePending = append(vm.donePending, id)
	return false
}

// returnLeases gives back what root's lease pools hold.
func (vm *VM) returnLeases(root *Plugin) {
	for i := 0; i < root.configs(); i++ {
		root.configAt(i).remote.endLeases(vm.host.Now())
	}
}

// rlsInFlight reports whether the rls backend of one of root's
// configurations has calls in flight.
func rlsInFlight(root *Plugin) bool {
	for i := 0; i < root.configs(); i++ {
		if q := root.configAt(i); q.rls != nil && q.remote.inFlight() {
			return true
		}
	}
	return false
}

// maybeDone calls proxy_done for root context id if it answered false from
// proxy_on_done and its last rls call has ended. A grant that arrived in
// the meantime is returned first (its return is one more call to wait for).
func (vm *VM) maybeDone(id uint32) {
	k := -1
	for i, d := range vm.donePending {
		if d == id {
			k = i
		}
	}
	root := vm.plugins[id]
	if k < 0 || root == nil {
		return
	}
	vm.returnLeases(root)
	if rlsInFlight(root) {
		return
	}
	vm.donePending = append(vm.donePending[:k], vm.donePending[k+1:]...)
	for i := 0; i < root.configs(); i++ {
		if rs := root.configAt(i).rls; rs != nil {
			rs.gh.Done()
			return
		}
	}
}

// OnDelete implements abi.Handler.
func (vm *VM) OnDelete(id uint32) {
	if vm.release(id) {
		return
	}
	if id != 0 && id == vm.endedID {
		// The stream released at its proxy_on_done or access log: context
		// ids are unique among root and stream contexts, so it is not a
		// root context.
		vm.endedID = 0
		return
	}
	if _, ok := vm.plugins[id]; ok {
		delete(vm.plugins, id)
		if vm.lastRootID == id {
			vm.lastRootID, vm.lastRoot = 0, nil
		}
	}
}

// OnTick implements abi.Handler: the remote backends' guards and the
// release of held requests (hold.go).
func (vm *VM) OnTick(rootID uint32) {
	if root := vm.plugins[rootID]; root != nil {
		held := false
		for i := 0; i < root.configs(); i++ {
			p := root.configAt(i)
			if p.remote != nil {
				p.remote.tick()
			}
			if p.obs != nil && p.obs.top != nil {
				p.obs.top.tick(vm.host.Now())
			}
			if p.holds != nil {
				p.holds.release(vm.host.Now())
				held = true
			}
			if p.bodies != nil {
				p.bodies.expire(vm.host.Now(), false)
				held = true
			}
			if p.conc != nil {
				p.conc.tick(vm.host.Now())
				held = true
			}
		}
		if held {
			root.retick(vm.host.Now(), 0)
		}
		if len(vm.donePending) > 0 {
			vm.maybeDone(rootID)
		}
	}
}

// release frees the stream id; false if there is none.
func (vm *VM) release(id uint32) bool {
	s := vm.streams.remove(id)
	if s == nil {
		return false
	}
	if s.hold != nil {
		s.plugin.holds.abandon(s)
	}
	if s.body != nil {
		s.plugin.bodies.drop(s)
	}
	if s.bill != nil {
		s.plugin.guarded(func() { s.plugin.settle(s) })
	}
	if s.cwait != nil {
		s.plugin.conc.abandon(s)
	}
	if s.conc != nil {
		s.plugin.guarded(func() { s.plugin.conc.releaseStream(s, vm.host.Now()) })
	}
	vm.recycle(s)
	return true
}

// recycle keeps a released stream for the next one (up to maxFreeStreams).
func (vm *VM) recycle(s *stream) {
	*s = stream{}
	if len(vm.free) < maxFreeStreams {
		vm.free = append(vm.free, s)
	}
}

// Streams returns the number of live stream contexts (for tests).
func (vm *VM) Streams() int { return vm.streams.len() }

// guardedRequest runs onRequest, turning a panic into a logged error and
// the failure_mode outcome.
func (p *Plugin) guardedRequest(s *stream) (act abi.Action) {
	defer func() {
		if r := recover(); r != nil {
			act = s.plugin.recovered(s, r)
		}
	}()
	// The configuration that applies: p's own or one of its scopes'
	// (scope.go); the stream belongs to it from now on.
	p.props.reset(p.host)
	q := p.selectPlugin()
	if q == nil {
		return abi.ActionContinue
	}
	s.plugin = q
	return q.onRequest(s)
}

// guardedBody reads a body chunk of s for its reservation, turning a panic into a
// logged error and the failure_mode outcome (as at the headers).
func (p *Plugin) guardedBody(s *stream, size int, eos bool) (act abi.Action) {
	defer func() {
		if r := recover(); r != nil {
			if s.body != nil {
				p.bodies.unlink(s.body)
			}
			act = p.recovered(s, r)
		}
	}()
	return p.bodies.read(s, size, eos)
}

// guarded runs f, turning a panic into a logged error.
func (p *Plugin) guarded(f func()) {
	defer func() {
		if r := recover(); r != nil {
			p.recovered(nil, r)
		}
	}()
	f()
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
