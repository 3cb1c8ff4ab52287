package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-proxy/sluice/serve/rls"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

func TestServeFlags(t *testing.T) {
	cases := []struct {
		args []string
		code int
		out  string
	}{
		{nil, 2, "--redis-cluster is required"},
		{[]string{"--redis-cluster", "nohost"}, 2, `bad address "nohost"`},
		{[]string{"--redis-cluster", "127.0.0.1:1", "--inline-domains", "a,,b"}, 2, "empty domain"},
		{[]string{"--redis-cluster", "127.0.0.1:1", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--redis-cluster", "127.0.0.1:1", "--redis-timeout", "0s"}, 2, "--redis-timeout must be positive"},
		{[]string{"--help"}, 0, "usage: sluice serve --redis-cluster"},
	}
	for _, tc := range cases {
		var stdout, stderr bytes.Buffer
		code := dispatch(append([]string{"serve"}, tc.args...), &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("serve %q: exit %d, output %q; want exit %d with %q", tc.args, code, stdout.String()+stderr.String(), tc.code, tc.out)
		}
	}
	// --check validates a configuration and lists its limits.
	good := writeFile(t, "rl.yaml", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket, burst: 9}\n    descriptors:\n      - key: n\n        rate_limit: {unlimited: true}\n")
	var out bytes.Buffer
	if code := dispatch([]string{"serve", "--check", "--config", good}, &out, io.Discard); code != 0 ||
		out.String() != "ok\nd.k_v: 5 per minute token_bucket burst 9, shadow_mode\nd.k_v.n: unlimited\n" {
		t.Errorf("--check: exit %d, %q", code, out.String())
	}
	bad := writeFile(t, "bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: lightyear, requests_per_unit: 5}\n")
	var errOut bytes.Buffer
	if code := dispatch([]string{"serve", "--check", "--config", bad}, io.Discard, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "bad.yaml: descriptor 'd.k': invalid rate limit unit 'lightyear'") {
		t.Errorf("--check of a bad file: exit %d, %q", code, errOut.String())
	}
	// --charge-denied refuses a configuration with other algorithms than
	// fixed_window, in --check and at start-up (before Redis is dialled).
	errOut.Reset()
	if code := dispatch([]string{"serve", "--check", "--charge-denied", "--config", good}, io.Discard, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "--charge-denied applies to fixed_window limits only (envoyproxy/ratelimit's counters); not to d.k_v (token_bucket)") {
		t.Errorf("--check --charge-denied: exit %d, %q", code, errOut.String())
	}
	errOut.Reset()
	if code := dispatch([]string{"serve", "--redis-cluster", "127.0.0.1:1", "--charge-denied", "--config", good}, io.Discard, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "--config: --charge-denied applies to fixed_window limits only") {
		t.Errorf("serve --charge-denied: exit %d, %q", code, errOut.String())
	}
	fixed := writeFile(t, "fixed.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	out.Reset()
	if code := dispatch([]string{"serve", "--check", "--charge-denied", "--config", fixed}, &out, io.Discard); code != 0 ||
		out.String() != "ok\nd.k: 5 per minute fixed_window\n" {
		t.Errorf("--check --charge-denied of fixed windows: exit %d, %q", code, out.String())
	}
	var stderr bytes.Buffer
	if code := dispatch([]string{"serve", "--redis-cluster", "127.0.0.1:1", "--config", filepath.Join(t.TempDir(), "none.yaml")}, io.Discard, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "--config:") {
		t.Errorf("missing config: exit %d, %q", code, stderr.String())
	}
}

// TestServeHelperProcess is `sluice serve` in a child process of
// TestServeProcess (it does nothing in a normal run).
func TestServeHelperProcess(t *testing.T) {
	if os.Getenv("SLUICE_SERVE_HELPER") != "1" {
		return
	}
	os.Exit(runServe(strings.Split(os.Getenv("SLUICE_SERVE_ARGS"), "\n"), os.Stdout, os.Stderr))
}

// lineLog collects a child's stderr lines and lets a test wait for one.
type lineLog struct {
	mu    sync.Mutex
	lines []string
	cond  *sync.Cond
}

func newLineLog(r io.Reader) *lineLog {
	l := &lineLog{}
	l.cond = sync.NewCond(&l.mu)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.mu.Lock()
			l.lines = append(l.lines, sc.Text())
			l.cond.Broadcast()
			l.mu.Unlock()
		}
	}()
	return l
}

// wait returns the first line matching re, failing after timeout.
func (l *lineLog) wait(t *testing.T, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	go func() { time.Sleep(timeout); l.cond.Broadcast() }()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for _, s := range l.lines {
			if m := re.FindStringSubmatch(s); m != nil {
				return m
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line matching %s in:\n%s", re, strings.Join(l.lines, "\n"))
		}
		l.cond.Wait()
	}
}

// The process: a configuration directory (dot files and other extensions
// skipped), inline and configured descriptors, gRPC health, /healthz and
// /metrics, SIGHUP reloads (a bad file keeps the previous configuration),
// SIGTERM stops gracefully with exit status 0.
func TestServeProcess(t *testing.T) {
	skipShort(t, "runs sluice serve as a child process")
	c := testCluster(t)
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	key := "k" + time.Now().Format("150405.000000")
	write("a.yaml", "domain: a\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	write("b.yml", "domain: b\ndescriptors: []\n")
	write(".hidden.yaml", "not: [valid\n")
	write("README.txt", "not yaml at all: [\n")
	args := []string{"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--redis-cluster", strings.Join(c.Addrs, ","),
		"--config", dir, "--inline-domains", "mesh"}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeHelperProcess$")
	cmd.Env = append(os.Environ(), "SLUICE_SERVE_HELPER=1", "SLUICE_SERVE_ARGS="+strings.Join(args, "\n"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	log := newLineLog(stderr)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	}()
	m := log.wait(t, regexp.MustCompile(`grpc=(\S+) admin=(\S+).*config_domains=a,b`), 20*time.Second)
	grpcAddr, adminAddr := m[1], m[2]

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	decide := func(domain string, ds ...*ratelimitv3.RateLimitDescriptor) pb.RateLimitResponse_Code {
		t.Helper()
		r, err := client.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		return r.OverallCode
	}
	entry := func(k, v string) *ratelimitv3.RateLimitDescriptor_Entry {
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	user := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{entry("user", key)}}
	if decide("a", user) != pb.RateLimitResponse_OK || decide("a", user) != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatal("configured limit of 1 per hour not applied")
	}
	inline := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		entry(rlswire.Rule, "r"), entry(rlswire.Algorithm, "token_bucket"), entry(rlswire.Limit, "1"),
		entry(rlswire.WindowUS, "3600000000"), entry(rlswire.Burst, "0"), entry(rlswire.Key, key)}}
	if decide("mesh", inline) != pb.RateLimitResponse_OK || decide("mesh", inline) != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatal("inline limit of 1 per hour not applied")
	}

	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q: %v %v", svc, r, err)
		}
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + adminAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{
		`sluice_rls_calls_total{domain="a",code="OK"} 1`, `sluice_rls_calls_total{domain="a",code="OVER_LIMIT"} 1`,
		`sluice_rls_calls_total{domain="mesh",code="OK"} 1`, `sluice_rls_descriptors_total{domain="mesh",outcome="over_limit"} 1`,
		"sluice_rls_call_duration_seconds_count 4", "# TYPE sluice_rls_redis_errors_total counter",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}

	// SIGHUP: a broken file keeps the previous configuration...
	write("b.yml", "domain: b\ndescriptors: [\n")
	cmd.Process.Signal(syscall.SIGHUP)
	log.wait(t, regexp.MustCompile(`configuration not reloaded`), 10*time.Second)
	if decide("a", user) != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatal("a failed reload dropped the configuration")
	}
	// ...a good one replaces it: user now unlimited.
	write("b.yml", "domain: b\ndescriptors: []\n")
	write("a.yaml", "domain: a\ndescriptors:\n  - key: user\n    rate_limit: {unlimited: true}\n")
	cmd.Process.Signal(syscall.SIGHUP)
	log.wait(t, regexp.MustCompile(`configuration reloaded`), 10*time.Second)
	if decide("a", user) != pb.RateLimitResponse_OK {
		t.Fatal("the reloaded configuration is not applied")
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no exit 15 s after SIGTERM")
	}
	log.wait(t, regexp.MustCompile(`sluice serve: stopped`), 5*time.Second)
}

// heldBackend admits every call, but only when released: a call in flight.
type heldBackend struct {
	entered chan struct{}
	release chan struct{}
}

func (h *heldBackend) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	select {
	case h.entered <- struct{}{}:
	default: // the test knows a call is in flight already
	}
	<-h.release
	switch {
	case bytes.Contains(cmd, []byte("INCRBY")):
		return []byte(":1\r\n"), nil // a fixed window's counter (serve/rls counter.go): 1 of 10
	case bytes.Contains(cmd, []byte("PEXPIRE")):
		return []byte(":1\r\n"), nil
	}
	return []byte("*7\r\n:1\r\n:10\r\n:9\r\n:1000\r\n:0\r\n:1700000000000000\r\n:0\r\n"), nil
}

func (h *heldBackend) Close() error { return nil }

// A graceful stop (what SIGTERM and SIGINT trigger): health turns
// NOT_SERVING at once, the call in flight still gets its answer, then
// serve returns.
func TestServeGracefulStop(t *testing.T) {
	held := &heldBackend{entered: make(chan struct{}, 1), release: make(chan struct{})}
	old := newServeBackend
	newServeBackend = func(serveConfig) (interface {
		rls.Backend
		Close() error
	}, error) {
		return held, nil
	}
	defer func() { newServeBackend = old }()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	addrs := make(chan serveAddrs, 1)
	done := make(chan error, 1)
	cfg := serveConfig{listen: "127.0.0.1:0", admin: "127.0.0.1:0", inlineDomains: []string{"mesh"},
		redisTimeout: time.Second, shutdownTimeout: 30 * time.Second}
	go func() { done <- serve(ctx, cfg, nil, io.Discard, func(a serveAddrs) { addrs <- a }) }()
	a := <-addrs
	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	e := func(k, v string) *ratelimitv3.RateLimitDescriptor_Entry {
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		e(rlswire.Rule, "r"), e(rlswire.Algorithm, "fixed_window"), e(rlswire.Limit, "10"),
		e(rlswire.WindowUS, "1000000"), e(rlswire.Burst, "0"), e(rlswire.Key, "k")}}
	answer := make(chan error, 1)
	go func() {
		r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(),
			&pb.RateLimitRequest{Domain: "mesh", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err == nil && r.OverallCode != pb.RateLimitResponse_OK {
			err = fmt.Errorf("answer %v", r)
		}
		answer <- err
	}()
	<-held.entered // the call is in flight
	stop()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err == nil && r.Status == healthpb.HealthCheckResponse_NOT_SERVING {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health while stopping: %v %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("serve returned with a call in flight: %v", err)
	default:
	}
	close(held.release)
	if err := <-answer; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}
