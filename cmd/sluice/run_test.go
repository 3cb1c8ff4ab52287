package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// Modules used by these tests are compiled once per test binary run.
var (
	wasmOnce  sync.Map // package dir -> *wasmBuild
	wasmDirMu sync.Mutex
	wasmDir   string
)

type wasmBuild struct {
	once sync.Once
	path string
	err  error
}

// skipShort skips t under go test -short (make test-unit), the tier that runs no subprocess
// (go build, a child sluice, Chromium): what says what t would have run.
func skipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip(what + ": not under -short")
	}
}

// buildWasm compiles the Go package in dir (relative to this package) for wasip1 as a
// c-shared module and returns the file's path.
func buildWasm(t *testing.T, dir string) string {
	t.Helper()
	skipShort(t, "builds "+dir+" (go build, GOOS=wasip1)")
	wasmDirMu.Lock()
	if wasmDir == "" {
		d, err := os.MkdirTemp("", "sluice-run-test-")
		if err != nil {
			wasmDirMu.Unlock()
			t.Fatal(err)
		}
		wasmDir = d
	}
	out := filepath.Join(wasmDir, strings.NewReplacer("/", "_", ".", "_").Replace(dir)+".wasm")
	wasmDirMu.Unlock()
	b, _ := wasmOnce.LoadOrStore(dir, &wasmBuild{})
	wb := b.(*wasmBuild)
	wb.once.Do(func() {
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			wb.err = err
			t.Logf("%s", msg)
			return
		}
		if strings.HasSuffix(dir, "sluice-wasm") {
			if wb.err = wasmpatch.PatchFile(out); wb.err != nil {
				return
			}
		}
		wb.path = out
	})
	if wb.err != nil {
		t.Fatalf("building %s: %v", dir, wb.err)
	}
	return wb.path
}

const kitchenDir = "../../host/testdata/guests/kitchen"

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a running server.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startTestRun(t testing.TB, cfg runConfig) (*runServer, *syncBuffer, context.CancelFunc) {
	t.Helper()
	if cfg.listen == "" {
		cfg.listen = "127.0.0.1:0"
	}
	if cfg.workers == 0 {
		cfg.workers = 2
	}
	if cfg.logLevel == "" {
		cfg.logLevel = "info"
	}
	if cfg.memoryMB == 0 {
		cfg.memoryMB = 256
	}
	if cfg.vmID == "" {
		cfg.vmID = "sluice"
	}
	if cfg.cacheDir == "" {
		cfg.cacheDir = t.TempDir()
	}
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &syncBuffer{}, &syncBuffer{}
	rs, err := startRun(ctx, cfg, out, errOut)
	if err != nil {
		cancel()
		t.Fatalf("startRun: %v\n%s", err, errOut)
	}
	t.Cleanup(func() {
		cancel()
		rs.wait()
	})
	return rs, out, cancel
}

func httpGet(t *testing.T, url string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestRunServesThroughTheFilter(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "cfg")
	os.WriteFile(cfgFile, []byte("from-file"), 0o644)
	rs, out, cancel := startTestRun(t, runConfig{wasm: buildWasm(t, kitchenDir), configPath: cfgFile, admin: "127.0.0.1:0", clusters: clusterFlag{}})
	for _, want := range []string{"listening on http://" + rs.listenAddr + " -> built-in echo", "admin on http://" + rs.adminAddr, "config: " + cfgFile, "host profile envoy-1.33"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	base := "http://" + rs.listenAddr
	resp, body := httpGet(t, base+"/echo-headers?q=1", "X-Remove", "1")
	if resp.StatusCode != 200 || !strings.Contains(body, "GET /echo-headers?q=1 HTTP/1.1\n") || !strings.Contains(body, "X-Added: 1\n") || strings.Contains(body, "X-Remove") {
		t.Errorf("echo through filter: %d\n%s", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Kitchen-Response") == "" {
		t.Errorf("response phase did not run: %v", resp.Header)
	}
	_, body = httpGet(t, base+"/echo-headers", "Accept", "application/json")
	if !strings.Contains(body, `"method":"GET"`) || !strings.Contains(body, `"X-Added":["1"]`) {
		t.Errorf("JSON echo: %s", body)
	}
	resp, body = httpGet(t, base+"/local")
	if resp.StatusCode != 403 || body != "nope\n" {
		t.Errorf("local reply: %d %q", resp.StatusCode, body)
	}
	_, body = httpGet(t, base+"/props")
	if !strings.Contains(body, "source.address=127.0.0.1:") || !strings.Contains(body, "plugin_vm_id=sluice;0") {
		t.Errorf("props:\n%s", body)
	}
	admin := "http://" + rs.adminAddr
	_, body = httpGet(t, admin+"/metrics")
	if !strings.Contains(body, "kitchen_requests_total 4\n") || !strings.Contains(body, "sluice_host_requests_total 4\n") {
		t.Errorf("/metrics:\n%s", body)
	}
	_, body = httpGet(t, admin+"/status")
	if !strings.Contains(body, `"plugin_config": "from-file"`) {
		t.Errorf("/status:\n%s", body)
	}
	resp, _ = httpGet(t, admin+"/healthz")
	if resp.StatusCode != 200 {
		t.Errorf("/healthz: %d", resp.StatusCode)
	}
	// Graceful shutdown: wait returns, the port is closed.
	cancel()
	done := make(chan error, 1)
	go func() { done <- rs.wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("shutdown did not finish")
	}
	if _, err := http.Get(base + "/"); err == nil {
		t.Error("still serving after shutdown")
	}
}

func TestRunUpstream(t *testing.T) {
	var mu sync.Mutex
	var got []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Host+" "+r.Header.Get("X-Forwarded-For")+" "+r.Header.Get("X-Added"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "upstream says hi")
	}))
	defer up.Close()
	rs, _, _ := startTestRun(t, runConfig{wasm: buildWasm(t, kitchenDir), upstream: up.URL, clusters: clusterFlag{}})
	req, _ := http.NewRequest("GET", "http://"+rs.listenAddr+"/echo-headers", nil)
	req.Host = "api.example"
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "upstream says hi" || resp.Header.Get("X-Kitchen-Response") == "" {
		t.Errorf("response %q %v", b, resp.Header)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0] != "api.example 203.0.113.9, 127.0.0.1 1" {
		t.Errorf("upstream saw %q", got)
	}
}

func TestRunRefusesBadStart(t *testing.T) {
	ctx := context.Background()
	var out, errOut syncBuffer
	_, err := startRun(ctx, runConfig{wasm: buildWasm(t, "../../host/testdata/guests/badconfig"), listen: "127.0.0.1:0", workers: 1, logLevel: "info", memoryMB: 64, clusters: clusterFlag{}}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "proxy_on_configure returned false") {
		t.Fatalf("bad configuration: %v", err)
	}
	if !strings.Contains(errOut.String(), "is not a duration") {
		t.Errorf("the filter's reason is not logged:\n%s", errOut.String())
	}
	_, err = startRun(ctx, runConfig{wasm: buildWasm(t, "../../host/testdata/guests/noabi"), listen: "127.0.0.1:0", workers: 1, logLevel: "info", memoryMB: 64, clusters: clusterFlag{}}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "proxy_abi_version") {
		t.Fatalf("module without ABI version: %v", err)
	}
}

func TestRunCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-h"}, 0, "usage: sluice run"},
		{[]string{"--nope"}, 2, "sluice run: unknown flag --nope; see 'sluice run --help'"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--wasm", "/does/not/exist.wasm"}, 1, "reading --wasm"},
		{[]string{"--workers", "0", "--wasm", "x"}, 1, "--workers must be at least 1"},
		{[]string{"--upstream", "ftp://x", "--wasm", os.Args[0]}, 1, "--upstream: want an http://, https:// or h2c:// URL"},
		{[]string{"--upstream", "h2c:///nohost", "--wasm", os.Args[0]}, 1, `--upstream: want an http://, https:// or h2c:// URL, got "h2c:///nohost"`},
		{[]string{"--cluster", "noequals"}, 2, "want NAME=URL"},
		{[]string{"--log-level", "loud"}, 1, "--log-level"},
		{[]string{"--config", "/does/not/exist.json", "--wasm", os.Args[0]}, 1, "reading --config"},
		{[]string{"--call-timeout", "5x"}, 2, `sluice run: invalid value "5x" for flag --call-timeout: "5x" is not a duration (500ms, 1m30s, 1h, 1d); see 'sluice run --help'`},
		{[]string{"--profile", "envoy-9"}, 2, `--profile: host: unknown profile "envoy-9" (known: cpphost-533, envoy-1.33, higress, permissive)`},
		{[]string{"-h"}, 0, "envoy-1.33, cpphost-533, higress, permissive (the default is the strictest"},
		{[]string{"--failure-policy", "reboot"}, 2, `--failure-policy: host: unknown failure policy "reboot"`},
		{[]string{"-h"}, 0, "fail-closed (Envoy's default: 503 until restart)"},
	} {
		var out, errOut bytes.Buffer
		code := dispatch(append([]string{"run"}, tc.args...), &out, &errOut)
		if code != tc.code || !strings.Contains(out.String()+errOut.String(), tc.msg) {
			t.Errorf("sluice run %v = %d, want %d and %q; output:\n%s%s", tc.args, code, tc.code, tc.msg, out.String(), errOut.String())
		}
		// Help goes to stdout; a usage error is one line on stderr.
		if tc.code == 0 && errOut.Len() != 0 || tc.code == 2 && (out.Len() != 0 || strings.Count(errOut.String(), "\n") != 1) {
			t.Errorf("sluice run %v: stdout %q, stderr %q", tc.args, out.String(), errOut.String())
		}
	}
}

// The quick start: the real filter with the embedded default configuration allows 5
// requests from one client, then answers 429 with Retry-After.
func TestRunDefaultConfigWithTheFilter(t *testing.T) {
	rs, _, _ := startTestRun(t, runConfig{wasm: buildWasm(t, "../sluice-wasm"), clusters: clusterFlag{}})
	base := "http://" + rs.listenAddr
	for i := 1; i <= 5; i++ {
		resp, body := httpGet(t, base+"/hello")
		if resp.StatusCode != 200 || !strings.Contains(body, "GET /hello HTTP/1.1") {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	resp, body := httpGet(t, base+"/hello")
	if resp.StatusCode != 429 || body != "rate limited\n" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("6th request: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

func TestRunCompilationCacheDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	startTestRun(t, runConfig{wasm: buildWasm(t, kitchenDir), cacheDir: dir, clusters: clusterFlag{}})
	n := 0
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			n++
		}
		return nil
	})
	if n == 0 {
		t.Fatalf("no compiled module cached in %s", dir)
	}
}

// A configuration the module refuses: `sluice run` prints its errors one per line with the
// file name, exactly as `sluice check` does.
func TestRunPrintsConfigErrorsLikeCheck(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(cfgFile, []byte(`{"rules":[{"name":"a","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":0,"window":"10x"}]}`), 0o644)
	var checkOut, checkErr bytes.Buffer
	if code := dispatch([]string{"check", cfgFile}, &checkOut, &checkErr); code != 1 {
		t.Fatalf("check: %d\n%s", code, checkErr.String())
	}
	var out, errOut syncBuffer
	_, err := startRun(context.Background(), runConfig{wasm: buildWasm(t, "../sluice-wasm"), configPath: cfgFile, listen: "127.0.0.1:0",
		workers: 1, logLevel: "info", memoryMB: 64, clusters: clusterFlag{}}, &out, &errOut)
	if err == nil {
		t.Fatal("started with an invalid configuration")
	}
	for _, line := range strings.Split(strings.TrimSpace(checkErr.String()), "\n") {
		if !strings.Contains(err.Error(), "\n"+line) {
			t.Errorf("run's error lacks check's line %q:\n%v", line, err)
		}
	}
}

// --failure-policy reaches the host; --fail-open is Envoy's legacy flag.
func TestRunFailurePolicyFlag(t *testing.T) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		flag string
		want host.FailurePolicy
	}{{"", host.FailClosed}, {"fail-closed", host.FailClosed}, {"fail-reload", host.FailReload}, {"FAIL_OPEN", host.FailOpen}} {
		if got := runHostOptions(runConfig{failurePolicy: tc.flag}, runInputs{}, logger).FailurePolicy; got != tc.want {
			t.Errorf("--failure-policy %q: %v, want %v", tc.flag, got, tc.want)
		}
	}
	if o := runHostOptions(runConfig{failOpen: true}, runInputs{}, logger); !o.FailOpen {
		t.Errorf("--fail-open: %+v", o)
	}
}
