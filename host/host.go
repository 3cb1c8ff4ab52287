package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// Options configures a Host. Wasm is required; everything else has a default.
type Options struct {
	// Wasm is the module: a Proxy-Wasm 0.2.x filter (exports proxy_abi_version_0_2_1 or _0_2_0).
	Wasm []byte
	// PluginConfig is returned to the guest as buffer type 7 (plugin configuration) and its
	// length passed to proxy_on_configure. VMConfig likewise, buffer type 6 / proxy_on_vm_start.
	PluginConfig, VMConfig []byte
	// MorePlugins are the configurations of further plugins of the same module in the same
	// VMs — what Envoy does for two filter chains that load one module with one vm_id: each
	// plugin has its own root context in every VM. Plugin 0 is PluginConfig's, plugin i is
	// MorePlugins[i-1]'s; Request.Plugin and PluginHandler choose one.
	MorePlugins [][]byte
	// VMID names the shared-data map (default ""), RootID the root context (plugin_root_id,
	// default ""), PluginName the plugin_name property (default "sluice").
	VMID, RootID, PluginName string
	// Workers is the number of workers, each with its own VM (default runtime.NumCPU()).
	Workers int
	// FailurePolicy is what happens to requests once a worker's VM has failed (a trap), as
	// Envoy's failure_policy (see FailurePolicy). The zero value is FailClosed, Envoy's
	// default: an unset failure_policy with fail_open false.
	FailurePolicy FailurePolicy
	// ReloadBackoff is FailReload's base interval (Envoy's reload_config.backoff
	// base_interval; default 1 s): a failed VM is reloaded by the first request that comes
	// at least a random [ReloadBackoff, 1.5×ReloadBackoff) after the worker's last load.
	ReloadBackoff time.Duration
	// FailOpen is Envoy's legacy fail_open: true: the request whose callback trapped goes on
	// to the upstream unfiltered too (not only the later ones, as with FailurePolicy
	// FailOpen), and the filter is skipped from then on. It implies FailurePolicy FailOpen.
	FailOpen bool
	// MemoryLimitPages caps each VM's linear memory, in 64 KiB pages (default 4096 = 256 MiB).
	MemoryLimitPages uint32
	// Logger receives guest logs (proxy_log, stdout/stderr) and host events. Default: slog.Default().
	Logger *slog.Logger
	// LogLevel is what proxy_get_log_level reports, and guest messages below it are dropped
	// (default slog.LevelInfo). Proxy-Wasm trace/debug/info/warn/error/critical map to
	// slog -8/-4/0/4/8/12.
	LogLevel slog.Level
	// Clusters maps a proxy_http_call cluster name to a base URL such as "http://127.0.0.1:8080".
	Clusters map[string]string
	// HTTPClient sends proxy_http_call requests (default: a client with no overall timeout;
	// each call is bounded by its own timeout argument).
	HTTPClient *http.Client
	// Extensions add host calls to the "env" module (for example Higress's Redis calls).
	Extensions []Extension
	// CallTimeout bounds one call into the guest (0: no bound), on the host's Clock. A call
	// that runs longer — a guest stuck in a loop — is aborted and handled like a trap (see FailurePolicy).
	// It is off by default
	// because it is expensive: wazero 1.12 then checks for termination in every loop and
	// starts a goroutine per guest call (a full request cycle measured ~4x slower).
	CallTimeout time.Duration
	// CompilationCache is shared between Hosts to avoid recompiling the same module; default:
	// one process-wide in-memory cache.
	CompilationCache wazero.CompilationCache
	// Profile names the proxy-wasm-cpp-host behaviour set to reproduce (see Profile);
	// default DefaultProfile, the strictest.
	Profile string
	// Routes name the routes requests take, for the route and cluster properties
	// (xds.route_name, xds.cluster_name; route_name, cluster_name in profiles with
	// LegacyWasmAttributes): a request takes the route with the longest PathPrefix of
	// its :path. None matching, or no Routes: the request has no route. A
	// Request.RouteName given to Exchange takes precedence (routes.go).
	Routes []Route
	// MetricHelp, when set, gives the # HELP text of a guest metric from its name as the
	// guest defined it (Proxy-Wasm metrics carry no description); "" or nil: a
	// description by type and name.
	MetricHelp func(name string) string
	// AllowOnHeadersStopIteration is Envoy's PluginConfig allow_on_headers_stop_iteration
	// (Envoy ≥ 1.35; default false, as there): when true, Pause from
	// proxy_on_request_headers on a request with a body holds the headers only, and the
	// body goes on to proxy_on_request_body chunk by chunk until the guest continues
	// (held.go). When false, that Pause holds the body too, until proxy_continue_stream.
	AllowOnHeadersStopIteration bool
	// BufferLimit bounds, in bytes, the request body a filter buffers while it holds the
	// headers (AllowOnHeadersStopIteration): beyond it the request is answered 413 "Payload
	// Too Large", as Envoy answers a buffering filter past per_connection_buffer_limit_bytes.
	// Default (0 or less): DefaultBufferLimit, Envoy's default.
	BufferLimit int
	// Clock is the time the host runs on (see Clock): what the guest reads, proxy_on_tick,
	// FailReload's backoff, call timeouts, CallTimeout. Default (nil): WallClock().
	Clock Clock

	// jitter replaces the randomness of FailReload's backoff (tests).
	jitter func(n int64) int64
}

// Host runs a Proxy-Wasm module on a pool of workers. Safe for concurrent use.
type Host struct {
	opts     Options
	log      *slog.Logger
	rt       wazero.Runtime
	compiled wazero.CompiledModule
	abi      string
	workers  []*worker
	shared   *SharedData
	metrics  *metricRegistry
	start    time.Time
	rr       atomic.Uint32
	closed   chan struct{} // closed when Close has finished draining: workers stop, calls are abandoned
	closeMu  sync.Once
	client   *http.Client
	exports  map[string]bool

	// stopping is closed when Close begins: new requests are refused. inflight counts the
	// requests (Exchange, Handler) in progress; drainedReq wakes Close when it reaches 0.
	stopping   chan struct{}
	inflight   atomic.Int64
	drainedReq chan struct{}

	unimplMu   sync.Mutex
	unimplSeen map[string]bool

	extFuncs map[string]HostFunc
	genSeq   atomic.Uint64

	plugins  int        // 1 + len(opts.MorePlugins)
	reconfMu sync.Mutex // one Reconfigure at a time

	profile         Profile
	restrictedTraps atomic.Uint64 // host calls refused in a restricted callback
	pollOneoffCalls atomic.Uint64 // WASI poll_oneoff calls (the Go runtime's netpoll/usleep)

	canon   atomic.Pointer[map[string]string] // lower-case header name -> canonical form
	canonMu sync.Mutex

	grpcClients grpcClients // proxy_grpc_call's connections, one per cluster (grpccall.go)

	// clock is Options.Clock (WallClock by default); monoBase is when the host started on
	// it, the origin of the guest's monotonic clock. jitter is the randomness of
	// FailReload's backoff (rand.Int64N unless Options say otherwise).
	clock    Clock
	monoBase time.Time
	jitter   func(n int64) int64
}

var (
	defaultCacheOnce sync.Once
	defaultCache     wazero.CompilationCache
)

func processCache() wazero.CompilationCache {
	defaultCacheOnce.Do(func() { defaultCache = wazero.NewCompilationCache() })
	return defaultCache
}

// ErrClosed is returned by Exchange after Close.
var ErrClosed = errors.New("host: closed")

// New compiles the module, starts the workers and configures a VM on each. It returns an
// error when the module is not a Proxy-Wasm 0.2.x module, fails to instantiate, or when
// proxy_on_vm_start or proxy_on_configure returns false.
func New(ctx context.Context, opts Options) (*Host, error) {
	opts, profile, err := prepareOptions(opts)
	if err != nil {
		return nil, err
	}
	h := bareHost(opts, profile)
	if err := h.addExtensions(opts.Extensions); err != nil {
		return nil, err
	}
	rc := wazero.NewRuntimeConfig().
		WithMemoryLimitPages(opts.MemoryLimitPages).
		WithCompilationCache(opts.CompilationCache)
	if opts.CallTimeout > 0 {
		rc = rc.WithCloseOnContextDone(true)
	}
	h.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	t0 := time.Now()
	if err := h.compileAndLink(ctx); err != nil {
		h.rt.Close(ctx)
		return nil, err
	}
	t1 := time.Now()
	if err := h.startWorkers(ctx); err != nil {
		h.rt.Close(ctx)
		return nil, err
	}
	// Where the start-up goes (README, Performance): compiling (or loading from the
	// cache) and linking, then the workers' VMs in parallel (each VM logs its own phases).
	h.log.Debug("host: started", "compile_and_link", t1.Sub(t0).Round(time.Microsecond), "workers", time.Since(t1).Round(time.Microsecond))
	if opts.CallTimeout > 0 {
		go h.watchdog(opts.CallTimeout)
	}
	return h, nil
}

// prepareOptions checks opts and fills in what was left zero; it returns the options as the
// host keeps them and the profile they name.
func prepareOptions(opts Options) (Options, Profile, error) {
	if len(opts.Wasm) == 0 {
		return opts, Profile{}, errors.New("host: Options.Wasm is empty")
	}
	if opts.Workers <= 0 {
		opts.Workers = runtime.NumCPU()
	}
	if opts.MemoryLimitPages == 0 {
		opts.MemoryLimitPages = 4096
	}
	if opts.FailOpen {
		opts.FailurePolicy = FailOpen
	}
	if opts.FailurePolicy > FailOpen {
		return opts, Profile{}, fmt.Errorf("host: unknown FailurePolicy %d", opts.FailurePolicy)
	}
	if opts.ReloadBackoff <= 0 {
		opts.ReloadBackoff = DefaultReloadBackoff
	}
	if opts.BufferLimit <= 0 {
		opts.BufferLimit = DefaultBufferLimit
	}
	if opts.MemoryLimitPages > 65536 {
		return opts, Profile{}, fmt.Errorf("host: MemoryLimitPages %d exceeds 65536 (4 GiB)", opts.MemoryLimitPages)
	}
	if opts.PluginName == "" {
		opts.PluginName = "sluice"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = WallClock()
	}
	if opts.CompilationCache == nil {
		opts.CompilationCache = processCache()
	}
	profile, err := LookupProfile(opts.Profile)
	if err != nil {
		return opts, Profile{}, err
	}
	opts.Profile = profile.Name
	if err := checkRoutes(opts.Routes); err != nil {
		return opts, Profile{}, err
	}
	return opts, profile, nil
}

// bareHost is the Host before it has a runtime, a module or workers.
func bareHost(opts Options, profile Profile) *Host {
	h := &Host{
		opts:       opts,
		log:        opts.Logger,
		shared:     newSharedData(),
		metrics:    newMetricRegistry(),
		start:      opts.Clock.Now(),
		closed:     make(chan struct{}),
		stopping:   make(chan struct{}),
		drainedReq: make(chan struct{}, 1),
		client:     opts.HTTPClient,
		unimplSeen: map[string]bool{},
		extFuncs:   map[string]HostFunc{},
		exports:    map[string]bool{},
		clock:      opts.Clock,
		jitter:     rand.Int64N,
		profile:    profile,
		plugins:    1 + len(opts.MorePlugins),
	}
	h.monoBase = h.start
	if opts.jitter != nil {
		h.jitter = opts.jitter
	}
	if h.client == nil {
		h.client = &http.Client{}
	}
	return h
}

// addExtensions registers the extensions' host calls; a name may be defined once and may
// not shadow a built-in call.
func (h *Host) addExtensions(exts []Extension) error {
	for _, e := range exts {
		for _, f := range e.Funcs {
			if _, dup := h.extFuncs[f.Name]; dup {
				return fmt.Errorf("host: extension %q: host call %s defined twice", e.Name, f.Name)
			}
			if _, builtin := builtinHostCalls[f.Name]; builtin {
				return fmt.Errorf("host: extension %q: host call %s is built in", e.Name, f.Name)
			}
			h.extFuncs[f.Name] = f
		}
	}
	return nil
}

// compileAndLink compiles the module on h.rt, checks that it is a Proxy-Wasm 0.2.x module
// whose imports the profile provides, and instantiates the WASI and env host modules it
// links against.
func (h *Host) compileAndLink(ctx context.Context) error {
	// Compile functions on every CPU (wazero compiles one function at a time otherwise):
	// compiling is most of the time to the first response when nothing is cached.
	// Join the module's data segments (Go writes tens of thousands of a few bytes each),
	// which wazero would keep one by one: the same bytes land in memory (wasmpatch.JoinDataSegments).
	wasm, _ := wasmpatch.JoinDataSegments(h.opts.Wasm)
	compiled, err := h.rt.CompileModule(experimental.WithCompilationWorkers(ctx, runtime.GOMAXPROCS(0)), wasm)
	if err != nil {
		return fmt.Errorf("host: compiling module: %w", err)
	}
	h.compiled = compiled
	h.opts.Wasm = nil // compiled: the module's bytes (megabytes) are not needed again
	for name := range compiled.ExportedFunctions() {
		h.exports[name] = true
	}
	switch {
	case h.exports["proxy_abi_version_0_2_1"]:
		h.abi = "0.2.1"
	case h.exports["proxy_abi_version_0_2_0"]:
		h.abi = "0.2.0"
	default:
		return errors.New("host: module exports neither proxy_abi_version_0_2_1 nor proxy_abi_version_0_2_0: not a Proxy-Wasm 0.2.x module")
	}
	for _, need := range []string{"proxy_on_memory_allocate", "proxy_on_context_create"} {
		if !h.exports[need] {
			return fmt.Errorf("host: module does not export %s", need)
		}
	}
	if missing := h.missingImports(compiled); len(missing) > 0 {
		return fmt.Errorf("%w (profile %s): %s", errMissingImport, h.profile.Name, strings.Join(missing, ", "))
	}
	if err := h.instantiateWASI(ctx); err != nil {
		return fmt.Errorf("host: WASI: %w", err)
	}
	return h.instantiateEnv(ctx)
}

// startWorkers creates the workers, each with its own VM started and configured with every
// plugin's configuration, and starts their loops. The VMs start at the same time, as Envoy's
// worker threads start theirs; if one fails, the others are closed and no loop starts.
func (h *Host) startWorkers(ctx context.Context) error {
	configs := append([][]byte{h.opts.PluginConfig}, h.opts.MorePlugins...)
	h.workers = make([]*worker, h.opts.Workers)
	vms := make([]*vm, len(h.workers))
	errs := make([]error, len(h.workers))
	var wg sync.WaitGroup
	for i := range h.workers {
		w := newWorker(h, i)
		w.configs = append([][]byte(nil), configs...)
		h.workers[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			vms[i], errs[i] = h.newVM(ctx, w)
		}()
	}
	wg.Wait()
	if err := firstError(errs...); err != nil {
		for _, v := range vms {
			if v != nil {
				v.close()
			}
		}
		return err
	}
	for i, w := range h.workers {
		w.vm = vms[i]
		w.lastLoad = h.clock.Now()
		w.updateMemory()
		go w.loop()
	}
	return nil
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// instantiateEnv builds the "env" host module: the built-in Proxy-Wasm calls, the
// extensions' calls, and an UNIMPLEMENTED stub for anything else the module imports from env.
func (h *Host) instantiateEnv(ctx context.Context) error {
	b := h.rt.NewHostModuleBuilder("env")
	defined := map[string]bool{}
	for name, hc := range builtinHostCalls {
		fn := hc.fn
		qualified := "env." + name
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			v := vmFrom(ctx)
			if v.allow != nil {
				v.checkAllowed(qualified)
			}
			stack[0] = uint64(fn(v, stack))
		}), hc.params, hc.results).Export(name)
		defined[name] = true
	}
	for name, f := range h.extFuncs {
		f := f
		qualified := "env." + name
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			v := vmFrom(ctx)
			if v.allow != nil {
				v.checkAllowed(qualified)
			}
			f.Func(&Guest{vm: v}, stack)
		}), f.Params, f.Results).Export(name)
		defined[name] = true
	}
	for _, imp := range h.compiled.ImportedFunctions() {
		mod, name, _ := imp.Import()
		if mod != "env" || defined[name] {
			continue
		}
		results := imp.ResultTypes()
		qualified := "env." + name
		b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
			if v := vmFrom(ctx); v.allow != nil {
				v.checkAllowed(qualified)
			}
			h.unimplemented(name)
			for i := range results {
				stack[i] = 0
			}
			if len(results) > 0 {
				stack[0] = uint64(StatusUnimplemented)
			}
		}), imp.ParamTypes(), results).Export(name)
		defined[name] = true
	}
	if _, err := b.Instantiate(ctx); err != nil {
		return fmt.Errorf("host: env module: %w", err)
	}
	return nil
}

func (h *Host) unimplemented(name string) {
	h.unimplMu.Lock()
	seen := h.unimplSeen[name]
	h.unimplSeen[name] = true
	h.unimplMu.Unlock()
	if !seen {
		h.log.Warn("host: guest called an unimplemented host function; returning UNIMPLEMENTED", "function", name)
	}
}

// DefaultCloseTimeout bounds Close when its context has no deadline.
const DefaultCloseTimeout = 5 * time.Second

// Close stops the Host as Envoy stops a Wasm filter (host/doc.go, Stopping): new requests
// are refused at once (ErrClosed; Handler answers 503); requests in flight may finish; then
// every worker fails the streams still waiting on it and runs proxy_on_done for every root
// context. A root that answers true gets proxy_on_delete at once (its HTTP and gRPC calls
// are cancelled); one that answers false stays until it calls proxy_done, and the replies to
// its calls are delivered to it meanwhile; extension calls (Redis) still in flight complete.
// When ctx's deadline comes first (DefaultCloseTimeout when ctx has none), roots still
// waiting get proxy_on_delete, calls still in flight are abandoned, and requests still in
// flight fail with ErrClosed. Then the workers stop and the runtime is released. Close
// may be called more than once; later calls wait for the first.
func (h *Host) Close(ctx context.Context) error {
	h.closeMu.Do(func() {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, DefaultCloseTimeout)
			defer cancel()
		}
		close(h.stopping)
		h.waitRequests(ctx)
		h.shutdownWorkers(ctx)
		close(h.closed)
		for _, w := range h.workers {
			w.stop()
		}
	})
	return h.rt.Close(context.Background())
}

// Kill stops the Host as a killed proxy stops: no proxy_on_done, nothing waited for — the
// workers stop, requests in flight fail with ErrClosed, host calls in flight are abandoned
// and the runtime is released. Tests use it to model a crash (what a lease does when its
// proxy dies). After Kill, Close only releases what is left.
func (h *Host) Kill() error {
	h.closeMu.Do(func() {
		close(h.stopping)
		close(h.closed)
		for _, w := range h.workers {
			w.stop()
		}
	})
	return h.rt.Close(context.Background())
}

// enter admits a request (Exchange, Handler) unless Close has begun; leave ends it.
func (h *Host) enter() bool {
	h.inflight.Add(1)
	select {
	case <-h.stopping:
		h.leave()
		return false
	default:
		return true
	}
}

func (h *Host) leave() {
	if h.inflight.Add(-1) == 0 {
		select {
		case <-h.stopping:
			select {
			case h.drainedReq <- struct{}{}:
			default:
			}
		default:
		}
	}
}

// waitRequests waits until no request is in progress, or ctx ends.
func (h *Host) waitRequests(ctx context.Context) {
	for h.inflight.Load() > 0 {
		select {
		case <-h.drainedReq:
		case <-ctx.Done():
			return
		}
	}
}

// shutdownWorkers runs every worker's shutdown (worker.beginShutdown) and waits until each
// has drained or ctx ends; then roots still waiting for proxy_done are deleted
// (worker.finishShutdown). A worker stuck in a guest call cannot be interrupted: it is
// waited for at most a second past the deadline.
func (h *Host) shutdownWorkers(ctx context.Context) {
	drained := make([]chan struct{}, len(h.workers))
	for i, w := range h.workers {
		ch := make(chan struct{})
		drained[i] = ch
		w.postAsync(job{fn: func(w *worker) { w.beginShutdown(ch) }})
	}
	late := false
	for _, ch := range drained {
		select {
		case <-ch:
		case <-ctx.Done():
			late = true
		}
		if late {
			break
		}
	}
	if !late {
		return
	}
	h.log.Warn("host: closing: the deadline passed before every root context was done; deleting the rest", "error", ctx.Err())
	finished := make([]chan struct{}, len(h.workers))
	for i, w := range h.workers {
		ch := make(chan struct{})
		finished[i] = ch
		w.postAsync(job{fn: func(w *worker) {
			w.finishShutdown()
			close(ch)
		}})
	}
	stuck := time.NewTimer(time.Second)
	defer stuck.Stop()
	for _, ch := range finished {
		select {
		case <-ch:
		case <-stuck.C:
			return
		}
	}
}

// Profile returns the cpp-host profile the Host reproduces.
func (h *Host) Profile() Profile { return h.profile }

// ABIVersion reports the Proxy-Wasm ABI the module declared ("0.2.1" or "0.2.0").
func (h *Host) ABIVersion() string { return h.abi }

// Options returns the options the Host runs with (defaults filled in; Wasm is nil: the
// host lets go of the module's bytes once it has compiled them).
func (h *Host) Options() Options { return h.opts }

// SharedData is the shared-data map of the Host's vm_id.
func (h *Host) SharedData() *SharedData { return h.shared }

// pick chooses a worker: round-robin, skipping to the least-loaded of two neighbours.
func (h *Host) pick() *worker {
	n := uint32(len(h.workers))
	i := h.rr.Add(1) % n
	w := h.workers[i]
	if n > 1 {
		o := h.workers[(i+1)%n]
		if len(o.jobs) < len(w.jobs) {
			w = o
		}
	}
	return w
}

// Stats is a snapshot of the Host's health.
type Stats struct {
	Workers    []WorkerStats
	VMRestarts uint64 // sum over workers
	// ReloadBackoffs counts requests refused a reload by FailReload's backoff (Envoy's
	// wasm.<plugin>.vm_reload_backoff), sum over workers.
	ReloadBackoffs uint64
	Requests       uint64 // streams started, sum over workers
	Failed         uint64 // requests whose VM trapped
	Uptime         time.Duration
	ABIVersion     string
	SharedData     struct{ Keys, Bytes int }
	// Profile is the cpp-host profile in force; RestrictedTraps counts host calls that
	// trapped because cpp-host forbids them where they were made; PollOneoffCalls counts the
	// guest's WASI poll_oneoff calls (each is a VM death under the strictest profile).
	Profile                          string
	RestrictedTraps, PollOneoffCalls uint64
}

// WorkerStats describes one worker.
type WorkerStats struct {
	ID          int
	MemoryBytes uint64 // linear memory size of the current VM
	VMRestarts  uint64
	Requests    uint64
	Failed      uint64
	Healthy     bool // has a configured VM
}

// Stats returns a snapshot; safe to call at any time.
func (h *Host) Stats() Stats {
	var s Stats
	for _, w := range h.workers {
		ws := WorkerStats{
			ID:          w.id,
			MemoryBytes: w.memBytes.Load(),
			VMRestarts:  w.restarts.Load(),
			Requests:    w.requests.Load(),
			Failed:      w.failed.Load(),
			Healthy:     w.healthy.Load(),
		}
		s.Workers = append(s.Workers, ws)
		s.VMRestarts += ws.VMRestarts
		s.Requests += ws.Requests
		s.Failed += ws.Failed
		s.ReloadBackoffs += w.reloadBackoffs.Load()
	}
	s.Uptime = h.clock.Now().Sub(h.start)
	s.ABIVersion = h.abi
	s.Profile = h.profile.Name
	s.RestrictedTraps = h.restrictedTraps.Load()
	s.PollOneoffCalls = h.pollOneoffCalls.Load()
	s.SharedData.Keys, s.SharedData.Bytes = h.shared.Len(), h.shared.Bytes()
	return s
}

// Tick runs proxy_on_tick now for every root context that has a tick period set, on every
// worker, and waits for them. Tests use it to drive tick-based logic without waiting for the
// timers.
func (h *Host) Tick(ctx context.Context) error {
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	for _, w := range h.workers {
		wg.Add(1)
		done := make(chan struct{})
		err := w.post(ctx, job{fn: func(w *worker) {
			w.tick(true)
			close(done)
		}})
		if err != nil {
			wg.Done()
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
			continue
		}
		go func() {
			defer wg.Done()
			select {
			case <-done:
			case <-ctx.Done():
			case <-h.closed:
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// Reconfigure gives plugin a new configuration, as Envoy does when a listener's plugin
// configuration changes: on every worker's VM a new root context (a fresh id)
// gets proxy_on_context_create(root, 0), proxy_on_vm_start and proxy_on_configure(root,
// len(config)) with config as buffer type 7. Where that succeeds, new streams of the plugin
// get the new root as parent; the old root drains — streams already created keep it, and it
// gets proxy_on_done and proxy_on_delete when the last of them has ended (at once if there
// is none). Where the guest refuses (false from proxy_on_vm_start or proxy_on_configure), the
// old root stays in force on that worker and the refused root gets proxy_on_done and
// proxy_on_delete; where it traps, the VM is replaced by one with the previous configuration.
//
// Reconfigure tries every worker (no rollback: it is not all or none) and returns nil, or an
// error that names each worker that kept the previous configuration. A worker without a
// VM at that moment gets the new configuration when its VM is re-created. A VM re-created
// after a trap gets, for every plugin, the configuration last in force on its worker.
// Reconfigure calls do not overlap. If ctx ends first, Reconfigure returns ctx.Err() and
// the reconfigurations already queued still happen.
//
// Unlike Envoy, which validates a new configuration on a throw-away canary VM first
// (cpp-host's WasmHandleBase::canary), the refused configuration is tried on the live VMs.
func (h *Host) Reconfigure(ctx context.Context, plugin int, config []byte) error {
	if err := h.checkPlugin(plugin); err != nil {
		return err
	}
	select {
	case <-h.stopping:
		return ErrClosed
	default:
	}
	config = append([]byte{}, config...)
	h.reconfMu.Lock()
	defer h.reconfMu.Unlock()
	results := make([]chan error, len(h.workers))
	var errs []error
	for i, w := range h.workers {
		ch := make(chan error, 1)
		if err := w.post(ctx, job{fn: func(w *worker) { ch <- w.reconfigure(plugin, config) }}); err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", w.id, err))
			continue
		}
		results[i] = ch
	}
	for _, ch := range results {
		if ch == nil {
			continue
		}
		select {
		case err := <-ch:
			if err != nil {
				errs = append(errs, err)
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-h.closed:
			return ErrClosed
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("host: reconfigure plugin %d: %d of %d workers kept the previous configuration: %w", plugin, len(errs), len(h.workers), errors.Join(errs...))
	}
	return nil
}

// watchdog aborts guest calls that run longer than timeout on the host's clock by closing
// their module (wazero then returns an error from the call, on the worker, which replaces
// the VM). It looks every timeout/4 (at least 5 ms) of that clock.
func (h *Host) watchdog(timeout time.Duration) {
	period := timeout / 4
	if period < 5*time.Millisecond {
		period = 5 * time.Millisecond
	}
	for {
		fired, stop := h.clock.NewTimer(period)
		select {
		case <-h.closed:
			stop()
			return
		case <-fired:
		}
		now := h.clock.Now().UnixNano()
		for _, w := range h.workers {
			start := w.callStart.Load()
			if start == 0 || time.Duration(now-start) < timeout {
				continue
			}
			if v := w.callVM.Load(); v != nil && w.callStart.CompareAndSwap(start, 0) {
				h.log.Error("host: guest call exceeded the call timeout; aborting it", "worker", w.id, "timeout", timeout)
				v.mod.CloseWithExitCode(context.Background(), 124)
			}
		}
	}
}
