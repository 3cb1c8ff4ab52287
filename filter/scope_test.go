package filter_test

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Natively against the fake host: the route and cluster properties are read under either
// name, whichever the host has (Higress: route_name; Envoy ≥ 1.33: xds.route_name).
func TestScopePropertyNames(t *testing.T) {
	for _, names := range [][2]string{{"route_name", "cluster_name"}, {"xds\x00route_name", "xds\x00cluster_name"}} {
		n := startNative(t, filtertest.HigressScopes, t0)
		do := func(route, cluster string) filtertest.Response {
			return n.do(filtertest.Request{Source: "10.0.0.9:1", Authority: "x.test",
				Properties: map[string]string{names[0]: route, names[1]: cluster}})
		}
		if r := do("default/cart", ""); r.Header("ratelimit-policy") != `"per-ip";q=1;w=3600` {
			t.Errorf("%q: route scope not selected: %+v", names[0], r)
		}
		if r := do("x", "outbound|8080||health.default.svc.cluster.local"); r.Has("ratelimit-policy") {
			t.Errorf("%q: service scope not selected: %+v", names[1], r)
		}
		if r := do("x", "outbound|8080||other"); r.Header("ratelimit-policy") != `"global";q=3;w=3600` {
			t.Errorf("global not selected: %+v", r)
		}
	}
}

// Scopes with Redis rules (natively, the fake Redis host): each scope has its own Redis
// backend and keys (sluice:{<scope>.<rule>|…}), replies reach the scope that made the call
// whatever their order, the root context's one tick period is the shortest any scope needs,
// and the guard of each scope runs on it.
func TestRedisScopes(t *testing.T) {
	rl := func(name string) string {
		return `{"name":"` + name + `","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":100,"window":"1h","backend":"redis"}`
	}
	cfg := `{"_rules_":[
	  {"_match_route_":["ra"],"scope":"a","rules":[` + rl("r1") + `],"redis":{"cluster":"rc-a","timeout_ms":200}},
	  {"_match_route_":["rb"],"scope":"b","rules":[` + rl("r1") + `],"redis":{"cluster":"rc-b","timeout_ms":30},"failure_mode":"closed"}]}`
	r := startRedisRig(t, cfg)
	if r.f.tickMS != 30 {
		t.Errorf("tick period %d ms, want 30 (the shorter timeout)", r.f.tickMS)
	}
	on := func(route string) {
		r.f.Properties = map[string]string{"xds\x00route_name": route}
	}
	on("ra")
	a, act := r.request("alice")
	ta := r.lastToken()
	on("rb")
	b, _ := r.request("alice")
	tb := r.lastToken()
	if act != abi.ActionPause || !strings.Contains(r.f.sent[ta], "sluice:{a.r1|#") || !strings.Contains(r.f.sent[tb], "sluice:{b.r1|#") {
		t.Fatalf("queries %.80q / %.80q", r.f.sent[ta], r.f.sent[tb])
	}
	// Replies in the other order: each goes to its scope.
	r.answer(tb, 0, replyDeny)
	r.answer(ta, 0, replyAdmit)
	if lr := r.f.local[b]; lr == nil || lr.Status != 429 {
		t.Errorf("b: %+v", lr)
	}
	if !r.continuedOnce(a) || r.f.local[a] != nil {
		t.Errorf("a: continued %v local %v", r.f.continued, r.f.local[a])
	}
	r.end(a)
	r.end(b)
	if r.metric("sluice.a.r1.allowed") != 1 || r.metric("sluice.b.r1.denied") != 1 || r.metric("sluice.r1.allowed") != 0 {
		t.Errorf("metrics a.allowed %d b.denied %d", r.metric("sluice.a.r1.allowed"), r.metric("sluice.b.r1.denied"))
	}
	// A route no scope selects: nothing applies, no call.
	on("web")
	calls := len(r.f.order)
	if _, act := r.request("alice"); act != abi.ActionContinue || len(r.f.order) != calls {
		t.Errorf("unscoped request: %v, %d calls", act, len(r.f.order)-calls)
	}
	// The guard of scope b (30 ms + 10 ms) fails its wait on the tick; b is "closed": 503.
	on("rb")
	b, _ = r.request("bob")
	r.f.Now_ += 41e6
	r.f.effective = 1
	r.vm.OnTick(1)
	if lr := r.f.local[b]; lr == nil || lr.Status != 503 || r.metric(filter.MetricRedisTimeouts) != 1 {
		t.Errorf("guard: %+v, timeouts %d", lr, r.metric(filter.MetricRedisTimeouts))
	}
}
