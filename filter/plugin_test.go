package filter_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

var req = filtertest.NewRequest

// resetSeconds parses t= of a RateLimit header.
func param(t *testing.T, v, name string) int64 {
	t.Helper()
	for _, p := range strings.Split(v, ";") {
		if strings.HasPrefix(p, name+"=") {
			n, err := strconv.ParseInt(p[len(name)+1:], 10, 64)
			if err != nil {
				t.Fatalf("%s in %q: %v", name, v, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in %q", name, v)
	return 0
}

const perIPConfig = `{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],
  "algorithm":"fixed_window","limit":3,"window":"1h"}]}`

func TestLimitPerRemoteIP(t *testing.T) {
	forEachTarget(t, perIPConfig, func(t *testing.T, tg target) {
		for i := 0; i < 3; i++ {
			r := tg.do(req("10.0.0.1:1234"))
			if r.Status != 200 {
				t.Fatalf("request %d: status %d, want 200", i+1, r.Status)
			}
			rl := r.Header("ratelimit")
			if !strings.HasPrefix(rl, `"per-ip";r=`+strconv.Itoa(2-i)+";t=") {
				t.Errorf("request %d: RateLimit = %q", i+1, rl)
			}
			if reset := param(t, rl, "t"); reset < 1 || reset > 3600 {
				t.Errorf("request %d: t=%d, want 1..3600", i+1, reset)
			}
			if got := r.Header("ratelimit-policy"); got != `"per-ip";q=3;w=3600` {
				t.Errorf("RateLimit-Policy = %q", got)
			}
			if got := r.Header("x-ratelimit-limit"); got != "3" {
				t.Errorf("X-RateLimit-Limit = %q", got)
			}
			if got := r.Header("x-ratelimit-remaining"); got != strconv.Itoa(2-i) {
				t.Errorf("X-RateLimit-Remaining = %q", got)
			}
			if got := r.Header("x-ratelimit-reset"); got != strconv.FormatInt(param(t, rl, "t"), 10) {
				t.Errorf("X-RateLimit-Reset = %q, RateLimit %q", got, rl)
			}
		}
		// The same client from another port is the same key.
		r := tg.do(req("10.0.0.1:999"))
		if r.Status != 429 || !r.Local {
			t.Fatalf("4th request: status %d local %v, want a local 429", r.Status, r.Local)
		}
		if r.Body != "rate limited\n" {
			t.Errorf("body %q", r.Body)
		}
		ra, err := strconv.Atoi(r.Header("retry-after"))
		if err != nil || ra < 1 || ra > 3600 {
			t.Errorf("Retry-After %q", r.Header("retry-after"))
		}
		if got := r.Header("ratelimit"); !strings.HasPrefix(got, `"per-ip";r=0;t=`) {
			t.Errorf("denied RateLimit = %q", got)
		}
		if got := r.Header("x-ratelimit-remaining"); got != "0" {
			t.Errorf("denied X-RateLimit-Remaining = %q", got)
		}
		if r.Header("x-test-error") != "" {
			t.Error(r.Header("x-test-error"))
		}
		// Another client is not affected.
		if r := tg.do(req("10.0.0.2:1234")); r.Status != 200 {
			t.Errorf("other client: status %d", r.Status)
		}
		if got := tg.metric("sluice.per-ip.allowed"); got != 4 {
			t.Errorf("allowed metric = %d, want 4", got)
		}
		if got := tg.metric("sluice.per-ip.denied"); got != 1 {
			t.Errorf("denied metric = %d, want 1", got)
		}
	})
}

func TestMetricNames(t *testing.T) {
	got := filter.MetricNames("api")
	want := [6]string{"sluice.api.allowed", "sluice.api.denied", "sluice.api.shadow_denied", "sluice.api.store_errors", "sluice.api.evicted", "sluice.api.evicted_used"}
	if got != want {
		t.Errorf("MetricNames = %v", got)
	}
}

func TestShadowModeNeverRejects(t *testing.T) {
	cfg := `{"rules":[{"name":"shadow","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":2,"window":"1h","mode":"shadow"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		for i := 0; i < 5; i++ {
			r := tg.do(req("10.1.0.1:1"))
			if r.Status != 200 {
				t.Fatalf("request %d: status %d, shadow mode must not reject", i+1, r.Status)
			}
			want := max(1-i, 0)
			if got := param(t, r.Header("ratelimit"), "r"); got != int64(want) {
				t.Errorf("request %d: r=%d, want %d", i+1, got, want)
			}
		}
		if a, s, d := tg.metric("sluice.shadow.allowed"), tg.metric("sluice.shadow.shadow_denied"), tg.metric("sluice.shadow.denied"); a != 2 || s != 3 || d != 0 {
			t.Errorf("allowed %d shadow_denied %d denied %d, want 2 3 0", a, s, d)
		}
	})
}

// A request denied by one rule is charged to no rule.
func TestDeniedRequestChargesNoRule(t *testing.T) {
	cfg := `{"rules":[
	  {"name":"ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1h"},
	  {"name":"apikey","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":2,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		src := "10.2.0.1:1"
		for i := 0; i < 2; i++ {
			if r := tg.do(req(src, "x-api-key", "k1")); r.Status != 200 {
				t.Fatalf("request %d: %d", i+1, r.Status)
			}
		}
		for i := 0; i < 3; i++ {
			r := tg.do(req(src, "x-api-key", "k1"))
			if r.Status != 429 {
				t.Fatalf("over apikey limit: status %d", r.Status)
			}
			if got := r.Header("ratelimit"); !strings.HasPrefix(got, `"apikey";r=0;`) {
				t.Errorf("denied by apikey, RateLimit %q", got)
			}
		}
		// Without the key header only "ip" applies; it was charged twice.
		r := tg.do(req(src))
		if r.Status != 200 {
			t.Fatalf("status %d", r.Status)
		}
		if got := r.Header("ratelimit"); !strings.HasPrefix(got, `"ip";r=2;`) {
			t.Errorf("RateLimit %q, want ip with r=2 (denied requests not charged)", got)
		}
		if got := tg.metric("sluice.apikey.denied"); got != 3 {
			t.Errorf("apikey denied = %d", got)
		}
		if got := tg.metric("sluice.ip.denied"); got != 0 {
			t.Errorf("ip denied = %d", got)
		}
	})
}

// The response reports the most restrictive rule.
func TestMostRestrictiveRuleReported(t *testing.T) {
	cfg := `{"rules":[
	  {"name":"wide","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":100,"window":"1h"},
	  {"name":"narrow","key":[{"method":true}],"algorithm":"fixed_window","limit":3,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		r := tg.do(req("10.3.0.1:1"))
		if got := r.Header("ratelimit"); !strings.HasPrefix(got, `"narrow";r=2;`) {
			t.Errorf("RateLimit %q, want narrow", got)
		}
		if got := r.Header("ratelimit-policy"); got != `"narrow";q=3;w=3600` {
			t.Errorf("RateLimit-Policy %q", got)
		}
	})
}

func TestMissingKeyPartRuleDoesNotApply(t *testing.T) {
	cfg := `{"rules":[{"name":"k","key":[{"header":"x-api-key"},{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		for i := 0; i < 3; i++ {
			r := tg.do(req("10.4.0.1:1"))
			if r.Status != 200 || r.Has("ratelimit") || r.Has("x-ratelimit-limit") {
				t.Fatalf("no key header: status %d headers %v; the rule must not apply", r.Status, r.Headers)
			}
		}
		tg.do(req("10.4.0.1:1", "x-api-key", "a"))
		if r := tg.do(req("10.4.0.1:1", "x-api-key", "a")); r.Status != 429 {
			t.Errorf("second keyed request: %d", r.Status)
		}
		if r := tg.do(req("10.4.0.1:1", "x-api-key", "")); r.Status != 200 {
			t.Errorf("empty key header is missing: %d", r.Status)
		}
	})
}

func TestMatch(t *testing.T) {
	cfg := `{"rules":[{"name":"api","match":{"path_prefix":"/api/","methods":["POST"],"headers":[{"name":"x-tenant","exact":"acme"}]},
	  "key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		do := func(method, path string, hdrs ...string) int {
			r := req("10.5.0.1:1", hdrs...)
			r.Method, r.Path = method, path
			return tg.do(r).Status
		}
		if s := do("POST", "/api/x?y=1", "x-tenant", "acme"); s != 200 {
			t.Fatalf("first: %d", s)
		}
		if s := do("POST", "/api/x", "x-tenant", "acme"); s != 429 {
			t.Errorf("second matching: %d", s)
		}
		for _, c := range []struct{ m, p, tenant string }{
			{"GET", "/api/x", "acme"}, {"POST", "/other", "acme"}, {"POST", "/api/x", "other"}, {"POST", "/apix", "acme"},
		} {
			if s := do(c.m, c.p, "x-tenant", c.tenant); s != 200 {
				t.Errorf("%s %s tenant %s: %d, rule must not match", c.m, c.p, c.tenant, s)
			}
		}
	})
}

func TestHeaderStyles(t *testing.T) {
	all := []string{"ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}
	for _, c := range []struct {
		style string
		want  []string
	}{
		{"draft", all[:2]}, {"legacy", all[2:]}, {"none", nil}, {"both", all},
	} {
		t.Run(c.style, func(t *testing.T) {
			cfg := `{"rules":[{"name":"s","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"90s"}],
			  "response":{"status":503,"body":"slow down","headers":"` + c.style + `"}}`
			forEachTarget(t, cfg, func(t *testing.T, tg target) {
				check := func(r filtertest.Response, extra ...string) {
					t.Helper()
					want := append(append([]string(nil), c.want...), extra...)
					for _, h := range all {
						if r.Has(h) != contains(want, h) {
							t.Errorf("status %d: header %s present=%v, want %v (headers %v)", r.Status, h, r.Has(h), !r.Has(h), r.Headers)
						}
					}
				}
				r := tg.do(req("10.6.0.1:1"))
				check(r)
				r = tg.do(req("10.6.0.1:1"))
				if r.Status != 503 || r.Body != "slow down" || !r.Has("retry-after") {
					t.Errorf("denied: %d %q %v", r.Status, r.Body, r.Headers)
				}
				check(r)
				if c.style == "draft" || c.style == "both" {
					if got := r.Header("ratelimit-policy"); got != `"s";q=1;w=90` {
						t.Errorf("policy %q", got)
					}
				}
			})
		})
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func TestIPv6PrefixGroupsClients(t *testing.T) {
	cfg := `{"rules":[{"name":"v6","key":[{"remote_ip":true,"ipv6_prefix":64}],"algorithm":"fixed_window","limit":2,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		if r := tg.do(req("[2001:db8:1:2::1]:443")); r.Status != 200 {
			t.Fatal(r.Status)
		}
		if r := tg.do(req("[2001:db8:1:2:ffff::9]:80")); r.Status != 200 {
			t.Fatal(r.Status)
		}
		if r := tg.do(req("[2001:db8:1:2::77]:80")); r.Status != 429 {
			t.Errorf("same /64: %d, want 429", r.Status)
		}
		if r := tg.do(req("[2001:db8:1:3::1]:80")); r.Status != 200 {
			t.Errorf("other /64: %d", r.Status)
		}
		// IPv4 is kept whole, bare addresses and mapped ones are the same client.
		tg.do(req("192.0.2.1"))
		tg.do(req("[::ffff:192.0.2.1]:5"))
		if r := tg.do(req("192.0.2.1:7")); r.Status != 429 {
			t.Errorf("192.0.2.1 third time: %d", r.Status)
		}
		if r := tg.do(req("192.0.2.2:7")); r.Status != 200 {
			t.Errorf("192.0.2.2: %d", r.Status)
		}
	})
}

func TestXForwardedFor(t *testing.T) {
	t.Run("untrusted", func(t *testing.T) {
		cfg := `{"rules":[{"name":"ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
		forEachTarget(t, cfg, func(t *testing.T, tg target) {
			tg.do(req("10.7.0.1:1", "x-forwarded-for", "1.1.1.1"))
			// A forged X-Forwarded-For does not change the key.
			if r := tg.do(req("10.7.0.1:1", "x-forwarded-for", "2.2.2.2")); r.Status != 429 {
				t.Errorf("forged XFF changed the key: %d", r.Status)
			}
		})
	})
	t.Run("one-trusted-hop", func(t *testing.T) {
		cfg := `{"rules":[{"name":"ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],"client_ip":{"xff_trusted_hops":1}}`
		forEachTarget(t, cfg, func(t *testing.T, tg target) {
			if r := tg.do(req("10.7.0.9:1", "x-forwarded-for", "6.6.6.6, 3.3.3.3")); r.Status != 200 {
				t.Fatal(r.Status)
			}
			// The client forges the left entry; the rightmost (added by
			// the trusted proxy) is the key.
			if r := tg.do(req("10.7.0.9:1", "x-forwarded-for", "7.7.7.7,3.3.3.3")); r.Status != 429 {
				t.Errorf("same rightmost hop: %d", r.Status)
			}
			if r := tg.do(req("10.7.0.9:1", "x-forwarded-for", "3.3.3.3, 4.4.4.4")); r.Status != 200 {
				t.Errorf("other client: %d", r.Status)
			}
			// Garbage falls back to the peer address.
			if r := tg.do(req("10.7.0.10:1", "x-forwarded-for", "not-an-ip")); r.Status != 200 {
				t.Errorf("garbage XFF: %d", r.Status)
			}
			if r := tg.do(req("10.7.0.10:1")); r.Status != 429 {
				t.Errorf("garbage XFF used the peer address: %d", r.Status)
			}
		})
	})
}

func TestQueryCookiePathKeys(t *testing.T) {
	cfg := `{"rules":[
	  {"name":"q","match":{"path_prefix":"/q"},"key":[{"query":"api_key"}],"algorithm":"fixed_window","limit":1,"window":"1h"},
	  {"name":"c","match":{"path_prefix":"/c"},"key":[{"cookie":"session"}],"algorithm":"fixed_window","limit":1,"window":"1h"},
	  {"name":"p","match":{"path_prefix":"/p"},"key":[{"path":true},{"method":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		get := func(path string, hdrs ...string) int {
			r := req("10.8.0.1:1", hdrs...)
			r.Path = path
			return tg.do(r).Status
		}
		steps := []struct {
			path   string
			hdrs   []string
			status int
		}{
			{"/q?x=1&api_key=abc", nil, 200},
			{"/q?api_key=ab%63", nil, 429}, // percent-decoded: same key
			{"/q?api_key=abd", nil, 200},
			{"/q?api_key=", nil, 200}, // empty: rule does not apply
			{"/q", nil, 200},
			{"/c", []string{"cookie", "a=1; session=s1"}, 200},
			{"/c", []string{"cookie", `session="s1";b=2`}, 429},
			{"/c", []string{"cookie", "session=s2"}, 200},
			{"/c", []string{"cookie", "xsession=s1"}, 200},
			{"/p/a?x=1", nil, 200},
			{"/p/a?x=2", nil, 429}, // the query is not part of the path key
			{"/p/b", nil, 200},
		}
		for _, s := range steps {
			if got := get(s.path, s.hdrs...); got != s.status {
				t.Errorf("%s %v: status %d, want %d", s.path, s.hdrs, got, s.status)
			}
		}
	})
}

func TestBadConfigurationRefused(t *testing.T) {
	bad := `{"rules":[{"name":"x","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"10x"}]}`
	want := `rules[0].window: "10x" is not a duration`
	t.Run("native", func(t *testing.T) {
		h := filtertest.NewHost()
		w := filtertest.NewWorker(h, filter.NewVM(h))
		if w.Start(bad) {
			t.Fatal("bad configuration accepted")
		}
		if len(h.Logs) == 0 || !strings.Contains(h.Logs[len(h.Logs)-1].Msg, want) || h.Logs[len(h.Logs)-1].Level != 5 {
			t.Errorf("logs %v, want a critical log containing %q", h.Logs, want)
		}
	})
	t.Run("wasm-proxytest", func(t *testing.T) {
		host, st := newProxytestHost(t, bad)
		if st {
			t.Fatal("bad configuration accepted")
		}
		logs := strings.Join(host.GetCriticalLogs(), "\n")
		if !strings.Contains(logs, want) {
			t.Errorf("critical logs %q, want %q", logs, want)
		}
	})
	t.Run("redis-rule-in-local-build", func(t *testing.T) {
		cfg := `{"rules":[{"name":"x","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1s","backend":"redis"}],
		  "redis":{"cluster":"redis"}}`
		h := filtertest.NewHost()
		w := filtertest.NewWorker(h, filter.NewVM(h))
		if w.Start(cfg) {
			t.Fatal("redis rule accepted by the local build")
		}
		if len(h.Logs) == 0 || !strings.Contains(h.Logs[len(h.Logs)-1].Msg, `rules[0].backend: "redis" needs sluice-redis.wasm`) {
			t.Errorf("logs %v", h.Logs)
		}
	})
}

// Envoy with use_remote_address appends the peer to X-Forwarded-For before
// filters run; with proxy_appends_xff that entry is skipped and does not
// count as a trusted hop. It is skipped because the configuration says so,
// never because its value equals the peer.
func TestXForwardedForAppendedByEnvoy(t *testing.T) {
	cfg := `{"rules":[{"name":"ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],"client_ip":{"xff_trusted_hops":1,"proxy_appends_xff":true}}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		// Peer 10.9.9.9 is the load balancer; it appended the client
		// 3.3.3.3, then Envoy appended the peer.
		if r := tg.do(req("10.9.9.9:1", "x-forwarded-for", "6.6.6.6, 3.3.3.3, 10.9.9.9")); r.Status != 200 {
			t.Fatal(r.Status)
		}
		if r := tg.do(req("10.9.9.9:2", "x-forwarded-for", "3.3.3.3,10.9.9.9")); r.Status != 429 {
			t.Errorf("same client behind the same LB: %d", r.Status)
		}
		if r := tg.do(req("10.9.9.9:3", "x-forwarded-for", "4.4.4.4, 10.9.9.9")); r.Status != 200 {
			t.Errorf("another client: %d", r.Status)
		}
		// The appended entry is skipped whatever its value (Envoy appends
		// its own address for a loopback peer, for one).
		if r := tg.do(req("10.9.9.9:4", "x-forwarded-for", "3.3.3.3, 127.0.0.1")); r.Status != 429 {
			t.Errorf("same client, another appended value: %d", r.Status)
		}
		// A client at the load balancer's address that forges an entry
		// reaches the filter as "forged, LB (its peer), LB (Envoy's
		// append)": keyed as the load balancer, never as the forged entry.
		if r := tg.do(req("10.9.9.9:5", "x-forwarded-for", "5.5.5.5, 10.9.9.9, 10.9.9.9")); r.Status != 200 {
			t.Fatal(r.Status)
		}
		if r := tg.do(req("10.9.9.9:6", "x-forwarded-for", "5.5.5.6, 10.9.9.9, 10.9.9.9")); r.Status != 429 {
			t.Errorf("co-located client with a fresh forged entry: %d", r.Status)
		}
	})
}
