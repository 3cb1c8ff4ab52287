package main

import (
	"debug/elf"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	dynmodv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_modules/v3"
	localrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

func TestParseRSS(t *testing.T) {
	st := "Name:\tenvoy\nVmPeak:\t  300000 kB\nVmRSS:\t  175432 kB\nRssAnon:\t  100 kB\n"
	if got, err := parseRSS(st); err != nil || got != 175432 {
		t.Errorf("parseRSS = %d, %v; want 175432", got, err)
	}
	if _, err := parseRSS("Name:\tenvoy\n"); err == nil {
		t.Error("no VmRSS: no error")
	}
}

func TestParseStatsAndKeep(t *testing.T) {
	m := envoyproc.ParseStats("wasm.envoy.wasm.runtime.v8.active: 4\nwasm.sluice.vm_reload: 0\nwasmcustom.sluice.guest.heap_bytes: 146432\nsome.histogram: P0(nan,1)\n")
	if len(m) != 3 || m["wasm.envoy.wasm.runtime.v8.active"] != 4 {
		t.Errorf("ParseStats = %v", m)
	}
	for n, want := range map[string]bool{
		"wasm.envoy.wasm.runtime.v8.active":  true,
		"wasm.wasm_vm_count":                 true,
		"wasmcustom.sluice.guest.heap_bytes": true,
		"wasm.sluice.vm_reload":              false,
		"wasm.remote_load_cache_hits":        false,
		"wasmcustom.sluice.deny-1.denied":    false,
	} {
		if keepWasmStat(n) != want {
			t.Errorf("keepWasmStat(%q) = %v", n, !want)
		}
	}
}

func TestListenerPort(t *testing.T) {
	doc := `{"listener_statuses":[{"name":"upstream","local_address":{"socket_address":{"address":"127.0.0.1","port_value":4000}}},
{"name":"v-admit-1","local_address":{"socket_address":{"address":"127.0.0.1","port_value":4001}}}]}`
	if p, err := envoyproc.ListenerPort(doc, "v-admit-1"); err != nil || p != 4001 {
		t.Errorf("ListenerPort = %d, %v", p, err)
	}
	if _, err := envoyproc.ListenerPort(doc, "v-deny-1"); err == nil {
		t.Error("unknown listener: no error")
	}
}

// parseBootstrap parses YAML strictly into a v3 Bootstrap (envoyproc.ParseBootstrap).
func parseBootstrap(t *testing.T, data []byte) *bootstrapv3.Bootstrap {
	t.Helper()
	b, err := envoyproc.ParseBootstrap(data)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBootstraps: the shared bootstrap of a round and each family's own are valid Envoy v3
// configurations: loopback only, the upstream a direct response on the port the cluster
// names, one listener per configuration routed to it with the family's filter before the
// router and the limits the variant asks for (sluice's configuration parses as the product
// parses it, on either artifact), one VM per Wasm family, the dynamic-module families
// loading their library by name.
func TestBootstraps(t *testing.T) {
	const port, wasm, noop, denier = 18123, "/tmp/bench-envoy/sluice.wasm", "/tmp/bench-envoy/noop.wasm", "/tmp/bench-envoy/denier.wasm"
	const counter = "/tmp/bench-envoy/counter.wasm"
	const wasmB = "/tmp/bench-envoy/before.wasm"
	specs := map[string]bootstrapSpec{
		"shared":   sharedSpec(families, wasm, noop, denier, counter, port),
		"shared-b": sharedSpec(withB(families, wasmB), wasm, noop, denier, counter, port), // -wasm-b
	}
	for _, f := range families {
		if !f.floor() { // throughput only: no bootstrap of its own
			specs[f.name] = familySpec(f, wasm, noop, port, 18124)
		}
	}
	for name, spec := range specs {
		t.Run(name, func(t *testing.T) {
			y, err := renderBootstrap(spec)
			if err != nil {
				t.Fatal(err)
			}
			b := parseBootstrap(t, y)
			if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" || a.GetPortValue() != 0 {
				t.Errorf("admin on %s:%d, want 127.0.0.1:0", a.GetAddress(), a.GetPortValue())
			}
			cs := b.GetStaticResources().GetClusters()
			if len(cs) != 1 || cs[0].GetName() != "upstream" {
				t.Fatalf("clusters %v, want upstream only", cs)
			}
			ep := cs[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
			if ep.GetAddress() != "127.0.0.1" || ep.GetPortValue() != port {
				t.Errorf("upstream endpoint %s:%d, want 127.0.0.1:%d", ep.GetAddress(), ep.GetPortValue(), port)
			}
			ls := b.GetStaticResources().GetListeners()
			if len(ls) != 1+len(spec.listeners) {
				t.Fatalf("%d listeners, want the upstream and %d", len(ls), len(spec.listeners))
			}
			vms := map[string]string{} // vm_id → module
			for i, l := range ls {
				sa := l.GetAddress().GetSocketAddress()
				if sa.GetAddress() != "127.0.0.1" {
					t.Errorf("listener %s on %s: not loopback", l.GetName(), sa.GetAddress())
				}
				var hcm hcmv3.HttpConnectionManager
				if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatal(err)
				}
				routes := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()
				filters := hcm.GetHttpFilters()
				if filters[len(filters)-1].GetName() != "envoy.filters.http.router" {
					t.Errorf("%s: the router is not last", l.GetName())
				}
				if i == 0 {
					if l.GetName() != "upstream" || sa.GetPortValue() != port {
						t.Errorf("first listener %s:%d, want upstream on %d", l.GetName(), sa.GetPortValue(), port)
					}
					if routes[0].GetDirectResponse().GetStatus() != 200 || len(filters) != 1 {
						t.Error("upstream: want a direct 200 and the router alone")
					}
					continue
				}
				want := spec.listeners[i-1]
				if l.GetName() != listenerName(want.c) || sa.GetPortValue() != uint32(want.port) {
					t.Errorf("listener %s port %d, want %s on %d", l.GetName(), sa.GetPortValue(), listenerName(want.c), want.port)
				}
				if got := l.GetConnectionBalanceConfig().GetExactBalance() != nil; got != want.exact {
					t.Errorf("%s: exact balance %v, want %v", l.GetName(), got, want.exact)
				}
				if routes[0].GetRoute().GetCluster() != "upstream" {
					t.Errorf("%s: not routed to upstream", l.GetName())
				}
				module := wasm
				switch want.c.f.kind {
				case "noop":
					module = noop
				case "denier":
					module = denier
				case "counter":
					module = counter
				case "dynmod":
					module = dynmodSluice
				case "dm-c":
					module = dynmodNoop
				}
				if want.c.f.b != "" {
					module = want.c.f.b
				}
				if id := checkFilter(t, want.c.f, want.c.v, filters, module); id != "" {
					if m, ok := vms[id]; ok && m != module {
						t.Errorf("vm %s runs %s and %s", id, m, module)
					}
					vms[id] = module
				}
			}
			if name == "shared" && len(vms) != 6 || name == "shared-b" && len(vms) != 9 {
				t.Errorf("VMs %v: want one per Wasm family", vms)
			}
		})
	}
	// The shared bootstrap holds every configuration once; a family's, its admit-1k.
	if got, want := len(specs["shared"].listeners), 6+7*len(variants); got != want {
		t.Errorf("shared: %d listeners, want %d", got, want)
	}
	if got, want := len(specs["shared-b"].listeners), 6+10*len(variants); got != want {
		t.Errorf("shared-b: %d listeners, want %d (each sluice family twice)", got, want)
	}
	if fs := withB(families, wasmB); fs[6].name != "tb-none-b" || fs[6].b != wasmB || fs[5].b != "" || len(withB(families, "")) != len(families) {
		t.Errorf("withB: %+v", fs)
	}
	if l := specs["tb-none"].listeners; len(l) != 1 || l[0].c.v.name != baselineVariant || !l[0].exact {
		t.Errorf("family tb-none alone: %+v", l)
	}
}

// checkFilter checks a listener's filters against its configuration (module: the Wasm file,
// or the dynamic module's name) and returns the vm_id of its Wasm filter ("" without one).
func checkFilter(t *testing.T, f family, v variant, filters []*hcmv3.HttpFilter, module string) string {
	t.Helper()
	if f.kind == "none" {
		if len(filters) != 1 {
			t.Errorf("%s: %d filters, want the router alone", v.name, len(filters))
		}
		return ""
	}
	if len(filters) != 2 {
		t.Fatalf("%s: %d filters, want the family's and the router", v.name, len(filters))
	}
	switch f.kind {
	case "native":
		var rl localrlv3.LocalRateLimit
		if err := filters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
			t.Fatal(err)
		}
		a := rl.GetRateLimits()[0].GetActions()[0].GetRequestHeaders()
		if a.GetHeaderName() != keyHeader {
			t.Errorf("descriptor from header %q, want %q", a.GetHeaderName(), keyHeader)
		}
		d := rl.GetDescriptors()[0]
		if e := d.GetEntries()[0]; e.GetKey() != a.GetDescriptorKey() || e.GetValue() != "" {
			t.Errorf("descriptor entry %v: want key %q with a blank value (dynamic: one bucket per value)", e, a.GetDescriptorKey())
		}
		if rl.GetMaxDynamicDescriptors().GetValue() < 1000 {
			t.Errorf("max_dynamic_descriptors %d: fewer than the 1,000 keys", rl.GetMaxDynamicDescriptors().GetValue())
		}
		if rl.GetAlwaysConsumeDefaultTokenBucket() == nil || rl.GetAlwaysConsumeDefaultTokenBucket().GetValue() {
			t.Error("always_consume_default_token_bucket must be false")
		}
		if rl.GetFilterEnabled().GetDefaultValue().GetNumerator() != 100 || rl.GetFilterEnforced().GetDefaultValue().GetNumerator() != 100 {
			t.Error("filter not enabled and enforced for every request")
		}
		tb := d.GetTokenBucket()
		wantTok, wantFill := uint32(admitLimit), time.Second
		if v.deny {
			wantTok, wantFill = denyLimit, time.Hour
		}
		if tb.GetMaxTokens() != wantTok || tb.GetTokensPerFill().GetValue() != wantTok || tb.GetFillInterval().AsDuration() != wantFill {
			t.Errorf("%s: bucket %v, want %d per %v", v.name, tb, wantTok, wantFill)
		}
		return ""
	case "noop", "denier", "counter", "sluice":
		var w wasmv3.Wasm
		if err := filters[0].GetTypedConfig().UnmarshalTo(&w); err != nil {
			t.Fatal(err)
		}
		vm := w.GetConfig().GetVmConfig()
		if vm.GetRuntime() != "envoy.wasm.runtime.v8" || vm.GetCode().GetLocal().GetFilename() != module {
			t.Errorf("vm %v: want V8 and %s", vm, module)
		}
		var cfg wrapperspb.StringValue
		if err := w.GetConfig().GetConfiguration().UnmarshalTo(&cfg); err != nil {
			t.Fatal(err)
		}
		if f.kind != "sluice" {
			if cfg.GetValue() != "" {
				t.Errorf("%s configuration %q, want empty", f.kind, cfg.GetValue())
			}
			return vm.GetVmId()
		}
		checkPlugin(t, f, v, cfg.GetValue())
		return vm.GetVmId()
	case "dynmod", "dm-c":
		var dm dynmodv3.DynamicModuleFilter
		if err := filters[0].GetTypedConfig().UnmarshalTo(&dm); err != nil {
			t.Fatal(err)
		}
		if c := dm.GetDynamicModuleConfig(); c.GetName() != module || !c.GetDoNotClose() {
			t.Errorf("%s: dynamic module %v, want %s kept loaded (do_not_close)", f.name, c, module)
		}
		var cfg wrapperspb.StringValue
		if err := dm.GetFilterConfig().UnmarshalTo(&cfg); err != nil {
			t.Fatal(err)
		}
		if f.kind == "dm-c" {
			if cfg.GetValue() != "" {
				t.Errorf("dm-c configuration %q, want empty", cfg.GetValue())
			}
			return ""
		}
		if dm.GetFilterName() != "sluice" {
			t.Errorf("%s: filter_name %q, want sluice", f.name, dm.GetFilterName())
		}
		checkPlugin(t, f, v, cfg.GetValue())
		return ""
	}
	t.Errorf("%s: unknown kind %q", f.name, f.kind)
	return ""
}

// checkPlugin checks sluice's plugin configuration as rendered (either artifact): it parses
// as the product parses it, with the variant's limit, the family's algorithm, response
// headers and match (none, or a path no request has).
func checkPlugin(t *testing.T, f family, v variant, got string) {
	t.Helper()
	if got != pluginConfig(f, v) {
		t.Errorf("plugin configuration changed in rendering:\n%s\nwant\n%s", got, pluginConfig(f, v))
	}
	c, err := config.ParseFor([]byte(got), config.BuildLocal)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	wantLimit, wantWindow := int64(admitLimit), time.Second
	if v.deny {
		wantLimit, wantWindow = denyLimit, time.Hour
	}
	kind, _ := algorithms.ParseKind(f.algorithm)
	if r.Algorithm != kind || r.Limit != wantLimit || r.Window != wantWindow || len(r.Key) != 1 || r.Key[0].Header != keyHeader {
		t.Errorf("%s: rule %+v, want %s %d per %v on %s", v.name, r, f.algorithm, wantLimit, wantWindow, keyHeader)
	}
	if !strings.Contains(got, `"headers":"`+f.headers+`"`) {
		t.Errorf("%s: response headers not %q", v.name, f.headers)
	}
	if r.Name != (setup{f, v}).ruleName() {
		t.Errorf("rule %q, want %q", r.Name, setup{f, v}.ruleName())
	}
	wantPrefix := ""
	if f.never {
		wantPrefix = "/never/"
	}
	if r.Match.PathPrefix != wantPrefix || r.Match.Matches("GET", "/", nil) == f.never {
		t.Errorf("%s: match %+v, want path_prefix %q (the load's path / matching: %v)", f.name, r.Match, wantPrefix, !f.never)
	}
}

// The configurations: every family's variants once (the baselines one each: admit-1k, the
// deny floor deny-1k), grouped by variant so that a variant's configurations neighbour each
// other.
func TestConfigurations(t *testing.T) {
	cs := configurations(families)
	if len(cs) != 6+7*len(variants) {
		t.Fatalf("%d configurations", len(cs))
	}
	seen := map[string]bool{}
	for i, c := range cs {
		if seen[c.name()] {
			t.Errorf("%s twice", c.name())
		}
		seen[c.name()] = true
		if c.f.baseline && c.v.name != c.f.variantName() || c.f.kind == "denier" && c.v.name != "deny-1k" {
			t.Errorf("baseline %s on %s", c.f.name, c.v.name)
		}
		if i > 0 && cs[i-1].v.name != c.v.name && seen["x "+c.v.name] {
			t.Errorf("variant %s split", c.v.name)
		}
		seen["x "+c.v.name] = true
	}
	if l := latencyFamilies(families); len(l) != 7 || l[0].name != "native" || l[4].name != "dm-tb-none" {
		t.Errorf("latency families %v, want native and the three sluice families on each artifact", l)
	}
}

// TestSelectFamilies: -families adds the baselines the ratios need — none and native always,
// Wasm's unless only dm-* families are named, the dynamic module's with any dm-* family —
// refuses an unknown name, and leaves the dm-* families out of an Envoy that cannot load
// libsluice.so.
func TestSelectFamilies(t *testing.T) {
	names := func(fs []family) string {
		var n []string
		for _, f := range fs {
			n = append(n, f.name)
		}
		return strings.Join(n, ",")
	}
	const wasmBase, dmBase = "none,noop,deny-floor,admit-floor,native", "dm-noop-c,dm-noop-go"
	for _, c := range []struct {
		only string
		dm   bool
		b    string
		want string
	}{
		{"", true, "", wasmBase + ",tb-none,tb-both,sw-none," + dmBase + ",dm-tb-none,dm-tb-both,dm-sw-none"},
		{"", false, "", wasmBase + ",tb-none,tb-both,sw-none"},
		{"tb-none", true, "", wasmBase + ",tb-none"},
		{"tb-none", false, "", wasmBase + ",tb-none"},
		{"native", true, "", wasmBase},
		{"tb-none", true, "/b.wasm", wasmBase + ",tb-none,tb-none-b"},
		{"dm-tb-none, dm-noop-go,dm-noop-c", true, "", "none,native," + dmBase + ",dm-tb-none"},
		{"dm-noop-c", true, "", "none,native," + dmBase},
		{"sw-none,dm-tb-both", true, "/b.wasm", wasmBase + ",sw-none,sw-none-b," + dmBase + ",dm-tb-both"},
	} {
		fs, err := selectFamilies(c.only, c.dm, c.b)
		if err != nil {
			t.Errorf("%q: %v", c.only, err)
			continue
		}
		if got := names(fs); got != c.want {
			t.Errorf("%q (dm %v, b %q):\n got %s\nwant %s", c.only, c.dm, c.b, got, c.want)
		}
	}
	for _, bad := range []struct {
		only string
		dm   bool
	}{{"tb-none,tb-nothing", true}, {"dm-tb-none", false}, {"tb-none-b", true}} {
		if _, err := selectFamilies(bad.only, bad.dm, ""); err == nil {
			t.Errorf("%q (dm %v): accepted", bad.only, bad.dm)
		}
	}
}

func TestDynmodSpoken(t *testing.T) {
	for v, want := range map[string]bool{"1.40.0": true, "1.38.3": true, "1.39.0-dev": true, "2.0.0": true, "1.37.2": false, "1.36.4": false, "unknown": true} {
		if got := dynmodSpoken(v); got != want {
			t.Errorf("dynmodSpoken(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestWorkerConnections(t *testing.T) {
	st := envoyproc.ParseStats("listener.127.0.0.1_4001.worker_0.downstream_cx_total: 8\nlistener.127.0.0.1_4001.worker_1.downstream_cx_total: 7\n" +
		"listener.127.0.0.1_4002.worker_0.downstream_cx_total: 99\nlistener.127.0.0.1_4001.worker_1.downstream_cx_active: 7\n")
	got := workerConnections(st, 4001)
	if len(got) != 2 || got[0] != 8 || got[1] != 7 {
		t.Errorf("workerConnections = %v, want 0:8 1:7", got)
	}
}

func TestParsePhases(t *testing.T) {
	ph, err := parsePhases("throughput, latency,memory")
	if err != nil || !ph["throughput"] || !ph["latency"] || !ph["memory"] || ph["startup"] {
		t.Errorf("parsePhases = %v, %v", ph, err)
	}
	for _, bad := range []string{"", "latency", "throughput,cpu"} {
		if _, err := parsePhases(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

func TestLoadArgs(t *testing.T) {
	a := loadArgs{url: "http://127.0.0.1:1", keys: 1000, d: 3 * time.Second, warmup: time.Second, rate: 2500.25, want: 200}
	got := strings.Join(a.args(32), " ")
	want := "-url http://127.0.0.1:1/ -c 32 -d 3s -warmup 1s -keys 1000 -key-header x-key -json -want-status 200 -rate 2500.2"
	if got != want {
		t.Errorf("args\n%s\nwant\n%s", got, want)
	}
	a = loadArgs{url: "http://127.0.0.1:1", keys: 200000, d: time.Minute, n: 200000, conc: 16}
	if got := strings.Join(a.args(32), " "); !strings.Contains(got, "-c 16 ") || !strings.HasSuffix(got, "-want-status 0 -n 200000") {
		t.Errorf("args %s", got)
	}
}

func TestReportHelpers(t *testing.T) {
	ms := memSample{rssMB: []float64{100, 120, 121, 122.5, 130}}
	if g := ms.requestGrowth(); g != 2.5 {
		t.Errorf("requestGrowth = %v", g)
	}
	if g, ok := ms.keyGrowth(); !ok || g != 7.5 {
		t.Errorf("keyGrowth = %v, %v", g, ok)
	}
	if _, ok := (memSample{rssMB: []float64{1, 2, 3, 4}}).keyGrowth(); ok {
		t.Error("keyGrowth without the keys reading")
	}
	a := []sample{{rps: 10}, {rps: 20}, {rps: 30}}
	b := []sample{{rps: 5}, {rps: 40}}
	if got := perRound(a, b, rpsOf); !slices.Equal(got, []float64{2, 0.5}) {
		t.Errorf("perRound = %v", got)
	}
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 300000: "300,000", 1234567: "1,234,567"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestParseSmaps: Rss summed by mapping kind — a path is file-backed, an anonymous
// executable mapping is compiled code, every other anonymous one (heap, stack) the rest.
func TestParseSmaps(t *testing.T) {
	const smaps = `55d0c0000000-55d0c4000000 r-xp 00000000 fd:01 1234                       /opt/envoy
Size:              65536 kB
Rss:               10240 kB
Pss:               10240 kB
7f0000000000-7f0000a00000 rwxp 00000000 00:00 0 
Size:              10240 kB
Rss:                5120 kB
7f1000000000-7f1005000000 rw-p 00000000 00:00 0 
Rss:                2048 kB
VmFlags: rd wr mr mw me ac
7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]
Rss:                1024 kB
`
	sp, err := parseSmaps(smaps)
	if err != nil {
		t.Fatal(err)
	}
	if sp != (memSplit{fileMB: 10, execMB: 5, anonMB: 3}) {
		t.Errorf("split %+v, want 10 file, 5 exec, 3 other", sp)
	}
	if _, err := parseSmaps("nothing\n"); err == nil {
		t.Error("no mapping: no error")
	}
	if _, err := parseSmaps("7f0000000000-7f0000a00000 rwxp 00000000 00:00 0\nRss: x kB\n"); err == nil {
		t.Error("a bad Rss line: no error")
	}
}

// requiredHooks are the hooks Envoy 1.40 resolves when it loads an HTTP dynamic module's
// filter configuration: leaving any one out refuses the configuration.
var requiredHooks = []string{"program_init", "http_filter_config_new", "http_filter_config_destroy", "http_filter_new",
	"http_filter_request_headers", "http_filter_request_body", "http_filter_request_trailers",
	"http_filter_response_headers", "http_filter_response_body", "http_filter_response_trailers",
	"http_filter_stream_complete", "http_filter_destroy", "http_filter_http_callout_done",
	"http_filter_http_stream_headers", "http_filter_http_stream_data", "http_filter_http_stream_trailers",
	"http_filter_http_stream_complete", "http_filter_http_stream_reset", "http_filter_scheduled",
	"http_filter_downstream_above_write_buffer_high_watermark", "http_filter_downstream_below_write_buffer_low_watermark"}

// TestNoopDynmod: the C no-op (family dm-noop-c) builds as the benchmark builds it, without
// a warning, and exports every hook Envoy requires.
func TestNoopDynmod(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	lib := filepath.Join(t.TempDir(), dynmodLib(dynmodNoop))
	s := build.CShared(filepath.Join("testdata", filepath.Base(noopDynmodSource)), lib)
	out, err := exec.Command(s.Cmd[0], append(s.Cmd[1:], "-Wall", "-Werror")...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(s.Cmd, " "), err, out)
	}
	f, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			defined[s.Name] = true
		}
	}
	for _, h := range requiredHooks {
		if !defined["envoy_dynamic_module_on_"+h] {
			t.Errorf("envoy_dynamic_module_on_%s not exported", h)
		}
	}
}
