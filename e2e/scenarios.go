package e2e

import (
	"fmt"
	"net/http"
	"os"
	"time"
)

// Algorithms are the five algorithms of the configuration contract.
var Algorithms = []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_log", "sliding_window"}

// The header names of the contract (draft-ietf-httpapi-ratelimit-headers and legacy).
const (
	hRateLimit       = "RateLimit"
	hRateLimitPolicy = "RateLimit-Policy"
	hLimit           = "X-RateLimit-Limit"
	hRemaining       = "X-RateLimit-Remaining"
	hReset           = "X-RateLimit-Reset"
	hRetryAfter      = "Retry-After"
)

var allRateLimitHeaders = []string{hRateLimit, hRateLimitPolicy, hLimit, hRemaining, hReset}

// Exact-admission bursts: 2,000 concurrent requests on one key limited to
// 100 per hour, through 8 workers.
const (
	BurstRequests = 2000
	BurstLimit    = 100
	BurstWorkers  = 8
)

// Scenarios returns every scenario, in a stable order with unique names.
func Scenarios() []Scenario {
	var s []Scenario
	for _, alg := range Algorithms {
		s = append(s, limitReachedAndRecovered(alg))
	}
	s = append(s, headerStyles()...)
	s = append(s,
		shadowMode(),
		badConfig(),
		unknownField(),
		perRoute(),
		headerKey(),
		remoteIPIgnoresForgedXFF(),
		xffColocatedClient(),
		xffClientsBehindProxy(),
		pathNormalized(),
		customResponse(),
		everyRuleApplies(),
		routeNames(),
		higressScopes(),
		exactUnderConcurrency(),
		keyFlood(os.Getenv(envFlood) == "full"),
		grpcResourceExhausted(),
		grpcCustomStatus(),
		keyless(),
	)
	return s
}

func get(path string, kv ...string) Request {
	return request(http.MethodGet, path, kv...)
}

func request(method, path string, kv ...string) Request {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return Request{Method: method, Path: path, Header: h}
}

func ok() Expect { return Expect{Status: http.StatusOK} }

// noRateLimitHeaders requires every rate-limit header (and Retry-After) to be absent.
func noRateLimitHeaders() map[string]Check {
	m := map[string]Check{hRetryAfter: Absent()}
	for _, h := range allRateLimitHeaders {
		m[h] = Absent()
	}
	return m
}

// limitReachedAndRecovered: limit 2 per second per client IP. Two requests pass, then one is
// rejected with the configured status and body and a Retry-After of 1 or 2 whole seconds,
// and within a few seconds requests pass again. (A fixed window may turn over between the
// requests, so the rejection is polled for; the algorithms' unit tests pin exact timing.)
func limitReachedAndRecovered(alg string) Scenario {
	const body = "e2e: limited\n"
	denied := Expect{Status: 429, Body: body, Header: map[string]Check{
		hRetryAfter: IntIn(1, 2),
		hRateLimit:  Matches(`^"per-ip";r=0;t=[0-9]+$`),
		hRemaining:  Exact("0"),
	}}
	return Scenario{
		Name: "limit-" + alg,
		Config: fmt.Sprintf(`{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":%q,"limit":2,"window":"1s"}],
 "response":{"status":429,"body":%q,"headers":"both"}}`, alg, body),
		Steps: []Step{
			{Desc: "within the limit", Req: get("/a"), Times: 2, Want: Expect{Status: 200, Header: map[string]Check{
				hLimit: Exact("2"), hRateLimitPolicy: Exact(`"per-ip";q=2;w=1`), hRetryAfter: Absent()}}},
			{Desc: "limit reached", Req: get("/a"), Poll: 3 * time.Second, PollWhile: []int{200}, Want: denied},
			{Desc: "recovered", Req: get("/a"), Poll: 5 * time.Second, PollWhile: []int{429}, Want: ok()},
		},
	}
}

// headerStyles: the same rule (3 per hour, exact sliding log) under each response.headers
// style; Remaining counts down 2, 1, 0, then a 429.
func headerStyles() []Scenario {
	var out []Scenario
	for _, style := range []string{"draft", "legacy", "both", "none"} {
		draft := style == "draft" || style == "both"
		legacy := style == "legacy" || style == "both"
		want := func(status int, remaining int) Expect {
			h := map[string]Check{}
			if draft {
				h[hRateLimit] = Matches(fmt.Sprintf(`^"quota";r=%d;t=([1-9][0-9]{0,2}|[1-2][0-9]{3}|3[0-5][0-9]{2}|3600)$`, remaining))
				h[hRateLimitPolicy] = Exact(`"quota";q=3;w=3600`)
			} else {
				h[hRateLimit], h[hRateLimitPolicy] = Absent(), Absent()
			}
			if legacy {
				h[hLimit] = Exact("3")
				h[hRemaining] = Exact(fmt.Sprint(remaining))
				h[hReset] = IntIn(1, 3600)
			} else {
				h[hLimit], h[hRemaining], h[hReset] = Absent(), Absent(), Absent()
			}
			if status == 429 {
				h[hRetryAfter] = IntIn(1, 3600)
			} else {
				h[hRetryAfter] = Absent()
			}
			return Expect{Status: status, Header: h}
		}
		out = append(out, Scenario{
			Name: "headers-" + style,
			Config: fmt.Sprintf(`{"rules":[{"name":"quota","key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":3,"window":"1h"}],
 "response":{"headers":%q}}`, style),
			Steps: []Step{
				{Desc: "first", Req: get("/h"), Want: want(200, 2)},
				{Desc: "second", Req: get("/h"), Want: want(200, 1)},
				{Desc: "third", Req: get("/h"), Want: want(200, 0)},
				{Desc: "denied", Req: get("/h"), Want: want(429, 0)},
			},
		})
	}
	return out
}

// shadowMode: a shadow rule decides and emits headers but never rejects.
func shadowMode() Scenario {
	h := map[string]Check{
		hRateLimit:  Matches(`^"observe";r=0;t=[0-9]+$`),
		hLimit:      Exact("1"),
		hRemaining:  Exact("0"),
		hRetryAfter: Absent(),
	}
	return Scenario{
		Name: "shadow",
		Config: `{"rules":[{"name":"observe","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1,"window":"1h","mode":"shadow"}],
 "response":{"headers":"both"}}`,
		Steps: []Step{
			{Desc: "over the limit, never rejected", Req: get("/s"), Times: 5, Want: Expect{Status: 200, Header: h}},
		},
	}
}

// badConfig: the proxy refuses a configuration with an error naming the JSON path (sluice
// run exits; Envoy exits at start-up, "Unable to create Wasm plugin").
func badConfig() Scenario {
	return Scenario{
		Name:   "bad-config-refused",
		Config: `{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"10x"}]}`,
		StartFails: &StartFailure{StderrContains: []string{
			`rules[0].window`, `is not a duration`,
		}, HostContains: []string{"proxy_on_configure returned false"}, EnvoyContains: []string{"Unable to create Wasm plugin sluice"}},
	}
}

func unknownField() Scenario {
	return Scenario{
		Name:   "unknown-field-refused",
		Config: `{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":5,"window":"1s","limt":3}]}`,
		StartFails: &StartFailure{StderrContains: []string{
			`rules[0].limt`,
		}, HostContains: []string{"proxy_on_configure returned false"}, EnvoyContains: []string{"Unable to create Wasm plugin sluice"}},
	}
}

// perRoute: rule "api" limits POST /api/ with x-tenant: acme (1 per hour), rule "admin"
// limits /admin/ (2 per hour). Only matching requests are limited, and the two rules count
// separately.
func perRoute() Scenario {
	api := func(status int) Expect {
		e := Expect{Status: status, Header: map[string]Check{hRateLimitPolicy: Exact(`"api";q=1;w=3600`)}}
		return e
	}
	admin := func(status int, remaining string) Expect {
		return Expect{Status: status, Header: map[string]Check{
			hRateLimitPolicy: Exact(`"admin";q=2;w=3600`), hRemaining: Exact(remaining)}}
	}
	return Scenario{
		Name: "per-route",
		Config: `{"rules":[
  {"name":"api","match":{"path_prefix":"/api/","methods":["POST"],"headers":[{"name":"x-tenant","exact":"acme"}]},
   "key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"},
  {"name":"admin","match":{"path_prefix":"/admin/"},
   "key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":2,"window":"1h"}],
 "response":{"headers":"both"}}`,
		Steps: []Step{
			{Desc: "api: matching request admitted", Req: request("POST", "/api/orders", "X-Tenant", "acme"), Want: api(200)},
			{Desc: "api: matching request limited", Req: request("POST", "/api/orders", "X-Tenant", "acme"), Want: api(429)},
			{Desc: "api: other method not limited", Req: request("GET", "/api/orders", "X-Tenant", "acme"), Times: 3,
				Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "api: other tenant not limited", Req: request("POST", "/api/orders", "X-Tenant", "globex"), Times: 3,
				Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "api: no tenant header not limited", Req: request("POST", "/api/orders"), Times: 2,
				Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "other path not limited", Req: request("POST", "/apix/orders", "X-Tenant", "acme"), Times: 2,
				Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "admin: own counter (1)", Req: get("/admin/users"), Want: admin(200, "1")},
			{Desc: "admin: own counter (2)", Req: request("DELETE", "/admin/users/7"), Want: admin(200, "0")},
			{Desc: "admin: limited", Req: get("/admin/"), Want: admin(429, "0")},
			{Desc: "api still limited", Req: request("POST", "/api/x", "X-Tenant", "acme"), Want: api(429)},
		},
	}
}

// headerKey: a header key part gives one bucket per header value; a request without the
// header is not limited by the rule.
func headerKey() Scenario {
	limited := func(status int, remaining string) Expect {
		return Expect{Status: status, Header: map[string]Check{hRemaining: Exact(remaining), hLimit: Exact("2")}}
	}
	return Scenario{
		Name: "key-header",
		Config: `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":2,"window":"1h"}],
 "response":{"headers":"legacy"}}`,
		Steps: []Step{
			{Desc: "key a (1)", Req: get("/k", "X-Api-Key", "a"), Want: limited(200, "1")},
			{Desc: "key a (2)", Req: get("/k", "X-Api-Key", "a"), Want: limited(200, "0")},
			{Desc: "key a limited", Req: get("/k", "X-Api-Key", "a"), Want: limited(429, "0")},
			{Desc: "key b has its own bucket", Req: get("/k", "X-Api-Key", "b"), Want: limited(200, "1")},
			{Desc: "key A is another value", Req: get("/k", "X-Api-Key", "A"), Want: limited(200, "1")},
			{Desc: "no key header: rule does not apply", Req: get("/k"), Times: 5, Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "key b (2)", Req: get("/k", "X-Api-Key", "b"), Want: limited(200, "0")},
			{Desc: "key b limited", Req: get("/k", "X-Api-Key", "b"), Want: limited(429, "0")},
		},
	}
}

// remoteIPIgnoresForgedXFF: with xff_trusted_hops 0 the key is the TCP peer; a client
// cannot get a fresh bucket by sending X-Forwarded-For.
func remoteIPIgnoresForgedXFF() Scenario {
	denied := Expect{Status: 429, Body: "rate limited\n"}
	return Scenario{
		Name: "key-remote-ip-forged-xff",
		Config: `{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"sliding_window","limit":1,"window":"1h"}],
 "client_ip":{"xff_trusted_hops":0}}`,
		Steps: []Step{
			{Desc: "first", Req: get("/", "X-Forwarded-For", "203.0.113.7"), Want: ok()},
			{Desc: "another forged address", Req: get("/", "X-Forwarded-For", "198.51.100.9"), Want: denied},
			{Desc: "forged chain", Req: get("/", "X-Forwarded-For", "192.0.2.1, 192.0.2.2"), Want: denied},
			{Desc: "no header", Req: get("/"), Want: denied},
		},
	}
}

// xffColocatedClient: with one trusted hop, a client at the trusted proxy's own address
// (here the test client, at the proxy's loopback address) that writes a fresh X-Forwarded-For
// entry on every request is held to its limit: 5 of 50 admitted. The entry the trusted proxy
// appended (the client's address, 127.0.0.1) is the key, whatever its value; an older filter
// skipped a right-most entry equal to the peer and keyed on the forged one (35 of 50
// admitted). Behind Envoy (use_remote_address: true, so Envoy appends the TCP peer and
// proxy_appends_xff stays false here) the key is Envoy's entry, the peer: also 5.
func xffColocatedClient() Scenario {
	const limit, n = 5, 50
	steps := make([]Step, 0, n+2)
	for i := 0; i < n; i++ {
		want := Expect{Status: 429, Body: "rate limited\n"}
		if i < limit {
			want = ok()
		}
		steps = append(steps, Step{Desc: fmt.Sprintf("forged entry %d", i),
			Req: get("/", "X-Forwarded-For", fmt.Sprintf("203.0.113.%d, 127.0.0.1", i)), Want: want})
	}
	steps = append(steps,
		Step{Desc: "forged entry in a header of its own, before the proxy's",
			Req: get("/", "X-Forwarded-For", "198.51.100.77", "X-Forwarded-For", "127.0.0.1"), Want: Expect{Status: 429}},
		Step{Desc: "no header", Req: get("/"), Want: Expect{Status: 429}},
	)
	return Scenario{
		Name: "xff-colocated-client",
		Config: `{"rules":[{"name":"per-client","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1h"}],
 "client_ip":{"xff_trusted_hops":1}}`,
		Steps: steps,
	}
}

// xffClientsBehindProxy: with one trusted hop and nothing appended by the proxy running the
// filter (sluice run appends the peer only to the upstream request), the right-most entry,
// written by the trusted proxy in front, is the client: each client behind the proxy has its
// own limit, and entries a client writes to the left of it change nothing. Several
// X-Forwarded-For headers count as one list, in order (Envoy joins them; the embedded host
// keeps them apart). Host only: an Envoy in front with use_remote_address appends its peer.
func xffClientsBehindProxy() Scenario {
	denied := Expect{Status: 429}
	return Scenario{
		Name:     "xff-clients-behind-proxy",
		HostOnly: true,
		Config: `{"rules":[{"name":"per-client","key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":1,"window":"1h"}],
 "client_ip":{"xff_trusted_hops":1}}`,
		Steps: []Step{
			{Desc: "client A", Req: get("/", "X-Forwarded-For", "192.0.2.1, 198.51.100.1"), Want: ok()},
			{Desc: "client A, other forged entries", Req: get("/", "X-Forwarded-For", "192.0.2.2, 198.51.100.1"), Want: denied},
			{Desc: "client A, no forged entry", Req: get("/", "X-Forwarded-For", "198.51.100.1"), Want: denied},
			{Desc: "client A, forged header first", Req: get("/", "X-Forwarded-For", "192.0.2.9", "X-Forwarded-For", "198.51.100.1"), Want: denied},
			{Desc: "client B", Req: get("/", "X-Forwarded-For", "192.0.2.1, 198.51.100.2"), Want: ok()},
			{Desc: "client C, in a header of its own", Req: get("/", "X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "198.51.100.3"), Want: ok()},
			{Desc: "not an address: the peer", Req: get("/", "X-Forwarded-For", "unknown"), Want: ok()},
			{Desc: "no header: the peer", Req: get("/"), Want: denied},
		},
	}
}

// pathNormalized: a rule on /h (limit 1) limits every spelling of /h that Envoy's
// normalize_path and merge_slashes — and so the upstream — resolve to /h: percent-encoded
// letters, repeated slashes, dot segments, and %2568/.. (one decoding pass: %2568 is the
// segment "%68", which the ".." removes). Paths that are not /h once normalized (%2568 alone
// is the text /%68) are not limited. The e2e Envoy bootstrap enables both options, so there
// the filter sees Envoy's normalized path; sluice run normalizes in the filter.
func pathNormalized() Scenario {
	denied := Expect{Status: 429, Body: "rate limited\n"}
	steps := []Step{
		{Desc: "another path", Req: get("/other"), Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
		{Desc: "/h", Req: get("/h"), Want: ok()},
	}
	for _, p := range []string{"/%68", "//h", "/./h", "/x/../h", "/h/../h", "/%2568/../h", "/%2e/h", "//x/..//h?q=1"} {
		steps = append(steps, Step{Desc: p + " is /h", Req: get(p), Want: denied})
	}
	for _, p := range []string{"/%2568", "/x%2Fh", "/H"} {
		steps = append(steps, Step{Desc: p + " is not /h", Req: get(p), Want: Expect{Status: 200, Header: noRateLimitHeaders()}})
	}
	return Scenario{
		Name: "path-normalized",
		Config: `{"rules":[{"name":"h","match":{"path_prefix":"/h"},"key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":1,"window":"1h"}],
 "response":{"headers":"both"}}`,
		Steps: steps,
	}
}

// customResponse: the configured status and body are what a rejected client sees.
func customResponse() Scenario {
	const body = `{"error":"slow down"}` + "\n"
	return Scenario{
		Name: "custom-response",
		Config: fmt.Sprintf(`{"rules":[{"name":"tight","key":[{"remote_ip":true}],"algorithm":"leaky_bucket","limit":1,"window":"1h"}],
 "response":{"status":503,"body":%q,"headers":"none"}}`, body),
		Steps: []Step{
			{Desc: "admitted", Req: get("/c"), Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
			{Desc: "custom rejection", Req: get("/c"), Times: 2, Want: Expect{Status: 503, Body: body, Header: map[string]Check{
				hRetryAfter: IntIn(1, 3600), hRateLimit: Absent(), hLimit: Absent()}}},
		},
	}
}

// everyRuleApplies: two rules match the same requests; any denial rejects, a rejected
// request is charged to no rule, and the headers describe the most restrictive rule.
func everyRuleApplies() Scenario {
	rl := func(status int, re string) Expect {
		return Expect{Status: status, Header: map[string]Check{hRateLimit: Matches(re)}}
	}
	return Scenario{
		Name: "every-rule-applies",
		Config: `{"rules":[
  {"name":"per-user","key":[{"header":"x-user"}],"algorithm":"sliding_log","limit":2,"window":"1h"},
  {"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":3,"window":"1h"}],
 "response":{"headers":"draft"}}`,
		Steps: []Step{
			{Desc: "u1 (1): per-user has 1 left, per-ip 2", Req: get("/", "X-User", "u1"), Want: rl(200, `^"per-user";r=1;t=`)},
			{Desc: "u1 (2): per-user 0 left, per-ip 1", Req: get("/", "X-User", "u1"), Want: rl(200, `^"per-user";r=0;t=`)},
			{Desc: "u1 denied by per-user, not charged to per-ip", Req: get("/", "X-User", "u1"), Times: 3, Want: rl(429, `^"per-user";r=0;t=`)},
			{Desc: "u2 (1): per-ip has 0 left, the most restrictive", Req: get("/", "X-User", "u2"), Want: rl(200, `^"per-ip";r=0;t=`)},
			{Desc: "u2 denied by per-ip", Req: get("/", "X-User", "u2"), Want: rl(429, `^"per-ip";r=0;t=`)},
		},
	}
}

// exactUnderConcurrency: 8 workers, a rule per algorithm (100 per hour per
// x-key, selected by path), 2,000 concurrent requests on one key: exactly the limit is
// admitted, for a new key (the first requests race on every worker to create it) and for a
// key that already exists (one request first, so 99 remain).
func exactUnderConcurrency() Scenario {
	cfg := `{"rules":[`
	var steps []Step
	for i, alg := range Algorithms {
		if i > 0 {
			cfg += ","
		}
		cfg += fmt.Sprintf(`
  {"name":%q,"match":{"path_prefix":"/%s/"},"key":[{"header":"x-key"}],"algorithm":%q,"limit":%d,"window":"1h"}`,
			alg, alg, alg, BurstLimit)
		path := "/" + alg + "/x"
		steps = append(steps,
			Step{Desc: alg + ": new key, 2000 at once",
				Req: get(path, "X-Key", "new"), Want: ok(),
				Burst: &Burst{N: BurstRequests, Admitted: BurstLimit, DeniedStatus: 429}},
			Step{Desc: alg + ": existing key, first request", Req: get(path, "X-Key", "existing"), Want: ok()},
			Step{Desc: alg + ": existing key, 2000 at once",
				Req: get(path, "X-Key", "existing"), Want: ok(),
				Burst: &Burst{N: BurstRequests, Admitted: BurstLimit - 1, DeniedStatus: 429}},
		)
	}
	cfg += `],
 "response":{"headers":"none"}}`
	return Scenario{Name: "exact-8-workers", Workers: BurstWorkers, Config: cfg, Steps: steps}
}

// routeNames: "match": {"routes": [...]} selects requests by the name of the route the proxy
// chose (xds.route_name): sluice run --route checkout=/checkout --route cart=/cart
// --route web=/, or the same named routes in Envoy. Checkout and cart share one counter;
// the web route is not limited by that rule.
func routeNames() Scenario {
	shop := func(status int, remaining string) Expect {
		return Expect{Status: status, Header: map[string]Check{
			hRateLimitPolicy: Exact(`"shop";q=2;w=3600`), hRateLimit: Exact(`"shop";r=` + remaining + `;t=3600`)}}
	}
	all := Expect{Status: 200, Header: map[string]Check{hRateLimitPolicy: Exact(`"all";q=100;w=3600`)}}
	return Scenario{
		Name:   "route-names",
		Routes: []Route{{"checkout", "/checkout"}, {"cart", "/cart"}, {"web", "/"}},
		Config: `{"rules":[
  {"name":"shop","match":{"routes":["checkout","cart"]},"key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":2,"window":"1h"},
  {"name":"all","key":[{"remote_ip":true}],"algorithm":"sliding_log","limit":100,"window":"1h"}],
 "response":{"headers":"draft"}}`,
		Steps: []Step{
			{Desc: "checkout route: shop rule (1)", Req: get("/checkout/pay"), Want: shop(200, "1")},
			{Desc: "cart route: same counter (2)", Req: get("/cart?item=7"), Want: shop(200, "0")},
			{Desc: "checkout route: limited", Req: get("/checkout"), Want: shop(429, "0")},
			{Desc: "web route: not the shop rule", Req: get("/catalog"), Times: 3, Want: all},
			{Desc: "a path like the route's name is not the route", Req: get("/web/checkout"), Want: all},
		},
	}
}

// higressScopes: Higress's matchRules as its controller hands them to the plugin ("_rules_"
// entries with _match_route_ / _match_domain_): the first entry that selects a request
// (route level, then domain level) applies its own configuration and counters; the
// top-level rules take the rest; an entry with no rules exempts its requests.
func higressScopes() Scenario {
	perIP := func(status int, q string) Expect {
		return Expect{Status: status, Header: map[string]Check{hRateLimitPolicy: Exact(`"per-ip";q=` + q + `;w=3600`)}}
	}
	global := func(status int) Expect {
		return Expect{Status: status, Header: map[string]Check{hRateLimitPolicy: Exact(`"global";q=3;w=3600`)}}
	}
	return Scenario{
		Name:   "higress-scopes",
		Routes: []Route{{"shop/checkout", "/checkout"}, {"infra/health", "/health"}},
		Config: `{"rules":[{"name":"global","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":3,"window":"1h"}],
 "_rules_":[
  {"_match_route_":["shop/checkout"],"scope":"shop",
   "rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],
   "response":{"status":503,"body":"shop closed\n","headers":"draft"}},
  {"_match_domain_":["*.example.com"],
   "rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":2,"window":"1h"}],
   "response":{"headers":"draft"}},
  {"_match_route_":["infra/health"],"rules":[]}]}`,
		Steps: []Step{
			{Desc: "route scope", Req: get("/checkout", "Host", "a.example.com"), Want: perIP(200, "1")},
			{Desc: "route scope: its limit and its own response", Req: get("/checkout/x"), Want: Expect{Status: 503, Body: "shop closed\n",
				Header: map[string]Check{hRateLimitPolicy: Exact(`"per-ip";q=1;w=3600`), hRetryAfter: IntAtLeast(1), hLimit: Absent()}}},
			{Desc: "domain scope (port ignored)", Req: get("/page", "Host", "a.example.com:8080"), Want: perIP(200, "2")},
			{Desc: "domain scope, another host under it", Req: get("/page", "Host", "b.example.com"), Want: perIP(200, "2")},
			{Desc: "domain scope: own counter, limited", Req: get("/page", "Host", "C.Example.Com"), Want: perIP(429, "2")},
			{Desc: "the domain itself is not under *.example.com", Req: get("/page", "Host", "example.com"), Want: global(200)},
			{Desc: "global rules for the rest", Req: get("/page"), Times: 2, Want: global(200)},
			{Desc: "global: limited", Req: get("/page"), Want: global(429)},
			{Desc: "exempt route", Req: get("/health"), Times: 4, Want: Expect{Status: 200, Header: noRateLimitHeaders()}},
		},
	}
}

// envFlood=full runs keyFlood at the size (about 105,000 requests) instead of the
// CI size.
const envFlood = "SLUICE_E2E_FLOOD"

// keyFlood: a flood of fresh keys must not deny innocent clients nor free heavy
// hitters. One rule per algorithm (its own path), 10 per hour per x-user: attacker keys
// sending one request each, innocent clients sending 5 (half their limit), heavy hitters
// sending 10× their limit, in one random order over 16 connections. No innocent request
// is denied, no heavy hitter gets more than 12, and shared data stays within the rules'
// max_keys (+1 for the hash seed). The CI size is max_keys 100 with 2,000 attackers, 20
// innocents and 3 heavy hitters per rule; SLUICE_E2E_FLOOD=full runs the issue's: max_keys
// 1000, 20,000 attackers, 100 innocents, 5 heavy hitters.
func keyFlood(full bool) Scenario {
	maxKeys, f := 100, Flood{Attackers: 2000, Innocents: 20, Heavy: 3}
	if full {
		maxKeys, f = 1000, Flood{Attackers: 20_000, Innocents: 100, Heavy: 5}
	}
	f.KeyHeader, f.AttackerRequests, f.InnocentRequests, f.HeavyRequests = "X-User", 1, 5, 100
	f.Conns, f.MaxInnocentDenied, f.MaxHeavyAdmitted, f.DeniedStatus = 16, 0, 12, 429
	f.MaxSharedKeys = len(Algorithms)*maxKeys + 1
	cfg := `{"rules":[`
	var steps []Step
	for i, alg := range Algorithms {
		if i > 0 {
			cfg += ","
		}
		cfg += fmt.Sprintf(`
  {"name":%q,"match":{"path_prefix":"/%s/"},"key":[{"header":"x-user"}],"algorithm":%q,"limit":10,"window":"1h","max_keys":%d}`,
			alg, alg, alg, maxKeys)
		fl := f
		steps = append(steps, Step{Desc: alg + ": key flood", Req: get("/" + alg + "/x"), Want: ok(), Flood: &fl})
	}
	cfg += `],
 "response":{"headers":"none"}}`
	return Scenario{Name: "key-flood", Config: cfg, Steps: steps}
}
