package host

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// job is one unit of work for a worker: advance a stream, abort one, or run fn.
type job struct {
	s     *stream
	abort bool
	fn    func(w *worker)
}

// worker owns one VM and the goroutine that makes every call into it.
type worker struct {
	h    *Host
	id   int
	jobs chan job
	// replies carries the outcomes of extension calls (Guest.Start's deliver: Redis
	// replies), which the loop takes before jobs: a reply completes requests already
	// admitted to the VM, so it does not wait behind the new requests queued meanwhile
	// (a burst of three proxies on one key: a reply waited up to 0.3 s there under load).
	replies chan job
	quit    chan struct{}
	exited  chan struct{}

	vm      *vm // current VM; nil while none is configured
	pending []*stream
	// advancing is the stream advance is running: a held stream that its own
	// proxy_on_request_body continues is not woken again (it is paused during that call).
	advancing *stream
	// lastLoad is when the worker last loaded a VM, or tried to: its start, or its last
	// reload (FailReload measures the backoff from it; worker.reloadDue).
	lastLoad time.Time
	// configs holds, per plugin, the configuration in force on this worker: a VM created
	// for it (at start, after a trap) gets one root per plugin configured with these.
	configs [][]byte
	// inForce publishes configs for Snapshot (nil: still the Options' configurations).
	inForce atomic.Pointer[[][]byte]

	// closing is set when Close has begun the worker's shutdown (beginShutdown): no new
	// streams, no fresh VM after a trap. drained, while non-nil, is closed once the VM has
	// no root context left and no host call in flight (or has died).
	closing bool
	drained chan struct{}

	callStart atomic.Int64 // UnixNano when the current guest call started; 0 when idle
	callVM    atomic.Pointer[vm]

	memBytes       atomic.Uint64
	restarts       atomic.Uint64
	reloadBackoffs atomic.Uint64 // requests refused a reload by FailReload's backoff
	requests       atomic.Uint64
	failed         atomic.Uint64
	healthy        atomic.Bool
}

func newWorker(h *Host, id int) *worker {
	w := &worker{
		h:       h,
		id:      id,
		jobs:    make(chan job, 256),
		replies: make(chan job, 1024),
		quit:    make(chan struct{}),
		exited:  make(chan struct{}),
	}
	w.healthy.Store(true)
	return w
}

// post queues j. It fails only when ctx ends or the host is closed.
func (w *worker) post(ctx context.Context, j job) error {
	select {
	case w.jobs <- j:
		return nil
	default:
	}
	select {
	case w.jobs <- j:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-w.quit:
		return ErrClosed
	}
}

// postAsync queues j without blocking the caller.
func (w *worker) postAsync(j job) {
	select {
	case w.jobs <- j:
	default:
		go func() {
			select {
			case w.jobs <- j:
			case <-w.quit:
			}
		}()
	}
}

// postReply queues j, an extension call's outcome, on the replies the loop takes first.
func (w *worker) postReply(j job) {
	select {
	case w.replies <- j:
	default:
		go func() {
			select {
			case w.replies <- j:
			case <-w.quit:
			}
		}()
	}
}

func (w *worker) stop() {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	select {
	case <-w.exited:
	case <-time.After(5 * time.Second): // a guest stuck in a loop cannot be interrupted
	}
}

func (w *worker) loop() {
	defer close(w.exited)
	// One timer for the earliest tick due on any root context of the VM; re-armed when the
	// VM changes or a root's period (or the set of roots) does.
	// The timer is the host's clock's (Options.Clock).
	var tickC <-chan time.Time
	stop := func() bool { return false }
	var armed *vm
	defer func() {
		stop()
		if w.vm != nil {
			w.vm.close()
		}
	}()
	for {
		if v := w.vm; v != armed || (v != nil && v.tickChanged) {
			armed, tickC = v, nil
			stop()
			if v != nil {
				v.tickChanged = false
				if d, ok := v.nextTickIn(w.h.clock.Now()); ok {
					tickC, stop = w.h.clock.NewTimer(d)
				}
			}
		}
		select {
		case j := <-w.replies: // first, whatever else is ready
			w.do(j)
		default:
			select {
			case j := <-w.replies:
				w.do(j)
			case j := <-w.jobs:
				w.do(j)
			case <-tickC:
				w.tick(false)
			case <-w.quit:
				return
			}
		}
		for len(w.pending) > 0 {
			s := w.pending[0]
			w.pending[0] = nil
			w.pending = w.pending[1:]
			w.advance(s)
		}
		w.deleteDone()
		w.checkDrained()
		w.updateMemory()
	}
}

func (w *worker) updateMemory() {
	if w.vm != nil {
		w.memBytes.Store(w.vm.memorySize())
	}
}

func (w *worker) do(j job) {
	switch {
	case j.fn != nil:
		j.fn(w)
	case j.abort:
		w.abort(j.s)
	default:
		w.advance(j.s)
	}
}

// current returns the worker's VM, or nil when it has none: its VM failed and the failure
// policy keeps it failed (FailClosed, FailOpen), or FailReload's backoff since the last load
// has not passed. Under FailReload a request that comes after the backoff reloads the VM
// first, as Envoy's PluginConfig::maybeReloadHandleIfNeeded does when it creates the
// request's filter.
func (w *worker) current() *vm {
	if w.vm != nil && !w.vm.dead {
		return w.vm
	}
	if w.closing || w.h.opts.FailurePolicy != FailReload || !w.reloadDue() {
		return nil
	}
	w.restart()
	return w.vm
}

func (w *worker) restart() {
	w.lastLoad = w.h.clock.Now()
	v, err := w.h.newVM(context.Background(), w)
	if err != nil {
		w.h.log.Error("host: re-creating the VM failed; requests on this worker fail until it succeeds", "worker", w.id, "error", err)
		w.vm = nil
		w.healthy.Store(false)
		return
	}
	w.vm = v
	w.restarts.Add(1)
	w.healthy.Store(true)
	w.h.log.Info("host: worker has a fresh VM", "worker", w.id, "restarts", w.restarts.Load())
}

// trap handles a failed guest call on v: v is closed, and the worker has no VM until the
// failure policy gives it one (current). Streams paused on v fail now; the others (their
// goroutine owns them between phases) find out at their next step, when vmFor sees that
// their VM is gone. The caller marks the stream it was advancing.
func (w *worker) trap(v *vm, where string, err error) {
	w.h.log.Error("host: guest trapped; the VM is failed", "worker", w.id, "in", where, "error", err, "failure_policy", w.h.opts.FailurePolicy)
	v.dead = true
	for _, s := range v.streams {
		if s.paused {
			s.failed = true
			s.paused, s.held = false, false
			if s != w.advancing {
				w.pending = append(w.pending, s)
			}
		}
	}
	v.streams = nil
	v.close()
	if w.vm == v {
		w.vm = nil
		w.healthy.Store(false)
	}
}

// tick calls proxy_on_tick(root) for every root context with a tick period that is due —
// or, with force, for every root context with a tick period (as cpp-host keeps one timer per
// root context: Envoy's Wasm::setTickPeriod and Wasm::tickHandler). A root's next tick is
// due one period after this one starts.
func (w *worker) tick(force bool) {
	v := w.vm
	if v == nil || v.dead || v.onTick == nil {
		return
	}
	now := w.h.clock.Now()
	v.tickChanged = true
	for _, r := range v.roots { // a tick callback cannot add or end roots
		if r.tickMS == 0 || (!force && now.Before(r.nextTick)) {
			continue
		}
		r.nextTick = now.Add(time.Duration(r.tickMS) * time.Millisecond)
		v.setRoot(r)
		if _, err := v.call(v.onTick, uint64(r.id)); err != nil {
			w.trap(v, "proxy_on_tick", err)
			return
		}
	}
}

// reconfigure gives plugin a new root context on this worker's VM configured with config
// (Reconfigure). On success new streams of the plugin get the new root and the old one
// drains; a refusal leaves the old root in force (the refused root gets proxy_on_done and
// proxy_on_delete); a trap replaces the VM, which is re-created with the previous
// configuration.
func (w *worker) reconfigure(plugin int, config []byte) error {
	v := w.vm
	if v == nil || v.dead {
		// No VM to ask: the next one is created with the new configuration.
		w.setConfig(plugin, config)
		w.h.log.Warn("host: reconfigure: worker has no VM; its next VM gets the new configuration", "worker", w.id, "plugin", plugin)
		return nil
	}
	r, err := v.startRoot(plugin, config)
	if err != nil {
		if v.dead {
			w.trap(v, "reconfigure", err)
			// Envoy would not get here: its canary VM configures the update first and
			// a trap there NACKs it, leaving the workers' VMs as they are. The nearest
			// equivalent: this worker gets a fresh VM with the previous configuration
			// at once, whatever the failure policy.
			if !w.closing {
				w.restart()
			}
			return fmt.Errorf("worker %d: %w (the VM was replaced; the previous configuration stays in force)", w.id, err)
		}
		w.retire(v, r)
		return fmt.Errorf("worker %d: %w; the previous configuration stays in force", w.id, err)
	}
	old := v.active[plugin]
	v.active[plugin] = r
	w.setConfig(plugin, config)
	old.draining = true
	if old.streams == 0 {
		w.retire(v, old)
	}
	return nil
}

// retire ends root context r — a replaced root that no stream has as parent any more, one
// whose configuration the guest refused, or, when the Host closes, every root: proxy_on_done,
// then, if it answers true (or does not export it), proxy_on_delete at once (deleteRoot). A
// root that answers false stays, pending, until it calls proxy_done (hcDone; it is deleted
// after the guest call it did that in) — or, when the Host closes, until Close's deadline.
// Meanwhile it keeps its ticks and its calls' replies. This is cpp-host's
// WasmBase::startShutdown(plugin_key) / startShutdown() with pending_done_, and
// WasmBase::done / finishShutdown (src/wasm.cc).
func (w *worker) retire(v *vm, r *rootCtx) {
	if r.done {
		return // proxy_on_done ran already
	}
	r.done = true
	v.setRoot(r)
	ok := true
	if v.onDone != nil {
		res, err := v.call(v.onDone, uint64(r.id))
		if err != nil {
			w.trap(v, "proxy_on_done", err)
			return
		}
		ok = uint32(res) != 0
	}
	if !ok {
		r.pendingDone = true
		w.h.log.Debug("host: root context answered false from proxy_on_done; it is deleted when it calls proxy_done", "worker", w.id, "root", r.id)
		return
	}
	w.deleteRoot(v, r)
}

// deleteRoot runs proxy_on_delete for root r and forgets it. Its HTTP and gRPC calls still in
// flight are cancelled, as Envoy's Context destructor cancels a deleted context's requests
// (envoyproxy/envoy source/extensions/common/wasm/context.cc, Context::~Context); calls of
// extensions (Redis) are not: their replies are dropped (their root is gone), but Close waits
// for them, so what was sent reaches its server.
func (w *worker) deleteRoot(v *vm, r *rootCtx) {
	v.setRoot(r)
	if err := v.callOpt(v.onDelete, r.id); err != nil {
		w.trap(v, "proxy_on_delete", err)
		return
	}
	v.removeRoot(r)
	v.cancelCalls(r.id)
}

// deleteDone deletes the roots that called proxy_done during the last guest call (cpp-host
// defers their onDelete until the call has returned: WasmBase::done's after-VM-call action).
func (w *worker) deleteDone() {
	v := w.vm
	for v != nil && !v.dead && len(v.doneRoots) > 0 {
		r := v.doneRoots[0]
		v.doneRoots = v.doneRoots[1:]
		if v.root(r.id) == r {
			w.deleteRoot(v, r)
		}
	}
}

// beginShutdown starts the worker's part of Close once requests have drained (or the drain
// deadline passed): streams still waiting on the worker fail (they get proxy_on_log,
// proxy_on_done and proxy_on_delete first), no stream starts after this, and every root
// context gets proxy_on_done (retire), as cpp-host's WasmBase::startShutdown() does when
// Envoy lets go of the VM. drained is closed when the VM has no root left and no host call in
// flight — roots that answered false having called proxy_done, their calls' replies
// delivered, extension calls of deleted roots completed — or has died.
func (w *worker) beginShutdown(drained chan struct{}) {
	w.closing = true
	w.drained = drained
	v := w.vm
	if v != nil && !v.dead {
		ids := make([]uint32, 0, len(v.streams))
		for id, s := range v.streams {
			if s.waiting.Load() {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			s := v.streams[id]
			if s == nil || v.dead {
				continue
			}
			w.abort(s) // log, done, delete
			s.failed = true
			s.waiting.Store(true)
			s.signal()
		}
		for _, r := range slices.Clone(v.roots) {
			if v.dead {
				break
			}
			if v.root(r.id) == r {
				w.retire(v, r)
			}
		}
		w.deleteDone()
	}
	w.checkDrained()
}

// checkDrained closes drained once the closing worker's VM has nothing left to wait for.
func (w *worker) checkDrained() {
	if w.drained == nil {
		return
	}
	if v := w.vm; v != nil && !v.dead && (len(v.roots) > 0 || v.callsInFlight() > 0) {
		return
	}
	close(w.drained)
	w.drained = nil
}

// finishShutdown runs after Close's deadline: roots still waiting to call proxy_done get
// proxy_on_delete now (what cpp-host's finishShutdown does for them when they call it).
func (w *worker) finishShutdown() {
	w.closing = true
	v := w.vm
	for v != nil && !v.dead {
		var r *rootCtx
		for _, x := range v.roots {
			if x.pendingDone {
				r = x
				break
			}
		}
		if r == nil {
			return
		}
		r.pendingDone = false
		w.h.log.Warn("host: closing: root context did not call proxy_done before the deadline; deleting it", "worker", w.id, "root", r.id)
		w.deleteRoot(v, r)
	}
}

// wake schedules a paused stream to continue after the current guest call.
func (w *worker) wake(s *stream) {
	w.pending = append(w.pending, s)
}

// abort ends a stream whose caller went away: log/done/delete, no signal needed.
func (w *worker) abort(s *stream) {
	s.aborted = true
	s.steps = 0
	s.paused, s.held = false, false
	s.waiting.Store(false)
	w.finish(s)
}

// advance runs the stream's remaining steps until it pauses or they are done.
func (w *worker) advance(s *stream) {
	w.advancing = s
	// A held stream (held.go) is paused, yet its body steps run.
	for s.steps != 0 && (!s.paused || s.held && s.steps&stepReqBody != 0) {
		if s.failed || s.aborted {
			s.steps = 0
			if s.held {
				s.held, s.paused = false, false
			}
			break
		}
		step := s.steps & -s.steps
		s.steps &^= step
		if step == stepFinish {
			w.finish(s)
			continue
		}
		if step == stepUpstream {
			s.callUpstream()
			continue
		}
		v := w.vmFor(s, step)
		if v == nil {
			continue // s.failed is set
		}
		v.cur, v.curID, v.curRoot = s, s.id, s.root
		if !w.callStep(v, s, step) {
			continue // trapped: s.failed is set
		}
		if s.local != nil {
			// A local response ends the phase it was sent in.
			if step&requestSteps != 0 {
				s.steps &^= requestSteps
			} else {
				s.steps &^= stepRespBody
			}
		}
	}
	w.advancing = nil
	if !s.paused {
		s.signal()
	}
}

// callStep calls the plugin's callback of step on VM v for stream s; false when the VM
// trapped (s is failed).
func (w *worker) callStep(v *vm, s *stream, step uint8) bool {
	switch step {
	case stepReqHeaders:
		w.requests.Add(1)
		r, err := v.call(v.onRequestHeaders, uint64(s.id), uint64(len(s.reqHeaders.kv)), b2u(s.reqHeadersEOS))
		if err != nil {
			w.trap(v, "proxy_on_request_headers", err)
			s.failed = true
			return false
		}
		if (r == actionPause || v.lastStopped) && s.local == nil {
			// Pause, or StopAllIterationAndWatermark because a local reply for another
			// stream raised cpp-host's VM-wide flag during this callback: either way the
			// stream waits for proxy_continue_stream.
			s.paused, s.pauseOn = true, streamHTTPRequest
			if r == actionPause && !v.lastStopped && !s.reqHeadersEOS && w.h.opts.AllowOnHeadersStopIteration {
				s.held = true // allow_on_headers_stop_iteration: the body still flows (held.go)
			}
		}
	case stepReqBody:
		s.bodyAction = actionContinue
		if v.onRequestBody != nil {
			r, err := v.call(v.onRequestBody, uint64(s.id), uint64(len(s.reqBody)), b2u(s.reqBodyEOS))
			if err != nil {
				w.trap(v, "proxy_on_request_body", err)
				s.failed = true
				return false
			}
			s.bodyAction = r
			if v.lastStopped {
				s.bodyAction = actionPause
			}
		}
		if s.held {
			w.heldBodyDone(s)
		}
	case stepRespHeaders:
		s.respPhase = true
		if v.onResponseHeaders != nil {
			r, err := v.call(v.onResponseHeaders, uint64(s.id), uint64(len(s.respHeaders.kv)), b2u(s.respHeadersEOS))
			if err != nil {
				w.trap(v, "proxy_on_response_headers", err)
				s.failed = true
				return false
			}
			if (r == actionPause || v.lastStopped) && s.local == nil {
				s.paused, s.pauseOn = true, streamHTTPResponse
			}
		}
	case stepRespBody:
		s.bodyAction = actionContinue
		if v.onRespBody != nil {
			r, err := v.call(v.onRespBody, uint64(s.id), uint64(len(s.respBody)), b2u(s.respBodyEOS))
			if err != nil {
				w.trap(v, "proxy_on_response_body", err)
				s.failed = true
				return false
			}
			s.bodyAction = r
			if v.lastStopped {
				s.bodyAction = actionPause
			}
		}
	}
	return true
}

// vmFor returns the VM the stream lives on, creating the stream's context on the first step.
// It returns nil (and marks the stream failed) when that VM is gone.
func (w *worker) vmFor(s *stream, step uint8) *vm {
	if !s.created {
		if w.closing { // Close has begun: the roots are ending, no stream starts
			s.failed = true
			return nil
		}
		v := w.current()
		if v == nil {
			s.failed = true
			// Envoy creates no filter for the request under FAIL_OPEN
			// (PluginConfig::createContext returns nullptr), a failing one otherwise.
			s.bypass = w.h.opts.FailurePolicy == FailOpen
			return nil
		}
		s.vm = v
		s.id = v.newContextID()
		r := v.active[s.plugin]
		s.root = r
		r.streams++
		v.streams[s.id] = s
		s.created = true
		v.cur, v.curID, v.curRoot = s, s.id, r
		if _, err := v.call(v.onContextCreate, uint64(s.id), uint64(r.id)); err != nil {
			w.trap(v, "proxy_on_context_create", err)
			s.failed = true
			return nil
		}
		return v
	}
	if s.vm == nil || s.vm.dead || s.vm != w.vm {
		s.failed = true
		return nil
	}
	return s.vm
}

// finish runs proxy_on_log, proxy_on_done and proxy_on_delete once.
func (w *worker) finish(s *stream) {
	if s.ended || !s.created {
		s.ended = true
		return
	}
	s.ended = true
	v := s.vm
	if v == nil || v.dead || v != w.vm {
		return
	}
	v.cur, v.curID, v.curRoot = s, s.id, s.root
	if err := v.callOpt(v.onLog, s.id); err != nil {
		w.trap(v, "proxy_on_log", err)
		return
	}
	if err := v.callOpt(v.onDone, s.id); err != nil {
		w.trap(v, "proxy_on_done", err)
		return
	}
	if err := v.callOpt(v.onDelete, s.id); err != nil {
		w.trap(v, "proxy_on_delete", err)
		return
	}
	delete(v.streams, s.id)
	r := s.root
	r.streams--
	if v.cur == s {
		v.setRoot(r)
	}
	if r.draining && r.streams == 0 && !w.closing {
		w.retire(v, r)
	}
}
