package filter_test

import (
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// A target runs the plugin: natively against the fake host, or the
// compiled module in the proxytest emulator. Every behaviour test that does
// not need to move the clock runs against both.
type target interface {
	do(r filtertest.Request) filtertest.Response
	metric(name string) int64
}

type targetKind struct {
	name  string
	start func(t *testing.T, config string) target
}

var targets = []targetKind{
	{"native", func(t *testing.T, cfg string) target { return startNative(t, cfg, t0) }},
	{"wasm-proxytest", startProxytest},
}

// t0 is the fixed instant native tests start at: 10 minutes into an hour.
var t0 = time.Date(2026, 1, 1, 12, 10, 0, 0, time.UTC).UnixNano()

type nativeTarget struct {
	w  *filtertest.Worker
	vm *filter.VM
}

func startNative(t *testing.T, cfg string, now int64) *nativeTarget {
	t.Helper()
	h := filtertest.NewHost()
	h.Now_ = now
	vm := filter.NewVM(h)
	w := filtertest.NewWorker(h, vm)
	if !w.Start(cfg) {
		t.Fatalf("plugin refused to start: %v", h.Logs)
	}
	return &nativeTarget{w: w, vm: vm}
}

func (n *nativeTarget) do(r filtertest.Request) filtertest.Response { return n.w.Do(r) }

func (n *nativeTarget) metric(name string) int64 {
	v, _ := n.w.Host.Metrics.Get(name)
	return v
}

func (n *nativeTarget) advance(d time.Duration) { n.w.Host.Now_ += int64(d) }

// wasmForProxytest is the compiled module with the _start alias, built with the tags
// nogrpc (the emulator has no proxy_grpc_call, which sluice.wasm imports for the rls
// backend; wasm_test.go TestNoGrpcModule pins the difference) and proxytest (it exports
// proxy_on_log, which the emulator calls and sluice.wasm does not export).
var wasmForProxytest = sync.OnceValues(func() ([]byte, error) {
	b, err := filtertest.BuildWasm("nogrpc,proxytest")
	if err != nil {
		return nil, err
	}
	return filtertest.AddStartAlias(b)
})

// proxytest keeps global state: tests using it never run in parallel.
var proxytestMu sync.Mutex

type proxytestTarget struct {
	t     *testing.T
	host  proxytest.HostEmulator
	props map[string]bool // the request properties set so far (the emulator cannot unset one)
}

func newProxytestHost(t *testing.T, cfg string) (proxytest.HostEmulator, types.OnPluginStartStatus) {
	t.Helper()
	filtertest.SkipShort(t, "builds the wasm module for the proxytest emulator")
	wasm, err := wasmForProxytest()
	if err != nil {
		t.Fatal(err)
	}
	proxytestMu.Lock()
	t.Cleanup(proxytestMu.Unlock)
	vm, err := proxytest.NewWasmVMContext(wasm)
	if err != nil {
		t.Fatal(err)
	}
	opt := proxytest.NewEmulatorOption().WithVMContext(vm).WithPluginConfiguration([]byte(cfg))
	host, reset := proxytest.NewHostEmulator(opt)
	t.Cleanup(func() { reset(); vm.Close() })
	return host, host.StartPlugin()
}

func startProxytest(t *testing.T, cfg string) target {
	host, st := newProxytestHost(t, cfg)
	if st != types.OnPluginStartStatusOK {
		t.Fatalf("plugin refused to start: %v", host.GetCriticalLogs())
	}
	return &proxytestTarget{t: t, host: host}
}

func (p *proxytestTarget) do(r filtertest.Request) filtertest.Response {
	h := p.host
	if r.Source == "" {
		p.t.Fatal("proxytest requests need a Source (the emulator cannot unset a property)")
	}
	if err := h.SetProperty([]string{"source", "address"}, []byte(r.Source)); err != nil {
		p.t.Fatal(err)
	}
	p.setProperties(r.Properties) // metadata_test.go
	method, path := r.Method, r.Path
	if method == "" {
		method = "GET"
	}
	if path == "" {
		path = "/"
	}
	hdrs := append([][2]string{{":method", method}, {":path", path}, {":authority", "example.test"}}, r.Headers...)
	id := h.InitializeHttpContext()
	act := h.CallOnRequestHeaders(id, hdrs, true)
	resp := filtertest.Response{Action: abi.Action(act)}
	if lr := h.GetSentLocalResponse(id); lr != nil {
		resp.Status, resp.Local, resp.Body, resp.Headers, resp.GRPCStatus = int(lr.StatusCode), true, string(lr.Data), lr.Headers, lr.GRPCStatus
	} else {
		h.CallOnResponseHeaders(id, [][2]string{{":status", "200"}, {"content-type", "text/plain"}}, false)
		resp.Status = 200
		for _, kv := range h.GetCurrentResponseHeaders(id) {
			if kv[0] != ":status" && kv[0] != "content-type" {
				resp.Headers = append(resp.Headers, kv)
			}
		}
	}
	h.CompleteHttpContext(id)
	return resp
}

func (p *proxytestTarget) metric(name string) int64 {
	v, err := p.host.GetCounterMetric(name)
	if err != nil {
		return 0
	}
	return int64(v)
}

// forEachTarget runs f once per target as a subtest.
func forEachTarget(t *testing.T, cfg string, f func(t *testing.T, tg target)) {
	for _, k := range targets {
		t.Run(k.name, func(t *testing.T) { f(t, k.start(t, cfg)) })
	}
}
