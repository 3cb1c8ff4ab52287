package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/serve/rls"
)

func init() {
	commands["serve"] = command{summary: "a rate-limit service (Envoy RLS v3) on a Redis Cluster", run: runServe}
}

const serveUsage = `usage: sluice serve --redis-cluster HOST:PORT[,HOST:PORT...] [flags]
       sluice serve --check --config FILE|DIR

Serves envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit (gRPC: HTTP/2,
cleartext or, with --tls-cert, TLS) and decides on the Redis Cluster with sluice's Redis scripts. Stateless: run any
number of replicas on one cluster. Two kinds of descriptors:

  inline       sent by sluice.wasm (backend "rls"), accepted for --inline-domains only
  configured   matched against --config, envoyproxy/ratelimit's YAML format (a file or a
               directory of *.yaml / *.yml files, one domain each); SIGHUP reloads it

A Redis failure answers UNAVAILABLE (Envoy's failure_mode_deny decides). The admin
address serves /metrics (Prometheus) and /healthz; the gRPC port also serves grpc.health.v1.
SIGTERM or SIGINT stops gracefully (calls in flight finish, up to --shutdown-timeout).
The Redis password, if any, is read from the environment variable SLUICE_REDIS_PASSWORD.
--redis-tls connects to Redis over TLS; --tls-cert serves TLS (mTLS with --tls-client-ca).

` + serveRLQSUsage + `
Flags:
`

// serveConfig is the parsed command line of `sluice serve`.
type serveConfig struct {
	listen, admin, configPath string
	redisAddrs                []string
	redisUser                 string
	inlineDomains             []string
	redisTimeout              time.Duration
	shutdownTimeout           time.Duration
	headers                   *rls.HeaderNames
	poolSize                  int
	shadow                    bool
	quota                     bool
	maxStatKeys               int
	dynamicMetadata           bool
	chargeDenied              bool
	confOpts                  rls.ConfigOptions
	tls                       serveTLS // serve_tls.go
}

func runServe(args []string, stdout, stderr io.Writer) int {
	cfg, code := parseServeFlags(args, stdout, stderr)
	if cfg == nil {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := serve(ctx, *cfg, hup, stderr, nil); err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 1
	}
	return 0
}

func parseServeFlags(args []string, stdout, stderr io.Writer) (*serveConfig, int) {
	cfg := &serveConfig{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var cluster, inline string
	var headers, check bool
	fs.BoolVar(&cfg.confOpts.MergeDomains, "merge-domains", os.Getenv("MERGE_DOMAIN_CONFIG") == "true",
		"let several --config files configure one domain (merged), as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG")
	fs.BoolVar(&cfg.shadow, "shadow-mode", os.Getenv("SHADOW_MODE") == "true",
		"answer OK even over a limit (statuses still say OVER_LIMIT), as envoyproxy/ratelimit's SHADOW_MODE; without --charge-denied such calls are still charged to no descriptor")
	fs.BoolVar(&cfg.quota, "quota-mode", os.Getenv("QUOTA_MODE") == "true",
		"put every configured descriptor in quota mode, as envoyproxy/ratelimit's QUOTA_MODE: a call is over only when a descriptor outside quota mode is, or every one in it")
	fs.BoolVar(&cfg.chargeDenied, "charge-denied", false,
		"count denied requests too, as envoyproxy/ratelimit does: every descriptor of every call adds its hits_addend to its window's counter; fixed_window limits only")
	fs.BoolVar(&cfg.dynamicMetadata, "response-dynamic-metadata", os.Getenv("RESPONSE_DYNAMIC_METADATA") == "true",
		"return the domain, the descriptors, the hits addend and the metadata of the descriptors that passed as the response's dynamic metadata, as envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA")
	fs.IntVar(&cfg.maxStatKeys, "max-stat-keys", rls.DefaultMaxStatKeys,
		"per-limit statistics: how many stat keys holding request values (detailed_metric, value_to_metric, limit overrides) get series of their own; later ones count as key \"other\"")
	fs.BoolVar(&check, "check", false, "validate --config, print \"ok\" and one line per limit, and exit (no --redis-cluster needed)")
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:8081", "address to serve gRPC on")
	fs.StringVar(&cluster, "redis-cluster", "", "HOST:PORT[,HOST:PORT...]: seed nodes of the Redis Cluster (required)")
	fs.StringVar(&cfg.redisUser, "redis-username", "", "Redis ACL user (the password comes from $SLUICE_REDIS_PASSWORD)")
	fs.StringVar(&cfg.configPath, "config", "", "envoyproxy/ratelimit configuration: a YAML file or a directory of them; empty: none")
	fs.StringVar(&cfg.admin, "admin", "", "address for /metrics and /healthz; empty: none")
	fs.StringVar(&inline, "inline-domains", "", "D[,D...]: domains whose inline (sluice.wasm) descriptors are accepted; \"*\": any; empty: none")
	fs.DurationVar(&cfg.redisTimeout, "redis-timeout", time.Second, "bound on each Redis call (dial, send, reply)")
	fs.IntVar(&cfg.poolSize, "redis-pool-size", 0, "connections per Redis node (0: go-redis's default, 10 per CPU)")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful stop waits for calls in flight")
	fs.BoolVar(&headers, "response-headers", os.Getenv("LIMIT_RESPONSE_HEADERS_ENABLED") == "true",
		"add RateLimit-Limit, -Remaining and -Reset to responses as envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED (names from LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER)")
	tlsFlags := registerServeTLSFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, serveUsage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil, 0
		}
		return nil, usageError(stderr, "serve", err)
	}
	if fs.NArg() > 0 {
		return nil, usageError(stderr, "serve", fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if cfg.maxStatKeys < 1 {
		return nil, usageError(stderr, "serve", fmt.Errorf("--max-stat-keys %d: must be at least 1", cfg.maxStatKeys))
	}
	if check {
		return nil, checkServeConfig(*cfg, stdout, stderr)
	}
	if err := cfg.lists(cluster, inline); err != nil {
		return nil, usageError(stderr, "serve", err)
	}
	var err error
	if cfg.tls, err = tlsFlags.parse(); err != nil {
		fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return nil, 2
	}
	if cfg.redisTimeout <= 0 || cfg.shutdownTimeout < 0 {
		return nil, usageError(stderr, "serve", errors.New("--redis-timeout must be positive and --shutdown-timeout not negative"))
	}
	if headers {
		h := rls.DefaultHeaderNames
		for _, e := range []struct {
			env string
			dst *string
		}{{"LIMIT_LIMIT_HEADER", &h.Limit}, {"LIMIT_REMAINING_HEADER", &h.Remaining}, {"LIMIT_RESET_HEADER", &h.Reset}} {
			if v := os.Getenv(e.env); v != "" {
				*e.dst = v
			}
		}
		cfg.headers = &h
	}
	return cfg, 0
}

// checkServeConfig is --check: it validates --config and prints "ok" and
// one line per limit; the exit status.
func checkServeConfig(cfg serveConfig, stdout, stderr io.Writer) int {
	if cfg.configPath == "" {
		return usageError(stderr, "serve", errors.New("--check needs --config"))
	}
	c, err := loadServeConfig(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "sluice serve --check: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "ok")
	for _, l := range c.Summary() {
		fmt.Fprintln(stdout, l)
	}
	return 0
}

// lists reads --redis-cluster (required) and --inline-domains.
func (cfg *serveConfig) lists(cluster, inline string) error {
	if cluster == "" {
		return errors.New("--redis-cluster is required")
	}
	for _, a := range strings.Split(cluster, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("--redis-cluster: bad address %q", a)
		}
		cfg.redisAddrs = append(cfg.redisAddrs, a)
	}
	if inline == "" {
		return nil
	}
	for _, d := range strings.Split(inline, ",") {
		if d == "" {
			return errors.New("--inline-domains: empty domain")
		}
		cfg.inlineDomains = append(cfg.inlineDomains, d)
	}
	return nil
}

// loadServeConfig reads --config and checks it against the flags that
// constrain it (--charge-denied: fixed_window limits only).
func loadServeConfig(cfg serveConfig) (*rls.Config, error) {
	c, err := rls.LoadConfigWith(cfg.configPath, cfg.confOpts)
	if err != nil {
		return nil, err
	}
	if cfg.chargeDenied {
		if err := c.CheckChargeDenied(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// newServeBackend connects the service to its Redis Cluster; tests replace
// it to hold calls in flight.
var newServeBackend = func(cfg serveConfig) (interface {
	rls.Backend
	Close() error
}, error) {
	return rls.NewClusterBackend(cfg.redisAddrs, cfg.redisUser, os.Getenv("SLUICE_REDIS_PASSWORD"),
		redisclient.Options{PoolSize: cfg.poolSize, TLS: cfg.tls.redis}, cfg.redisTimeout)
}

// startServeAdmin serves h on addr (none when addr is empty): the server
// and the address it bound; a failure to serve goes to errc.
func startServeAdmin(addr string, h http.Handler, errc chan<- error) (*http.Server, string, error) {
	if addr == "" {
		return nil, "", nil
	}
	al, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	admin := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := admin.Serve(al); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()
	return admin, al.Addr().String(), nil
}

// serveUntil reloads the configuration on hup until ctx ends (nil) or a
// server fails (its error, from errc).
func serveUntil(ctx context.Context, errc <-chan error, hup <-chan os.Signal, cfg serveConfig, srv *rls.Server, logger *slog.Logger) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-hup:
			if cfg.configPath == "" {
				logger.Warn("SIGHUP: no --config to reload")
				continue
			}
			c, err := loadServeConfig(cfg)
			if err != nil {
				logger.Error("SIGHUP: configuration not reloaded, the previous one stays", "err", err)
				continue
			}
			srv.SetConfig(c)
			logger.Info("SIGHUP: configuration reloaded", "domains", strings.Join(c.Domains(), ","))
		}
	}
}

// serveAddrs are the addresses a started `sluice serve` bound.
type serveAddrs struct{ grpc, admin string }

// serve runs the service until ctx ends, then stops gracefully. A value on
// hup reloads --config (a bad file keeps the previous configuration).
// ready, if set, receives the bound addresses once both listeners accept.
func serve(ctx context.Context, cfg serveConfig, hup <-chan os.Signal, stderr io.Writer, ready func(serveAddrs)) error {
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	var conf *rls.Config
	if cfg.configPath != "" {
		c, err := loadServeConfig(cfg)
		if err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		conf = c
	}
	backend, err := newServeBackend(cfg)
	if err != nil {
		return err
	}
	defer backend.Close()
	goredis.SetLogger(redisLogger{logger})
	cfg.tls.check(logger, backend)
	var hsp atomic.Pointer[health.Server]
	watch := newServeWatch(backend, logger, &hsp)
	defer watch.Stop()
	srv := rls.New(rls.Options{Backend: watch, InlineDomains: cfg.inlineDomains, Config: conf,
		Headers: cfg.headers, GlobalShadow: cfg.shadow, GlobalQuota: cfg.quota, MaxStatKeys: cfg.maxStatKeys, DynamicMetadata: cfg.dynamicMetadata, ChargeDenied: cfg.chargeDenied, RefundTimeout: cfg.redisTimeout, Logger: logger})

	lis, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	g := grpc.NewServer(cfg.tls.serverOptions()...)
	pb.RegisterRateLimitServiceServer(g, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	hs.SetServingStatus("envoy.service.ratelimit.v3.RateLimitService", healthpb.HealthCheckResponse_SERVING)
	quota := registerRLQS(g, hs, srv, watch, cfg, logger)
	hsp.Store(hs)
	errc := make(chan error, 2)
	go func() { errc <- g.Serve(lis) }()

	addrs := serveAddrs{grpc: lis.Addr().String()}
	stopping := make(chan struct{})
	admin, adminAddr, err := startServeAdmin(cfg.admin, withReady(watch, withRLQSMetrics(quota, srv.Metrics.Handler(func() error {
		select {
		case <-stopping:
			return errors.New("shutting down")
		default:
			return nil
		}
	}))), errc)
	if err != nil {
		g.Stop()
		return err
	}
	addrs.admin = adminAddr
	domains := "none"
	if conf != nil {
		domains = strings.Join(conf.Domains(), ",")
	}
	grpcTLS, redisTLS := cfg.tls.modes()
	logger.Info("sluice serve: serving envoy.service.ratelimit.v3.RateLimitService", "grpc", addrs.grpc, "admin", addrs.admin,
		"redis_cluster", strings.Join(cfg.redisAddrs, ","), "inline_domains", strings.Join(cfg.inlineDomains, ","), "config_domains", domains,
		"grpc_transport", grpcTLS, "redis_transport", redisTLS)
	if ready != nil {
		ready(addrs)
	}

	runErr := serveUntil(ctx, errc, hup, cfg, srv, logger)
	// Graceful stop: health answers NOT_SERVING, new calls are refused, calls
	// in flight finish (with their refunds) until the deadline.
	close(stopping)
	hs.Shutdown()
	stopRLQS(quota, cfg.shutdownTimeout)
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(cfg.shutdownTimeout):
		logger.Warn("sluice serve: shutdown deadline passed; closing the calls still in flight")
		g.Stop()
		<-done
	}
	if admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		admin.Shutdown(sctx)
		cancel()
	}
	logger.Info("sluice serve: stopped")
	return runErr
}
