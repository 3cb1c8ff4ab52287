package envoy

import (
	"os"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/config"
)

// loadHigressWasmPlugin checks a Higress WasmPlugin: its Istio fields strictly with
// istio.io/api (loadWasmPlugin, on the spec without Higress's own fields), and
// defaultConfig with sluice's config package. It returns the parsed configuration.
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
	defaultConfig, ok := doc.Spec["defaultConfig"]
	if !ok {
		return nil, &multiError{[]string{"spec.defaultConfig is missing"}}
	}
	if _, ok := doc.Spec["matchRules"]; ok {
		return nil, &multiError{[]string{"spec.matchRules: not checked by this test; extend it"}}
	}
	istioSpec := map[string]any{}
	for k, v := range doc.Spec {
		if k != "defaultConfig" && k != "defaultConfigDisable" {
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
	js, err := yaml.Marshal(defaultConfig)
	if err != nil {
		return nil, err
	}
	if js, err = yaml.YAMLToJSON(js); err != nil {
		return nil, err
	}
	return config.Parse(js)
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
	if !strings.Contains(string(data), "sluice-redis") {
		t.Error("the Higress example must use the sluice-redis.wasm artifact")
	}
}

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
