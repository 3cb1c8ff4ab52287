package envoy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/config"
)

// loadHigressWasmPlugin checks a Higress WasmPlugin: its Istio fields strictly with
// istio.io/api (loadWasmPlugin, on the spec without Higress's own fields), its matchRules
// strictly by hand (Higress's MatchRule: ingress, domain, service, config, configDisable,
// routeType), then builds the plugin configuration as Higress's controller does and parses
// it with sluice's config package. It returns the parsed configuration.
func loadHigressWasmPlugin(data []byte) (*config.Config, error) {
	var doc struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       map[string]any `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, err
	}
	if doc.APIVersion != "extensions.higress.io/v1alpha1" || doc.Kind != "WasmPlugin" {
		return nil, &multiError{[]string{"not an extensions.higress.io/v1alpha1 WasmPlugin: " + doc.APIVersion + " " + doc.Kind}}
	}
	istioSpec := map[string]any{}
	for k, v := range doc.Spec {
		if k != "defaultConfig" && k != "defaultConfigDisable" && k != "matchRules" {
			istioSpec[k] = v
		}
	}
	istioDoc, err := yaml.Marshal(map[string]any{"apiVersion": "extensions.istio.io/v1alpha1", "kind": "WasmPlugin", "metadata": doc.Metadata, "spec": istioSpec})
	if err != nil {
		return nil, err
	}
	if _, err := loadWasmPlugin(istioDoc); err != nil {
		return nil, err
	}
	var spec struct {
		DefaultConfig        map[string]any     `json:"defaultConfig"`
		DefaultConfigDisable bool               `json:"defaultConfigDisable"`
		MatchRules           []higressMatchRule `json:"matchRules"`
	}
	higress := map[string]any{}
	for _, k := range []string{"defaultConfig", "defaultConfigDisable", "matchRules"} {
		if v, ok := doc.Spec[k]; ok {
			higress[k] = v
		}
	}
	js, err := yaml.Marshal(higress)
	if err != nil {
		return nil, err
	}
	if err := yaml.UnmarshalStrict(js, &spec); err != nil {
		return nil, err
	}
	pluginConfig, err := higressPluginConfig(spec.DefaultConfig, spec.DefaultConfigDisable, spec.MatchRules)
	if err != nil {
		return nil, err
	}
	if pluginConfig == nil {
		return nil, &multiError{[]string{"no plugin configuration: defaultConfigDisable and no matchRules (Higress would not load the plugin)"}}
	}
	if js, err = json.Marshal(pluginConfig); err != nil {
		return nil, err
	}
	return config.ParseFor(js, config.BuildRedis)
}

// higressMatchRule is Higress's MatchRule (api/extensions/v1alpha1/wasmplugin.proto).
type higressMatchRule struct {
	Ingress       []string       `json:"ingress"`
	Domain        []string       `json:"domain"`
	Service       []string       `json:"service"`
	Config        map[string]any `json:"config"`
	ConfigDisable bool           `json:"configDisable"`
	RouteType     string         `json:"routeType"`
}

// higressPluginConfig builds the plugin configuration from defaultConfig and the
// matchRules as Higress's controller does (alibaba/higress
// pkg/ingress/config/ingress_config.go, convertIstioWasmPlugin): defaultConfig unless
// disabled; each matchRule not configDisable'd becomes a "_rules_" entry, its config with
// _match_route_ (ingress), _match_service_ (service) and _match_domain_ (domain) added; a
// matchRule with none of them is an error. nil: Higress gives the plugin no configuration.
func higressPluginConfig(defaultConfig map[string]any, defaultDisabled bool, rules []higressMatchRule) (map[string]any, error) {
	var out map[string]any
	if !defaultDisabled && defaultConfig != nil {
		out = map[string]any{}
		for k, v := range defaultConfig {
			out[k] = v
		}
	}
	var entries []any
	for _, r := range rules {
		if r.RouteType != "" && r.RouteType != "HTTP" {
			return nil, &multiError{[]string{"matchRules: routeType " + r.RouteType + " is not checked by this test"}}
		}
		if r.ConfigDisable {
			continue
		}
		e := map[string]any{}
		for k, v := range r.Config {
			e[k] = v
		}
		n := 0
		for _, m := range []struct {
			key  string
			vals []string
		}{{"_match_route_", r.Ingress}, {"_match_service_", r.Service}, {"_match_domain_", r.Domain}} {
			if len(m.vals) > 0 {
				e[m.key] = m.vals
				n++
			}
		}
		if n == 0 {
			return nil, &multiError{[]string{"matchRules: a rule without ingress, domain or service (Higress refuses it)"}}
		}
		entries = append(entries, e)
	}
	if len(entries) > 0 {
		if out == nil {
			out = map[string]any{}
		}
		out["_rules_"] = entries
	}
	return out, nil
}

func TestHigressWasmPlugin(t *testing.T) {
	data, err := os.ReadFile("higress-wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadHigressWasmPlugin(data)
	if err != nil {
		t.Fatalf("higress-wasmplugin.yaml: %v", err)
	}
	if !cfg.HasRedisRules() || cfg.Redis == nil || cfg.FailureMode != config.FailLocal {
		t.Fatalf("want Redis rules with failure_mode local: %+v", cfg)
	}
	if !strings.HasPrefix(cfg.Redis.Cluster, "outbound|6379||") || cfg.Redis.Instances != 3 || cfg.Redis.TimeoutMS != 50 {
		t.Errorf("redis: %+v", *cfg.Redis)
	}
	for _, r := range cfg.Rules {
		if r.Backend != config.BackendRedis {
			t.Errorf("rule %s: backend %v", r.Name, r.Backend)
		}
	}
	// Higress's gateway listeners run with use_remote_address: its Envoy
	// appends the peer before sluice runs.
	if cfg.ClientIP != (config.ClientIP{XFFTrustedHops: 1, ProxyAppendsXFF: true}) {
		t.Errorf("client_ip %+v", cfg.ClientIP)
	}
	if !strings.Contains(string(data), "sluice-redis") {
		t.Error("the Higress example must use the sluice-redis.wasm artifact")
	}
	// The matchRules, in order: route level, domain level, service level.
	want := []struct {
		name  string
		kind  config.ScopeKind
		rules int
	}{{"shop", config.ScopeRoute, 1}, {"partners", config.ScopeDomain, 1}, {"rules_2", config.ScopeService, 0}}
	if len(cfg.Scopes) != len(want) {
		t.Fatalf("%d scopes, want %d", len(cfg.Scopes), len(want))
	}
	for i, w := range want {
		s := cfg.Scopes[i]
		if s.Name != w.name || s.Kind != w.kind || len(s.Config.Rules) != w.rules {
			t.Errorf("scope %d: %s %v with %d rules, want %s %v with %d", i, s.Name, s.Kind, len(s.Config.Rules), w.name, w.kind, w.rules)
		}
	}
	if shop := cfg.Scopes[0].Config; shop.FailureMode != config.FailClosed || shop.Redis == nil || !shop.HasRedisRules() {
		t.Errorf("shop scope: %+v", shop)
	}
	// Requests as Higress's gateway presents them select what the comments say.
	for _, c := range []struct {
		req  higressRequest
		want string
	}{
		{higressRequest{route: "shop/cart", host: "a.example.com"}, "shop"}, // route level first
		{higressRequest{route: "shop/checkout", host: "shop.test"}, "shop"},
		{higressRequest{route: "web/home", host: "a.example.com:443"}, "partners"},
		{higressRequest{route: "web/home", host: "example.com"}, "global"},
		{higressRequest{route: "infra/health", host: "x.test", cluster: "outbound|8080||health.infra.svc.cluster.local"}, "rules_2"},
		{higressRequest{route: "infra/health", host: "x.test", cluster: "outbound|9090||health.infra.svc.cluster.local"}, "global"},
	} {
		got := "global"
		if s := cfg.Select(&c.req); s != nil {
			got = s.Name
		}
		if got != c.want {
			t.Errorf("%+v selects %s, want %s", c.req, got, c.want)
		}
	}
}

// higressRequest is a request as a Higress gateway presents it to a plugin: route_name
// "namespace/ingress", :authority, cluster_name "outbound|PORT||FQDN".
type higressRequest struct{ route, host, cluster string }

func (r *higressRequest) RouteName() (string, bool)   { return r.route, r.route != "" }
func (r *higressRequest) Authority() (string, bool)   { return r.host, r.host != "" }
func (r *higressRequest) ClusterName() (string, bool) { return r.cluster, r.cluster != "" }

func TestHigressWasmPluginMistakesFail(t *testing.T) {
	data, err := os.ReadFile("higress-wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, old, new, want string }{
		{"typo in spec", "failStrategy: FAIL_OPEN", "failStrategie: FAIL_OPEN", "failStrategie"},
		{"bad enum", "phase: AUTHN", "phase: AUTHENTICATION", "AUTHENTICATION"},
		{"istio kind", "apiVersion: extensions.higress.io/v1alpha1", "apiVersion: extensions.istio.io/v1alpha1", "not an extensions.higress.io"},
		{"typo in defaultConfig", "failure_mode: local", "failure_mod: local", "failure_mod"},
		{"redis without cluster", "cluster: outbound", "clustr: outbound", "redis.clustr"},
		{"bad timeout", "timeout_ms: 50", "timeout_ms: 0", "redis.timeout_ms"},
		{"bad backend", "backend: redis\n    - name", "backend: memcached\n    - name", "backend"},
		{"typo in a matchRule's config", "limit: 20", "limt: 20", "_rules_[0].rules[0].limt: unknown field"},
		{"domain with a port", `"*.example.com"`, `"*.example.com:443"`, "_rules_[1]._match_domain_[0]"},
		{"bad service port", "cluster.local:8080", "cluster.local:80800", "_rules_[2]._match_service_[0]"},
		{"typo in a matchRule", "- ingress:", "- ingres:", "ingres"},
		{"matchRule without a condition", "  - service:\n    - health.infra.svc.cluster.local:8080\n    config:", "  - config:", "without ingress, domain or service"},
		{"matchRule without rules", "    config:\n      rules: []", "    config:\n      response: {status: 429}", "_rules_[2].rules: is required"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(string(data), c.old) {
				t.Fatalf("higress-wasmplugin.yaml does not contain %q", c.old)
			}
			_, err := loadHigressWasmPlugin([]byte(strings.Replace(string(data), c.old, c.new, 1)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
}
