package envoy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	securityv1beta1 "istio.io/api/security/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/serve/rls"
)

// The HTTP protocol options are imported so that their @type resolves.
var _ = &httpv3.HttpProtocolOptions{}

// rlsConfig is the part of an envoyproxy/ratelimit configuration (the
// format of sluice serve --config) that descriptor matching reads. The file
// is validated by sluice's own parser (rls.ParseConfig) first; this model
// only answers "which limit does this descriptor get".
type rlsConfig struct {
	Domain      string          `json:"domain"`
	Descriptors []rlsDescriptor `json:"descriptors"`
}

type rlsDescriptor struct {
	Key         string          `json:"key"`
	Value       string          `json:"value"`
	RateLimit   map[string]any  `json:"rate_limit"`
	Descriptors []rlsDescriptor `json:"descriptors"`
}

// parseServeConfig parses a sluice serve configuration with sluice's parser
// (the file must load in the service) and returns the matching model.
func parseServeConfig(name string, data []byte) (*rlsConfig, error) {
	if _, err := rls.ParseConfig([]string{name}, [][]byte{data}); err != nil {
		return nil, err
	}
	var c rlsConfig
	if err := yaml.Unmarshal(data, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// entry is one descriptor entry.
type entry struct{ key, value string }

// limitFor walks the configuration as envoyproxy/ratelimit (and sluice
// serve) does: at each level the entry's key_value, else its key alone; the
// descriptor is limited if the walk consumes every entry and ends on a
// rate_limit. It returns the rate_limit, or nil (the descriptor is not
// limited: the service answers OK to every request).
func (c *rlsConfig) limitFor(es []entry) map[string]any {
	level := c.Descriptors
	var found *rlsDescriptor
	for _, e := range es {
		found = nil
		for i := range level {
			if level[i].Key == e.key && level[i].Value == e.value {
				found = &level[i]
				break
			}
		}
		if found == nil {
			for i := range level {
				if level[i].Key == e.key && level[i].Value == "" {
					found = &level[i]
					break
				}
			}
		}
		if found == nil {
			return nil
		}
		level = found.Descriptors
	}
	if found == nil {
		return nil
	}
	return found.RateLimit
}

// descriptorEntries returns the entries Envoy builds from one rate_limits
// item for a request that gives every action a value (remote address
// 192.0.2.1, every header "v"), or an error for an action this check does not
// model.
func descriptorEntries(rl *routev3.RateLimit) ([]entry, error) {
	var es []entry
	for _, a := range rl.GetActions() {
		switch {
		case a.GetRemoteAddress() != nil:
			es = append(es, entry{"remote_address", "192.0.2.1"})
		case a.GetGenericKey() != nil:
			k := a.GetGenericKey().GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			es = append(es, entry{k, a.GetGenericKey().GetDescriptorValue()})
		case a.GetRequestHeaders() != nil:
			es = append(es, entry{a.GetRequestHeaders().GetDescriptorKey(), "v"})
		case a.GetHeaderValueMatch() != nil:
			k := a.GetHeaderValueMatch().GetDescriptorKey()
			if k == "" {
				k = "header_match"
			}
			es = append(es, entry{k, a.GetHeaderValueMatch().GetDescriptorValue()})
		default:
			return nil, fmt.Errorf("action %v is not modelled by this check", a)
		}
	}
	return es, nil
}

// checkRateLimits checks that every descriptor the rate_limits produce has a
// limit in cfg.
func checkRateLimits(where string, rls []*routev3.RateLimit, cfg *rlsConfig) []string {
	var problems []string
	for i, rl := range rls {
		if err := rl.ValidateAll(); err != nil {
			problems = append(problems, where+": rate_limits["+strconv.Itoa(i)+"]: "+err.Error())
			continue
		}
		es, err := descriptorEntries(rl)
		if err != nil {
			problems = append(problems, where+": "+err.Error())
			continue
		}
		if cfg.limitFor(es) == nil {
			problems = append(problems, fmt.Sprintf("%s: rate_limits[%d] produces %v, which has no limit in the service's configuration (domain %s): every such request would be allowed", where, i, es, cfg.Domain))
		}
	}
	return problems
}

// checkRateLimitFilter checks an envoy.filters.http.ratelimit configuration
// against the service's configuration and returns its cluster name.
func checkRateLimitFilter(where string, rl *ratelimitfilterv3.RateLimit, cfg *rlsConfig) (cluster string, problems []string) {
	fail := func(s string) { problems = append(problems, where+": "+s) }
	if rl.GetDomain() != cfg.Domain {
		fail("domain " + strconv.Quote(rl.GetDomain()) + ", but the service's configuration is for " + strconv.Quote(cfg.Domain))
	}
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		fail("rate_limit_service.transport_api_version is not V3 (sluice serve implements envoy.service.ratelimit.v3)")
	}
	cluster = svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if cluster == "" {
		fail("rate_limit_service.grpc_service has no envoy_grpc cluster")
	}
	if rl.GetTimeout() == nil {
		fail("timeout not set: Envoy's 20 ms default counts a loaded Redis round trip as a failure")
	}
	if !rl.GetRateLimitedAsResourceExhausted() {
		fail("rate_limited_as_resource_exhausted is off: limited gRPC clients would see UNAVAILABLE, which they retry")
	}
	return cluster, problems
}

// checkRateLimitBootstrap does the checks no schema makes on
// ratelimit-service.yaml: the rate-limit filter before the router, its
// cluster present and speaking HTTP/2, its domain the service's, and every
// descriptor the routes produce limited by the service's configuration.
func checkRateLimitBootstrap(b *bootstrapv3.Bootstrap, cfg *rlsConfig) (problems []string, filters int) {
	clusters := map[string]bool{}
	http2 := map[string]bool{}
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
		if a, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; ok {
			var o httpv3.HttpProtocolOptions
			if a.UnmarshalTo(&o) == nil && o.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil {
				http2[c.GetName()] = true
			}
		}
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					problems = append(problems, checkRateLimits("virtual host "+vh.GetName(), vh.GetRateLimits(), cfg)...)
					for _, r := range vh.GetRoutes() {
						where := "route " + r.GetMatch().GetPrefix()
						if c := r.GetRoute().GetCluster(); c != "" && !clusters[c] {
							problems = append(problems, where+": unknown cluster "+c)
						}
						problems = append(problems, checkRateLimits(where, r.GetRoute().GetRateLimits(), cfg)...)
					}
				}
				hf := hcm.GetHttpFilters()
				router := slices.IndexFunc(hf, func(f *hcmv3.HttpFilter) bool { return f.GetTypedConfig().MessageIs(&routerv3.Router{}) })
				if router != len(hf)-1 {
					problems = append(problems, "listener "+l.GetName()+": the router is not the last HTTP filter")
				}
				if !hcm.GetUseRemoteAddress().GetValue() {
					problems = append(problems, "listener "+l.GetName()+": use_remote_address is off: remote_address would be a client-written X-Forwarded-For entry")
				}
				for i, h := range hf {
					var rl ratelimitfilterv3.RateLimit
					if h.GetTypedConfig().UnmarshalTo(&rl) != nil {
						continue
					}
					filters++
					if i > router {
						problems = append(problems, "the rate-limit filter is after the router: it would never run")
					}
					cluster, p := checkRateLimitFilter("rate-limit filter", &rl, cfg)
					problems = append(problems, p...)
					switch {
					case !clusters[cluster]:
						problems = append(problems, "rate-limit filter: unknown cluster "+strconv.Quote(cluster))
					case !http2[cluster]:
						problems = append(problems, "cluster "+cluster+": no explicit HTTP/2 (gRPC needs it)")
					}
				}
			}
		}
	}
	return problems, filters
}

func loadRateLimitService(t *testing.T, bootstrap, serveConfig []byte) ([]string, int) {
	t.Helper()
	cfg, err := parseServeConfig("ratelimit-service-config.yaml", serveConfig)
	if err != nil {
		t.Fatalf("ratelimit-service-config.yaml: %v", err)
	}
	b, err := loadBootstrap(bootstrap)
	if err != nil {
		t.Fatalf("ratelimit-service.yaml: %v", err)
	}
	return checkRateLimitBootstrap(b, cfg)
}

func readFiles(t *testing.T, names ...string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

func TestRateLimitServiceEnvoy(t *testing.T) {
	f := readFiles(t, "ratelimit-service.yaml", "ratelimit-service-config.yaml")
	problems, n := loadRateLimitService(t, f[0], f[1])
	for _, p := range problems {
		t.Error(p)
	}
	if n != 1 {
		t.Errorf("%d rate-limit filters, want 1", n)
	}
	// The limits the comments describe.
	cfg, _ := parseServeConfig("c", f[1])
	if l := cfg.limitFor([]entry{{"route", "api"}, {"api_key", "k"}}); l["algorithm"] != "token_bucket" || l["burst"] != 20.0 || l["requests_per_unit"] != 100.0 {
		t.Errorf("api_key limit %v", l)
	}
	if l := cfg.limitFor([]entry{{"remote_address", "192.0.2.9"}}); l["algorithm"] != "sliding_window" || l["requests_per_unit"] != 600.0 {
		t.Errorf("remote_address limit %v", l)
	}
	if l := cfg.limitFor([]entry{{"route", "web"}, {"api_key", "k"}}); l != nil {
		t.Errorf("route=web matched %v", l)
	}
}

func TestRateLimitServiceEnvoyMistakesFail(t *testing.T) {
	f := readFiles(t, "ratelimit-service.yaml", "ratelimit-service-config.yaml")
	bootstrap, serveConfig := string(f[0]), string(f[1])
	// Schemas: Envoy's (go-control-plane) and sluice serve's parser.
	for _, c := range []struct{ name, old, new string }{
		{"typo in the rate-limit filter", "failure_mode_deny: false", "failure_mode_denied: false"},
		{"bad transport version", "transport_api_version: V3", "transport_api_version: V4"},
		{"typo in an action", "descriptor_key: api_key", "descriptor: api_key"},
		{"typo in the HTTP/2 options", "http2_protocol_options: {}", "http2_options: {}"},
		{"validation inside the filter", "cluster_name: sluice_rls", `cluster_name: ""`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(bootstrap, c.old) {
				t.Fatalf("ratelimit-service.yaml does not contain %q", c.old)
			}
			if _, err := loadBootstrap([]byte(strings.Replace(bootstrap, c.old, c.new, 1))); err == nil {
				t.Error("mistake accepted")
			}
		})
	}
	for _, c := range []struct{ name, old, new string }{
		{"unknown algorithm", "algorithm: token_bucket", "algorithm: token-bucket"},
		{"burst on a window", "algorithm: sliding_window", "algorithm: sliding_window\n      burst: 5"},
		{"typo in rate_limit", "requests_per_unit: 600", "request_per_unit: 600"},
		{"bad unit", "unit: minute\n      requests_per_unit: 600", "unit: minutes\n      requests_per_unit: 600"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(serveConfig, c.old) {
				t.Fatalf("ratelimit-service-config.yaml does not contain %q", c.old)
			}
			if _, err := parseServeConfig("c", []byte(strings.Replace(serveConfig, c.old, c.new, 1))); err == nil {
				t.Error("mistake accepted")
			} else {
				t.Logf("rejected: %.200s", err)
			}
		})
	}
	// What no schema catches.
	for _, c := range []struct{ name, file, old, new, want string }{
		{"descriptor key renamed in Envoy", "b", "descriptor_key: api_key", "descriptor_key: apikey", "no limit"},
		{"descriptor key renamed in the service", "c", "- key: api_key", "- key: apikey", "no limit"},
		{"generic_key value changed", "b", "descriptor_value: api}", "descriptor_value: apis}", "no limit"},
		{"other domain", "b", "domain: edge", "domain: mesh", "domain"},
		{"filter to a missing cluster", "b", "cluster_name: sluice_rls", "cluster_name: sluice-rls", "unknown cluster"},
		{"cluster without HTTP/2", "b", "explicit_http_config:\n          http2_protocol_options: {}", "explicit_http_config:\n          http_protocol_options: {}", "HTTP/2"},
		{"default timeout", "b", "timeout: 0.1s\n", "\n", "timeout"},
		{"gRPC clients limited with UNAVAILABLE", "b", "rate_limited_as_resource_exhausted: true", "rate_limited_as_resource_exhausted: false", "rate_limited_as_resource_exhausted"},
		{"remote_address from X-Forwarded-For", "b", "use_remote_address: true", "use_remote_address: false", "use_remote_address"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, s := bootstrap, serveConfig
			target := &b
			if c.file == "c" {
				target = &s
			}
			if !strings.Contains(*target, c.old) {
				t.Fatalf("file does not contain %q", c.old)
			}
			*target = strings.Replace(*target, c.old, c.new, 1)
			problems, _ := loadRateLimitService(t, []byte(b), []byte(s))
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("not caught (want a problem mentioning %q): %q", c.want, problems)
			}
		})
	}
}

// A strict model of the Kubernetes fields istio-ratelimit-service.yaml uses
// (k8s.io/api is not a dependency of this module): any other field is
// rejected, so a typo fails here as it would fail kubectl apply's validation.
type (
	k8sMeta struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	k8sPort struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	}
	k8sProbe struct {
		HTTPGet *struct {
			Path string `json:"path"`
			Port int    `json:"port"`
		} `json:"httpGet,omitempty"`
		Exec *struct {
			Command []string `json:"command"`
		} `json:"exec,omitempty"`
	}
	k8sContainer struct {
		Name            string    `json:"name"`
		Image           string    `json:"image"`
		ImagePullPolicy string    `json:"imagePullPolicy,omitempty"`
		Command         []string  `json:"command,omitempty"`
		Args            []string  `json:"args,omitempty"`
		Ports           []k8sPort `json:"ports,omitempty"`
		ReadinessProbe  *k8sProbe `json:"readinessProbe,omitempty"`
		Resources       *struct {
			Requests map[string]string `json:"requests,omitempty"`
			Limits   map[string]string `json:"limits,omitempty"`
		} `json:"resources,omitempty"`
		VolumeMounts []struct {
			Name      string `json:"name"`
			MountPath string `json:"mountPath"`
			ReadOnly  bool   `json:"readOnly,omitempty"`
		} `json:"volumeMounts,omitempty"`
	}
	k8sVolume struct {
		Name      string `json:"name"`
		ConfigMap *struct {
			Name string `json:"name"`
		} `json:"configMap,omitempty"`
		EmptyDir *struct{} `json:"emptyDir,omitempty"`
	}
	k8sPodTemplate struct {
		Metadata k8sMeta `json:"metadata"`
		Spec     struct {
			RestartPolicy string         `json:"restartPolicy,omitempty"`
			Containers    []k8sContainer `json:"containers"`
			Volumes       []k8sVolume    `json:"volumes,omitempty"`
		} `json:"spec"`
	}
	k8sSelector struct {
		MatchLabels map[string]string `json:"matchLabels"`
	}
	k8sObject struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   k8sMeta           `json:"metadata"`
		Data       map[string]string `json:"data,omitempty"`
		Spec       json.RawMessage   `json:"spec,omitempty"`
	}
	k8sDeployment struct {
		Replicas int            `json:"replicas"`
		Selector k8sSelector    `json:"selector"`
		Template k8sPodTemplate `json:"template"`
	}
	k8sStatefulSet struct {
		ServiceName string         `json:"serviceName"`
		Replicas    int            `json:"replicas"`
		Selector    k8sSelector    `json:"selector"`
		Template    k8sPodTemplate `json:"template"`
	}
	k8sJob struct {
		BackoffLimit int            `json:"backoffLimit"`
		Template     k8sPodTemplate `json:"template"`
	}
	k8sService struct {
		ClusterIP string            `json:"clusterIP,omitempty"`
		Selector  map[string]string `json:"selector"`
		Ports     []struct {
			Name        string `json:"name"`
			Port        int    `json:"port"`
			TargetPort  int    `json:"targetPort"`
			AppProtocol string `json:"appProtocol,omitempty"`
		} `json:"ports"`
	}
)

// istioRLS is istio-ratelimit-service.yaml, parsed.
type istioRLS struct {
	namespaces  []string
	configMaps  map[string]k8sObject
	deployments map[string]k8sDeployment
	statefuls   map[string]k8sStatefulSet
	services    map[string]k8sService
	jobs        int
	filter      *networkingv1alpha3.EnvoyFilter
	policies    []*securityv1beta1.AuthorizationPolicy
	namespace   map[string]string // object name → namespace
}

// strictJSON unmarshals js into v rejecting unknown fields. encoding/json
// matches field names without regard to case, Kubernetes does not: the keys
// are also compared exactly with v's json tags (exactKeys).
func strictJSON(js []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(js))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	var generic any
	if err := json.Unmarshal(js, &generic); err != nil {
		return err
	}
	return exactKeys("", generic, reflect.TypeOf(v))
}

// exactKeys checks that every object key in v is spelled exactly as a json
// tag of the struct type t describes it (recursively); json.RawMessage is
// checked later against its own type.
func exactKeys(path string, v any, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeOf(json.RawMessage(nil)) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil // a type error, reported by the decoder
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			fields[name] = t.Field(i).Type
		}
		for k, x := range m {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("%s: unknown field %q", path, k)
			}
			if err := exactKeys(path+"."+k, x, ft); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if xs, ok := v.([]any); ok {
			for i, x := range xs {
				if err := exactKeys(path+"["+strconv.Itoa(i)+"]", x, t.Elem()); err != nil {
					return err
				}
			}
		}
	case reflect.Map:
		if m, ok := v.(map[string]any); ok {
			for k, x := range m {
				if err := exactKeys(path+"."+k, x, t.Elem()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func parseIstioRLS(data []byte) (*istioRLS, error) {
	r := &istioRLS{configMaps: map[string]k8sObject{}, deployments: map[string]k8sDeployment{}, statefuls: map[string]k8sStatefulSet{},
		services: map[string]k8sService{}, namespace: map[string]string{}}
	for i, doc := range bytes.Split(data, []byte("\n---\n")) {
		var o k8sObject
		js, err := yaml.YAMLToJSON(doc)
		if err == nil {
			err = strictJSON(js, &o)
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if o.Metadata.Name == "" {
			return nil, fmt.Errorf("document %d (%s): no metadata.name", i, o.Kind)
		}
		r.namespace[o.Kind+"/"+o.Metadata.Name] = o.Metadata.Namespace
		switch o.APIVersion + " " + o.Kind {
		case "v1 Namespace":
			r.namespaces = append(r.namespaces, o.Metadata.Name)
		case "v1 ConfigMap":
			r.configMaps[o.Metadata.Name] = o
		case "apps/v1 Deployment":
			var d k8sDeployment
			err = strictJSON(o.Spec, &d)
			r.deployments[o.Metadata.Name] = d
		case "apps/v1 StatefulSet":
			var s k8sStatefulSet
			err = strictJSON(o.Spec, &s)
			r.statefuls[o.Metadata.Name] = s
		case "v1 Service":
			var s k8sService
			err = strictJSON(o.Spec, &s)
			r.services[o.Metadata.Name] = s
		case "batch/v1 Job":
			var j k8sJob
			err = strictJSON(o.Spec, &j)
			r.jobs++
		case "networking.istio.io/v1alpha3 EnvoyFilter":
			var ef networkingv1alpha3.EnvoyFilter
			err = loadIstio(doc, "networking.istio.io/v1alpha3", "EnvoyFilter", &ef)
			r.filter = &ef
		case "security.istio.io/v1 AuthorizationPolicy":
			var ap securityv1beta1.AuthorizationPolicy // security/v1's types are aliases of v1beta1's
			err = loadIstio(doc, "security.istio.io/v1", "AuthorizationPolicy", &ap)
			r.policies = append(r.policies, &ap)
		default:
			err = fmt.Errorf("unexpected %s %s", o.APIVersion, o.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("document %d (%s %s): %w", i, o.Kind, o.Metadata.Name, err)
		}
	}
	if r.filter == nil {
		return nil, fmt.Errorf("no EnvoyFilter")
	}
	return r, nil
}

// structTo converts an EnvoyFilter patch value to msg, rejecting unknown fields.
func structTo(v *structpb.Struct, msg proto.Message) error {
	js, err := protojson.Marshal(v)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(js, msg)
}

// flagValue returns the value of --name=VALUE in args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// outboundCluster is the Envoy cluster name Istio builds for a Service port
// (pilot's BuildSubsetKey: outbound|PORT|SUBSET|HOST).
func outboundCluster(service, namespace string, port int) string {
	return "outbound|" + strconv.Itoa(port) + "||" + service + "." + namespace + ".svc.cluster.local"
}

// grpcClusters returns the outbound cluster names of the Services' ports that
// Istio treats as gRPC (appProtocol grpc, or a port name grpc / grpc-*).
func (r *istioRLS) grpcClusters() map[string]string {
	out := map[string]string{}
	for name, s := range r.services {
		for _, p := range s.Ports {
			if p.AppProtocol == "grpc" || p.Name == "grpc" || strings.HasPrefix(p.Name, "grpc-") {
				out[outboundCluster(name, r.namespace["Service/"+name], p.Port)] = name
			}
		}
	}
	return out
}

// checkIstioRLS does the checks no schema makes on istio-ratelimit-service.yaml.
func checkIstioRLS(r *istioRLS) (problems []string, cfg *rlsConfig) {
	fail := func(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }
	for key, ns := range r.namespace {
		if ns == "" && !strings.HasPrefix(key, "Namespace/") {
			fail("%s has no namespace", key)
		} else if ns != "" && ns != "istio-system" && !slices.Contains(r.namespaces, ns) {
			fail("%s is in namespace %s, which this file does not create", key, ns)
		}
	}
	d, ok := r.deployments["sluice-rls"]
	if !ok {
		fail("no Deployment sluice-rls")
		return problems, nil
	}
	if len(d.Template.Spec.Containers) != 1 {
		fail("sluice-rls: %d containers", len(d.Template.Spec.Containers))
		return problems, nil
	}
	c := d.Template.Spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		fail("sluice-rls: args %v do not run sluice serve", c.Args)
	}
	for k, v := range d.Selector.MatchLabels {
		if d.Template.Metadata.Labels[k] != v {
			fail("sluice-rls: the selector %s=%s does not select the pod template", k, v)
		}
	}
	// --config names the ConfigMap's key through the volume mount.
	cfgPath, _ := flagValue(c.Args, "config")
	for _, m := range c.VolumeMounts {
		key, ok := strings.CutPrefix(cfgPath, m.MountPath+"/")
		if !ok {
			continue
		}
		for _, v := range d.Template.Spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			cm, ok := r.configMaps[v.ConfigMap.Name]
			if !ok {
				fail("sluice-rls: volume %s: no ConfigMap %s", v.Name, v.ConfigMap.Name)
				continue
			}
			data, ok := cm.Data[key]
			if !ok {
				fail("sluice-rls: --config=%s: ConfigMap %s has no key %s", cfgPath, v.ConfigMap.Name, key)
				continue
			}
			var err error
			if cfg, err = parseServeConfig(key, []byte(data)); err != nil {
				fail("ConfigMap %s: %v", v.ConfigMap.Name, err)
			}
		}
	}
	if cfg == nil && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, "ConfigMap") }) {
		fail("sluice-rls: --config=%s is not a ConfigMap key mounted in the pod", cfgPath)
	}
	// The gRPC port: --listen, the container port and the Service's target.
	listen, _ := flagValue(c.Args, "listen")
	admin, _ := flagValue(c.Args, "admin")
	port := func(addr string) int {
		i := strings.LastIndexByte(addr, ':')
		n, _ := strconv.Atoi(addr[i+1:])
		return n
	}
	ports := map[int]bool{}
	for _, p := range c.Ports {
		ports[p.ContainerPort] = true
	}
	if !ports[port(listen)] || !ports[port(admin)] {
		fail("sluice-rls: --listen=%s or --admin=%s is not a container port", listen, admin)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Port != port(admin) || p.HTTPGet.Path != "/healthz" {
		fail("sluice-rls: the readiness probe is not GET /healthz on the admin port")
	}
	svc, ok := r.services["sluice-rls"]
	if !ok {
		fail("no Service sluice-rls")
	} else {
		for k, v := range svc.Selector {
			if d.Template.Metadata.Labels[k] != v {
				fail("Service sluice-rls: the selector %s=%s does not select the Deployment's pods", k, v)
			}
		}
		for _, p := range svc.Ports {
			if !ports[p.TargetPort] {
				fail("Service sluice-rls: port %s targets %d, not a container port", p.Name, p.TargetPort)
			}
		}
	}
	// --redis-cluster names the StatefulSet's pods through its headless Service.
	redisArg, _ := flagValue(c.Args, "redis-cluster")
	for _, a := range strings.Split(redisArg, ",") {
		host, p, _ := strings.Cut(a, ":")
		pod, rest, _ := strings.Cut(host, ".")
		svcName, rest, _ := strings.Cut(rest, ".")
		ns, _, _ := strings.Cut(rest, ".")
		i := strings.LastIndexByte(pod, '-')
		ss, ok := r.statefuls[pod[:max(i, 0)]]
		ord, err := strconv.Atoi(pod[i+1:])
		switch {
		case !ok || err != nil || ord >= ss.Replicas || ss.ServiceName != svcName || r.namespace["StatefulSet/"+pod[:i]] != ns:
			fail("--redis-cluster: %s is not a pod of this file's StatefulSet", host)
		case r.services[svcName].ClusterIP != "None":
			fail("--redis-cluster: Service %s is not headless (pods have no DNS names)", svcName)
		case !slices.ContainsFunc(ss.Template.Spec.Containers[0].Ports, func(cp k8sPort) bool { return strconv.Itoa(cp.ContainerPort) == p }):
			fail("--redis-cluster: %s: port %s is not Redis's container port", host, p)
		}
	}
	// Only authenticated callers may reach the gRPC port.
	grpcPort := strconv.Itoa(port(listen))
	guarded := false
	for _, ap := range r.policies {
		selects := len(ap.GetSelector().GetMatchLabels()) > 0
		for k, v := range ap.GetSelector().GetMatchLabels() {
			selects = selects && d.Template.Metadata.Labels[k] == v
		}
		if !selects {
			fail("AuthorizationPolicy: the selector %v does not select sluice-rls's pods", ap.GetSelector().GetMatchLabels())
			continue
		}
		if ap.GetAction() != securityv1beta1.AuthorizationPolicy_ALLOW {
			fail("AuthorizationPolicy: action %v, want ALLOW (only the listed callers)", ap.GetAction())
			continue
		}
		for i, rule := range ap.GetRules() {
			toGRPC := len(rule.GetTo()) == 0
			for _, to := range rule.GetTo() {
				toGRPC = toGRPC || len(to.GetOperation().GetPorts()) == 0 || slices.Contains(to.GetOperation().GetPorts(), grpcPort)
			}
			if !toGRPC {
				continue
			}
			principals := len(rule.GetFrom()) > 0
			for _, from := range rule.GetFrom() {
				principals = principals && len(from.GetSource().GetPrincipals()) > 0
			}
			if !principals {
				fail("AuthorizationPolicy: rule %d lets anyone call the gRPC port %s (every source needs principals)", i, grpcPort)
				continue
			}
			guarded = true
		}
	}
	if !guarded {
		fail("no AuthorizationPolicy admits callers of the gRPC port %s by identity: anyone who reaches it can consume any counter", grpcPort)
	}
	if cfg == nil {
		return problems, nil
	}
	// The EnvoyFilter: the filter's cluster is sluice-rls's gRPC port, and
	// the virtual host's descriptors have limits.
	clusters := r.grpcClusters()
	filters := 0
	for i, cp := range r.filter.GetConfigPatches() {
		where := "EnvoyFilter patch " + strconv.Itoa(i)
		switch cp.GetApplyTo() {
		case networkingv1alpha3.EnvoyFilter_HTTP_FILTER:
			var hf hcmv3.HttpFilter
			if err := structTo(cp.GetPatch().GetValue(), &hf); err != nil {
				fail("%s: %v", where, err)
				continue
			}
			if err := hf.ValidateAll(); err != nil {
				fail("%s: %v", where, err)
			}
			if err := envoyproc.ValidateAnys(&hf); err != nil {
				fail("%s: %v", where, err)
			}
			var rl ratelimitfilterv3.RateLimit
			if hf.GetTypedConfig().UnmarshalTo(&rl) != nil {
				continue
			}
			filters++
			if cp.GetPatch().GetOperation() != networkingv1alpha3.EnvoyFilter_Patch_INSERT_BEFORE || cp.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != "envoy.filters.http.router" {
				fail("%s: the rate-limit filter is not inserted before the router", where)
			}
			cluster, p := checkRateLimitFilter(where, &rl, cfg)
			problems = append(problems, p...)
			if clusters[cluster] != "sluice-rls" {
				fail("%s: cluster %q is not the gRPC port of Service sluice-rls (%v)", where, cluster, clusters)
			}
		case networkingv1alpha3.EnvoyFilter_VIRTUAL_HOST:
			var vh routev3.VirtualHost
			if err := structTo(cp.GetPatch().GetValue(), &vh); err != nil {
				fail("%s: %v", where, err)
				continue
			}
			problems = append(problems, checkRateLimits(where, vh.GetRateLimits(), cfg)...)
		default:
			fail("%s: unexpected applyTo %v", where, cp.GetApplyTo())
		}
	}
	if filters != 1 {
		fail("%d rate-limit filters in the EnvoyFilter, want 1", filters)
	}
	return problems, cfg
}

func TestIstioRateLimitService(t *testing.T) {
	data := readFiles(t, "istio-ratelimit-service.yaml")[0]
	r, err := parseIstioRLS(data)
	if err != nil {
		t.Fatalf("istio-ratelimit-service.yaml: %v", err)
	}
	problems, cfg := checkIstioRLS(r)
	for _, p := range problems {
		t.Error(p)
	}
	if r.jobs != 1 || len(r.statefuls) != 1 || r.statefuls["redis-cluster"].Replicas != 3 {
		t.Errorf("jobs %d, statefulsets %v", r.jobs, r.statefuls)
	}
	// The ConfigMap holds the same limits as ratelimit-service-config.yaml.
	file, _ := parseServeConfig("c", readFiles(t, "ratelimit-service-config.yaml")[0])
	if cfg == nil || file == nil || fmt.Sprint(cfg) != fmt.Sprint(file) {
		t.Errorf("the ConfigMap's configuration differs from ratelimit-service-config.yaml:\n%v\n%v", cfg, file)
	}
}

func TestIstioRateLimitServiceMistakesFail(t *testing.T) {
	data := string(readFiles(t, "istio-ratelimit-service.yaml")[0])
	for _, c := range []struct{ name, old, new, want string }{
		// Schemas.
		{"typo in a Deployment", "  replicas: 2", "  replica: 2", "replica"},
		{"typo in a container", "        readinessProbe:\n          httpGet", "        readinessprobe:\n          httpGet", "readinessprobe"},
		{"typo in the EnvoyFilter", "workloadSelector:", "workloadselector:", "workloadselector"},
		{"bad applyTo", "applyTo: VIRTUAL_HOST", "applyTo: VHOST", "VHOST"},
		{"typo inside the filter patch", "failure_mode_deny: false", "failure_mode_denied: false", "failure_mode_denied"},
		{"typo inside the virtual host patch", "header_name: x-api-key", "header: x-api-key", "header"},
		{"unknown @type", "ratelimit.v3.RateLimit\n", "ratelimit.v3.RateLimits\n", "RateLimits"},
		{"bad service configuration", "algorithm: token_bucket", "algorithm: gcra", "gcra"},
		// Names that must agree.
		{"filter to another port", "cluster_name: outbound|8081||sluice-rls", "cluster_name: outbound|8080||sluice-rls", "not the gRPC port"},
		{"Service port not gRPC", "  - name: grpc\n    port: 8081\n    targetPort: 8081\n    appProtocol: grpc", "  - name: rls\n    port: 8081\n    targetPort: 8081", "not the gRPC port"},
		{"descriptor key renamed", "descriptor_key: api_key", "descriptor_key: apikey", "no limit"},
		{"other domain", "domain: edge\n          timeout", "domain: mesh\n          timeout", "domain"},
		{"--config not mounted", "--config=/etc/sluice/config.yaml", "--config=/etc/sluice/limits.yaml", "no key limits.yaml"},
		{"--listen not a container port", "--listen=0.0.0.0:8081", "--listen=0.0.0.0:8082", "not a container port"},
		{"selector mismatch", "  selector:\n    app: sluice-rls", "  selector:\n    app: sluice", "does not select"},
		{"redis pod out of range", "redis-cluster-2.redis-cluster.sluice", "redis-cluster-3.redis-cluster.sluice", "not a pod"},
		{"redis Service not headless", "clusterIP: None", "clusterIP: 10.0.0.10", "not headless"},
		{"policy open to anyone", "  - from:\n    - source:\n        principals: [cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account]\n    to:", "  - to:", "lets anyone"},
		{"policy on other pods", "      app: sluice-rls\n  action: ALLOW", "      app: sluice\n  action: ALLOW", "does not select"},
		{"policy on the admin port only", `ports: ["8081"]`, `ports: ["9091"]`, "no AuthorizationPolicy admits"},
		{"typo in the policy", "  action: ALLOW", "  actions: ALLOW", "actions"},
		{"probe on the gRPC port", "            path: /healthz\n            port: 9090", "            path: /healthz\n            port: 8081", "readiness probe"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(data, c.old) {
				t.Fatalf("istio-ratelimit-service.yaml does not contain %q", c.old)
			}
			r, err := parseIstioRLS([]byte(strings.Replace(data, c.old, c.new, 1)))
			var problems []string
			if err != nil {
				problems = []string{err.Error()}
			} else {
				problems, _ = checkIstioRLS(r)
			}
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("not caught (want a problem mentioning %q): %q", c.want, problems)
			}
		})
	}
}

// checkWasmPluginRLS checks istio-wasmplugin-rls.yaml against sluice's
// configuration and the service of istio-ratelimit-service.yaml: the
// cluster is its gRPC port, the domain one it accepts inline descriptors for.
func checkWasmPluginRLS(plugin []byte, svc *istioRLS) (*config.Config, []string, error) {
	wp, err := loadWasmPlugin(plugin)
	if err != nil {
		return nil, nil, err
	}
	js, err := pluginConfigJSON(wp)
	if err != nil {
		return nil, nil, err
	}
	cfg, err := config.ParseFor(js, config.BuildLocal)
	if err != nil {
		return nil, nil, err
	}
	var problems []string
	if cfg.RLS == nil {
		return cfg, []string{"no rls object"}, nil
	}
	if svc.grpcClusters()[cfg.RLS.Cluster] != "sluice-rls" {
		problems = append(problems, "rls.cluster "+strconv.Quote(cfg.RLS.Cluster)+" is not the gRPC port of Service sluice-rls")
	}
	c := svc.deployments["sluice-rls"].Template.Spec.Containers[0]
	domains, _ := flagValue(c.Args, "inline-domains")
	if !slices.Contains(strings.Split(domains, ","), cfg.RLS.Domain) && domains != "*" {
		problems = append(problems, "rls.domain "+strconv.Quote(cfg.RLS.Domain)+" is not in sluice serve's --inline-domains="+domains+": every call would be PERMISSION_DENIED")
	}
	for _, r := range cfg.Rules {
		if r.Backend != config.BackendRLS {
			problems = append(problems, "rule "+r.Name+" is not backend rls")
		}
	}
	return cfg, problems, nil
}

func TestIstioWasmPluginRLS(t *testing.T) {
	f := readFiles(t, "istio-wasmplugin-rls.yaml", "istio-ratelimit-service.yaml")
	svc, err := parseIstioRLS(f[1])
	if err != nil {
		t.Fatal(err)
	}
	cfg, problems, err := checkWasmPluginRLS(f[0], svc)
	if err != nil {
		t.Fatalf("istio-wasmplugin-rls.yaml: %v", err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if len(cfg.Rules) != 2 || cfg.RLS.TimeoutMS != 100 || cfg.RLS.Instances != 2 || cfg.FailureMode != config.FailLocal {
		t.Errorf("rules %d, rls %+v, failure_mode %v", len(cfg.Rules), cfg.RLS, cfg.FailureMode)
	}
	data := string(f[0])
	for _, c := range []struct{ name, old, new, want string }{
		{"typo in rls", "timeout_ms: 100", "timeout: 100", "timeout"},
		{"rls without a domain", "      domain: mesh\n", "", "domain"},
		{"cluster by Service name", "cluster: outbound|8081||sluice-rls.sluice.svc.cluster.local", "cluster: sluice-rls", "not the gRPC port"},
		{"domain not enabled in the service", "domain: mesh", "domain: edge", "--inline-domains"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(data, c.old) {
				t.Fatalf("istio-wasmplugin-rls.yaml does not contain %q", c.old)
			}
			_, problems, err := checkWasmPluginRLS([]byte(strings.Replace(data, c.old, c.new, 1)), svc)
			if err != nil {
				problems = append(problems, err.Error())
			}
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.want) }) {
				t.Errorf("not caught (want a problem mentioning %q): %q", c.want, problems)
			}
		})
	}
}
