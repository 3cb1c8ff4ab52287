package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

//go:embed default-config.json
var defaultConfig []byte

func init() {
	commands["run"] = command{summary: "serve HTTP through the filter on an embedded Proxy-Wasm host", run: runRun}
}

const runUsage = `usage: sluice run [flags]

Serves HTTP on --listen through a Proxy-Wasm filter (default: the module built in) running
on an embedded host (one VM per worker), forwarding what the filter lets through to
--upstream, or to a built-in echo server when --upstream is not given. --listen speaks
HTTP/1.1 and HTTP/2 cleartext (h2c with prior knowledge, as gRPC clients use it); an
upstream given as h2c://HOST:PORT is reached over HTTP/2 cleartext (a gRPC server).
SIGHUP reloads --config (a file with an error keeps the previous configuration and logs
why); SIGTERM or SIGINT stops gracefully (see --drain-timeout). The log is on stderr.

Flags:
`

// runHook lets another file of this package add flags and host options to `sluice run`
// (for example --redis-cluster). flags is called before parsing; apply after, and may return
// a cleanup function.
type runHook struct {
	flags func(fs *flag.FlagSet)
	apply func(opts *host.Options) (cleanup func(), err error)
}

var runHooks []runHook

// adminRoutes lets another file add routes to the admin server (for example a dashboard).
// The host's own /metrics, /status and /healthz are registered first.
var adminRoutes []func(mux *http.ServeMux, h *host.Host)

// runConfig is the parsed command line of `sluice run`.
type runConfig struct {
	wasm, configPath, listen, upstream, admin, vmID, logLevel string
	workers                                                   int
	failOpen                                                  bool
	failurePolicy                                             string // --failure-policy
	memoryMB                                                  int
	callTimeout                                               time.Duration
	drainTimeout                                              time.Duration // --drain-timeout: Close's deadline on SIGTERM/SIGINT
	cacheDir                                                  string
	clusters                                                  clusterFlag
	profile                                                   string
	logger                                                    *slog.Logger // nil: startRun makes one on stderr (runRun shares its own)

	allowOnHeadersStopIteration bool     // --allow-on-headers-stop-iteration
	jwt                         jwtFlags // --jwt-* (jwt.go)
}

type clusterFlag map[string]string

func (c clusterFlag) String() string {
	var s []string
	for k, v := range c {
		s = append(s, k+"="+v)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

func (c clusterFlag) Set(v string) error {
	name, u, ok := strings.Cut(v, "=")
	if !ok || name == "" || u == "" {
		return fmt.Errorf("want NAME=URL, got %q", v)
	}
	if _, err := url.ParseRequestURI(u); err != nil {
		return fmt.Errorf("cluster %s: %v", name, err)
	}
	c[name] = u
	return nil
}

func runRun(args []string, stdout, stderr io.Writer) int {
	cfg := runConfig{clusters: clusterFlag{}}
	fs := flag.NewFlagSet("sluice run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&cfg.wasm, "wasm", "", "Proxy-Wasm module to run (default: the one built into this binary: sluice.wasm, or sluice-redis.wasm for a --config with a \"redis\" rule)")
	fs.StringVar(&cfg.configPath, "config", "", "plugin configuration file (default: the embedded example, 5 requests per 10s per client IP)")
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:8080", "address to serve HTTP on")
	fs.StringVar(&cfg.upstream, "upstream", "", "URL to forward allowed requests to: http://, https://, or h2c://HOST:PORT for HTTP/2 cleartext (a gRPC server) (default: a built-in echo server)")
	fs.IntVar(&cfg.workers, "workers", runtime.NumCPU(), "workers, each with its own VM")
	fs.StringVar(&cfg.admin, "admin", "", "address for the admin server (/metrics, /status, /healthz); empty: none")
	fs.BoolVar(&cfg.failOpen, "fail-open", false, "Envoy's legacy fail_open: true: a request whose filter traps, and every later one on that worker, goes through unfiltered (default: --failure-policy)")
	fs.StringVar(&cfg.failurePolicy, "failure-policy", "fail-closed", "what a worker does once its VM has trapped, as Envoy's failure_policy: fail-closed (Envoy's default: 503 until restart), fail-reload (503 until a request comes at least 1-1.5 s after the last load, which reloads it) or fail-open (later requests skip the filter)")
	fs.StringVar(&cfg.vmID, "vm-id", "sluice", "vm_id: names the shared-data map")
	fs.IntVar(&cfg.memoryMB, "memory-limit-mb", 256, "linear memory cap per VM, in MiB")
	fs.Var(durationFlag{&cfg.callTimeout}, "call-timeout", "abort a filter call that runs longer (a stuck filter) and replace its VM; 0: off (it slows every call)")
	cfg.drainTimeout = defaultDrainTimeout
	fs.Var(durationFlag{&cfg.drainTimeout}, "drain-timeout", "on SIGTERM/SIGINT, after the requests in flight: how long the filter's root contexts may take to finish (proxy_on_done; leases go back to Redis) and host calls in flight to complete; 0: do not wait")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "debug, info, warn or error (also what the filter's proxy_get_log_level sees)")
	fs.StringVar(&cfg.profile, "profile", host.DefaultProfile, "proxy-wasm-cpp-host behaviour to reproduce: "+profileNames()+" (the default is the strictest: Envoy 1.33–1.38)")
	fs.StringVar(&cfg.cacheDir, "cache-dir", defaultCacheDir(), "directory for compiled modules, so later starts skip compilation; empty: compile every time")
	fs.BoolVar(&cfg.allowOnHeadersStopIteration, "allow-on-headers-stop-iteration", false, "mirrors Envoy's Wasm PluginConfig field allow_on_headers_stop_iteration (Envoy ≥ 1.35, default false there too): Pause from the filter's proxy_on_request_headers holds only the headers while the request body goes on to proxy_on_request_body, buffered up to 1 MiB (413 beyond); false: the body waits with the headers until the filter continues")
	fs.Var(cfg.clusters, "cluster", "NAME=URL: an upstream for the filter's proxy_http_call and proxy_grpc_call (http://HOST:PORT: gRPC over HTTP/2 cleartext) (repeatable)")
	cfg.jwt.register(fs) // jwt.go
	for _, hk := range runHooks {
		if hk.flags != nil {
			hk.flags(fs)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, runUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0
		}
		return usageError(stderr, "run", err)
	}
	if fs.NArg() > 0 {
		return usageError(stderr, "run", fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if _, err := host.LookupProfile(cfg.profile); err != nil {
		return usageError(stderr, "run", fmt.Errorf("--profile: %v", err))
	}
	if _, err := host.ParseFailurePolicy(cfg.failurePolicy); err != nil {
		return usageError(stderr, "run", fmt.Errorf("--failure-policy: %v", err))
	}
	if level, err := parseLevel(cfg.logLevel); err == nil { // else startRun says so
		cfg.logger = newRunLogger(stderr, level)
		if processLoggers {
			useProcessLogger(cfg.logger)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP reloads --config (a signal during start-up waits for it to finish).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv, err := startRun(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice run: %v\n", err)
		return 1
	}
	go srv.reloadOn(ctx, hup)
	if err := srv.wait(); err != nil {
		fmt.Fprintf(stderr, "sluice run: %v\n", err)
		return 1
	}
	return 0
}

// runServer is a started `sluice run`.
type runServer struct {
	host                *host.Host
	listenAddr          string // the address actually bound
	adminAddr           string
	errc                chan error
	done                chan struct{}
	servers             []*http.Server
	cleanups            []func()
	shutdownGracePeriod time.Duration
	drainTimeout        time.Duration

	// For SIGHUP (reload): --config, the configuration in force, the module's build and
	// --cluster. reloadMu orders reloads.
	reloadMu     sync.Mutex
	configPath   string
	pluginConfig []byte
	build        config.Build
	clusters     map[string]string
}

// defaultDrainTimeout is --drain-timeout's default: time for the filter's root contexts to
// end (a Redis round trip or a few, for returning leases) well inside Kubernetes' default
// 30 s termination grace period.
const defaultDrainTimeout = 5 * time.Second

// defaultCacheDir is where `sluice run` keeps compiled modules: $XDG_CACHE_HOME/sluice/wazero
// or ~/.cache/sluice/wazero; empty when there is no cache directory.
func defaultCacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "sluice", "wazero")
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	return l, err
}

// startRun loads the module and configuration, starts the host and the listeners, and
// returns once they accept connections. Everything stops when ctx ends.
func startRun(ctx context.Context, cfg runConfig, stdout, stderr io.Writer) (*runServer, error) {
	if cfg.wasm == "" {
		cfg.wasm = defaultWasm(cfg.configPath) // embedded.go
	}
	in, err := readRunInputs(cfg)
	if err != nil {
		return nil, err
	}
	if err := checkServices(cfg, in); err != nil {
		return nil, err
	}
	logger := cfg.logger
	if logger == nil {
		logger = newRunLogger(stderr, in.level)
	}
	// Until the host has started, log records are held: a configuration the filter refuses
	// is then printed once, by the command (hostStartError), not once more per worker.
	hold := &holdState{holding: true}
	logger = slog.New(holdHandler{inner: logger.Handler(), st: hold})
	if in.upstreamURL != nil {
		in.upstream = reverseProxy(in.upstreamURL, logger)
	}
	opts := runHostOptions(cfg, in, logger)
	rs := &runServer{errc: make(chan error, 2), done: make(chan struct{}), shutdownGracePeriod: 10 * time.Second, drainTimeout: cfg.drainTimeout}
	fail := func(err error) (*runServer, error) {
		hold.release(nil)
		for _, c := range rs.cleanups {
			c()
		}
		return nil, err
	}
	if err := rs.applyRunHooks(&opts); err != nil {
		return fail(err)
	}
	h, err := host.New(ctx, opts)
	if err != nil {
		err = hostStartError(cfg, in, err)
		var refused configRefused
		if errors.As(err, &refused) {
			// The command prints the reasons once; the module's own critical line (one per
			// worker, escaped onto one line) would repeat them.
			hold.release(func(r slog.Record) bool { return r.Level >= slog.LevelError+4 })
		}
		return fail(err)
	}
	rs.host = h
	rs.cleanups = append(rs.cleanups, func() { h.Close(context.Background()) })
	ln, adminLn, err := rs.listen(cfg, in.upstream, logger)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "sluice: filter %s (Proxy-Wasm %s), %d workers, vm_id %q, host profile %s, config: %s\n", cfg.wasm, h.ABIVersion(), cfg.workers, cfg.vmID, h.Profile().Name, in.configName)
	fmt.Fprintf(stdout, "sluice: listening on http://%s -> %s\n", rs.listenAddr, in.upstreamName)
	if adminLn != nil {
		fmt.Fprintf(stdout, "sluice: admin on http://%s (/dashboard/ /metrics /status /healthz)\n", rs.adminAddr)
	}
	hold.release(nil)
	rs.configPath, rs.pluginConfig, rs.build, rs.clusters = cfg.configPath, in.pluginConfig, moduleBuild(in.wasm), cfg.clusters
	rs.serve(ctx, ln, adminLn)
	// Compiling the module leaves tens of MB of garbage that the Go runtime would keep
	// (and only slowly return): collect it and give it back now, off the serving path.
	go func() {
		debug.FreeOSMemory()
		writeMemProfile(logger)
	}()
	return rs, nil
}

// memProfileEnv names a file for a heap profile of what is live once `sluice run` has
// started (after the collection that follows start-up): a measuring aid (README,
// Performance), not a flag.
const memProfileEnv = "SLUICE_DEBUG_MEMPROFILE"

func init() {
	if os.Getenv(memProfileEnv) != "" {
		runtime.MemProfileRate = 4096 // fine enough to attribute the start-up's megabytes
	}
}

// writeMemProfile writes the heap profile that memProfileEnv asks for, if it does.
func writeMemProfile(logger *slog.Logger) {
	path := os.Getenv(memProfileEnv)
	if path == "" {
		return
	}
	err := func() error {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}()
	if err != nil {
		logger.Warn("sluice run: "+memProfileEnv, "error", err)
	}
}

// runInputs is what `sluice run` reads before it starts anything: the log level, the
// module, the plugin configuration and the upstream, with the names the startup line
// prints for the last two.
type runInputs struct {
	level        slog.Level
	wasm         []byte
	pluginConfig []byte
	configName   string
	upstream     http.Handler
	upstreamURL  *url.URL // --upstream; nil: the built-in echo (upstream)
	upstreamName string
}

// readRunInputs checks the numeric flags and reads the module, the configuration and the
// upstream that cfg names.
func readRunInputs(cfg runConfig) (runInputs, error) {
	var in runInputs
	level, err := parseLevel(cfg.logLevel)
	if err != nil {
		return in, fmt.Errorf("--log-level: %v", err)
	}
	in.level = level
	if cfg.workers < 1 {
		return in, fmt.Errorf("--workers must be at least 1, got %d", cfg.workers)
	}
	if cfg.drainTimeout < 0 {
		return in, fmt.Errorf("--drain-timeout must not be negative, got %v", cfg.drainTimeout)
	}
	if cfg.memoryMB < 1 || cfg.memoryMB > 4096 {
		return in, fmt.Errorf("--memory-limit-mb must be in 1..4096, got %d", cfg.memoryMB)
	}
	if in.wasm, err = readWasm(cfg.wasm); err != nil {
		return in, err
	}
	in.pluginConfig, in.configName = defaultConfig, "embedded default (5 requests per 10s per client IP)"
	if cfg.configPath != "" {
		if in.pluginConfig, err = os.ReadFile(cfg.configPath); err != nil {
			return in, fmt.Errorf("reading --config: %v", err)
		}
		in.configName = cfg.configPath
	}
	in.upstream, in.upstreamName = echoHandler(), "built-in echo"
	if cfg.upstream != "" {
		u, err := url.Parse(cfg.upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "h2c") || u.Host == "" {
			return in, fmt.Errorf("--upstream: want an http://, https:// or h2c:// URL, got %q", cfg.upstream)
		}
		in.upstreamURL, in.upstreamName = u, u.String()
	}
	return in, nil
}

// failurePolicy is --failure-policy, checked by runRun ("" and unknown: Envoy's default).
func failurePolicy(s string) host.FailurePolicy {
	p, _ := host.ParseFailurePolicy(s)
	return p
}

// runHostOptions builds the host's options from the flags and what was read; without a
// usable --cache-dir it warns and compiles every time.
func runHostOptions(cfg runConfig, in runInputs, logger *slog.Logger) host.Options {
	opts := host.Options{
		Wasm:             in.wasm,
		PluginConfig:     in.pluginConfig,
		VMID:             cfg.vmID,
		PluginName:       "sluice",
		Workers:          cfg.workers,
		FailOpen:         cfg.failOpen,
		FailurePolicy:    failurePolicy(cfg.failurePolicy),
		MemoryLimitPages: uint32(cfg.memoryMB) * 16,
		Logger:           logger,
		LogLevel:         in.level,
		Clusters:         cfg.clusters,
		CallTimeout:      cfg.callTimeout,
		Profile:          cfg.profile,

		AllowOnHeadersStopIteration: cfg.allowOnHeadersStopIteration,
	}
	if cfg.cacheDir != "" {
		cache, err := wazero.NewCompilationCacheWithDir(cfg.cacheDir)
		if err != nil {
			logger.Warn("sluice run: no compilation cache; compiling every time", "dir", cfg.cacheDir, "error", err)
		} else {
			opts.CompilationCache = cache
		}
	}
	return opts
}

// applyRunHooks lets the other files' hooks amend opts, keeping their cleanups in rs
// (the caller runs them if starting fails).
func (rs *runServer) applyRunHooks(opts *host.Options) error {
	for _, hk := range runHooks {
		if hk.apply == nil {
			continue
		}
		cleanup, err := hk.apply(opts)
		if err != nil {
			return err
		}
		if cleanup != nil {
			rs.cleanups = append(rs.cleanups, cleanup)
		}
	}
	return nil
}

// hostStartError says why host.New failed. For a sluice module that refuses its
// configuration it says why as `sluice check` does, one error per line with the file name
// (the module's own log line has them too, escaped onto one line).
func hostStartError(cfg runConfig, in runInputs, err error) error {
	build := moduleBuild(in.wasm)
	if _, perr := config.ParseFor(in.pluginConfig, build); perr != nil && strings.Contains(err.Error(), "proxy_on_configure returned false") {
		lines, _ := configErrorLines(printable(in.configName), in.pluginConfig, perr)
		return configRefused{fmt.Errorf("the filter %s refused the configuration (proxy_on_configure returned false; as `sluice check` finds it for %s):\n%s", cfg.wasm, build, strings.Join(lines, "\n"))}
	}
	return fmt.Errorf("starting the filter %s: %v", cfg.wasm, err)
}

// configRefused is hostStartError's error for a configuration the sluice module refused,
// with sluice check's lines.
type configRefused struct{ error }

// moduleBuild tells which sluice artifact a module is: sluice-redis.wasm imports Higress's
// Redis calls.
func moduleBuild(wasm []byte) config.Build {
	if wasmpatch.ImportsFunction(wasm, "env", "proxy_redis_call") {
		return config.BuildRedis
	}
	return config.BuildLocal
}

// listen binds --listen and, when given, --admin, and sets up their servers in rs (the
// main one first). adminLn is nil without --admin.
func (rs *runServer) listen(cfg runConfig, upstream http.Handler, logger *slog.Logger) (ln, adminLn net.Listener, err error) {
	ln, err = net.Listen("tcp", cfg.listen)
	if err != nil {
		return nil, nil, fmt.Errorf("--listen: %v", err)
	}
	rs.listenAddr = ln.Addr().String()
	// HTTP/1.1 and HTTP/2 cleartext with prior knowledge on the same port (no h2c
	// upgrade from HTTP/1.1: gRPC clients do not use it, and net/http does not offer it).
	protocols := new(http.Protocols)
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	handler, err := cfg.jwt.handler(rs.host.Handler(upstream)) // jwt.go
	if err != nil {
		ln.Close()
		return nil, nil, err
	}
	rs.servers = append(rs.servers, &http.Server{Handler: handler, Protocols: protocols, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)})
	if cfg.admin == "" {
		return ln, nil, nil
	}
	if adminLn, err = net.Listen("tcp", cfg.admin); err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("--admin: %v", err)
	}
	rs.adminAddr = adminLn.Addr().String()
	rs.servers = append(rs.servers, &http.Server{Handler: adminMux(rs.host), ReadHeaderTimeout: 10 * time.Second})
	return ln, adminLn, nil
}

// adminMux serves the host's /metrics, /status and /healthz, the routes other files add
// (the dashboard), and a front page at the root.
func adminMux(h *host.Host) *http.ServeMux {
	mux := http.NewServeMux()
	admin := h.AdminHandler()
	for _, p := range []string{"/metrics", "/status", "/healthz"} {
		mux.Handle(p, admin)
	}
	for _, add := range adminRoutes {
		add(mux, h)
	}
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if len(adminRoutes) > 0 { // the dashboard is mounted: the admin root is its front page
			http.Redirect(w, r, "/dashboard/", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "sluice admin: /metrics /status /healthz\n")
	})
	return mux
}

// serve starts serving on the listeners from listen, and shuts everything down when ctx
// ends.
func (rs *runServer) serve(ctx context.Context, ln, adminLn net.Listener) {
	go func() { rs.errc <- serveOrClosed(rs.servers[0], ln) }()
	if adminLn != nil {
		go func() { rs.errc <- serveOrClosed(rs.servers[1], adminLn) }()
	}
	go func() {
		<-ctx.Done()
		rs.shutdown()
	}()
}

func serveOrClosed(s *http.Server, ln net.Listener) error {
	if err := s.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// shutdown stops accepting, lets requests in flight finish (bounded), then closes the host
// within --drain-timeout — its root contexts' proxy_on_done and the host calls they make
// (leases returned to Redis) — before the admin server and the extensions' connections
// (Redis) close.
func (rs *runServer) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), rs.shutdownGracePeriod)
	defer cancel()
	rs.servers[0].Shutdown(ctx)
	drain, cancelDrain := context.WithTimeout(context.Background(), max(rs.drainTimeout, 0))
	start := time.Now()
	rs.host.Close(drain)
	cancelDrain()
	rs.host.Options().Logger.Info("sluice run: filter stopped", "took", time.Since(start).Round(time.Millisecond))
	for _, s := range rs.servers[1:] {
		s.Shutdown(ctx)
	}
	for _, c := range rs.cleanups {
		c()
	}
	close(rs.done)
}

// wait blocks until shutdown finished; it returns the first serving error, if any.
func (rs *runServer) wait() error {
	<-rs.done
	for {
		select {
		case err := <-rs.errc:
			if err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// upstreamLogInterval is the least time between two log lines about --upstream failing.
const upstreamLogInterval = 10 * time.Second

// reverseProxy forwards to target, keeping the client's Host (as Envoy keeps :authority)
// and appending the peer to X-Forwarded-For. An h2c:// target is reached over HTTP/2
// cleartext with prior knowledge: one pooled connection multiplexes the requests, the
// request body streams up while the response streams down (flushed as it comes: its
// length is unknown), and trailers pass in both directions (httputil.ReverseProxy
// carries them; TE is reduced to "trailers").
func reverseProxy(target *url.URL, logger *slog.Logger) http.Handler {
	var transport http.RoundTripper
	name := target.String()
	if target.Scheme == "h2c" {
		t := *target
		t.Scheme = "http"
		target = &t
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
		transport = tr
	}
	return &httputil.ReverseProxy{
		Transport: transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			prior := pr.In.Header.Values("X-Forwarded-For")
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
				pr.Out.Header.Set("X-Forwarded-For", strings.Join(append(prior, ip), ", "))
			}
			pr.Out.Header.Set("X-Forwarded-Proto", "http")
			if pr.In.TLS != nil {
				pr.Out.Header.Set("X-Forwarded-Proto", "https")
			}
		},
		// An upstream that cannot be reached gets Envoy's answer (503, or UNAVAILABLE to a
		// gRPC request), and its cause is logged, one line per 10 s (host/upstream.go).
		ErrorHandler: host.UpstreamErrorHandler(logger, name, upstreamLogInterval),
		ErrorLog:     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// echoHandler is the built-in upstream: it answers with what it received — the request line,
// the headers (sorted) and the body size — as text, or as JSON when the client accepts
// application/json.
func echoHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		sort.Strings(names)
		if strings.Contains(r.Header.Get("Accept"), "application/json") {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(struct {
				Method    string              `json:"method"`
				Path      string              `json:"path"`
				Host      string              `json:"host"`
				Headers   map[string][]string `json:"headers"`
				BodyBytes int64               `json:"body_bytes"`
			}{r.Method, r.URL.RequestURI(), r.Host, r.Header, n})
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s %s\nHost: %s\n", r.Method, r.URL.RequestURI(), r.Proto, r.Host)
		for _, k := range names {
			for _, v := range r.Header[k] {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
			}
		}
		fmt.Fprintf(&b, "\n(%d body bytes)\n", n)
		io.WriteString(w, b.String())
	})
}

// profileNames lists the host profiles for --help.
func profileNames() string {
	var names []string
	for _, p := range host.Profiles() {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}
