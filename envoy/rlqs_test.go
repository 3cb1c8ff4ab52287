package envoy

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3" // HttpRequestHeaderMatchInput
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/serve/rls"
)

// checkRLQSFilter checks what no schema does for one rate_limit_quota filter:
// its domain is configured, every bucket its matchers build (the entries,
// sorted by key, with any value for a request-derived one) matches a
// fixed_window limit in cfg (the only algorithm RLQS serves: another is
// answered ALLOW_ALL), and its no_assignment_behavior is a blanket rule
// (Envoy keeps no token bucket behind a token-bucket one).
func checkRLQSFilter(where string, f *rlqsv3.RateLimitQuotaFilterConfig, cfg *rls.Config) (problems []string) {
	fail := func(format string, args ...any) { problems = append(problems, where+": "+fmt.Sprintf(format, args...)) }
	known := false
	for _, d := range cfg.Domains() {
		known = known || d == f.GetDomain()
	}
	if !known {
		fail("domain %q is not in the service's configuration (%v)", f.GetDomain(), cfg.Domains())
	}
	ms := f.GetBucketMatchers().GetMatcherList().GetMatchers()
	if len(ms) == 0 {
		fail("no bucket matchers")
	}
	for i, m := range ms {
		var s rlqsv3.RateLimitQuotaBucketSettings
		if err := m.GetOnMatch().GetAction().GetTypedConfig().UnmarshalTo(&s); err != nil {
			fail("matcher %d: %v", i, err)
			continue
		}
		var es []rls.Entry
		for k, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			val := v.GetStringValue()
			if v.GetCustomValue() != nil {
				val = "v"
			}
			es = append(es, rls.Entry{Key: k, Value: val})
		}
		sort.Slice(es, func(a, b int) bool { return es[a].Key < es[b].Key })
		mt := cfg.Match(f.GetDomain(), es)
		switch {
		case mt == nil:
			fail("matcher %d: the bucket %v matches no limit: every request would be allowed", i, es)
		case mt.Limit.Unlimited || mt.Limit.Kind != algorithms.FixedWindow:
			fail("matcher %d: the bucket %v matches %s, which RLQS does not enforce (fixed_window only)", i, es, mt.FullKey)
		}
		if s.GetReportingInterval() == nil {
			fail("matcher %d: no reporting_interval", i)
		}
		if nb := s.GetNoAssignmentBehavior(); nb != nil && nb.GetFallbackRateLimit().GetTokenBucket() != nil {
			fail("matcher %d: a token-bucket no_assignment_behavior", i)
		}
	}
	return problems
}

// checkRLQSBootstrap finds the rate_limit_quota filters of a bootstrap and
// checks them and their cluster (present, HTTP/2).
func checkRLQSBootstrap(b *bootstrapv3.Bootstrap, cfg *rls.Config) (problems []string, filters int) {
	p, _ := checkEnvoy(b)
	problems = append(problems, p...)
	clusters := map[string]bool{}
	for _, c := range b.GetStaticResources().GetClusters() {
		var po httpv3.HttpProtocolOptions
		a := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		clusters[c.GetName()] = a != nil && a.UnmarshalTo(&po) == nil && po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
	}
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, nf := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if nf.GetTypedConfig().UnmarshalTo(&hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					var f rlqsv3.RateLimitQuotaFilterConfig
					if hf.GetTypedConfig().UnmarshalTo(&f) != nil {
						continue
					}
					filters++
					where := "listener " + l.GetName()
					problems = append(problems, checkRLQSFilter(where, &f, cfg)...)
					c := f.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
					if h2, ok := clusters[c]; !ok {
						problems = append(problems, where+": rlqs_server cluster "+strconv.Quote(c)+" does not exist")
					} else if !h2 {
						problems = append(problems, where+": rlqs_server cluster "+c+" does not speak HTTP/2 (gRPC)")
					}
				}
			}
		}
	}
	return problems, filters
}

func loadRLQS(bootstrap, config []byte) ([]string, int) {
	cfg, err := rls.ParseConfig([]string{"rlqs-config.yaml"}, [][]byte{config})
	if err != nil {
		return []string{"rlqs-config.yaml: " + err.Error()}, 0
	}
	b, err := loadBootstrap(bootstrap)
	if err != nil {
		return []string{"rlqs.yaml: " + err.Error()}, 0
	}
	return checkRLQSBootstrap(b, cfg)
}

func TestRLQSEnvoy(t *testing.T) {
	f := readFiles(t, "rlqs.yaml", "rlqs-config.yaml")
	problems, n := loadRLQS(f[0], f[1])
	for _, p := range problems {
		t.Error(p)
	}
	if n != 1 {
		t.Errorf("%d rate_limit_quota filters, want 1", n)
	}
}

func TestRLQSEnvoyMistakesFail(t *testing.T) {
	f := readFiles(t, "rlqs.yaml", "rlqs-config.yaml")
	bootstrap, config := string(f[0]), string(f[1])
	for _, c := range []struct{ name, old, new string }{
		{"typo in the filter", "bucket_matchers:", "bucket_matcher:"},
		{"typo in the bucket settings", "reporting_interval: 5s", "report_interval: 5s"},
		{"unknown @type", "rate_limit_quota.v3.RateLimitQuotaFilterConfig", "rate_limit_quota.v3.RateLimitQuotaConfig"},
		{"regex without an engine", "{google_re2: {}, regex:", "{regex:"},
		{"another domain", "domain: quota", "domain: quotas"},
		{"bucket without a limit", "api_key:\n                                custom_value:", "user:\n                                custom_value:"},
		{"unknown cluster", "cluster_name: sluice_rlqs}", "cluster_name: sluice}"},
		{"token-bucket no_assignment_behavior", "{blanket_rule: DENY_ALL}", "{token_bucket: {max_tokens: 1, fill_interval: 1s}}"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(bootstrap, c.old) {
				t.Fatalf("rlqs.yaml has no %q", c.old)
			}
			if p, _ := loadRLQS([]byte(strings.Replace(bootstrap, c.old, c.new, 1)), []byte(config)); len(p) == 0 {
				t.Errorf("accepted")
			}
		})
	}
	for _, c := range []struct{ name, old, new string }{
		{"another algorithm", "requests_per_unit: 600", "requests_per_unit: 600\n      algorithm: token_bucket"},
		{"bad unit", "unit: minute", "unit: fortnight"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if p, _ := loadRLQS([]byte(bootstrap), []byte(strings.Replace(config, c.old, c.new, 1))); len(p) == 0 {
				t.Errorf("accepted")
			}
		})
	}
}

// checkIstioRLQS checks istio-rlqs.yaml: the EnvoyFilter's patch against
// Envoy's schemas and the ConfigMap's configuration, its cluster the
// Service's gRPC port, the Deployment reading the ConfigMap.
func checkIstioRLQS(data []byte) []string {
	r, err := parseIstioRLS(data)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	fail := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	cm, ok := r.configMaps["sluice-rlqs-config"]
	if !ok {
		return []string{"no ConfigMap sluice-rlqs-config"}
	}
	cfg, err := rls.ParseConfig([]string{"config.yaml"}, [][]byte{[]byte(cm.Data["config.yaml"])})
	if err != nil {
		return []string{"the ConfigMap's configuration: " + err.Error()}
	}
	d, ok := r.deployments["sluice-rlqs"]
	if !ok || len(d.Template.Spec.Containers) != 1 {
		fail("no Deployment sluice-rlqs with one container")
	} else {
		args := d.Template.Spec.Containers[0].Args
		if p, _ := flagValue(args, "config"); p != "/etc/sluice/config.yaml" {
			fail("the Deployment's --config is %q", p)
		}
		if len(d.Template.Spec.Volumes) != 1 || d.Template.Spec.Volumes[0].ConfigMap == nil || d.Template.Spec.Volumes[0].ConfigMap.Name != "sluice-rlqs-config" {
			fail("the Deployment does not mount the ConfigMap")
		}
		if len(args) == 0 || args[0] != "serve" {
			fail("the Deployment does not run serve: %v", args)
		}
	}
	clusters := r.grpcClusters()
	filters := 0
	for i, cp := range r.filter.GetConfigPatches() {
		where := "EnvoyFilter patch " + strconv.Itoa(i)
		if cp.GetApplyTo() != networkingv1alpha3.EnvoyFilter_HTTP_FILTER {
			fail("%s: applies to %v", where, cp.GetApplyTo())
			continue
		}
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
		var f rlqsv3.RateLimitQuotaFilterConfig
		if err := hf.GetTypedConfig().UnmarshalTo(&f); err != nil {
			fail("%s: %v", where, err)
			continue
		}
		filters++
		problems = append(problems, checkRLQSFilter(where, &f, cfg)...)
		if c := f.GetRlqsServer().GetEnvoyGrpc().GetClusterName(); clusters[c] != "sluice-rlqs" {
			fail("%s: rlqs_server cluster %q is not the gRPC port of the Service sluice-rlqs (%v)", where, c, clusters)
		}
	}
	if filters != 1 {
		fail("%d rate_limit_quota filters in the EnvoyFilter, want 1", filters)
	}
	return problems
}

func TestIstioRLQS(t *testing.T) {
	for _, p := range checkIstioRLQS(readFiles(t, "istio-rlqs.yaml")[0]) {
		t.Error(p)
	}
}

func TestIstioRLQSMistakesFail(t *testing.T) {
	data := string(readFiles(t, "istio-rlqs.yaml")[0])
	for _, c := range []struct{ name, old, new string }{
		{"typo in the EnvoyFilter", "workloadSelector:", "workloadselector:"},
		{"typo inside the filter patch", "bucket_id_builder:\n                        bucket_id_builder:", "bucket_id_builder:\n                        bucket_id_builders:"},
		{"wrong cluster", "cluster_name: outbound|8081||", "cluster_name: outbound|8082||"},
		{"other domain", "domain: gateway-quota\n          bucket", "domain: quota\n          bucket"},
		{"another algorithm", "requests_per_unit: 600", "requests_per_unit: 600\n          algorithm: sliding_log"},
		{"typo in the Deployment", "  replicas: 2", "  replica: 2"},
		{"another ConfigMap mounted", "          name: sluice-rlqs-config", "          name: sluice-rls-config"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(data, c.old) {
				t.Fatalf("istio-rlqs.yaml has no %q", c.old)
			}
			if p := checkIstioRLQS([]byte(strings.Replace(data, c.old, c.new, 1))); len(p) == 0 {
				t.Errorf("accepted")
			}
		})
	}
}
