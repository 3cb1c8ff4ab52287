// Package cycle measures one request cycle of the compiled module in the embedded host, in
// process (host.Exchange, no HTTP): its CPU per request beside a no-op module's, the calls it
// makes across the ABI, and where its guest time goes.
package cycle

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/bench/internal/build"
)

// envWasm names a sluice.wasm built elsewhere (a path relative to the repository root, or
// absolute) to measure instead of building one.
const envWasm = "SLUICE_BENCH_WASM"

var algorithms = []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_log", "sliding_window"}

var modules struct {
	once         sync.Once
	sluice, noop string
	noopWasm     []byte
	err          error
}

// built builds sluice.wasm (unless SLUICE_BENCH_WASM names one) and the no-op module once
// per test binary, both patched as make build ships them.
func built(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("builds the modules (go build); not under -short")
	}
	modules.once.Do(func() {
		root, dir, err := build.Workspace("sluice-cycle")
		if err != nil {
			modules.err = err
			return
		}
		modules.noop = filepath.Join(dir, "noop.wasm")
		steps := []build.Step{build.NoopWasm(modules.noop)}
		patch := []string{modules.noop}
		if w := os.Getenv(envWasm); w != "" {
			if !filepath.IsAbs(w) {
				w = filepath.Join(root, w)
			}
			modules.sluice = w
		} else {
			modules.sluice = filepath.Join(dir, "sluice.wasm")
			steps = append(steps, build.SluiceWasm(modules.sluice))
			patch = append(patch, modules.sluice)
		}
		if modules.err = build.Run(root, dir, "cycle", append(steps, build.Patch(patch...))...); modules.err != nil {
			return
		}
		modules.noopWasm, modules.err = os.ReadFile(modules.noop)
	})
	if modules.err != nil {
		tb.Fatal(modules.err)
	}
}

// sluiceModule is the path of the sluice module measured.
func sluiceModule(tb testing.TB) string {
	built(tb)
	return modules.sluice
}

// noopModule is host/testdata/guests/minimal, a Proxy-Wasm module that does nothing.
func noopModule(tb testing.TB) []byte {
	built(tb)
	return modules.noopWasm
}
