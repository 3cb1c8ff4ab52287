package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// The Envoy suite runs its scenarios on both artifacts: sluice.wasm in the Wasm filter, and
// libsluice.so, the same filter as an Envoy dynamic module, in every target Envoy whose
// dynamic-module ABI it speaks (1.38 and later; make test runs 1.40.0).

// artifact is one way sluice runs in Envoy.
type artifact struct {
	name   string // as subtests and messages name it
	dynmod bool
	// stats is the prefix of sluice's own metrics in Envoy's /stats.
	stats string
}

var (
	artWasm   = artifact{name: "wasm", stats: "wasmcustom."}
	artDynmod = artifact{name: "dynmod", dynmod: true, stats: "dynamicmodulescustom."}
)

// dynmodMinVersion is the oldest Envoy whose dynamic-module ABI libsluice.so speaks.
const dynmodMinVersion = "1.38.0"

// shippedDynmod is libsluice.so built as `make build` builds it, once per test binary, in a
// directory of its own (Envoy's ENVOY_DYNAMIC_MODULES_SEARCH_PATH), unless SLUICE_E2E_DYNMOD
// names one.
var shippedDynmod = sync.OnceValues(func() (string, error) {
	if p := os.Getenv("SLUICE_E2E_DYNMOD"); p != "" {
		return filepath.Abs(p)
	}
	return buildDynmod("")
})

// buildDynmod builds cmd/sluice-dynmod with the build tags into a new directory and returns
// the library's path (libsluice.so).
func buildDynmod(tags string) (string, error) {
	return goBuildShared("dynmod-", "libsluice.so", "./cmd/sluice-dynmod", tags, "CGO_ENABLED=1")
}

// forEachArtifact runs f once per Envoy target and artifact: sluice.wasm in every target,
// libsluice.so in those from dynmodMinVersion on, as subtests "VERSION" and
// "VERSION-dynmod".
func forEachArtifact(t *testing.T, f func(t *testing.T, tg envoyproc.Target, a artifact)) {
	t.Helper()
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		f(t, tg, artWasm)
	})
	forEachEnvoyWhere(t, dynmodSpoken, "-dynmod", func(t *testing.T, tg envoyproc.Target) { f(t, tg, artDynmod) })
}

// dynmodSpoken reports whether libsluice.so speaks tg's dynamic-module ABI.
func dynmodSpoken(tg envoyproc.Target) bool {
	return compareVersions(tg.Version, dynmodMinVersion) >= 0
}

// forEachEnvoyWhere runs f as subtest VERSION+suffix for each Envoy target that pred
// accepts.
func forEachEnvoyWhere(t *testing.T, pred func(envoyproc.Target) bool, suffix string, f func(t *testing.T, tg envoyproc.Target)) {
	t.Helper()
	skipShort(t, "runs real Envoy")
	ts, err := envoyTargets()
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range ts {
		if pred(tg) {
			t.Run(tg.Version+suffix, func(t *testing.T) { f(t, tg) })
		}
	}
}

// startEnvoyAs is startEnvoy for artifact a.
func startEnvoyAs(t *testing.T, tg envoyproc.Target, a artifact, workers int, render func(EnvoySite) ([]byte, error), args ...string) *envoyproc.Envoy {
	t.Helper()
	e, err := tryStartEnvoyAs(t, tg, a, "", workers, render, args...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// tryStartEnvoyAs starts Envoy with sluice as artifact a (lib: another build of
// libsluice.so, "" for the shipped one).
func tryStartEnvoyAs(t *testing.T, tg envoyproc.Target, a artifact, lib string, workers int, render func(EnvoySite) ([]byte, error), args ...string) (*envoyproc.Envoy, error) {
	t.Helper()
	site, env := EnvoySite{}, []string(nil)
	if a.dynmod {
		if lib == "" {
			var err error
			if lib, err = shippedDynmod(); err != nil {
				t.Fatal(err)
			}
		}
		site.DynamicModule = "sluice"
		env = []string{"ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + filepath.Dir(lib)}
	} else {
		wasm, err := shippedWasm()
		if err != nil {
			t.Fatal(err)
		}
		site.WasmPath = wasm
	}
	up, err := sharedUpstream()
	if err != nil {
		t.Fatal(err)
	}
	site.UpstreamPort = up.port
	y, err := render(site)
	if err != nil {
		t.Fatal(err)
	}
	envoyParallel <- struct{}{}
	var once sync.Once
	release := func() { once.Do(func() { <-envoyParallel }) }
	e, err := envoyproc.Start(context.Background(), tg, envoyproc.Options{Bootstrap: y, Concurrency: workers, Dir: t.TempDir(), Args: args, Env: env})
	if err != nil {
		release()
		return nil, err
	}
	t.Cleanup(func() {
		e.Stop()
		release()
		if t.Failed() {
			t.Logf("envoy %s (%s) log:\n%s", tg.Version, a.name, boundedLog(e.Log()))
		}
	})
	return e, nil
}

// checkHealthyAs is checkEnvoyHealthy for artifact a. For the dynamic module: sluice's error
// counter present and 0, and no line of a recovered panic, a Go crash or a refused module in
// the log.
func checkHealthyAs(t *testing.T, e *envoyproc.Envoy, a artifact, workers int) {
	t.Helper()
	if !a.dynmod {
		checkEnvoyHealthy(t, e, workers)
		return
	}
	signals, lines := dynmodFailureSignals(e)
	for _, s := range signals {
		t.Errorf("envoy shows a module failure: %s", s)
	}
	for _, l := range lines {
		t.Errorf("envoy log: %s", l)
	}
}

var dynmodFailureLines = regexp.MustCompile(`recovered from a panic|runtime\.throw|panic:|fatal error|Failed to load dynamic module|Failed to initialize dynamic module|Caught Aborted|Caught Segmentation`)

func dynmodFailureSignals(e *envoyproc.Envoy) (signals []string, lines []string) {
	st, err := e.Stats(`dynamicmodulescustom\.sluice\.errors`)
	if err != nil {
		return []string{"admin /stats: " + err.Error()}, nil
	}
	signals = append(signals, errorsCounter(st, artDynmod)...)
	lines = failureLines(e, dynmodFailureLines)
	return signals, lines
}
