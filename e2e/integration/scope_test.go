package integration

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
)

// Scopes ("_rules_", Higress's matchRules) and match.routes through the compiled module in
// the embedded host, with the route, host and cluster set as Higress's gateway sets them:
// route names "namespace/ingress", clusters "outbound|PORT||FQDN", :authority with a port.

func newScopeHost(t *testing.T, wasm []byte, cfg, profile string) *host.Host {
	t.Helper()
	var logs bytes.Buffer
	h, err := host.New(context.Background(), host.Options{
		Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1, VMID: "sluice-test", Profile: profile,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{new(sync.Mutex), &logs}, nil)),
	})
	if err != nil {
		t.Fatalf("host.New: %v\n%s", err, logs.String())
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	return h
}

func exchange(t *testing.T, h *host.Host, r *host.Request) *host.Response {
	t.Helper()
	resp, err := h.Exchange(context.Background(), r, upstream200)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Failed {
		t.Fatalf("guest trapped: %+v", resp)
	}
	return resp
}

func TestScopesThroughModule(t *testing.T) {
	wasm := filtertest.Wasm(t, "")
	// Higress's gateway serves route_name and cluster_name (and xds.*); upstream Envoy ≥ 1.33
	// only xds.*: the module must select the same scopes on both.
	for _, profile := range []string{"higress", "envoy-1.33"} {
		t.Run(profile, func(t *testing.T) {
			h := newScopeHost(t, wasm, filtertest.HigressScopes, profile)
			type step struct {
				desc                          string
				route, authority, cluster, ip string
				status                        int
				policy                        string // RateLimit-Policy ("" = absent)
			}
			const co, health = "outbound|80||checkout.default.svc.cluster.local", "outbound|8080||health.default.svc.cluster.local"
			steps := []step{
				{"checkout: the shop scope", "default/checkout", "shop.test", co, "10.0.0.1:1", 200, `"per-ip";q=1;w=3600`},
				{"checkout: shop limit 1, its own response", "default/checkout", "shop.test", co, "10.0.0.1:1", 503, `"per-ip";q=1;w=3600`},
				{"cart: same scope, same counter", "default/cart", "shop.test", co, "10.0.0.1:1", 503, `"per-ip";q=1;w=3600`},
				{"cart: another client", "default/cart", "shop.test", co, "10.0.0.2:1", 200, `"per-ip";q=1;w=3600`},
				// The route scope comes first in _rules_: it wins over the domain scope.
				{"route before domain", "default/checkout", "a.example.com", co, "10.0.0.3:1", 200, `"per-ip";q=1;w=3600`},
				{"domain scope, port stripped", "default/other", "a.example.com:8443", co, "10.0.0.1:1", 200, `"per-ip";q=2;w=3600`},
				{"domain scope, case-insensitive", "default/other", "B.EXAMPLE.COM", co, "10.0.0.1:1", 200, `"per-ip";q=2;w=3600`},
				{"domain scope limit 2, own counter", "default/other", "c.example.com", co, "10.0.0.1:1", 429, `"per-ip";q=2;w=3600`},
				{"global", "default/other", "other.test", co, "10.0.0.1:1", 200, `"global";q=3;w=3600`},
				{"global, no route", "", "other.test", "", "10.0.0.1:1", 200, `"global";q=3;w=3600`},
				{"global 3", "default/other", "other.test", co, "10.0.0.1:1", 200, `"global";q=3;w=3600`},
				{"global limited", "default/other", "other.test", co, "10.0.0.1:1", 429, `"global";q=3;w=3600`},
				{"exempt service scope", "default/health", "other.test", health, "10.0.0.1:1", 200, ""},
				{"exempt service scope again", "default/health", "other.test", health, "10.0.0.1:1", 200, ""},
				{"service port must match", "default/health", "other.test", "outbound|9090||health.default.svc.cluster.local", "10.0.0.1:1", 429, `"global";q=3;w=3600`},
			}
			for _, s := range steps {
				resp := exchange(t, h, &host.Request{Path: "/x", Authority: s.authority, RemoteAddr: s.ip, RouteName: s.route, ClusterName: s.cluster})
				if resp.Status != s.status || resp.Header("ratelimit-policy") != s.policy {
					t.Fatalf("%s: status %d policy %q, want %d %q (%+v)", s.desc, resp.Status, resp.Header("ratelimit-policy"), s.status, s.policy, resp)
				}
				if s.status == 503 && string(resp.Body) != "shop closed\n" || s.desc == "checkout: the shop scope" && resp.Header("x-ratelimit-limit") != "" {
					t.Errorf("%s: the scope's own response settings not applied: %+v", s.desc, resp)
				}
			}
			metric := func(name string) int64 {
				m, _ := h.Metric(name)
				return m.Value
			}
			for name, want := range map[string]int64{
				"sluice.shop.per-ip.allowed": 3, "sluice.shop.per-ip.denied": 2,
				"sluice.rules_1.per-ip.allowed": 2, "sluice.rules_1.per-ip.denied": 1,
				"sluice.global.allowed": 3, "sluice.global.denied": 2,
			} {
				if got := metric(name); got != want {
					t.Errorf("%s = %d, want %d", name, got, want)
				}
			}
			prefixes := map[string]int{}
			for _, k := range h.SharedData().Keys() {
				if k == filter.SeedKey {
					continue
				}
				i := strings.LastIndexByte(k, ':')
				prefixes[k[:i+1]]++
			}
			for _, p := range []string{"sluice:sluice:shop.per-ip:", "sluice:sluice:rules_1.per-ip:", "sluice:sluice:global:"} {
				if prefixes[p] == 0 {
					t.Errorf("no shared-data keys under %s: %v", p, prefixes)
				}
			}
			if len(prefixes) != 3 {
				t.Errorf("shared-data key prefixes %v", prefixes)
			}
			if st := h.Stats(); st.VMRestarts != 0 || st.Failed != 0 {
				t.Errorf("restarts %d failed %d", st.VMRestarts, st.Failed)
			}
		})
	}
}

// A configuration of "_rules_" alone: requests no entry selects are not limited at all.
func TestScopesOnlyThroughModule(t *testing.T) {
	wasm := filtertest.Wasm(t, "")
	cfg := `{"_rules_":[{"_match_route_prefix_":["api-"],"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1,"window":"1h"}]}]}`
	h := newScopeHost(t, wasm, cfg, "higress")
	for i, want := range []int{200, 429, 429} {
		if resp := exchange(t, h, &host.Request{Path: "/", RemoteAddr: "10.0.0.1:1", RouteName: "api-v1"}); resp.Status != want {
			t.Errorf("api-v1 request %d: %d, want %d", i, resp.Status, want)
		}
	}
	for i := 0; i < 3; i++ {
		resp := exchange(t, h, &host.Request{Path: "/", RemoteAddr: "10.0.0.1:1", RouteName: "web"})
		if resp.Status != 200 || resp.Header("ratelimit") != "" {
			t.Errorf("web request %d: %+v", i, resp)
		}
	}
}

// match.routes: the route name Envoy reports (xds.route_name on Envoy ≥ 1.33), with
// sluice run's routes: longest path prefix.
func TestMatchRoutesThroughModule(t *testing.T) {
	wasm := filtertest.Wasm(t, "")
	cfg := `{"rules":[{"name":"shop","match":{"routes":["checkout","cart"]},"key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	var logs bytes.Buffer
	h, err := host.New(context.Background(), host.Options{
		Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1,
		Routes: []host.Route{{Name: "checkout", PathPrefix: "/checkout"}, {Name: "cart", PathPrefix: "/cart"}, {Name: "web", PathPrefix: "/"}},
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err, logs.String())
	}
	defer h.Close(context.Background())
	for _, c := range []struct {
		path   string
		status int
	}{{"/checkout/pay", 200}, {"/cart", 429}, {"/checkout", 429}, {"/", 200}, {"/other", 200}, {"/other", 200}} {
		if resp := exchange(t, h, &host.Request{Path: c.path, RemoteAddr: "10.0.0.1:1"}); resp.Status != c.status {
			t.Errorf("%s: %d, want %d", c.path, resp.Status, c.status)
		}
	}
}

// Heap allocations per request with scopes and match.routes (sluice_debug build): selecting
// a scope and matching routes allocate nothing in the guest.
func TestGuestAllocationsPerRequestScoped(t *testing.T) {
	wasm := filtertest.Wasm(t, "sluice_debug")
	cfg := `{"rules":[{"name":"g","match":{"routes":["a","b"]},"key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}],
	  "_rules_":[{"_match_route_":["x"],"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}]},
	    {"_match_domain_":["*.example.com"],"rules":[{"name":"d","match":{"routes":["b"]},"key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}]}]}`
	for _, profile := range []string{"envoy-1.33", "higress"} {
		h := newScopeHost(t, wasm, cfg, profile)
		reqs := []*host.Request{
			{Path: "/", Authority: "a.example.com:80", RemoteAddr: "192.0.2.10:1", RouteName: "b", ClusterName: "outbound|80||s"},
			{Path: "/", Authority: "other.test", RemoteAddr: "192.0.2.10:1", RouteName: "a"},
			{Path: "/", Authority: "other.test", RemoteAddr: "192.0.2.10:1", RouteName: "x"},
		}
		for i := 0; i < 1000; i++ {
			exchange(t, h, reqs[i%3])
		}
		m0, _ := h.Metric(filter.DebugAllocsMetric)
		const n = 9000
		for i := 0; i < n; i++ {
			if resp := exchange(t, h, reqs[i%3]); resp.Status != 200 || resp.Header("ratelimit") == "" {
				t.Fatalf("request %d: %+v", i, resp)
			}
		}
		m1, ok := h.Metric(filter.DebugAllocsMetric)
		if !ok {
			t.Fatal("no allocation metric")
		}
		per := float64(m1.Value-m0.Value) / n
		t.Logf("%s: %.4f guest heap allocations per request", profile, per)
		if per > 0.01 {
			t.Errorf("%s: %.4f allocations per request in the guest", profile, per)
		}
	}
}
