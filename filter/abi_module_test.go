package filter_test

import (
	"context"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Direct checks of the module's exports (no host behind them: every env
// import traps if called).

func instantiateBare(t *testing.T) (api.Module, context.Context) {
	t.Helper()
	wasm := filtertest.Wasm(t, "")
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	env := rt.NewHostModuleBuilder("env")
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if mod != "env" {
			continue
		}
		env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(context.Context, api.Module, []uint64) {
			panic("unexpected host call " + name)
		}), f.ParamTypes(), f.ResultTypes()).Export(name)
	}
	if _, err := env.Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
	if err != nil {
		t.Fatal(err)
	}
	return m, ctx
}

func TestMemoryAllocate(t *testing.T) {
	m, ctx := instantiateBare(t)
	alloc := m.ExportedFunction("proxy_on_memory_allocate")
	call := func(size uint64) uint32 {
		t.Helper()
		r, err := alloc.Call(ctx, size)
		if err != nil {
			t.Fatalf("allocate(%d): %v", size, err)
		}
		return uint32(r[0])
	}
	memSize := m.Memory().Size()
	if p := call(0); p == 0 || p >= memSize {
		t.Errorf("allocate(0) = %d, want a valid non-null address", p)
	}
	type span struct{ p, n uint32 }
	var spans []span
	for _, n := range []uint32{1, 7, 100, 4096, 70 << 10, 3, 1 << 20} {
		p := call(uint64(n))
		if p == 0 || uint64(p)+uint64(n) > uint64(m.Memory().Size()) {
			t.Fatalf("allocate(%d) = %d outside memory (%d bytes)", n, p, m.Memory().Size())
		}
		if n >= 8 && p%8 != 0 {
			t.Errorf("allocate(%d) = %d not 8-aligned", n, p)
		}
		// The host writes into it: it must be writable and not overlap.
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(len(spans) + 1)
		}
		if !m.Memory().Write(p, buf) {
			t.Fatalf("cannot write %d bytes at %d", n, p)
		}
		for _, s := range spans {
			if p < s.p+s.n && s.p < p+n {
				t.Errorf("allocation [%d,+%d) overlaps [%d,+%d)", p, n, s.p, s.n)
			}
		}
		spans = append(spans, span{p, n})
	}
	for i, s := range spans {
		got, _ := m.Memory().Read(s.p, s.n)
		for _, c := range got {
			if c != byte(i+1) {
				t.Fatalf("allocation %d was overwritten", i)
			}
		}
	}
}

// Callbacks for contexts the module never saw are answered, not trapped.
func TestCallbacksForUnknownContexts(t *testing.T) {
	m, ctx := instantiateBare(t)
	for _, c := range []struct {
		name string
		args []uint64
		want uint64
	}{
		{"proxy_on_request_headers", []uint64{42, 3, 1}, 0},
		{"proxy_on_response_headers", []uint64{42, 3, 1}, 0},
		{"proxy_on_response_body", []uint64{42, 100, 1}, 0},
		{"proxy_on_response_trailers", []uint64{42, 2}, 0},
		{"proxy_on_done", []uint64{42}, 1},
		{"proxy_on_vm_start", []uint64{1, 0}, 1},
	} {
		r, err := m.ExportedFunction(c.name).Call(ctx, c.args...)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if r[0] != c.want {
			t.Errorf("%s = %d, want %d", c.name, r[0], c.want)
		}
	}
	for _, name := range []string{"proxy_on_delete", "proxy_on_tick"} {
		if _, err := m.ExportedFunction(name).Call(ctx, 42); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := m.ExportedFunction("proxy_on_context_create").Call(ctx, 43, 42); err != nil {
		t.Errorf("stream of an unknown root: %v", err)
	}
}
