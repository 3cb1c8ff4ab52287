package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// The embedded host's target: build sluice.wasm and the sluice binary into a temporary
// directory (or use SLUICE_E2E_WASM / SLUICE_E2E_BIN), start `sluice run` as a subprocess per
// scenario, built-in echo upstream. Real Envoy runs the same scenarios in envoy_run_test.go
// (TestEnvoyScenarios), as local processes.
const (
	envWasm = "SLUICE_E2E_WASM"
	envBin  = "SLUICE_E2E_BIN"
)

// startTimeout bounds how long a proxy may take to start (compile the module, start the VMs)
// on a loaded 2-core machine.
const startTimeout = 2 * time.Minute

// proxy is a running proxy for one scenario.
type proxy struct {
	url   string // base URL, no trailing slash
	admin string // sluice run's admin base URL (empty for Envoy)
	envoy *envoyproc.Envoy
}

// artifacts are the module and the binary the host target runs.
var artifacts struct {
	once      sync.Once
	wasm, bin string
	err       error
	dir       string
}

// buildArtifacts builds dist-like artifacts once per test binary, unless given by env.
func buildArtifacts(t testing.TB) (wasm, bin string) {
	t.Helper()
	skipShort(t, "builds sluice.wasm and the sluice binary (go build) and runs them")
	artifacts.once.Do(func() {
		artifacts.wasm, artifacts.bin = os.Getenv(envWasm), os.Getenv(envBin)
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		}
		// `go test` runs in e2e/: paths given relative to the repository root (as README
		// writes them: SLUICE_E2E_WASM=dist/sluice.wasm) are resolved against the root.
		if root, err := moduleRoot(goTool); err == nil {
			for _, p := range []*string{&artifacts.wasm, &artifacts.bin} {
				if *p != "" && !filepath.IsAbs(*p) {
					*p = filepath.Join(root, *p)
				}
			}
		}
		if artifacts.wasm != "" && artifacts.bin != "" {
			return
		}
		root, err := moduleRoot(goTool)
		if err != nil {
			artifacts.err = err
			return
		}
		dir, err := os.MkdirTemp("", "sluice-e2e-")
		if err != nil {
			artifacts.err = err
			return
		}
		artifacts.dir = dir
		if artifacts.wasm == "" {
			artifacts.wasm = filepath.Join(dir, "sluice.wasm")
			cmd := exec.Command(goTool, "build", "-buildmode=c-shared", "-o", artifacts.wasm, "./cmd/sluice-wasm")
			cmd.Dir = root
			cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
			if out, err := cmd.CombinedOutput(); err != nil {
				artifacts.err = fmt.Errorf("building sluice.wasm: %v\n%s", err, out)
				return
			}
			if err := wasmpatch.PatchFile(artifacts.wasm); err != nil {
				artifacts.err = err
				return
			}
		}
		if artifacts.bin == "" {
			artifacts.bin = filepath.Join(dir, "sluice")
			cmd := exec.Command(goTool, "build", "-o", artifacts.bin, "./cmd/sluice")
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				artifacts.err = fmt.Errorf("building sluice: %v\n%s", err, out)
				return
			}
		}
	})
	if artifacts.err != nil {
		t.Fatal(artifacts.err)
	}
	return artifacts.wasm, artifacts.bin
}

// skipShort skips t under go test -short (make test-unit), the tier that runs no subprocess:
// no go build, no sluice binary, no Envoy, no Redis. what says what t would have run.
func skipShort(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skip(what + ": not under -short")
	}
}

func moduleRoot(goTool string) (string, error) {
	out, err := exec.Command(goTool, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the sluice module")
	}
	return filepath.Dir(mod), nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	closeSurvivalCluster()
	if artifacts.dir != "" {
		os.RemoveAll(artifacts.dir)
	}
	if envoyWasmDir != "" {
		os.RemoveAll(envoyWasmDir)
	}
	os.Exit(code)
}

// syncBuffer is a bytes.Buffer safe for the subprocess copier and the test.
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

// sluiceCmd returns the `sluice run` command for a configuration file.
func sluiceCmd(t *testing.T, configPath string, workers int) *exec.Cmd {
	wasm, bin := buildArtifacts(t)
	return exec.Command(bin, "run", "--wasm", wasm, "--config", configPath,
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
		"--workers", strconv.Itoa(workers), "--log-level", "warn")
}

func writeConfig(t *testing.T, sc Scenario) string {
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(sc.Config), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startHost runs `sluice run` for sc and waits until it serves (the listening addresses
// printed on stdout, then /healthz on the admin address). The process is stopped (SIGINT,
// then SIGKILL) when the test ends; its stderr is logged when the test failed.
func startHost(t *testing.T, sc Scenario) *proxy {
	t.Helper()
	cmd := sluiceCmd(t, writeConfig(t, sc), ScenarioWorkers(sc))
	for _, r := range sc.Routes {
		cmd.Args = append(cmd.Args, "--route", r.Name+"="+r.PathPrefix)
	}
	return startHostCmd(t, cmd)
}

// startHostCmd starts cmd, a `sluice run` command with --listen and --admin, as startHost
// does.
func startHostCmd(t *testing.T, cmd *exec.Cmd) *proxy {
	t.Helper()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	addrs := make(chan [2]string, 1)
	go func() {
		var listen, admin string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, "sluice: listening on "); ok {
				listen, _, _ = strings.Cut(a, " ")
			}
			if a, ok := strings.CutPrefix(line, "sluice: admin on "); ok {
				admin, _, _ = strings.Cut(a, " ")
			}
			if listen != "" && admin != "" {
				addrs <- [2]string{listen, admin}
				break
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("sluice run did not stop within 15s of SIGINT")
		}
		if t.Failed() {
			t.Logf("sluice run stderr:\n%s", stderr.String())
		}
	})
	var p proxy
	select {
	case a := <-addrs:
		p = proxy{url: strings.TrimRight(a[0], "/"), admin: strings.TrimRight(a[1], "/")}
	case err := <-exited:
		exited <- err
		t.Fatalf("sluice run exited before serving (%v):\n%s", err, stderr.String())
	case <-time.After(startTimeout):
		t.Fatalf("sluice run did not print its addresses within %v:\n%s", startTimeout, stderr.String())
	}
	// Readiness: poll the admin server's /healthz.
	deadline := time.Now().Add(startTimeout)
	for {
		resp, err := http.Get(p.admin + "/healthz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return &p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/healthz not OK within %v (last: %v)", p.admin, startTimeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runStartFailure checks that the proxy refuses sc's configuration: the process exits
// non-zero, promptly, with the expected error text on stderr.
func runStartFailure(t *testing.T, sc Scenario) {
	t.Helper()
	cmd := sluiceCmd(t, writeConfig(t, sc), 2)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(startTimeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("sluice run kept running with a bad configuration; stdout:\n%s", stdout.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("sluice run: %v, want a non-zero exit status; stderr:\n%s", err, stderr.String())
	}
	// The guest's message reaches stderr through slog, which quotes it: unquote before
	// looking for the JSON path.
	text := strings.ReplaceAll(stderr.String(), `\"`, `"`)
	for _, want := range append(sc.StartFails.StderrContains, sc.StartFails.HostContains...) {
		if !strings.Contains(text, want) {
			t.Errorf("stderr does not contain %q:\n%s", want, stderr.String())
		}
	}
	if strings.Contains(stdout.String(), "listening on") {
		t.Errorf("stdout says it is listening:\n%s", stdout.String())
	}
}

// hostStatus is the part of the admin /status document the scenarios check afterwards.
type hostStatus struct {
	Requests       int64 `json:"requests"`
	VMRestarts     int64 `json:"vm_restarts"`
	FailedRequests int64 `json:"failed_requests"`
}

// checkHostHealthy fails the test if the host restarted a VM or failed a request.
func checkHostHealthy(t *testing.T, p *proxy) {
	t.Helper()
	if p.admin == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.admin+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("admin /status: %v", err)
		return
	}
	defer resp.Body.Close()
	var st hostStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Errorf("admin /status: %v", err)
		return
	}
	if st.VMRestarts != 0 || st.FailedRequests != 0 {
		t.Errorf("host status after the scenario: %d VM restarts, %d failed requests, want none", st.VMRestarts, st.FailedRequests)
	}
}
