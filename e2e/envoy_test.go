package e2e

import (
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmextv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/config"
)

// parseBootstrap parses YAML strictly into an Envoy v3 Bootstrap (envoyproc.ParseBootstrap:
// unknown fields refused, nested Any too, every message validated).
func parseBootstrap(t *testing.T, data []byte) *bootstrapv3.Bootstrap {
	t.Helper()
	b, err := envoyproc.ParseBootstrap(data)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEnvoyBootstraps: the bootstrap rendered for each Envoy scenario is a valid Envoy v3
// configuration, carries the scenario's plugin configuration unchanged (and it parses), loads
// the module from the site's path, and routes to the upstream cluster it defines, with the
// router last.
func TestEnvoyBootstraps(t *testing.T) {
	n := 0
	for _, sc := range Scenarios() {
		if sc.HostOnly {
			continue
		}
		n++
		t.Run(sc.Name, func(t *testing.T) {
			y, err := RenderEnvoy(sc, testSite)
			if err != nil {
				t.Fatal(err)
			}
			hcm := checkRenderedBootstrap(t, y, sc.Config, sc.StartFails == nil)
			if hcm.GetMaxRequestHeadersKb() != nil {
				t.Errorf("max_request_headers_kb set to %d: the scenarios run with Envoy's default", hcm.GetMaxRequestHeadersKb().GetValue())
			}
		})
	}
	if n == 0 {
		t.Fatal("no scenario for Envoy")
	}
}

// testSite is the site the bootstrap tests render for.
var testSite = EnvoySite{WasmPath: "/tmp/sluice-test/sluice.wasm", UpstreamPort: 18080}

// TestEnvoySurvivalBootstrap: the survival stage's bootstrap is valid like the scenarios',
// keys both rules on x-api-key, and lets 96 KiB header values through, here and at the
// upstream (Envoy's default limit, 60 KiB, would answer 431 before sluice sees them; the
// test's upstream is a Go server, whose limit envoyUpstream raises).
func TestEnvoySurvivalBootstrap(t *testing.T) {
	y, err := RenderEnvoySurvival(testSite)
	if err != nil {
		t.Fatal(err)
	}
	hcm := checkRenderedBootstrap(t, y, SurvivalConfig, true)
	const need = 96 + 4 // the largest value the stage sends, plus the other headers
	if got := hcm.GetMaxRequestHeadersKb().GetValue(); got < need {
		t.Errorf("max_request_headers_kb %d, want at least %d", got, need)
	}
	if upstreamMaxHeaderBytes < need<<10 {
		t.Errorf("upstream MaxHeaderBytes %d, want at least %d KiB", upstreamMaxHeaderBytes, need)
	}
	cfg, err := config.ParseFor([]byte(SurvivalConfig), config.BuildLocal)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Rules) != 2 {
		t.Fatalf("%d rules, want 2", len(cfg.Rules))
	}
	for _, r := range cfg.Rules {
		if len(r.Key) != 1 || r.Key[0].Header != "x-api-key" {
			t.Errorf("rule %s: key %+v, want the x-api-key header", r.Name, r.Key)
		}
	}
	if SurvivalWorkers != 1 {
		t.Errorf("SurvivalWorkers %d: the attack is on one VM", SurvivalWorkers)
	}
}

// checkRenderedBootstrap checks one rendered bootstrap (see TestEnvoyBootstraps) and returns
// its connection manager.
// A configuration the proxy must refuse (valid is false) is carried but not parsed.
func checkRenderedBootstrap(t *testing.T, y []byte, pluginConfig string, valid bool) *hcmv3.HttpConnectionManager {
	t.Helper()
	b := parseBootstrap(t, y)
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetPortValue() != 0 || a.GetAddress() != "127.0.0.1" {
		t.Errorf("admin on %s:%d, want 127.0.0.1:0 (a free port)", a.GetAddress(), a.GetPortValue())
	}
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || ls[0].GetName() != "ingress" || ls[0].GetAddress().GetSocketAddress().GetPortValue() != 0 {
		t.Fatalf("want one listener \"ingress\" on a free port")
	}
	var hcm hcmv3.HttpConnectionManager
	if err := ls[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if !hcm.GetUseRemoteAddress().GetValue() {
		t.Error("use_remote_address is off: source.address would be the right-most X-Forwarded-For entry, which the client writes")
	}
	if !hcm.GetNormalizePath().GetValue() || !hcm.GetMergeSlashes() {
		t.Error("normalize_path and merge_slashes must both be on (scenario path-normalized: the upstream gets the path sluice matched)")
	}
	filters := hcm.GetHttpFilters()
	if len(filters) != 2 || filters[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http filters %v: want sluice then the router", filters)
	}
	var w wasmv3.Wasm
	if err := filters[0].GetTypedConfig().UnmarshalTo(&w); err != nil {
		t.Fatal(err)
	}
	if got := w.GetConfig().GetVmConfig().GetCode().GetLocal().GetFilename(); got != testSite.WasmPath {
		t.Errorf("module path %q, want %q", got, testSite.WasmPath)
	}
	//lint:ignore SA1019 Envoy still honours the deprecated fail_open: it must stay unset too
	failOpen := w.GetConfig().GetFailOpen()
	if failOpen || w.GetConfig().GetFailurePolicy() != wasmextv3.FailurePolicy_FAIL_CLOSED {
		t.Errorf("failure policy %v (fail_open %v), want FAIL_CLOSED: the scenarios must see the filter failing, not have it reloaded away",
			w.GetConfig().GetFailurePolicy(), failOpen)
	}
	var cfg wrapperspb.StringValue
	if err := w.GetConfig().GetConfiguration().UnmarshalTo(&cfg); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(cfg.GetValue()) != strings.TrimSpace(pluginConfig) {
		t.Errorf("plugin configuration changed in rendering:\n%s\nwant:\n%s", cfg.GetValue(), pluginConfig)
	}
	if _, err := config.ParseFor([]byte(cfg.GetValue()), config.BuildLocal); valid && err != nil {
		t.Errorf("plugin configuration: %v", err)
	}
	clusters := map[string]bool{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
	}
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if c := r.GetRoute().GetCluster(); !clusters[c] {
				t.Errorf("route to unknown cluster %q", c)
			}
		}
	}
	return &hcm
}
