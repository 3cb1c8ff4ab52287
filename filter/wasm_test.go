package filter_test

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// The host calls sluice.wasm may import: exactly those the filter uses,
// each provided by Envoy ≥ 1.33. A stray import makes Envoy refuse the
// module, so this list is pinned. The proxytest emulator provides all but
// the gRPC calls (grpcImports): the module it runs is built with the tag
// nogrpc, which leaves them out (TestNoGrpcModule).
var wantProxyImports = []string{
	"proxy_add_header_map_value",
	"proxy_continue_stream",
	"proxy_define_metric",
	"proxy_done",
	"proxy_get_buffer_bytes",
	"proxy_get_header_map_pairs",
	"proxy_get_header_map_value",
	"proxy_get_property",
	"proxy_get_shared_data",
	"proxy_grpc_call",
	"proxy_grpc_cancel",
	"proxy_increment_metric",
	"proxy_log",
	"proxy_record_metric",
	"proxy_send_local_response",
	"proxy_set_effective_context",
	"proxy_set_property",
	"proxy_set_shared_data",
	"proxy_set_tick_period_milliseconds",
}

// The gRPC calls (the rls backend), which the proxytest emulator lacks, and
// proxy_done, which only the rls backend needs (a stopping root waits for its
// gRPC returns; cpp-host include/proxy-wasm/exports.h registers it as
// proxy_done) and is declared beside them.
var grpcImports = []string{"proxy_done", "proxy_grpc_call", "proxy_grpc_cancel"}

// The gRPC callbacks sluice.wasm exports (the nogrpc build does not).
var grpcExports = []string{
	"proxy_on_grpc_close",
	"proxy_on_grpc_receive",
	"proxy_on_grpc_receive_initial_metadata",
	"proxy_on_grpc_receive_trailing_metadata",
}

// The WASI functions the Go runtime (and the os package, pulled in by
// fmt via encoding/json and the algorithms package) imports.
var wantWASIImports = []string{
	"args_get", "args_sizes_get", "clock_time_get", "environ_get", "environ_sizes_get",
	"fd_close", "fd_fdstat_get", "fd_fdstat_set_flags", "fd_prestat_dir_name", "fd_prestat_get",
	"fd_write", "poll_oneoff", "proc_exit", "random_get", "sched_yield",
}

// Host calls the tetratelabs emulator lacks (other than the gRPC call
// itself), and the Redis extension's calls (only in sluice-redis.wasm):
// never in sluice.wasm.
var forbiddenImports = []string{
	"proxy_get_current_time_nanoseconds", "proxy_get_log_level", "proxy_get_header_map_size",
	"proxy_get_buffer_status", "proxy_get_status", "proxy_grpc_stream",
	"proxy_redis_init", "proxy_redis_call",
}

var wantExports = []string{
	"_initialize",
	"proxy_abi_version_0_2_1",
	"proxy_on_configure",
	"proxy_on_context_create",
	"proxy_on_delete",
	"proxy_on_done",
	"proxy_on_grpc_close",
	"proxy_on_grpc_receive",
	"proxy_on_grpc_receive_initial_metadata",
	"proxy_on_grpc_receive_trailing_metadata",
	"proxy_on_http_call_response",
	"proxy_on_memory_allocate",
	"proxy_on_queue_ready",
	"proxy_on_request_body",
	"proxy_on_request_headers",
	"proxy_on_response_body",
	"proxy_on_response_headers",
	"proxy_on_response_trailers",
	"proxy_on_tick",
	"proxy_on_vm_start",
}

func moduleImportsExports(t *testing.T, tags string) (imports map[string][]string, exports []string) {
	t.Helper()
	wasm := filtertest.Wasm(t, tags)
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	cm, err := rt.CompileModule(ctx, wasm)
	if err != nil {
		t.Fatal(err)
	}
	imports = map[string][]string{}
	for _, f := range cm.ImportedFunctions() {
		mod, name, _ := f.Import()
		if !slices.Contains(imports[mod], name) {
			imports[mod] = append(imports[mod], name)
		}
	}
	for m := range imports {
		sort.Strings(imports[m])
	}
	if len(cm.ImportedMemories()) != 0 {
		t.Errorf("module imports a memory")
	}
	for name := range cm.ExportedFunctions() {
		exports = append(exports, name)
	}
	sort.Strings(exports)
	if _, ok := cm.ExportedMemories()["memory"]; !ok {
		t.Error("module does not export its memory")
	}
	// Cross-check with our own section parser (the one AddStartAlias uses).
	exps, err := filtertest.Exports(wasm)
	if err != nil {
		t.Fatal(err)
	}
	var funcs []string
	for _, e := range exps {
		if e.Kind == 0 {
			funcs = append(funcs, e.Name)
		}
	}
	sort.Strings(funcs)
	if !slices.Equal(funcs, exports) {
		t.Errorf("export parsers disagree: ours %v, wazero %v", funcs, exports)
	}
	return imports, exports
}

func TestModuleImportsAndExports(t *testing.T) {
	imports, exports := moduleImportsExports(t, "")
	for mod, names := range imports {
		switch mod {
		case "env":
			if !slices.Equal(names, wantProxyImports) {
				t.Errorf("env imports:\n got %s\nwant %s", strings.Join(names, " "), strings.Join(wantProxyImports, " "))
			}
		case "wasi_snapshot_preview1":
			if !slices.Equal(names, wantWASIImports) {
				t.Errorf("WASI imports:\n got %s\nwant %s", strings.Join(names, " "), strings.Join(wantWASIImports, " "))
			}
		default:
			t.Errorf("unexpected import module %q: %v", mod, names)
		}
		for _, n := range names {
			if slices.Contains(forbiddenImports, n) {
				t.Errorf("forbidden import %s.%s", mod, n)
			}
		}
	}
	if !slices.Equal(exports, wantExports) {
		t.Errorf("exports:\n got %s\nwant %s", strings.Join(exports, " "), strings.Join(wantExports, " "))
	}
}

// The redis build compiles and adds at most the calls of redisOnlyImports
// (redis_imports_test.go pins both modules' lists exactly).
func TestRedisModuleBuilds(t *testing.T) {
	imports, exports := moduleImportsExports(t, "redis")
	for _, n := range imports["env"] {
		if !slices.Contains(wantProxyImports, n) && !slices.Contains(redisOnlyImports, n) {
			t.Errorf("sluice-redis.wasm imports env.%s", n)
		}
	}
	for _, n := range wantExports {
		if !slices.Contains(exports, n) {
			t.Errorf("sluice-redis.wasm lacks export %s", n)
		}
	}
}

// The build the proxytest emulator runs (tags nogrpc and proxytest) is sluice.wasm
// without the gRPC calls and callbacks, and with proxy_on_log, which the emulator calls
// at every stream's end: every import it has, the emulator provides.
func TestNoGrpcModule(t *testing.T) {
	imports, exports := moduleImportsExports(t, "nogrpc,proxytest")
	var want []string
	for _, n := range wantProxyImports {
		if !slices.Contains(grpcImports, n) {
			want = append(want, n)
		}
	}
	if !slices.Equal(imports["env"], want) {
		t.Errorf("nogrpc env imports:\n got %s\nwant %s", strings.Join(imports["env"], " "), strings.Join(want, " "))
	}
	var wantExp []string
	for _, n := range wantExports {
		if !slices.Contains(grpcExports, n) {
			wantExp = append(wantExp, n)
		}
	}
	wantExp = append(wantExp, "proxy_on_log")
	sort.Strings(wantExp)
	if !slices.Equal(exports, wantExp) {
		t.Errorf("nogrpc exports:\n got %s\nwant %s", strings.Join(exports, " "), strings.Join(wantExp, " "))
	}
}

func TestStartAlias(t *testing.T) {
	wasm := filtertest.Wasm(t, "")
	orig := append([]byte(nil), wasm...)
	aliased, err := filtertest.AddStartAlias(wasm)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(wasm, orig) {
		t.Fatal("AddStartAlias modified its input")
	}
	exps, err := filtertest.Exports(aliased)
	if err != nil {
		t.Fatal(err)
	}
	var init, start int64 = -1, -1
	for _, e := range exps {
		switch e.Name {
		case "_initialize":
			init = int64(e.Index)
		case "_start":
			start = int64(e.Index)
		}
	}
	if init < 0 || start != init {
		t.Errorf("_initialize %d, _start %d", init, start)
	}
	if _, err := filtertest.AddStartAlias(aliased); err == nil {
		t.Error("aliasing twice accepted")
	}
	if _, err := filtertest.AddStartAlias([]byte("not wasm")); err == nil {
		t.Error("garbage accepted")
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	if _, err := rt.CompileModule(ctx, aliased); err != nil {
		t.Errorf("aliased module does not compile: %v", err)
	}
}
