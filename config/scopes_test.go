package config

import (
	"errors"
	"strings"
	"testing"
)

// entry builds one "_rules_" entry: the match keys (raw JSON pairs) and a
// configuration with one rule named name.
func entry(name string, kv ...string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(`"` + kv[i] + `":` + kv[i+1] + `,`)
	}
	b.WriteString(`"rules":[` + rule("name", `"`+name+`"`) + `]}`)
	return b.String()
}

// scopedDoc is a configuration with a global rule "g" (unless noGlobal) and
// the given "_rules_" entries.
func scopedDoc(noGlobal bool, entries ...string) string {
	list := `"_rules_":[` + strings.Join(entries, ",") + `]`
	if noGlobal {
		return "{" + list + "}"
	}
	return doc(list, rule("name", `"g"`))
}

// req is a ScopeRequest with fixed values; it counts the lookups.
type req struct {
	route, host, cluster       string
	noRoute, noHost, noCluster bool
	calls                      map[string]int
}

func (r *req) count(k string) {
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	r.calls[k]++
}
func (r *req) RouteName() (string, bool)   { r.count("route"); return r.route, !r.noRoute }
func (r *req) Authority() (string, bool)   { r.count("host"); return r.host, !r.noHost }
func (r *req) ClusterName() (string, bool) { r.count("cluster"); return r.cluster, !r.noCluster }

func mustParse(t *testing.T, js string) *Config {
	t.Helper()
	c, err := Parse([]byte(js))
	if err != nil {
		t.Fatalf("Parse(%s): %v", js, err)
	}
	return c
}

// Higress's own example (plugins/wasm-go/README_EN.md): two ingress-level
// entries, then a domain-level one; the global configuration for the rest.
func TestScopesHigressSelection(t *testing.T) {
	c := mustParse(t, scopedDoc(false,
		entry("foo", "_match_route_", `["default/foo"]`),
		entry("bar", "_match_route_", `["default/bar"]`),
		entry("dom", "_match_domain_", `["*.example.com","exact.test"]`),
		entry("svc", "_match_service_", `["backend.default.svc.cluster.local:8080","other.default.svc.cluster.local"]`),
		entry("both", "_match_route_", `["default/both"]`, "_match_service_", `["api.default.svc.cluster.local"]`),
		entry("pre", "_match_route_prefix_", `["ai-route-"]`),
	))
	if !c.HasGlobal() || len(c.Scopes) != 6 || c.Rules[0].Name != "g" {
		t.Fatalf("parsed %+v", c)
	}
	kinds := []ScopeKind{ScopeRoute, ScopeRoute, ScopeDomain, ScopeService, ScopeRouteService, ScopeRoutePrefix}
	for i, s := range c.Scopes {
		if s.Kind != kinds[i] || s.Index != i || s.Name != "rules_"+string(rune('0'+i)) || s.Config == nil || len(s.Config.Rules) != 1 {
			t.Errorf("scope %d: %+v", i, s)
		}
	}
	name := func(s *Scope) string {
		if s == nil {
			return "global"
		}
		return s.Config.Rules[0].Name
	}
	cases := []struct {
		r    req
		want string
	}{
		{req{route: "default/foo", host: "a.example.com"}, "foo"}, // route before domain: the order of _rules_
		{req{route: "default/bar"}, "bar"},
		{req{route: "default/baz", host: "a.example.com"}, "dom"},
		{req{route: "default/baz", host: "a.b.example.com:8443"}, "dom"}, // port removed
		{req{route: "default/baz", host: "A.EXAMPLE.COM"}, "dom"},        // case-insensitive
		{req{host: "example.com"}, "global"},                             // "*.example.com" needs a label before
		{req{host: "badexample.com"}, "global"},
		{req{host: "exact.test"}, "dom"},
		{req{host: "exact.test:80"}, "dom"},
		{req{host: "exact.testx"}, "global"},
		{req{noHost: true}, "global"},
		{req{cluster: "outbound|8080||backend.default.svc.cluster.local"}, "svc"},
		{req{cluster: "outbound|9090||backend.default.svc.cluster.local"}, "global"}, // port given: must match
		{req{cluster: "outbound|1||other.default.svc.cluster.local"}, "svc"},         // no port: any
		{req{cluster: "outbound|8080|v1|backend.default.svc.cluster.local"}, "svc"},  // subsets do not matter
		{req{cluster: "backend.default.svc.cluster.local"}, "global"},                // not Istio's form
		{req{cluster: "outbound|8080||backend.default.svc.cluster.local|x"}, "global"},
		{req{route: "default/both", cluster: "outbound|80||api.default.svc.cluster.local"}, "both"},
		{req{route: "default/both", cluster: "outbound|80||web.default.svc.cluster.local"}, "global"},
		{req{route: "default/both", noCluster: true}, "global"},
		{req{route: "ai-route-openai"}, "pre"},
		{req{route: "ai-route"}, "global"},
		{req{noRoute: true, noHost: true, noCluster: true}, "global"},
	}
	for _, tc := range cases {
		r := tc.r
		if got := name(c.Select(&r)); got != tc.want {
			t.Errorf("Select(%+v) = %s, want %s", tc.r, got, tc.want)
		}
		for k, n := range r.calls {
			if n > 1 {
				t.Errorf("Select(%+v) looked up %s %d times", tc.r, k, n)
			}
		}
	}
	// Lookups are lazy: a request of the first scope reads only its route.
	r := req{route: "default/foo"}
	c.Select(&r)
	if r.calls["host"] != 0 || r.calls["cluster"] != 0 {
		t.Errorf("lookups %v", r.calls)
	}
}

func TestScopesOnlyNoGlobal(t *testing.T) {
	c := mustParse(t, scopedDoc(true, entry("checkout", "_match_route_", `["checkout"]`, "scope", `"co"`)))
	if c.HasGlobal() || len(c.Rules) != 0 || len(c.Scopes) != 1 || c.Scopes[0].Name != "co" {
		t.Fatalf("parsed %+v", c)
	}
	if s := c.Select(&req{route: "checkout"}); s == nil || s.Config.Rules[0].Name != "checkout" {
		t.Errorf("checkout: %v", s)
	}
	if s := c.Select(&req{route: "cart"}); s != nil {
		t.Errorf("cart: %v", s)
	}
	// The top level has its defaults; nothing of it applies.
	if c.Response.Status != DefaultStatus {
		t.Errorf("response %+v", c.Response)
	}
}

// An entry is a whole configuration: its response, failure_mode, client_ip
// are its own, nothing is inherited from the top level; "rules": [] exempts.
func TestScopeOwnConfiguration(t *testing.T) {
	c := mustParse(t, doc(`"response":{"status":503,"headers":"none"},"failure_mode":"closed","_rules_":[
	  {"_match_route_":["r"],"rules":[`+rule("name", `"x"`)+`],"response":{"status":418},"client_ip":{"xff_trusted_hops":2}},
	  {"_match_route_":["health"],"rules":[]}]`, rule("name", `"g"`)))
	s := c.Scopes[0].Config
	if s.Response.Status != 418 || s.Response.Headers != HeadersBoth || s.FailureMode != FailOpen || s.ClientIP.XFFTrustedHops != 2 {
		t.Errorf("scope config %+v", s)
	}
	if c.Response.Status != 503 || c.FailureMode != FailClosed {
		t.Errorf("global %+v", c)
	}
	if e := c.Scopes[1]; len(e.Config.Rules) != 0 || !strings.HasSuffix(e.Summary(), "(no rules: exempt)") {
		t.Errorf("exempt scope %+v %s", e.Config, e.Summary())
	}
}

func TestScopeErrors(t *testing.T) {
	r := rule("name", `"x"`)
	cases := []struct{ name, json, want string }{
		{"rules_ not a list", `{"_rules_":{}}`, `_rules_: {} is not a list`},
		{"rules_ empty", `{"_rules_":[]}`, `_rules_: must contain at least one entry (omit it when nothing is scoped)`},
		{"entry not an object", `{"_rules_":[1]}`, `_rules_[0]: 1 is not an object`},
		{"no match key", `{"_rules_":[{"rules":[` + r + `]}]}`,
			`_rules_[0]: needs one of "_match_route_", "_match_domain_", "_match_service_", "_match_route_prefix_"`},
		{"entry without rules", `{"_rules_":[{"_match_route_":["a"]}]}`, `_rules_[0].rules: is required`},
		{"entry error path", `{"_rules_":[{"_match_route_":["a"],"rules":[` + rule("name", `"x"`, "window", `"10x"`) + `]}]}`,
			`_rules_[0].rules[0].window: "10x" is not a duration`},
		{"entry unknown field", `{"_rules_":[{"_match_route_":["a"],"rules":[` + r + `],"_match_routes_":["b"]}]}`,
			`_rules_[0]._match_routes_: unknown field (did you mean "_match_route_"?)`},
		{"nested rules_", `{"_rules_":[{"_match_route_":["a"],"rules":[` + r + `],"_rules_":[]}]}`,
			`_rules_[0]._rules_: unknown field (did you mean "rules"?)`},
		{"match key at top level", doc(`"_match_route_":["a"]`, r), `_match_route_: unknown field`},
		{"global needs rules", `{"response":{"status":429},"_rules_":[{"_match_route_":["a"],"rules":[` + r + `]}]}`, `rules: is required`},
		{"global rules empty", `{"rules":[],"_rules_":[{"_match_route_":["a"],"rules":[` + r + `]}]}`, `rules: must contain at least one rule`},
		{"repeated rules_", `{"_rules_":[{"_match_route_":["a"],"rules":[` + r + `]}],"_rules_":[]}`, `_rules_: duplicate field`},
		{"repeated rules_ with global", `{"rules":[` + r + `],"_rules_":[{"_match_route_":["a"],"rules":[` + r + `]}],"_rules_":[]}`, `_rules_: duplicate field`},
		{"route not a list", `{"_rules_":[{"_match_route_":"a","rules":[` + r + `]}]}`, `_rules_[0]._match_route_: "a" is not a list`},
		{"route list empty", `{"_rules_":[{"_match_route_":[],"rules":[` + r + `]}]}`, `_rules_[0]._match_route_: must not be empty`},
		{"route empty", `{"_rules_":[{"_match_route_":[""],"rules":[` + r + `]}]}`, `_rules_[0]._match_route_[0]: "" is empty`},
		{"route not a string", `{"_rules_":[{"_match_route_":[1],"rules":[` + r + `]}]}`, `_rules_[0]._match_route_[0]: 1 is not a string`},
		{"route control", `{"_rules_":[{"_match_route_":["a\nb"],"rules":[` + r + `]}]}`, `_rules_[0]._match_route_[0]: "a\nb" must not contain control characters`},
		{"route duplicate", `{"_rules_":[{"_match_route_":["a","a"],"rules":[` + r + `]}]}`, `_rules_[0]._match_route_[1]: duplicate route name "a"`},
		{"route too long", `{"_rules_":[{"_match_route_":["` + strings.Repeat("a", 513) + `"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_route_[0]: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"... is longer than 512 bytes`},
		{"domain port", `{"_rules_":[{"_match_domain_":["a.example.com:8080"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_domain_[0]: "a.example.com:8080" must not have a port: the request's host is compared without its port`},
		{"domain middle star", `{"_rules_":[{"_match_domain_":["a.*.com"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_domain_[0]: "a.*.com" may have one "*", at its start or its end`},
		{"domain two stars", `{"_rules_":[{"_match_domain_":["*.a.*"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_domain_[0]: "*.a.*" may have one "*", at its start or its end`},
		{"domain bad char", `{"_rules_":[{"_match_domain_":["a b"],"rules":[` + r + `]}]}`, `_rules_[0]._match_domain_[0]: "a b" is not a host name`},
		{"domain ipv6 port", `{"_rules_":[{"_match_domain_":["[::1]:80"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_domain_[0]: "[::1]:80" must not have a port: the request's host is compared without its port`},
		{"domain duplicate", `{"_rules_":[{"_match_domain_":["a.test","a.test"],"rules":[` + r + `]}]}`, `_rules_[0]._match_domain_[1]: duplicate domain "a.test"`},
		{"service bad port", `{"_rules_":[{"_match_service_":["a.ns.svc.cluster.local:0"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_service_[0]: "a.ns.svc.cluster.local:0" has a bad port (want FQDN or FQDN:PORT, PORT 1..65535)`},
		{"service cluster name", `{"_rules_":[{"_match_service_":["outbound|80||a.ns.svc.cluster.local"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_service_[0]: "outbound|80||a.ns.svc.cluster.local" is not a service name (want FQDN or FQDN:PORT, e.g. backend.default.svc.cluster.local:8080)`},
		{"route and domain", `{"_rules_":[{"_match_route_":["a"],"_match_domain_":["a.test"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_domain_: cannot be combined with _match_route_: Higress selects such an entry by _match_route_ alone; give it an entry of its own`},
		{"domain and service", `{"_rules_":[{"_match_domain_":["a.test"],"_match_service_":["a.b"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_service_: cannot be combined with _match_domain_: Higress selects such an entry by _match_domain_ alone; give it an entry of its own`},
		{"service and prefix", `{"_rules_":[{"_match_service_":["a.b"],"_match_route_prefix_":["x"],"rules":[` + r + `]}]}`,
			`_rules_[0]._match_route_prefix_: cannot be combined with _match_service_: Higress selects such an entry by _match_service_ alone; give it an entry of its own`},
		{"same condition twice", `{"_rules_":[{"_match_route_":["a","b"],"rules":[` + r + `]},{"_match_route_":["b","a"],"rules":[` + r + `]}]}`,
			`_rules_[1]: selects the same requests as _rules_[0], which comes first and wins: this entry would never apply`},
		{"scope name bad", `{"_rules_":[{"_match_route_":["a"],"scope":"a.b","rules":[` + r + `]}]}`,
			`_rules_[0].scope: "a.b" may contain only letters, digits, '-' and '_'`},
		{"scope name duplicate", `{"_rules_":[{"_match_route_":["a"],"rules":[` + r + `]},{"_match_route_":["b"],"scope":"rules_0","rules":[` + r + `]}]}`,
			`_rules_[1].scope: duplicate scope name "rules_0" (also _rules_[0])`},
		{"metric collision", `{"rules":[` + rule("name", `"s.x"`) + `],"_rules_":[{"_match_route_":["a"],"scope":"s","rules":[` + r + `]}]}`,
			`_rules_[0].rules[0].name: scope "s" and rule "x" give the same counter names as the top-level rule "s.x"; rename one`},
		{"rls name too long in a scope", `{"_rules_":[{"_match_route_":["a"],"scope":"` + strings.Repeat("s", 40) + `","rules":[` + rule("name", `"`+strings.Repeat("r", 24)+`"`, "backend", `"rls"`) + `],"rls":{"cluster":"c","domain":"d"}}]}`,
			`_rules_[0].rules[0].name: the rate-limit service names this rule "` + strings.Repeat("s", 40) + "." + strings.Repeat("r", 24) + `", longer than 64 bytes; shorten the scope or the rule name`},
		{"match routes empty", doc("", rule("match", `{"routes":[]}`)), `rules[0].match.routes: must not be empty`},
		{"match routes bad", doc("", rule("match", `{"routes":["ok",""]}`)), `rules[0].match.routes[1]: "" is empty`},
		{"match routes duplicate", doc("", rule("match", `{"routes":["a","a"]}`)), `rules[0].match.routes[1]: duplicate route name "a"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.json))
			if err == nil || c != nil {
				t.Fatalf("Parse(%s) = %v, %v; want error %q", tc.json, c, err, tc.want)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("Parse(%.200s)\n got: %s\nwant: %s", tc.json, got, tc.want)
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Errorf("%T", err)
			}
		})
	}
}

// Errors of the global part and of the entries come out in document order.
func TestScopeErrorsInDocumentOrder(t *testing.T) {
	js := `{"_rules_":[{"_match_route_":[""],"rules":[` + rule("limit", "0") + `]}],"rules":[` + rule("window", `"x"`) + `]}`
	_, err := Parse([]byte(js))
	want := "_rules_[0]._match_route_[0]: \"\" is empty\n_rules_[0].rules[0].limit: 0 is out of range 1..1000000000\nrules[0].window: \"x\" is not a duration"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
}

func TestScopeDomainsAndSummary(t *testing.T) {
	c := mustParse(t, scopedDoc(true,
		entry("a", "_match_domain_", `["*","API.*","[::1]","10.0.0.1"]`, "scope", `"d"`),
		entry("b", "_match_route_", `["default/a,b","x"]`, "_match_service_", `["s.ns:8080"]`),
	))
	d := c.Scopes[0]
	want := []DomainMatch{{"", DomainSuffix}, {"api.", DomainPrefix}, {"[::1]", DomainExact}, {"10.0.0.1", DomainExact}}
	for i, m := range d.Domains {
		if m != want[i] {
			t.Errorf("domain %d: %+v, want %+v", i, m, want[i])
		}
	}
	for _, h := range []string{"anything", "[::1]:8080", "[::1]", "Api.Example.com", "10.0.0.1:80", ""} {
		if !d.MatchHost(h) {
			t.Errorf("MatchHost(%q) false", h)
		}
	}
	if got := d.Summary(); got != `scope d (_rules_[0]): domain *,api.*,[::1],10.0.0.1` {
		t.Errorf("summary %s", got)
	}
	if got := c.Scopes[1].Summary(); got != `scope rules_1 (_rules_[1]): route "default/a,b",x and service s.ns:8080` {
		t.Errorf("summary %s", got)
	}
}

func TestMatchRoutes(t *testing.T) {
	c := mustParse(t, doc("", rule("name", `"r"`, "match", `{"routes":["checkout","cart"],"path_prefix":"/"}`)))
	m := &c.Rules[0].Match
	if m.IsZero() || len(m.Routes) != 2 {
		t.Fatalf("%+v", m)
	}
	for _, tc := range []struct {
		name string
		ok   bool
		want bool
	}{{"checkout", true, true}, {"cart", true, true}, {"Checkout", true, false}, {"", true, false}, {"checkout", false, false}} {
		if got := m.MatchesRoute(tc.name, tc.ok); got != tc.want {
			t.Errorf("MatchesRoute(%q, %v) = %v", tc.name, tc.ok, got)
		}
	}
	if got := m.String(); got != "path_prefix:/ routes:checkout,cart" {
		t.Errorf("String %q", got)
	}
	var zero Match
	if !zero.MatchesRoute("", false) {
		t.Error("no routes must match every request")
	}
}

// Selecting allocates nothing (it runs per request in the guest).
func TestSelectAllocations(t *testing.T) {
	c := mustParse(t, scopedDoc(false,
		entry("a", "_match_route_", `["x"]`),
		entry("b", "_match_domain_", `["*.example.com"]`),
		entry("c", "_match_service_", `["s.ns:80"]`),
	))
	r := &req{route: "y", host: "q.example.org:8080", cluster: "outbound|80||s.ns", calls: map[string]int{}}
	n := testing.AllocsPerRun(100, func() {
		if s := c.Select(r); s == nil || s.Index != 2 {
			t.Fatal("wrong scope")
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per Select", n)
	}
}
