package envoy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	dynmodv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_modules/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"github.com/google/go-containerregistry/pkg/name"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	istiov1alpha1 "istio.io/api/extensions/v1alpha1"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/images"
)

// loadBootstrap parses an Envoy bootstrap YAML strictly and validates it, including every
// Any (typed_config), however deeply nested (envoyproc.ParseBootstrap).
func loadBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	return envoyproc.ParseBootstrap(data)
}

type multiError struct{ errs []string }

func (m *multiError) Error() string { return strings.Join(m.errs, "\n") }

// checkEnvoy does the checks no schema makes: every route's cluster exists,
// the router is the last HTTP filter, and the sluice configuration parses.
// It returns the problems found and the number of sluice filters.
func checkEnvoy(b *bootstrapv3.Bootstrap) (problems []string, found int) {
	fail := func(s string) { problems = append(problems, s) }
	clusters := map[string]bool{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					continue
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.GetRoutes() {
						if c := r.GetRoute().GetCluster(); c != "" && !clusters[c] {
							fail("listener " + l.GetName() + ": route " + r.GetMatch().GetPrefix() + " goes to unknown cluster " + c)
						}
					}
				}
				filters := hcm.GetHttpFilters()
				if len(filters) == 0 {
					fail("listener " + l.GetName() + ": no HTTP filters")
					continue
				}
				if last := filters[len(filters)-1]; !last.GetTypedConfig().MessageIs(&routerv3.Router{}) {
					fail("listener " + l.GetName() + ": the last HTTP filter is " + last.GetName() + ", not the router")
				}
				for i, hf := range filters {
					// sluice.wasm in the Wasm filter, or libsluice.so in the dynamic-module filter.
					var plugin *anypb.Any
					build := config.BuildLocal
					var w wasmfilterv3.Wasm
					var dm dynmodv3.DynamicModuleFilter
					switch {
					case hf.GetTypedConfig().UnmarshalTo(&w) == nil:
						pc := w.GetConfig()
						if pc.GetVmConfig().GetVmId() == "" {
							fail("vm_id not set: workers would not share one limit")
						}
						if pc.GetVmConfig().GetRuntime() != "envoy.wasm.runtime.v8" {
							fail("runtime " + pc.GetVmConfig().GetRuntime())
						}
						plugin = pc.GetConfiguration()
					case hf.GetTypedConfig().UnmarshalTo(&dm) == nil && dm.GetDynamicModuleConfig().GetName() == "sluice":
						if !dm.GetDynamicModuleConfig().GetDoNotClose() {
							fail("listener " + l.GetName() + ": libsluice.so without do_not_close: a Go library cannot be unloaded")
						}
						plugin, build = dm.GetFilterConfig(), config.BuildDynamic
					default:
						continue
					}
					if i == len(filters)-1 {
						fail("sluice after the router")
					}
					if !hcm.GetUseRemoteAddress().GetValue() {
						fail("listener " + l.GetName() + ": use_remote_address is off: source.address would be the right-most X-Forwarded-For entry, which a client can write")
					}
					if !hcm.GetNormalizePath().GetValue() || !hcm.GetMergeSlashes() {
						fail("listener " + l.GetName() + ": normalize_path and merge_slashes must both be on: the upstream must receive the path sluice matched (/x/../h is /h)")
					}
					var sv wrapperspb.StringValue
					if err := plugin.UnmarshalTo(&sv); err != nil {
						fail("plugin configuration is not a StringValue: " + err.Error())
						continue
					}
					cfg, err := config.ParseFor([]byte(sv.GetValue()), build)
					if err != nil {
						fail("plugin configuration:\n" + err.Error())
						continue
					}
					appends := hcm.GetUseRemoteAddress().GetValue() && !hcm.GetSkipXffAppend()
					if cfg.ClientIP.XFFTrustedHops > 0 && cfg.ClientIP.ProxyAppendsXFF != appends {
						fail("listener " + l.GetName() + ": this Envoy appends its peer to X-Forwarded-For: " + strconv.FormatBool(appends) +
							", but the plugin's client_ip.proxy_appends_xff says " + strconv.FormatBool(cfg.ClientIP.ProxyAppendsXFF))
					}
					found++
				}
			}
		}
	}
	return problems, found
}

func TestEnvoyYAML(t *testing.T) {
	for _, name := range []string{"envoy.yaml", "envoy-dynmod.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := loadBootstrap(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		problems, n := checkEnvoy(b)
		for _, p := range problems {
			t.Errorf("%s: %s", name, p)
		}
		if n != 1 {
			t.Errorf("%s: %d sluice filters, want 1", name, n)
		}
	}
}

// The dynamic module's bootstrap is envoy.yaml with the filter swapped: the same listener,
// routes, cluster and plugin configuration.
func TestEnvoyDynmodYAMLMatches(t *testing.T) {
	a, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("envoy-dynmod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plugin := func(y []byte) string {
		s := string(y)
		i := strings.Index(s, `"rules"`)
		j := strings.Index(s, `"client_ip"`)
		if i < 0 || j < i {
			t.Fatal("no plugin configuration")
		}
		return strings.Join(strings.Fields(s[i:j]), " ")
	}
	if plugin(a) != plugin(b) {
		t.Errorf("the plugin configurations differ:\n%s\n%s", plugin(a), plugin(b))
	}
}

// A typo anywhere — top level, inside a typed_config, a value a validation
// rule forbids — fails.
func TestEnvoyYAMLMistakesFail(t *testing.T) {
	data, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, old, new string }{
		{"typo in bootstrap", "static_resources:", "static_resource:"},
		{"typo inside typed_config", "stat_prefix: ingress_http", "stat_prefx: ingress_http"},
		{"typo in wasm config", "root_id: sluice", "rootid: sluice"},
		{"unknown @type", "filters.http.router.v3.Router", "filters.http.router.v3.Routr"},
		{"validation inside Any", "stat_prefix: ingress_http", `stat_prefix: ""`},
		{"validation inside nested Any", "filename: /etc/envoy/sluice.wasm", `filename: ""`},
		{"bad duration", "connect_timeout: 1s", "connect_timeout: -1s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(string(data), c.old) {
				t.Fatalf("envoy.yaml does not contain %q", c.old)
			}
			mut := strings.Replace(string(data), c.old, c.new, 1)
			if _, err := loadBootstrap([]byte(mut)); err == nil {
				t.Errorf("mistake accepted")
			} else {
				t.Logf("rejected: %.200s", err)
			}
		})
	}
	// What no schema catches, the hand-written checks do.
	for _, c := range []struct{ name, old, new string }{
		{"route to a missing cluster", "route: {cluster: upstream}", "route: {cluster: upstrem}"},
		{"bad plugin configuration", `"limit": 100, "window": "1m"`, `"limit": 100, "window": "1x"`},
		{"source.address from X-Forwarded-For", "use_remote_address: true", "use_remote_address: false"},
		{"paths not normalized", "normalize_path: true", "normalize_path: false"},
		{"slashes not merged", "merge_slashes: true", "merge_slashes: false"},
		{"Envoy's X-Forwarded-For append not declared", `"client_ip": {"xff_trusted_hops": 0}`, `"client_ip": {"xff_trusted_hops": 1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			mut := strings.Replace(string(data), c.old, c.new, 1)
			b, err := loadBootstrap([]byte(mut))
			if err != nil {
				t.Fatalf("schema rejected it already: %v", err)
			}
			problems, _ := checkEnvoy(b)
			if len(problems) == 0 {
				t.Error("mistake accepted")
			} else {
				t.Logf("caught: %.200s", problems[0])
			}
		})
	}
}

// loadWasmPlugin parses an Istio WasmPlugin strictly (see loadIstio).
func loadWasmPlugin(data []byte) (*istiov1alpha1.WasmPlugin, error) {
	var wp istiov1alpha1.WasmPlugin
	if err := loadIstio(data, "extensions.istio.io/v1alpha1", "WasmPlugin", &wp); err != nil {
		return nil, err
	}
	return &wp, nil
}

// loadIstio parses an Istio resource of the given apiVersion and kind strictly: the
// envelope with unknown fields rejected, then the spec through protojson into msg
// (yaml.Unmarshal into the generated type would ignore unknown fields).
func loadIstio(data []byte, apiVersion, kind string, msg proto.Message) error {
	var doc struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       any            `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return err
	}
	if doc.APIVersion != apiVersion || doc.Kind != kind {
		return &multiError{[]string{"not a " + apiVersion + " " + kind + ": " + doc.APIVersion + " " + doc.Kind}}
	}
	spec, err := yaml.Marshal(doc.Spec)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(spec)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(js, msg)
}

func pluginConfigJSON(wp *istiov1alpha1.WasmPlugin) ([]byte, error) {
	return protojson.Marshal(wp.GetPluginConfig())
}

func TestIstioWasmPlugin(t *testing.T) {
	data, err := os.ReadFile("istio-wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wp, err := loadWasmPlugin(data)
	if err != nil {
		t.Fatalf("istio-wasmplugin.yaml: %v", err)
	}
	if wp.GetUrl() == "" || wp.GetPluginConfig() == nil {
		t.Fatalf("url %q, pluginConfig %v", wp.GetUrl(), wp.GetPluginConfig())
	}
	if wp.GetFailStrategy() != istiov1alpha1.FailStrategy_FAIL_OPEN {
		t.Errorf("failStrategy %v", wp.GetFailStrategy())
	}
	js, err := pluginConfigJSON(wp)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.ParseFor(js, config.BuildLocal)
	if err != nil {
		t.Fatalf("pluginConfig:\n%v\n%s", err, js)
	}
	// An Istio gateway runs with use_remote_address: true, so its Envoy
	// appends the peer before sluice runs.
	if len(cfg.Rules) != 2 || cfg.ClientIP != (config.ClientIP{XFFTrustedHops: 1, ProxyAppendsXFF: true}) {
		t.Errorf("parsed %d rules, client_ip %+v", len(cfg.Rules), cfg.ClientIP)
	}
}

// loadMeshConfig parses the meshConfig of an IstioOperator strictly
// (protojson into istio.io/api's MeshConfig).
func loadMeshConfig(data []byte) (*meshv1alpha1.MeshConfig, error) {
	var doc struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			MeshConfig any `json:"meshConfig"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return nil, err
	}
	if doc.APIVersion != "install.istio.io/v1alpha1" || doc.Kind != "IstioOperator" {
		return nil, &multiError{[]string{"not an install.istio.io/v1alpha1 IstioOperator: " + doc.APIVersion + " " + doc.Kind}}
	}
	js, err := json.Marshal(doc.Spec.MeshConfig)
	if err != nil {
		return nil, err
	}
	var mc meshv1alpha1.MeshConfig
	if err := protojson.Unmarshal(js, &mc); err != nil {
		return nil, err
	}
	return &mc, nil
}

// The Istio mesh configuration turns on normalize_path and merge_slashes
// (pathNormalization MERGE_SLASHES: Istio's listener builder sets both, and
// keeps escaped slashes), so the upstream receives the path sluice matched.
func TestIstioMeshConfig(t *testing.T) {
	data, err := os.ReadFile("istio-mesh-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	mc, err := loadMeshConfig(data)
	if err != nil {
		t.Fatalf("istio-mesh-config.yaml: %v", err)
	}
	if got := mc.GetPathNormalization().GetNormalization(); got != meshv1alpha1.MeshConfig_ProxyPathNormalization_MERGE_SLASHES {
		t.Errorf("pathNormalization %v, want MERGE_SLASHES", got)
	}
	for _, c := range []struct{ name, old, new string }{
		{"typo", "normalization: MERGE_SLASHES", "normalisation: MERGE_SLASHES"},
		{"bad enum", "normalization: MERGE_SLASHES", "normalization: MERGE"},
	} {
		mut := strings.Replace(string(data), c.old, c.new, 1)
		if _, err := loadMeshConfig([]byte(mut)); err == nil {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if mc, err := loadMeshConfig([]byte(strings.Replace(string(data), "normalization: MERGE_SLASHES", "normalization: BASE", 1))); err != nil || mc.GetPathNormalization().GetNormalization() == meshv1alpha1.MeshConfig_ProxyPathNormalization_MERGE_SLASHES {
		t.Errorf("BASE read as %v, %v", mc.GetPathNormalization().GetNormalization(), err)
	}
}

func TestIstioWasmPluginMistakesFail(t *testing.T) {
	data, err := os.ReadFile("istio-wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, old, new string }{
		{"typo in spec", "failStrategy: FAIL_OPEN", "failStrategie: FAIL_OPEN"},
		{"bad enum", "phase: AUTHN", "phase: AUTHENTICATION"},
		{"typo in kind", "kind: WasmPlugin", "kind: WasmPlugn"},
		{"typo in pluginConfig", "failure_mode: open", "failure_mod: open"},
		{"bad pluginConfig value", "window: 1m\n      burst", "window: 1q\n      burst"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(string(data), c.old) {
				t.Fatalf("istio-wasmplugin.yaml does not contain %q", c.old)
			}
			mut := strings.Replace(string(data), c.old, c.new, 1)
			wp, err := loadWasmPlugin([]byte(mut))
			if err == nil {
				var js []byte
				js, err = pluginConfigJSON(wp)
				if err == nil {
					_, err = config.ParseFor(js, config.BuildLocal)
				}
			}
			if err == nil {
				t.Error("mistake accepted")
			} else {
				t.Logf("rejected: %.200s", err)
			}
		})
	}
}

// imageLine is a manifest line naming an image: a WasmPlugin's url or a container's image.
var imageLine = regexp.MustCompile(`^\s*(?:-\s+)?(url|image):\s*"?([^\s"#]+)`)

// checkImageReferences returns what is wrong with the image references of a manifest:
// every image has a version tag or a digest, never latest; sluice's own images have the
// tag `make images` builds, are followed by imagePullPolicy: IfNotPresent, and a comment in
// the file shows their digest form. It returns the number of sluice references too.
func checkImageReferences(file, text string) (problems []string, sluice int) {
	fail := func(line int, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: ", file, line+1)+fmt.Sprintf(format, args...))
	}
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "imagePullPolicy:"); ok && k == "" && strings.TrimSpace(v) != "IfNotPresent" {
			fail(i, "imagePullPolicy %s: every image here has a fixed version, IfNotPresent fetches it once", strings.TrimSpace(v))
		}
		m := imageLine.FindStringSubmatch(line)
		if m == nil || (m[1] == "url" && !strings.HasPrefix(m[2], "oci://")) {
			continue // an https:// url (with sha256) or a file
		}
		s := strings.TrimPrefix(m[2], "oci://")
		ref, err := name.ParseReference(s)
		if err != nil {
			fail(i, "%s: %v", s, err)
			continue
		}
		last := s[strings.LastIndex(s, "/")+1:]
		tag, isTag := ref.(name.Tag)
		switch {
		case isTag && !strings.Contains(last, ":"):
			fail(i, "%s has no tag: it means latest", s)
		case isTag && tag.TagStr() == "latest":
			fail(i, "%s: latest moves, and IfNotPresent never fetches it again", s)
		}
		repo := ref.Context().Name()
		if !strings.HasPrefix(repo, images.Registry+"/") {
			continue
		}
		sluice++
		if !isTag || tag.TagStr() != images.Version {
			fail(i, "%s: want the tag make images builds, %s", s, images.Version)
		}
		if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "imagePullPolicy: IfNotPresent" {
			fail(i, "%s: not followed by imagePullPolicy: IfNotPresent", s)
		}
		digestForm := false
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), "#") && strings.Contains(l, repo+"@sha256:") {
				digestForm = true
			}
		}
		if !digestForm {
			fail(i, "no comment shows the digest form %s@sha256:…", repo)
		}
	}
	return problems, sluice
}

// The manifests name images that exist once `make images` has run and been published: a
// version tag (internal/images.Version), never latest, with the digest form shown.
func TestManifestImageReferences(t *testing.T) {
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatal(files, err)
	}
	total := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		problems, n := checkImageReferences(f, string(data))
		for _, p := range problems {
			t.Error(p)
		}
		total += n
	}
	// sluice in istio-wasmplugin, -rls, istio-routes; sluice-redis in higress-wasmplugin;
	// sluice-serve in istio-ratelimit-service and istio-rlqs.
	if total != 6 {
		t.Errorf("%d references to sluice's images, want 6", total)
	}

	data, err := os.ReadFile("istio-wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tagged := "oci://" + images.Registry + "/" + images.NameWasm + ":" + images.Version
	for _, c := range []struct{ name, old, new string }{
		{"latest", tagged, strings.TrimSuffix(tagged, images.Version) + "latest"},
		{"no tag", tagged, strings.TrimSuffix(tagged, ":"+images.Version)},
		{"another version", tagged, strings.TrimSuffix(tagged, images.Version) + "0.0.9"},
		{"pull policy", "imagePullPolicy: IfNotPresent", "imagePullPolicy: Always"},
		{"no digest form", "/" + images.NameWasm + "@sha256:", "/" + images.NameWasm + ":sha256-"},
	} {
		if !strings.Contains(string(data), c.old) {
			t.Fatalf("%s: istio-wasmplugin.yaml lacks %q", c.name, c.old)
		}
		if problems, _ := checkImageReferences("istio-wasmplugin.yaml", strings.Replace(string(data), c.old, c.new, 1)); len(problems) == 0 {
			t.Errorf("%s: accepted", c.name)
		}
	}
	if problems, _ := checkImageReferences("x.yaml", "containers:\n- name: r\n  image: redis:latest\n"); len(problems) == 0 {
		t.Error("a third-party :latest accepted")
	}
	if problems, _ := checkImageReferences("x.yaml", "containers:\n- name: r\n  image: redis\n"); len(problems) == 0 {
		t.Error("a third-party image without a tag accepted")
	}
}
