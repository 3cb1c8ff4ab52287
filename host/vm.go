package host

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"
)

// rootContextID is the id of the first root context of a VM (plugin 0's, at start-up).
const rootContextID = 1

// rootCtx is one root context: one plugin's configuration in one VM. A plugin has one
// active root per VM (the parent of its new streams); Reconfigure replaces it, and the old
// one drains: it gets proxy_on_done and proxy_on_delete when its last stream has ended.
// Touched only on the VM's worker goroutine.
type rootCtx struct {
	id       uint32
	plugin   int
	config   []byte    // buffer type 7 for this root
	tickMS   uint32    // proxy_set_tick_period_milliseconds of this root; 0: no ticks
	nextTick time.Time // when the next proxy_on_tick is due (tickMS > 0)
	streams  int       // live streams created with this root as parent
	draining bool      // replaced by a newer root of its plugin
	// done: proxy_on_done has run; pendingDone: it answered false and the root waits, alive,
	// for its proxy_done (worker.retire).
	done, pendingDone bool
}

type vmKey struct{}

func vmFrom(ctx context.Context) *vm { return ctx.Value(vmKey{}).(*vm) }

// vm is one module instance. Everything in it is touched only on its worker's goroutine.
type vm struct {
	h    *Host
	w    *worker
	gen  uint64
	ctx  context.Context
	mod  api.Module
	mem  api.Memory // mod.Memory(), looked up once
	dead bool
	// linmem backs mem (linmem.go); released by close, after the module.
	linmem *linearMemory

	stack  [8]uint64 // for top-level guest calls
	mstack [1]uint64 // for proxy_on_memory_allocate (called from inside host calls)

	malloc, onContextCreate, onVMStart, onConfigure, onTick        api.Function
	onRequestHeaders, onRequestBody, onResponseHeaders, onRespBody api.Function
	onLog, onDone, onDelete, onHTTPCallResponse                    api.Function
	onGrpcReceive, onGrpcClose                                     api.Function

	nextContext uint32
	idWrapped   bool // nextContext wrapped around: new ids must skip live ones
	streams     map[uint32]*stream
	roots       []*rootCtx // live root contexts, oldest first (active and draining)
	active      []*rootCtx // per plugin, the root its new streams get as parent
	cur         *stream    // effective context: nil = the root curRoot
	curID       uint32
	curRoot     *rootCtx // root of the effective context (nil only before the first root)

	tickChanged bool // a root's tick period or the set of roots changed: re-arm the timer

	callouts    map[uint32]callout // proxy_http_call id -> the call in flight
	nextCallout uint32
	callResp    *httpCallResult // during proxy_on_http_call_response

	grpcCalls    map[uint32]grpcCall // proxy_grpc_call token -> the call in flight
	nextGrpcCall uint32              // the last token issued (cpp-host: 1 + 4n)

	extBuffers map[uint32][]byte // buffers set by extensions for their callbacks
	extCalls   int               // extension calls started (Guest.Start) and not yet delivered

	doneRoots []*rootCtx // roots that called proxy_done in the current guest call (worker.deleteDone)

	// Restricted callbacks (Profile.InitAllow / AllocAllow): nil = unrestricted.
	allow            map[string]bool
	restrictedDuring string
	// stopIteration is cpp-host's VM-wide flag raised by proxy_send_local_response;
	// lastStopped is its value when the last top-level call returned (then it is cleared).
	stopIteration, lastStopped bool

	scratch []byte
	names   map[string]string // interned header names (headerName)
	log     *slog.Logger
}

// guestWriter forwards a guest's stdout/stderr to the logger, a line at a time.
type guestWriter struct {
	mu     sync.Mutex
	log    *slog.Logger
	stream string
	buf    []byte
}

func (g *guestWriter) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.buf = append(g.buf, p...)
	for {
		i := strings.IndexByte(string(g.buf), '\n')
		if i < 0 {
			break
		}
		g.log.Warn("guest "+g.stream, "line", string(g.buf[:i]))
		g.buf = g.buf[i+1:]
	}
	if len(g.buf) > 4096 {
		g.log.Warn("guest "+g.stream, "line", string(g.buf))
		g.buf = g.buf[:0]
	}
	return len(p), nil
}

// newVM instantiates the module for worker w and runs the start-up sequence.
func (h *Host) newVM(ctx context.Context, w *worker) (*vm, error) {
	gen := h.genSeq.Add(1)
	v := &vm{
		h: h, w: w, gen: gen,
		nextContext:  rootContextID,
		streams:      map[uint32]*stream{},
		callouts:     map[uint32]callout{},
		grpcCalls:    map[uint32]grpcCall{},
		nextGrpcCall: calloutGrpcCall,
		log:          h.log.With("worker", w.id),
	}
	v.ctx = context.WithValue(context.Background(), vmKey{}, v)
	name := fmt.Sprintf("sluice-w%d-g%d", w.id, gen)
	mc := wazero.NewModuleConfig().
		WithName(name).
		WithStartFunctions().
		// wazero's own WASI (the wazero profile) reads the host's clock too.
		WithWalltime(func() (int64, int32) {
			t := h.clock.Now()
			return t.Unix(), int32(t.Nanosecond())
		}, sys.ClockResolution(1)).
		WithNanotime(func() int64 { return int64(h.clock.Now().Sub(h.monoBase)) + 1 }, sys.ClockResolution(1)).
		WithSysNanosleep().
		WithRandSource(rand.Reader).
		WithArgs(h.opts.PluginName).
		WithStdout(&guestWriter{log: v.log, stream: "stdout"}).
		WithStderr(&guestWriter{log: v.log, stream: "stderr"})
	v.linmem = &linearMemory{}
	t0 := time.Now()
	mod, err := h.rt.InstantiateModule(experimental.WithMemoryAllocator(v.ctx, v.linmem), h.compiled, mc)
	if err != nil {
		v.linmem.release()
		return nil, fmt.Errorf("host: instantiating module: %w", err)
	}
	v.mod = mod
	v.mem = mod.Memory()
	fail := func(err error) (*vm, error) {
		v.close()
		return nil, err
	}
	exp := func(name string) api.Function { return mod.ExportedFunction(name) }
	v.malloc = exp("proxy_on_memory_allocate")
	v.onContextCreate = exp("proxy_on_context_create")
	v.onVMStart = exp("proxy_on_vm_start")
	v.onConfigure = exp("proxy_on_configure")
	v.onTick = exp("proxy_on_tick")
	v.onRequestHeaders = exp("proxy_on_request_headers")
	v.onRequestBody = exp("proxy_on_request_body")
	v.onResponseHeaders = exp("proxy_on_response_headers")
	v.onRespBody = exp("proxy_on_response_body")
	v.onLog = exp("proxy_on_log")
	v.onDone = exp("proxy_on_done")
	v.onDelete = exp("proxy_on_delete")
	v.onHTTPCallResponse = exp("proxy_on_http_call_response")
	v.onGrpcReceive = exp("proxy_on_grpc_receive")
	v.onGrpcClose = exp("proxy_on_grpc_close")

	t1 := time.Now()
	for _, start := range []string{"_initialize", "_start"} {
		f := exp(start)
		if f == nil {
			continue
		}
		var err error
		v.restrict(h.profile.InitAllow, start, func() { _, err = f.Call(v.ctx) })
		if err != nil {
			return fail(fmt.Errorf("host: %s: %w", start, err))
		}
		break
	}
	t2 := time.Now()
	v.active = make([]*rootCtx, len(w.configs))
	for p, cfg := range w.configs {
		r, err := v.startRoot(p, cfg)
		if err != nil {
			return fail(err)
		}
		v.active[p] = r
	}
	t3 := time.Now()
	v.log.Debug("host: VM started", "instantiate", t1.Sub(t0).Round(time.Microsecond), "initialize", t2.Sub(t1).Round(time.Microsecond),
		"start_and_configure", t3.Sub(t2).Round(time.Microsecond), "memory_bytes", v.mem.Size())
	return v, nil
}

// pluginPrefix names the plugin in errors: nothing for plugin 0 (the only one, usually).
func pluginPrefix(p int) string {
	if p == 0 {
		return "host: "
	}
	return fmt.Sprintf("host: plugin %d: ", p)
}

// startRoot creates a root context for plugin p with configuration cfg, as cpp-host's
// WasmBase::start and WasmBase::configure do for a plugin (src/wasm.cc; ContextBase::onStart
// and ContextBase::onConfigure in src/context.cc): proxy_on_context_create(root, 0),
// proxy_on_vm_start(root, len(VMConfig)) — cpp-host calls it for every new root context,
// not once per VM — and proxy_on_configure(root, len(cfg)) with cfg as buffer type 7.
// The root is in v.roots from the start (the guest may make it effective); on an error it
// is still there, and v.dead tells a trap from a refusal.
func (v *vm) startRoot(p int, cfg []byte) (*rootCtx, error) {
	r := &rootCtx{id: v.newContextID(), plugin: p, config: cfg}
	v.roots = append(v.roots, r)
	v.setRoot(r)
	pre := pluginPrefix(p)
	if _, err := v.call(v.onContextCreate, uint64(r.id), 0); err != nil {
		return r, fmt.Errorf("%sproxy_on_context_create(root %d): %w", pre, r.id, err)
	}
	if v.onVMStart != nil {
		v.setRoot(r)
		ok, err := v.call(v.onVMStart, uint64(r.id), uint64(len(v.h.opts.VMConfig)))
		if err != nil {
			return r, fmt.Errorf("%sproxy_on_vm_start: %w", pre, err)
		}
		if uint32(ok) == 0 {
			return r, errors.New(pre + "proxy_on_vm_start returned false: the plugin refused to start (see its log)")
		}
	}
	if v.onConfigure != nil {
		v.setRoot(r)
		ok, err := v.call(v.onConfigure, uint64(r.id), uint64(len(cfg)))
		if err != nil {
			return r, fmt.Errorf("%sproxy_on_configure: %w", pre, err)
		}
		if uint32(ok) == 0 {
			return r, errors.New(pre + "proxy_on_configure returned false: the plugin rejected its configuration (see its log)")
		}
	}
	return r, nil
}

// newContextID allocates a context id (roots and streams share the counter, as in cpp-host's
// WasmBase::allocContextId). After the counter wraps, ids still in use are skipped.
func (v *vm) newContextID() uint32 {
	for {
		id := v.nextContext
		v.nextContext++
		if v.nextContext == 0 {
			v.nextContext = 1
			v.idWrapped = true
		}
		if !v.idWrapped {
			return id
		}
		if _, live := v.streams[id]; !live && id != 0 && v.root(id) == nil {
			return id
		}
	}
}

// root returns the live root context id, or nil.
func (v *vm) root(id uint32) *rootCtx {
	for _, r := range v.roots {
		if r.id == id {
			return r
		}
	}
	return nil
}

// setRoot makes root r the effective context.
func (v *vm) setRoot(r *rootCtx) { v.cur, v.curID, v.curRoot = nil, r.id, r }

// removeRoot forgets r (after its proxy_on_delete, or when the guest refused it).
func (v *vm) removeRoot(r *rootCtx) {
	for i, x := range v.roots {
		if x == r {
			v.roots = append(v.roots[:i], v.roots[i+1:]...)
			break
		}
	}
	if r.tickMS > 0 {
		v.tickChanged = true
	}
	if v.curRoot == r && v.cur == nil {
		v.setRoot(v.active[r.plugin])
	}
}

// nextTickIn is the time until the earliest proxy_on_tick due on any root; false when no
// root has a tick period.
func (v *vm) nextTickIn(now time.Time) (time.Duration, bool) {
	var first time.Time
	for _, r := range v.roots {
		if r.tickMS > 0 && (first.IsZero() || r.nextTick.Before(first)) {
			first = r.nextTick
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return max(first.Sub(now), 0), true
}

// call invokes a guest export with up to 5 parameters and returns its first result.
// A non-nil error means the VM is dead (trap, exit, or a host call panicked).
func (v *vm) call(f api.Function, params ...uint64) (uint64, error) {
	if v.dead {
		return 0, errVMDead
	}
	copy(v.stack[:], params)
	if v.h.opts.CallTimeout > 0 {
		v.w.callVM.Store(v)
		v.w.callStart.Store(v.h.clock.Now().UnixNano())
	}
	err := f.CallWithStack(v.ctx, v.stack[:])
	if v.h.opts.CallTimeout > 0 {
		v.w.callStart.Store(0)
	}
	// cpp-host clears the stop-iteration flag when a callback returns, after converting its
	// result (DeferAfterCallActions in src/context.cc).
	v.lastStopped, v.stopIteration = v.stopIteration, false
	if err != nil {
		v.dead = true
		return 0, err
	}
	return v.stack[0], nil
}

var errVMDead = errors.New("host: VM is dead")

// guestTrap is panicked from a host call when a nested guest call (malloc) fails, so the
// outer guest call fails too.
type guestTrap struct{ err error }

func (t guestTrap) Error() string { return "guest trapped inside a host call: " + t.err.Error() }

// alloc calls proxy_on_memory_allocate.
func (v *vm) alloc(n uint32) uint32 {
	v.mstack[0] = uint64(n)
	prevAllow, prevDuring := v.allow, v.restrictedDuring
	v.allow, v.restrictedDuring = v.h.profile.AllocAllow, "proxy_on_memory_allocate"
	err := v.malloc.CallWithStack(v.ctx, v.mstack[:])
	v.allow, v.restrictedDuring = prevAllow, prevDuring
	if err != nil {
		v.dead = true
		panic(guestTrap{err})
	}
	return uint32(v.mstack[0])
}

func (v *vm) read(ptr, size uint32) ([]byte, bool) {
	return v.mem.Read(ptr, size)
}

func (v *vm) writeU32(ptr, val uint32) bool { return v.mem.WriteUint32Le(ptr, val) }
func (v *vm) writeU64(ptr uint32, val uint64) bool {
	return v.mem.WriteUint64Le(ptr, val)
}

// returnBytes allocates len(data) bytes in the guest, copies data there and writes the
// pointer and size to the out-slots. Empty data gives pointer 0, size 0.
func (v *vm) returnBytes(data []byte, ptrPtr, sizePtr uint32) Status {
	if len(data) == 0 {
		if !v.writeU32(ptrPtr, 0) || !v.writeU32(sizePtr, 0) {
			return StatusInvalidMemoryAccess
		}
		return StatusOK
	}
	p := v.alloc(uint32(len(data)))
	if p == 0 {
		return StatusInternalFailure
	}
	dst, ok := v.read(p, uint32(len(data)))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	copy(dst, data)
	if !v.writeU32(ptrPtr, p) || !v.writeU32(sizePtr, uint32(len(data))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// returnString is returnBytes for a string, without converting it.
func (v *vm) returnString(s string, ptrPtr, sizePtr uint32) Status {
	if len(s) == 0 {
		return v.returnBytes(nil, ptrPtr, sizePtr)
	}
	p := v.alloc(uint32(len(s)))
	if p == 0 {
		return StatusInternalFailure
	}
	dst, ok := v.read(p, uint32(len(s)))
	if !ok {
		return StatusInvalidMemoryAccess
	}
	copy(dst, s)
	if !v.writeU32(ptrPtr, p) || !v.writeU32(sizePtr, uint32(len(s))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// setCurrent makes id the effective context: any live root context (active or draining),
// or a stream. It reports false for an unknown id, and for a stream that is between phases
// (its own goroutine owns it then).
func (v *vm) setCurrent(id uint32) bool {
	if r := v.root(id); r != nil {
		v.setRoot(r)
		return true
	}
	s, ok := v.streams[id]
	if !ok || !s.waiting.Load() {
		return false
	}
	v.cur, v.curID, v.curRoot = s, id, s.root
	return true
}

func (v *vm) memorySize() uint64 {
	if v.mod == nil {
		return 0
	}
	return uint64(v.mod.Memory().Size())
}

func (v *vm) close() {
	v.dead = true
	if v.mod != nil {
		v.mod.Close(context.Background())
	}
	v.linmem.release()
}

func (v *vm) callOpt(f api.Function, id uint32) error {
	if f == nil {
		return nil
	}
	_, err := v.call(f, uint64(id))
	return err
}
