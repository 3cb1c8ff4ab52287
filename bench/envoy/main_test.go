package main

import (
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	localrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
)

// Registered so that every @type in the rendered bootstraps resolves.
var _ = []proto.Message{&routerv3.Router{}, &wrapperspb.StringValue{}, &localrlv3.LocalRateLimit{}, &wasmv3.Wasm{}, &hcmv3.HttpConnectionManager{}}

func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want spread
	}{
		{nil, spread{}},
		{[]float64{2}, spread{2, 2, 2}},
		{[]float64{3, 1, 2}, spread{2, 1, 3}},
		{[]float64{4, 1, 3, 2}, spread{2.5, 1, 4}},
		{[]float64{0.9, 1.1, 0.95, 1.0, 5}, spread{1.0, 0.9, 5}},
	} {
		if got := summarize(c.in); got != c.want {
			t.Errorf("summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
	in := []float64{3, 1, 2}
	summarize(in)
	if in[0] != 3 {
		t.Error("summarize sorted its argument")
	}
	if got, want := (spread{0.934, 0.881, 0.97}).ratio(), "0.93× (0.88–0.97)"; got != want {
		t.Errorf("ratio() = %q, want %q", got, want)
	}
	if got, want := (spread{12000.4, 11000, 13000}).format("%.0f"), "12000 (11000–13000)"; got != want {
		t.Errorf("format() = %q, want %q", got, want)
	}
}

func TestParseCPU(t *testing.T) {
	// A name with a space and a ')' in it: fields count from the last ')'.
	stat := "4242 (envoy (wrk) x) S 1 4242 4242 0 -1 4194560 8000 0 0 0 1234 567 0 0 20 0 9 0 100 1000000 5000 18446744073709551615\n"
	got, err := parseCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := (1234 + 567) * 10 * time.Millisecond; got != want {
		t.Errorf("parseCPU = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 envoy S 1", "4242 (envoy) S 1 2 3", "4242 (envoy) S 1 4242 4242 0 -1 4194560 8000 0 0 0 x 567 0"} {
		if _, err := parseCPU(bad); err == nil {
			t.Errorf("parseCPU(%q): no error", bad)
		}
	}
}

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
	m := parseStats("wasm.envoy.wasm.runtime.v8.active: 4\nwasm.sluice.vm_reload: 0\nwasmcustom.sluice.guest.heap_bytes: 146432\nsome.histogram: P0(nan,1)\n")
	if len(m) != 3 || m["wasm.envoy.wasm.runtime.v8.active"] != 4 {
		t.Errorf("parseStats = %v", m)
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

// TestBootstraps: every family's bootstrap is a valid Envoy v3 configuration: loopback only,
// the upstream a direct response on the port the cluster names, one listener per variant
// routed to it with the family's filter before the router and the limits the variant asks
// for (sluice's configuration parses as the product parses it).
func TestBootstraps(t *testing.T) {
	const port, wasm = 18123, "/tmp/bench-envoy/sluice.wasm"
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			y, err := renderBootstrap(f, wasm, port)
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
			if len(ls) != 1+len(variants) {
				t.Fatalf("%d listeners, want the upstream and %d variants", len(ls), len(variants))
			}
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
				v := variants[i-1]
				if l.GetName() != listenerName(v) || sa.GetPortValue() != 0 {
					t.Errorf("listener %s port %d, want %s on a free port", l.GetName(), sa.GetPortValue(), listenerName(v))
				}
				if routes[0].GetRoute().GetCluster() != "upstream" {
					t.Errorf("%s: not routed to upstream", l.GetName())
				}
				checkFilter(t, f, v, filters, wasm)
			}
		})
	}
}

func checkFilter(t *testing.T, f family, v variant, filters []*hcmv3.HttpFilter, wasm string) {
	t.Helper()
	if f.kind == "none" {
		if len(filters) != 1 {
			t.Errorf("%s: %d filters, want the router alone", v.name, len(filters))
		}
		return
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
	case "noop", "sluice":
		var w wasmv3.Wasm
		if err := filters[0].GetTypedConfig().UnmarshalTo(&w); err != nil {
			t.Fatal(err)
		}
		vm := w.GetConfig().GetVmConfig()
		if vm.GetRuntime() != "envoy.wasm.runtime.v8" || vm.GetCode().GetLocal().GetFilename() != wasm {
			t.Errorf("vm %v: want V8 and %s", vm, wasm)
		}
		var cfg wrapperspb.StringValue
		if err := w.GetConfig().GetConfiguration().UnmarshalTo(&cfg); err != nil {
			t.Fatal(err)
		}
		if f.kind == "noop" {
			if cfg.GetValue() != "" {
				t.Errorf("noop configuration %q, want empty", cfg.GetValue())
			}
			return
		}
		if cfg.GetValue() != pluginConfig(f, v) {
			t.Errorf("plugin configuration changed in rendering:\n%s\nwant\n%s", cfg.GetValue(), pluginConfig(f, v))
		}
		c, err := config.ParseFor([]byte(cfg.GetValue()), config.BuildLocal)
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
		if !strings.Contains(cfg.GetValue(), `"headers":"`+f.headers+`"`) {
			t.Errorf("%s: response headers not %q", v.name, f.headers)
		}
	}
}
