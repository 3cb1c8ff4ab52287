package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// The Envoy suite: the scenarios, and the stages only a real Envoy can run, through every
// Envoy binary envoyproc.Targets names (ENVOY=path, ENVOY_VERSIONS="…", by default
// envoyproc.CIVersions, fetched into a cache outside the repository when missing) with the
// module exactly as `make build` ships it. A binary that cannot be had, or has no V8, fails
// the suite with the command that installs it.

// envoyParallel bounds the Envoys running at once: each compiles the module in V8 and runs
// its workers on a 2-core machine.
var envoyParallel = make(chan struct{}, 3)

// upstreamMaxHeaderBytes is the test upstream's header limit: more than the survival stage's
// largest key (96 KiB) and the other headers.
const upstreamMaxHeaderBytes = 256 << 10

// envoyUpstream is the upstream every Envoy of the suite routes to: a Go server on a free
// 127.0.0.1 port, HTTP/1.1 and h2c, answering 200 "e2e upstream\n" and counting requests.
type envoyUpstream struct {
	port     int
	requests atomic.Int64
}

var sharedUpstream = sync.OnceValues(func() (*envoyUpstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &envoyUpstream{port: l.Addr().(*net.TCPAddr).Port}
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Protocols:      p,
		MaxHeaderBytes: upstreamMaxHeaderBytes,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.requests.Add(1)
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "e2e upstream\n")
		}),
	}
	go srv.Serve(l)
	return u, nil
})

// shippedWasm is sluice.wasm built as `make build` builds it (-trimpath, then wasmpatch),
// once per test binary, unless SLUICE_E2E_WASM names one.
var shippedWasm = sync.OnceValues(func() (string, error) {
	if w := os.Getenv(envWasm); w != "" {
		return filepath.Abs(w)
	}
	return buildGuest("sluice.wasm", "./cmd/sluice-wasm", "", true)
})

// buildGuest builds the Go package pkg (relative to the module root) for wasip1 as `make
// wasm` builds the modules — -buildmode=c-shared -trimpath, the build tags, then the
// wasmpatch shim unless patch is false — into the suite's build directory (removed by
// TestMain) under name.
func buildGuest(name, pkg, tags string, patch bool) (string, error) {
	out, err := goBuildShared("", name, pkg, tags, "GOOS=wasip1", "GOARCH=wasm")
	if err != nil || !patch {
		return out, err
	}
	return out, wasmpatch.PatchFile(out)
}

// goBuildShared builds the Go package pkg (relative to the module root) with
// -buildmode=c-shared -trimpath and the build tags, in the environment env adds, into the
// suite's build directory (removed by TestMain; in a new directory of it when dir is not
// "", the directory's name starting with dir) under name.
func goBuildShared(dir, name, pkg, tags string, env ...string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	root, err := moduleRoot(goTool)
	if err != nil {
		return "", err
	}
	envoyBuildOnce.Do(func() { envoyWasmDir, envoyBuildErr = os.MkdirTemp("", "sluice-e2e-envoy-") })
	if envoyBuildErr != nil {
		return "", envoyBuildErr
	}
	where := envoyWasmDir
	if dir != "" {
		if where, err = os.MkdirTemp(envoyWasmDir, dir); err != nil {
			return "", err
		}
	}
	out := filepath.Join(where, name)
	args := []string{"build", "-buildmode=c-shared", "-trimpath"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command(goTool, append(args, "-o", out, pkg)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s from %s: %v\n%s", name, pkg, err, b)
	}
	return out, nil
}

var (
	envoyBuildOnce sync.Once
	envoyBuildErr  error
)

var envoyWasmDir string

// envoyTargets resolves the Envoys to run, each checked for V8 once; it fails the test when
// one cannot be had.
var envoyTargets = sync.OnceValues(func() ([]envoyproc.Target, error) {
	ts, err := envoyproc.Targets()
	if err != nil {
		return nil, err
	}
	for _, tg := range ts {
		dir, err := os.MkdirTemp("", "sluice-envoy-v8-")
		if err != nil {
			return nil, err
		}
		err = envoyproc.CheckV8(tg, dir)
		os.RemoveAll(dir)
		if err != nil {
			return nil, err
		}
	}
	return ts, nil
})

// forEachEnvoy runs f once per Envoy target, as subtests named by version.
func forEachEnvoy(t *testing.T, f func(t *testing.T, tg envoyproc.Target)) {
	t.Helper()
	forEachEnvoyWhere(t, func(envoyproc.Target) bool { return true }, "", f)
}

// startEnvoy starts Envoy with a bootstrap rendered for the shared upstream and the shipped
// module, waits for /ready and stops it when the test ends (its log goes to the test's
// output when the test failed). It holds one of envoyParallel's slots until then.
func startEnvoy(t *testing.T, tg envoyproc.Target, workers int, render func(EnvoySite) ([]byte, error), args ...string) *envoyproc.Envoy {
	t.Helper()
	e, err := tryStartEnvoy(t, tg, workers, render, args...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func tryStartEnvoy(t *testing.T, tg envoyproc.Target, workers int, render func(EnvoySite) ([]byte, error), args ...string) (*envoyproc.Envoy, error) {
	t.Helper()
	return tryStartEnvoyAs(t, tg, artWasm, "", workers, render, args...)
}

// boundedLog shortens every line of an Envoy log to 400 bytes (a failing request's line may
// carry a 96 KiB header) and keeps its last 200 lines, leaving out the access log's 200s
// and 429s.
func boundedLog(s string) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		// The access log's ordinary answers would push everything else out.
		if !strings.HasPrefix(l, "e2e-access 200 ") && !strings.HasPrefix(l, "e2e-access 429 ") {
			lines = append(lines, l)
		}
	}
	if len(lines) > 200 {
		lines = lines[len(lines)-200:]
	}
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + "…"
		}
	}
	return strings.Join(lines, "\n")
}

// envoyProxy is the proxy of a started Envoy: its ingress listener and admin.
func envoyProxy(t *testing.T, e *envoyproc.Envoy) *proxy {
	t.Helper()
	u, err := e.URL("ingress")
	if err != nil {
		t.Fatal(err)
	}
	return &proxy{url: u, envoy: e}
}

// envoyFailureLines are log lines of a failed VM, a failed call into it, a refused
// module, or a Go runtime crash (Envoy runs at --log-level warn, so a guest's log line at
// warn or above shows too: "wasm log").
var envoyFailureLines = regexp.MustCompile(`wasm_fail_stream|Function: [a-z_]+ failed|Wasm VM failed|missing import|Unable to create Wasm|Failed to load Wasm|wasm log|restricted_callback|runtime\.throw|panic|fatal error|Plugin configured to fail closed`)

// checkEnvoyHealthy fails the test when Envoy shows a VM failure by any signal it gives
// (envoyFailureSignals).
func checkEnvoyHealthy(t *testing.T, e *envoyproc.Envoy, workers int) {
	t.Helper()
	signals, lines := envoyFailureSignals(e, workers)
	for _, s := range signals {
		t.Errorf("envoy shows a VM failure: %s", s)
	}
	for _, l := range lines {
		t.Errorf("envoy log: %s", l)
	}
}

// envoyFailureSignals lists the signals of a VM failure that fired (empty: none): the VM
// lifecycle stats, the plugin's reload counters, sluice's own error counter (present, and
// 0), and failure lines in the log — the bootstrap's access log writes every response's
// details to it, so a request answered by a failed VM shows as wasm_fail_stream even where
// the counters do not move (FAIL_CLOSED keeps the dead VM). Envoy 1.36 to 1.40 create
// workers + 3 VMs for one plugin — the base VM, a canary that is destroyed once it has
// configured, the main thread's and one per worker — so created = workers + 3 and active =
// workers + 2 while none has failed.
func envoyFailureSignals(e *envoyproc.Envoy, workers int) (signals []string, lines []string) {
	st, err := e.Stats("wasm")
	if err != nil {
		return []string{"admin /stats: " + err.Error()}, nil
	}
	created, okc := st["wasm.envoy.wasm.runtime.v8.created"]
	active, oka := st["wasm.envoy.wasm.runtime.v8.active"]
	if !okc || !oka {
		signals = append(signals, "no wasm.envoy.wasm.runtime.v8.created/active")
	} else if created != int64(workers)+3 || active != int64(workers)+2 {
		signals = append(signals, fmt.Sprintf("v8 created %d active %d (want %d and %d)", created, active, workers+3, workers+2))
	}
	for name, v := range st {
		if strings.Contains(name, "vm_reload") && !strings.HasSuffix(name, "backoff") && v != 0 {
			signals = append(signals, fmt.Sprintf("%s = %d", name, v))
		}
	}
	signals = append(signals, errorsCounter(st, artWasm)...)
	lines = failureLines(e, envoyFailureLines)
	if len(lines) > 0 {
		signals = append(signals, fmt.Sprintf("%d failure lines in the log", len(lines)))
	}
	return signals, lines
}

// errorsCounter is the signal of sluice's error counter in Envoy's stats st: missing, or
// not 0.
func errorsCounter(st map[string]int64, a artifact) []string {
	name := a.stats + "sluice.errors"
	if v, ok := st[name]; !ok {
		return []string{name + " missing"}
	} else if v != 0 {
		return []string{fmt.Sprintf("%s = %d", name, v)}
	}
	return nil
}

// failureLines are the lines of e's log that re matches, each cut at 300 bytes.
func failureLines(e *envoyproc.Envoy, re *regexp.Regexp) []string {
	var lines []string
	for _, l := range strings.Split(e.Log(), "\n") {
		if re.MatchString(l) {
			if len(l) > 300 {
				l = l[:300] + "…"
			}
			lines = append(lines, l)
		}
	}
	return lines
}

// TestEnvoyScenarios runs every scenario that applies to Envoy through each Envoy: one
// Envoy per scenario, its --concurrency the scenario's workers; a scenario whose
// configuration the proxy must refuse must make Envoy exit at start-up with the error in
// its log.
func TestEnvoyScenarios(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		for _, sc := range Scenarios() {
			if sc.HostOnly {
				continue
			}
			t.Run(sc.Name, func(t *testing.T) {
				t.Parallel()
				render := func(site EnvoySite) ([]byte, error) { return RenderEnvoy(sc, site) }
				if sc.StartFails != nil {
					envoyStartFailure(t, tg, a, sc, render)
					return
				}
				e := startEnvoyAs(t, tg, a, ScenarioWorkers(sc), render)
				p := envoyProxy(t, e)
				runSteps(t, p, sc.Steps)
				checkHealthyAs(t, e, a, ScenarioWorkers(sc))
			})
		}
	})
}

// envoyStartFailure: Envoy refuses the configuration (proxy_on_configure returned false) and
// exits at start-up, its log carrying the guest's reason.
func envoyStartFailure(t *testing.T, tg envoyproc.Target, a artifact, sc Scenario, render func(EnvoySite) ([]byte, error)) {
	t.Helper()
	e, err := tryStartEnvoyAs(t, tg, a, "", 2, render)
	if err == nil {
		e.Stop()
		t.Fatalf("envoy %s became ready with a configuration sluice must refuse", tg.Version)
	}
	text := strings.ReplaceAll(err.Error(), `\"`, `"`)
	envoySays := sc.StartFails.EnvoyContains
	if a.dynmod {
		// Envoy's words for a refused dynamic-module configuration; the module's are the same.
		envoySays = []string{"Failed to initialize dynamic module"}
	}
	for _, want := range append(sc.StartFails.StderrContains, envoySays...) {
		if !strings.Contains(text, want) {
			t.Errorf("envoy's log does not contain %q:\n%s", want, boundedLog(err.Error()))
		}
	}
}
