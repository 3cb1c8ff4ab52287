package dynmod

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/shareddata"
)

// rootID is the root context of every worker's VM; streams are numbered from rootID+1.
const rootID = 1

// maxConfigs bounds the filter configurations alive at once (each listener's filter chain
// holds one; a configuration update makes a new one and the old one ends when its streams
// drain).
const maxConfigs = 4096

// tickEvent is the one event the shell schedules: the VM's tick.
const tickEvent = 1

// module is the process: one Go runtime, one shared-data map (as one vm_id in Proxy-Wasm:
// every configuration of the library, and every configuration after an update, sees the
// same keys), and the live filter configurations.
type module struct {
	env     envoy
	now     func() int64 // Unix ns: the wall clock, or a test's
	shared  *shareddata.Map
	mu      sync.Mutex // configs' allocation
	configs [maxConfigs]atomic.Pointer[filterConfig]
	procs   int // GOMAXPROCS set so far (0: not yet)
}

func newModule(env envoy) *module {
	return &module{env: env, now: func() int64 { return time.Now().UnixNano() }, shared: shareddata.New()}
}

// filterConfig is one filter configuration: the plugin configuration compiled into one VM
// per Envoy worker (each worker thread runs its own VM, as Envoy runs one Wasm VM per
// worker; their state is shared through m.shared, exactly, with compare-and-swap).
type filterConfig struct {
	m       *module
	ptr     configPtr
	name    string
	failure config.FailureMode // the top-level failure_mode, for the shell's own panics
	data    []byte
	workers []*worker

	// Metrics defined while the configuration was made (Envoy defines them then only):
	// the VMs' ids index metrics.
	defining bool
	metrics  []metric
	byName   map[metricKey]uint32
}

type metricKey struct {
	kind metricKind
	name string
}

type metric struct {
	kind metricKind
	id   uint64
}

// worker is one Envoy worker's VM and what the shell keeps for its streams. Envoy calls a
// worker's hooks from its thread only; mu also orders them against the tick timer and the
// main thread (configuration end), and is never contended on the request path.
type worker struct {
	mu    sync.Mutex
	cfg   *filterConfig
	index int
	vm    *filter.VM
	host  host
	next  uint32 // the last stream id given

	live map[uint32]*liveStream // streams the VM still holds after their request headers

	// The VM's tick (proxy_on_tick): a Go timer, delivered on the worker's thread through the
	// scheduler of a paused stream (the only streams a tick acts on: held, or waiting for
	// their body).
	tickMS  uint32
	timer   *time.Timer
	pending uint32 // the stream whose scheduler carries an undelivered tick (0: none)
	paused  map[uint32]*liveStream

	fx     effects // made once the lock is released (unlock)
	packed []byte  // the prepared headers of the last stream ended at its request
}

// unlock releases w and then makes the effects of the hook (effects.go).
func (w *worker) unlock() {
	if len(w.fx.list) == 0 {
		w.mu.Unlock()
		return
	}
	fx := w.fx
	w.fx = effects{} // a hook Envoy runs from within them queues its own
	w.mu.Unlock()
	fx.run(w.cfg.m.env)
	w.mu.Lock()
	if len(w.fx.list) == 0 {
		w.fx = fx // keep the buffers
	}
	w.mu.Unlock()
}

// prepared receives the response headers of a stream Go ended at its request headers.
type prepared interface {
	set(packed []byte, n int)
}

// liveStream is a stream the VM holds past its request headers.
type liveStream struct {
	id     uint32
	f      filterPtr
	sched  schedPtr
	paused bool
}

// errRefused: a VM refused the configuration, and logged why.
var errRefused = errors.New("sluice: invalid plugin configuration")

var errTooManyConfigs = errors.New("sluice: " + strconv.Itoa(maxConfigs) + " filter configurations are alive already")

// newConfig compiles a filter configuration (Envoy's main thread, config_new): one VM per
// worker, each configured as Envoy configures a Wasm root context. The error is what the
// VMs logged (the JSON paths of a bad configuration), and Envoy refuses the configuration.
func (m *module) newConfig(ptr configPtr, name string, data []byte) (uint32, error) {
	n := max(m.env.concurrency(), 1)
	c := &filterConfig{m: m, ptr: ptr, name: name, data: append([]byte(nil), data...),
		defining: true, byName: map[metricKey]uint32{}}
	m.setProcs(n)
	for i := 0; i < n; i++ {
		w := &worker{cfg: c, index: i, next: rootID, live: map[uint32]*liveStream{}, paused: map[uint32]*liveStream{}}
		w.host = host{w: w}
		w.vm = filter.NewVM(&w.host)
		w.vm.OnContextCreate(rootID, 0)
		if !w.vm.OnConfigure(rootID, len(c.data)) {
			return 0, errRefused
		}
		c.workers = append(c.workers, w)
	}
	c.defining = false
	if cfg, err := config.ParseFor(c.data, config.BuildDynamic); err == nil {
		c.failure = cfg.FailureMode
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.configs {
		if m.configs[i].Load() == nil {
			m.configs[i].Store(c)
			return uint32(i + 1), nil
		}
	}
	return 0, errTooManyConfigs
}

// setProcs sets GOMAXPROCS to the workers of the largest configuration plus two: each Envoy
// worker that calls into Go keeps a P (in the system-call state while it runs Envoy's code
// between two calls), the keeper holds one (keeper.go), and one more stays idle. The runtime's
// monitor takes a P back from a thread in a system call after 20 µs when no P is idle (after
// 10 ms when one is): with an idle P a busy worker keeps its own and re-enters Go on the fast
// path, and the monitor, with nothing to take, sleeps ever longer. With one P fewer it took a
// worker's P nearly every request. GOMAXPROCS in the environment is the operator's choice and
// is kept.
func (m *module) setProcs(workers int) {
	want := workers + 2
	if want > m.procs {
		m.procs = want
		if os.Getenv("GOMAXPROCS") == "" {
			runtime.GOMAXPROCS(want)
		}
		startKeeper()
	}
}

// config returns configuration idx (nil when unknown).
func (m *module) config(idx uint32) *filterConfig {
	if idx == 0 || idx > maxConfigs {
		return nil
	}
	return m.configs[idx-1].Load()
}

// destroyConfig ends configuration idx (main thread, config_destroy: every stream of it has
// ended): each VM's root context ends as a Wasm root context does, returning what its
// leases hold and refusing what is still held.
func (m *module) destroyConfig(idx uint32) {
	c := m.config(idx)
	if c == nil {
		return
	}
	m.configs[idx-1].Store(nil)
	for _, w := range c.workers {
		w.mu.Lock()
		w.host.enter(0, nil)
		w.vm.OnDone(rootID)
		w.vm.OnDelete(rootID)
		if w.timer != nil {
			w.timer.Stop()
		}
		w.unlock()
	}
}

// worker returns the VM of the worker stream f runs on.
func (c *filterConfig) worker(f filterPtr) *worker {
	i := c.m.env.workerIndex(f)
	if i < 0 || i >= len(c.workers) {
		i = 0 // not expected: Envoy's concurrency is fixed for the process
	}
	return c.workers[i]
}

// requestHeaders is a stream's first call into Go: the VM creates the stream and decides it.
// When nothing later needs the VM (ended), the stream is over for Go: hdrs are the
// headers its response gets, which the C side adds, and the later hooks never enter Go.
func (c *filterConfig) requestHeaders(f filterPtr, eos bool, out prepared) (w *worker, id uint32, act abi.Action, ended bool) {
	w = c.worker(f)
	w.mu.Lock()
	defer w.unlock()
	w.next++
	if w.next == 0 || w.next == rootID {
		w.next = rootID + 1
	}
	id = w.next
	w.host.enter(id, f)
	done := false
	defer func() {
		if !done { // a panic in the shell: the VM forgets the stream
			w.vm.OnDone(id)
			w.vm.OnDelete(id)
			delete(w.live, id)
		}
	}()
	w.vm.OnContextCreate(id, rootID)
	act = w.vm.OnRequestHeaders(id, 0, eos)
	hdrs, ended := w.vm.EndAtRequest(id, act)
	if ended {
		if len(hdrs) > 0 {
			var n int
			w.packed, n = packHeaders(w.packed[:0], hdrs)
			out.set(w.packed, n)
		}
		done = true
		return w, id, act, true
	}
	s := &liveStream{id: id, f: f}
	w.live[id] = s
	if act == abi.ActionPause && !w.host.replied {
		w.pause(s)
	}
	done = true
	return w, id, act, false
}

// requestBody is a body chunk of a stream the VM holds.
func (w *worker) requestBody(id uint32, f filterPtr, size int, eos bool) abi.Action {
	w.mu.Lock()
	defer w.unlock()
	w.host.enter(id, f)
	act := w.vm.OnRequestBody(id, size, eos)
	if s := w.live[id]; s != nil {
		if act == abi.ActionPause {
			w.pause(s)
		} else {
			w.unpause(s)
		}
	}
	return act
}

func (w *worker) responseHeaders(id uint32, f filterPtr, eos bool) abi.Action {
	w.mu.Lock()
	defer w.unlock()
	w.host.enter(id, f)
	return w.vm.OnResponseHeaders(id, 0, eos)
}

func (w *worker) responseBody(id uint32, f filterPtr, size int, eos bool) abi.Action {
	w.mu.Lock()
	defer w.unlock()
	w.host.enter(id, f)
	return w.vm.OnResponseBody(id, size, eos)
}

func (w *worker) responseTrailers(id uint32, f filterPtr) abi.Action {
	w.mu.Lock()
	defer w.unlock()
	w.host.enter(id, f)
	return w.vm.OnResponseTrailers(id, 0)
}

// destroy ends a stream the VM holds (Envoy destroys the filter: the stream completed, was
// reset, or its connection closed), as proxy_on_done and proxy_on_delete end a Wasm stream.
func (w *worker) destroy(id uint32, f filterPtr) {
	w.mu.Lock()
	defer w.unlock()
	w.host.enter(id, f)
	w.vm.OnDone(id)
	w.vm.OnDelete(id)
	if s := w.live[id]; s != nil {
		delete(w.live, id)
		w.unpause(s)
		if s.sched != nil {
			w.cfg.m.env.deleteScheduler(s.sched)
		}
		if w.pending == id {
			// Its tick went with it (Envoy drops the events of a destroyed filter).
			w.pending = 0
			w.arm()
		}
	}
}

// scheduled is the tick, delivered on the worker's thread by stream id's scheduler.
func (w *worker) scheduled(id uint32, f filterPtr, event uint64) {
	w.mu.Lock()
	defer w.unlock()
	if w.pending == id {
		w.pending = 0
	}
	if event != tickEvent {
		return
	}
	w.host.enter(0, nil)
	w.host.hook = f // the tick's metrics go through the stream that carried it
	w.vm.OnTick(rootID)
	w.arm()
}

// pause records that s waits (held, or for its body): the tick must reach the VM while it
// does, through s's scheduler, made here on the worker's thread.
func (w *worker) pause(s *liveStream) {
	if s.paused {
		return
	}
	s.paused = true
	if s.sched == nil {
		s.sched = w.cfg.m.env.newScheduler(s.f)
	}
	w.paused[s.id] = s
	w.arm()
}

func (w *worker) unpause(s *liveStream) {
	if !s.paused {
		return
	}
	s.paused = false
	delete(w.paused, s.id)
}

// arm starts the tick timer when the VM wants ticks, some stream waits and no tick is on
// its way (w.mu held).
func (w *worker) arm() {
	if w.tickMS == 0 || len(w.paused) == 0 || w.pending != 0 {
		if w.timer != nil {
			w.timer.Stop()
		}
		return
	}
	d := time.Duration(w.tickMS) * time.Millisecond
	if w.timer == nil {
		w.timer = time.AfterFunc(d, w.fire)
		return
	}
	w.timer.Reset(d)
}

// fire runs on the timer's goroutine: it posts the tick to the worker's thread through a
// paused stream's scheduler (Envoy's scheduler commit may be called from any thread).
func (w *worker) fire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending != 0 {
		return
	}
	for _, s := range w.paused {
		if s.sched != nil {
			w.pending = s.id
			w.cfg.m.env.commit(s.sched, tickEvent)
			return
		}
	}
}
