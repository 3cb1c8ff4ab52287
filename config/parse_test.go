package config

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// rule builds one rule object from a valid base; kv are pairs of field name
// and raw JSON that replace (or, with "", remove) a base field or add one.
func rule(kv ...string) string {
	fields := [][2]string{
		{"name", `"r"`},
		{"key", `[{"remote_ip":true}]`},
		{"algorithm", `"fixed_window"`},
		{"limit", `10`},
		{"window", `"1s"`},
	}
	for i := 0; i+1 < len(kv); i += 2 {
		found := false
		for j := range fields {
			if fields[j][0] == kv[i] {
				fields[j][1] = kv[i+1]
				found = true
			}
		}
		if !found {
			fields = append(fields, [2]string{kv[i], kv[i+1]})
		}
	}
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for _, f := range fields {
		if f[1] == "" {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(`"` + f[0] + `":` + f[1])
	}
	b.WriteByte('}')
	return b.String()
}

// doc wraps rules (raw JSON objects) and extra top-level fields.
func doc(top string, rules ...string) string {
	s := `{"rules":[` + strings.Join(rules, ",") + `]`
	if top != "" {
		s += "," + top
	}
	return s + "}"
}

const redisObj = `"redis":{"cluster":"redis"}`

const rlsObj = `"rls":{"cluster":"rls","domain":"edge"}`

// errorCases pins every error message Parse can produce.
var errorCases = []struct {
	name, json, want string
}{
	// The document.
	{"empty", "  \n", `configuration: is empty`},
	{"invalid json", `{"rules": [}`, `configuration: is not valid JSON`},
	{"trailing garbage", `{} x`, `configuration: is not valid JSON`},
	{"invalid utf8", "{\"rules\":\"\xff\"}", `configuration: is not valid UTF-8`},
	{"not an object", `[]`, `configuration: [] is not an object`},
	{"scalar true", `true`, `configuration: true is not an object`},
	{"scalar after byte-order mark", "\ufeff0", `configuration: 0 is not an object`},
	{"byte-order mark only", "\ufeff \n", `configuration: is empty`},
	{"byte-order mark twice", "\ufeff\ufeff{}", `configuration: is not valid JSON`},
	{"byte-order mark after space", " \ufeff{}", `configuration: is not valid JSON`},
	{"unknown top field suggestion", `{"rulez":[]}`, "rulez: unknown field (did you mean \"rules\"?)\nrules: is required"},
	{"unknown top field", doc(`"colour":1`, rule()), `colour: unknown field`},
	{"duplicate field", doc(`"failure_mode":"open","failure_mode":"closed"`, rule()), `failure_mode: duplicate field`},
	{"rules missing", `{}`, `rules: is required`},
	{"rules not a list", `{"rules":{}}`, `rules: {} is not a list`},
	{"rules empty", `{"rules":[]}`, `rules: must contain at least one rule`},
	{"rule not an object", `{"rules":[1]}`, `rules[0]: 1 is not an object`},
	{"rule unknown field", doc("", rule("limits", "5")), `rules[0].limits: unknown field (did you mean "limit"?)`},
	{"rule duplicate field", `{"rules":[{"name":"a","name":"b","key":[{"path":true}],"algorithm":"fixed_window","limit":1,"window":"1s"}]}`, `rules[0].name: duplicate field`},

	// name
	{"name missing", doc("", rule("name", "")), `rules[0].name: is required`},
	{"name not a string", doc("", rule("name", "7")), `rules[0].name: 7 is not a string`},
	{"name empty", doc("", rule("name", `""`)), `rules[0].name: "" is empty`},
	{"name bad character", doc("", rule("name", `"a b"`)), `rules[0].name: "a b" may contain only letters, digits, '-', '_' and '.'`},
	{"name too long", doc("", rule("name", `"`+strings.Repeat("n", 65)+`"`)), `rules[0].name: "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"... is longer than 64 bytes`},
	{"name duplicate", doc("", rule(), rule("limit", "5"), rule("name", `"r"`)), "rules[1].name: duplicate rule name \"r\" (also rules[0])\nrules[2].name: duplicate rule name \"r\" (also rules[0])"},

	// key
	{"key missing", doc("", rule("key", "")), `rules[0].key: is required`},
	{"key not a list", doc("", rule("key", `{"path":true}`)), `rules[0].key: {"path":true} is not a list`},
	{"key empty", doc("", rule("key", `[]`)), `rules[0].key: must not be empty`},
	{"key too many parts", doc("", rule("key", `[`+strings.Repeat(`{"path":true},`, 8)+`{"path":true}]`)), `rules[0].key: has 9 parts, more than the limit of 8`},
	{"key part not an object", doc("", rule("key", `["x-api-key"]`)), `rules[0].key[0]: "x-api-key" is not an object`},
	{"key part no source", doc("", rule("key", `[{}]`)), `rules[0].key[0]: needs one of "remote_ip", "header", "query", "cookie", "path", "method", "metadata", "attribute"`},
	{"key part only ipv6_prefix", doc("", rule("key", `[{"ipv6_prefix":64}]`)), `rules[0].key[0]: needs one of "remote_ip", "header", "query", "cookie", "path", "method", "metadata", "attribute"`},
	{"key part several sources", doc("", rule("key", `[{"header":"a","query":"b"}]`)), `rules[0].key[0]: has several sources ("header", "query"); use one per key part`},
	{"key part unknown field", doc("", rule("key", `[{"headers":"a"}]`)), "rules[0].key[0].headers: unknown field (did you mean \"header\"?)\nrules[0].key[0]: needs one of \"remote_ip\", \"header\", \"query\", \"cookie\", \"path\", \"method\", \"metadata\", \"attribute\""},
	{"remote_ip false", doc("", rule("key", `[{"remote_ip":false}]`)), `rules[0].key[0].remote_ip: must be true (remove the key part instead)`},
	{"remote_ip not a boolean", doc("", rule("key", `[{"remote_ip":"yes"}]`)), `rules[0].key[0].remote_ip: "yes" is not a boolean`},
	{"path not a boolean", doc("", rule("key", `[{"path":1}]`)), `rules[0].key[0].path: 1 is not a boolean`},
	{"method false", doc("", rule("key", `[{"method":false}]`)), `rules[0].key[0].method: must be true (remove the key part instead)`},
	{"header name invalid", doc("", rule("key", `[{"header":"x api key"}]`)), `rules[0].key[0].header: "x api key" is not a header name`},
	{"header name empty", doc("", rule("key", `[{"header":""}]`)), `rules[0].key[0].header: "" is not a header name`},
	{"header name not a string", doc("", rule("key", `[{"header":true}]`)), `rules[0].key[0].header: true is not a string`},
	{"query empty", doc("", rule("key", `[{"query":""}]`)), `rules[0].key[0].query: "" is not a query parameter name`},
	{"query with equals", doc("", rule("key", `[{"query":"a=b"}]`)), `rules[0].key[0].query: "a=b" is not a query parameter name`},
	{"query with newline", doc("", rule("key", `[{"query":"a\nb"}]`)), `rules[0].key[0].query: "a\nb" is not a query parameter name`},
	{"cookie invalid", doc("", rule("key", `[{"cookie":"a=b"}]`)), `rules[0].key[0].cookie: "a=b" is not a cookie name`},
	{"ipv6_prefix without remote_ip", doc("", rule("key", `[{"header":"a","ipv6_prefix":64}]`)), `rules[0].key[0].ipv6_prefix: is valid only with "remote_ip"`},
	{"ipv6_prefix zero", doc("", rule("key", `[{"remote_ip":true,"ipv6_prefix":0}]`)), `rules[0].key[0].ipv6_prefix: 0 is out of range 1..128`},
	{"ipv6_prefix too large", doc("", rule("key", `[{"remote_ip":true,"ipv6_prefix":129}]`)), `rules[0].key[0].ipv6_prefix: 129 is out of range 1..128`},
	{"ipv6_prefix not an integer", doc("", rule("key", `[{"remote_ip":true,"ipv6_prefix":"64"}]`)), `rules[0].key[0].ipv6_prefix: "64" is not an integer`},

	// algorithm
	{"algorithm missing", doc("", rule("algorithm", "")), `rules[0].algorithm: is required`},
	{"algorithm unknown", doc("", rule("algorithm", `"gcra"`)), `rules[0].algorithm: "gcra" is not one of token_bucket, leaky_bucket, fixed_window, sliding_log, sliding_window, concurrency`},
	{"algorithm not a string", doc("", rule("algorithm", `1`)), `rules[0].algorithm: 1 is not a string`},

	// limit
	{"limit missing", doc("", rule("limit", "")), `rules[0].limit: is required`},
	{"limit string", doc("", rule("limit", `"100"`)), `rules[0].limit: "100" is not an integer`},
	{"limit fraction", doc("", rule("limit", `1.5`)), `rules[0].limit: 1.5 is not an integer`},
	{"limit exponent", doc("", rule("limit", `1e3`)), `rules[0].limit: 1e3 is not an integer`},
	{"limit null", doc("", rule("limit", `null`)), `rules[0].limit: null is not an integer`},
	{"limit zero", doc("", rule("limit", `0`)), `rules[0].limit: 0 is out of range 1..1000000000`},
	{"limit negative", doc("", rule("limit", `-5`)), `rules[0].limit: -5 is out of range 1..1000000000`},
	{"limit too large", doc("", rule("limit", `1000000001`)), `rules[0].limit: 1000000001 is out of range 1..1000000000`},
	{"limit overflows int64", doc("", rule("limit", `99999999999999999999`)), `rules[0].limit: 99999999999999999999 is out of range 1..1000000000`},
	{"limit too large for sliding_log", doc("", rule("algorithm", `"sliding_log"`, "limit", `20000`)), `rules[0].limit: must be at most 10000 for sliding_log`},

	// window
	{"window missing", doc("", rule("window", "")), `rules[0].window: is required`},
	{"window not a string", doc("", rule("window", `60`)), `rules[0].window: 60 is not a string`},
	{"window bad unit", doc("", rule("window", `"10x"`)), `rules[0].window: "10x" is not a duration`},
	{"window no unit", doc("", rule("window", `"10"`)), `rules[0].window: "10" is not a duration`},
	{"window fraction", doc("", rule("window", `"1.5s"`)), `rules[0].window: "1.5s" is not a duration`},
	{"window negative", doc("", rule("window", `"-1s"`)), `rules[0].window: "-1s" is not a duration`},
	{"window units out of order", doc("", rule("window", `"30s1m"`)), `rules[0].window: "30s1m" is not a duration`},
	{"window repeated unit", doc("", rule("window", `"1s1s"`)), `rules[0].window: "1s1s" is not a duration`},
	{"window with space", doc("", rule("window", `"1m 30s"`)), `rules[0].window: "1m 30s" is not a duration`},
	{"window zero", doc("", rule("window", `"0s"`)), `rules[0].window: "0s" is not longer than zero`},
	{"window too long", doc("", rule("window", `"367d"`)), `rules[0].window: "367d" is longer than the maximum 366d`},
	{"window overflow", doc("", rule("window", `"999999999999999999d"`)), `rules[0].window: "999999999999999999d" is not a duration`},

	// burst
	{"burst on fixed_window", doc("", rule("burst", `5`)), `rules[0].burst: applies only to token_bucket and leaky_bucket, not fixed_window`},
	{"burst on sliding_log", doc("", rule("algorithm", `"sliding_log"`, "burst", `5`)), `rules[0].burst: applies only to token_bucket and leaky_bucket, not sliding_log`},
	{"burst zero", doc("", rule("algorithm", `"token_bucket"`, "burst", `0`)), `rules[0].burst: 0 is out of range 1..1000000000`},
	{"burst not an integer", doc("", rule("algorithm", `"leaky_bucket"`, "burst", `"20"`)), `rules[0].burst: "20" is not an integer`},
	{"burst refill too slow", doc("", rule("algorithm", `"token_bucket"`, "limit", `1`, "window", `"366d"`, "burst", `1000`)), `rules[0].burst: is too large for this limit and window: refilling it would take more than 100 years`},

	// Redis bounds (sluice-redis.wasm; boundaries in TestRedisBoundsInParse)
	{"redis window too long for the limit", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"sliding_window"`, "limit", `104250`, "window", `"1d"`)), `rules[0].window: is too long for this limit/burst on the redis backend (limit × window in µs must stay below 2^53)`},
	{"redis fallback refill too slow", doc(`"redis":{"cluster":"r","instances":2}`, rule("backend", `"redis"`, "algorithm", `"token_bucket"`, "limit", `3`, "window", `"1d"`, "burst", `73202`)), `rules[0].burst: is too large for this limit and window: refilling it would take more than 100 years in the local fallback (limit 1 and burst 36601: divided by redis.instances 2)`},

	// backend, mode, max_keys
	{"backend unknown", doc("", rule("backend", `"memcached"`)), `rules[0].backend: "memcached" is not one of local, redis, rls`},
	{"backend redis without redis", doc("", rule("backend", `"redis"`)), `rules[0].backend: "redis" needs a top-level "redis" object`},
	{"mode unknown", doc("", rule("mode", `"dry_run"`)), `rules[0].mode: "dry_run" is not one of enforce, shadow`},
	{"mode not a string", doc("", rule("mode", `false`)), `rules[0].mode: false is not a string`},
	{"max_keys zero", doc("", rule("max_keys", `0`)), `rules[0].max_keys: 0 is out of range 1..1000000`},
	{"max_keys too large", doc("", rule("max_keys", `1000001`)), `rules[0].max_keys: 1000001 is out of range 1..1000000`},

	// match
	{"match not an object", doc("", rule("match", `"/api"`)), `rules[0].match: "/api" is not an object`},
	{"match unknown field", doc("", rule("match", `{"path":"/api"}`)), `rules[0].match.path: unknown field (did you mean "path_prefix"?)`},
	{"match prefix typo", doc("", rule("match", `{"path_prefx":"/api"}`)), `rules[0].match.path_prefx: unknown field (did you mean "path_prefix"?)`},
	{"path_prefix without slash", doc("", rule("match", `{"path_prefix":"api/"}`)), `rules[0].match.path_prefix: "api/" must start with "/"`},
	{"path_prefix with query", doc("", rule("match", `{"path_prefix":"/api?x=1"}`)), `rules[0].match.path_prefix: "/api?x=1" must not contain "?" or "#" (the query string is not matched)`},
	{"path_prefix with space", doc("", rule("match", `{"path_prefix":"/a b"}`)), `rules[0].match.path_prefix: "/a b" must not contain spaces or control characters`},
	{"path_prefix with dot segment", doc("", rule("match", `{"path_prefix":"/api/../admin/"}`)), `rules[0].match.path_prefix: "/api/../admin/" is not in normal form, and requests are matched in normal form (Envoy's normalize_path and merge_slashes): write "/admin/"`},
	{"path_prefix with escaped letter", doc("", rule("match", `{"path_prefix":"/%7Euser//x"}`)), `rules[0].match.path_prefix: "/%7Euser//x" is not in normal form, and requests are matched in normal form (Envoy's normalize_path and merge_slashes): write "/~user/x"`},
	{"path_prefix not a string", doc("", rule("match", `{"path_prefix":["/a"]}`)), `rules[0].match.path_prefix: ["/a"] is not a string`},
	{"methods not a list", doc("", rule("match", `{"methods":"GET"}`)), `rules[0].match.methods: "GET" is not a list`},
	{"methods empty", doc("", rule("match", `{"methods":[]}`)), `rules[0].match.methods: must not be empty (omit it to match every method)`},
	{"method invalid", doc("", rule("match", `{"methods":["GET","PO ST"]}`)), `rules[0].match.methods[1]: "PO ST" is not an HTTP method`},
	{"method not a string", doc("", rule("match", `{"methods":[1]}`)), `rules[0].match.methods[0]: 1 is not a string`},
	{"method duplicate", doc("", rule("match", `{"methods":["get","GET"]}`)), `rules[0].match.methods[1]: duplicate method "GET"`},
	{"headers empty", doc("", rule("match", `{"headers":[]}`)), `rules[0].match.headers: must not be empty (omit it to match any headers)`},
	{"headers not a list", doc("", rule("match", `{"headers":{"name":"a","exact":"b"}}`)), `rules[0].match.headers: {"name":"a","exact":"b"} is not a list`},
	{"header match not an object", doc("", rule("match", `{"headers":["x-a"]}`)), `rules[0].match.headers[0]: "x-a" is not an object`},
	{"header match name missing", doc("", rule("match", `{"headers":[{"exact":"b"}]}`)), `rules[0].match.headers[0].name: is required`},
	{"header match exact missing", doc("", rule("match", `{"headers":[{"name":"a"}]}`)), `rules[0].match.headers[0].exact: is required (or "absent": true to match a request without the header)`},
	{"header match name invalid", doc("", rule("match", `{"headers":[{"name":"a:b","exact":"b"}]}`)), `rules[0].match.headers[0].name: "a:b" is not a header name`},
	{"header match exact not a string", doc("", rule("match", `{"headers":[{"name":"a","exact":1}]}`)), `rules[0].match.headers[0].exact: 1 is not a string`},
	{"header match duplicate", doc("", rule("match", `{"headers":[{"name":"x-a","exact":"1"},{"name":"X-A","exact":"2"}]}`)), `rules[0].match.headers[1].name: duplicate header "x-a"`},
	{"header match unknown field", doc("", rule("match", `{"headers":[{"name":"a","prefix":"b"}]}`)), "rules[0].match.headers[0].prefix: unknown field\nrules[0].match.headers[0].exact: is required (or \"absent\": true to match a request without the header)"},

	// response
	{"response not an object", doc(`"response":429`, rule()), `response: 429 is not an object`},
	{"status too low", doc(`"response":{"status":199}`, rule()), `response.status: 199 is out of range 200..599`},
	{"status too high", doc(`"response":{"status":600}`, rule()), `response.status: 600 is out of range 200..599`},
	{"status not an integer", doc(`"response":{"status":"429"}`, rule()), `response.status: "429" is not an integer`},
	{"body not a string", doc(`"response":{"body":{"error":"x"}}`, rule()), `response.body: {"error":"x"} is not a string`},
	{"body too long", doc(`"response":{"body":"`+strings.Repeat("b", 65537)+`"}`, rule()), `response.body: is 65537 bytes, more than the limit of 65536`},
	{"grpc_status OK", doc(`"response":{"grpc_status":0}`, rule()), `response.grpc_status: 0 is out of range 1..16`},
	{"grpc_status unknown", doc(`"response":{"grpc_status":17}`, rule()), `response.grpc_status: 17 is out of range 1..16`},
	{"grpc_status name", doc(`"response":{"grpc_status":"RESOURCE_EXHAUSTED"}`, rule()), `response.grpc_status: "RESOURCE_EXHAUSTED" is not an integer`},
	{"headers style unknown", doc(`"response":{"headers":"all"}`, rule()), `response.headers: "all" is not one of both, draft, legacy, none`},
	{"response unknown field", doc(`"response":{"code":429}`, rule()), `response.code: unknown field`},

	// failure_mode, client_ip
	{"failure_mode unknown", doc(`"failure_mode":"fail_open"`, rule()), `failure_mode: "fail_open" is not one of open, closed, local`},
	{"failure_mode local without redis rules", doc(`"failure_mode":"local",`+redisObj, rule()), `failure_mode: "local" needs at least one rule with backend "redis" or "rls"`},
	{"client_ip not an object", doc(`"client_ip":1`, rule()), `client_ip: 1 is not an object`},
	{"xff_trusted_hops negative", doc(`"client_ip":{"xff_trusted_hops":-1}`, rule()), `client_ip.xff_trusted_hops: -1 is out of range 0..64`},
	{"proxy_appends_xff without hops", doc(`"client_ip":{"proxy_appends_xff":true}`, rule()), `client_ip.proxy_appends_xff: true has no effect without xff_trusted_hops >= 1 (the client is then source.address, which X-Forwarded-For does not change)`},
	{"proxy_appends_xff not a boolean", doc(`"client_ip":{"xff_trusted_hops":1,"proxy_appends_xff":"yes"}`, rule()), `client_ip.proxy_appends_xff: "yes" is not a boolean`},
	{"xff_trusted_hops too large", doc(`"client_ip":{"xff_trusted_hops":65}`, rule()), `client_ip.xff_trusted_hops: 65 is out of range 0..64`},
	{"client_ip unknown field", doc(`"client_ip":{"trust_xff":true}`, rule()), `client_ip.trust_xff: unknown field`},

	// redis
	{"redis not an object", doc(`"redis":"redis:6379"`, rule("backend", `"redis"`)), `redis: "redis:6379" is not an object`},
	{"redis cluster missing", doc(`"redis":{}`, rule()), `redis.cluster: is required`},
	{"redis cluster empty", doc(`"redis":{"cluster":""}`, rule()), `redis.cluster: must not be empty`},
	{"redis cluster not a string", doc(`"redis":{"cluster":6379}`, rule()), `redis.cluster: 6379 is not a string`},
	{"redis timeout zero", doc(`"redis":{"cluster":"r","timeout_ms":0}`, rule()), `redis.timeout_ms: 0 is out of range 1..60000`},
	{"redis timeout fraction", doc(`"redis":{"cluster":"r","timeout_ms":0.5}`, rule()), `redis.timeout_ms: 0.5 is not an integer`},
	{"redis instances zero", doc(`"redis":{"cluster":"r","instances":0}`, rule()), `redis.instances: 0 is out of range 1..10000`},
	{"redis password not a string", doc(`"redis":{"cluster":"r","password":123}`, rule()), `redis.password: 123 is not a string`},
	{"redis username not a string", doc(`"redis":{"cluster":"r","username":null}`, rule()), `redis.username: null is not a string`},
	{"redis unknown field", doc(`"redis":{"cluster":"r","timeout":50}`, rule()), `redis.timeout: unknown field (did you mean "timeout_ms"?)`},
	// rls
	{"backend rls without rls", doc("", rule("backend", `"rls"`)), `rules[0].backend: "rls" needs a top-level "rls" object`},
	{"rls not an object", doc(`"rls":"rls"`, rule("backend", `"rls"`)), `rls: "rls" is not an object`},
	{"rls cluster and domain missing", doc(`"rls":{}`, rule()), "rls.cluster: is required\nrls.domain: is required"},
	{"rls domain empty", doc(`"rls":{"cluster":"rls","domain":""}`, rule()), `rls.domain: must not be empty`},
	{"rls domain not a string", doc(`"rls":{"cluster":"rls","domain":7}`, rule()), `rls.domain: 7 is not a string`},
	{"rls domain too long", doc(`"rls":{"cluster":"rls","domain":"`+strings.Repeat("d", 257)+`"}`, rule()), `rls.domain: is longer than 256 bytes`},
	{"rls timeout zero", doc(`"rls":{"cluster":"rls","domain":"d","timeout_ms":0}`, rule()), `rls.timeout_ms: 0 is out of range 1..60000`},
	{"rls instances zero", doc(`"rls":{"cluster":"rls","domain":"d","instances":0}`, rule()), `rls.instances: 0 is out of range 1..10000`},
	{"rls unknown field", doc(`"rls":{"cluster":"rls","domain":"d","domian":"e"}`, rule()), `rls.domian: unknown field (did you mean "domain"?)`},
	{"rls window too long for the limit", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"sliding_window"`, "limit", `104250`, "window", `"1d"`)), `rules[0].window: is too long for this limit/burst on the redis backend (limit × window in µs must stay below 2^53)`},
	{"rls and redis rules mixed", doc(rlsObj+","+redisObj, rule("backend", `"redis"`)+`,{"name":"s","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":10,"window":"1s","backend":"rls"}`), `rules[1].backend: "rls" and "redis" rules cannot be mixed in one configuration (one remote backend per configuration)`},
	{"rls fallback refill too slow", doc(`"rls":{"cluster":"r","domain":"d","instances":2}`, rule("backend", `"rls"`, "algorithm", `"token_bucket"`, "limit", `3`, "window", `"1d"`, "burst", `73202`)), `rules[0].burst: is too large for this limit and window: refilling it would take more than 100 years in the local fallback (limit 1 and burst 36601: divided by rls.instances 2)`},

	// Input is echoed quoted and escaped: a field name that is not plain is
	// written in brackets (`path["name"]`), values as Go-quoted strings or
	// compact JSON, long ones cut with "..." after the closing quote.
	{"forged line in a field name", doc(`"ok\nrules[0].limit: 0 is out of range":1`, rule()), `["ok\nrules[0].limit: 0 is out of range"]: unknown field`},
	{"field name with a space", doc("", rule("a b", "1")), `rules[0]["a b"]: unknown field`},
	{"field name in a header match", doc("", rule("match", `{"headers":[{"name":"a","exact":"b"},{"name":"c","exact":"d","x\ny":1}]}`)), `rules[0].match.headers[1]["x\ny"]: unknown field`},
	{"field name NUL and escape", doc(`"\u0000\u001b[31m":1`, rule()), `["\x00\x1b[31m"]: unknown field`},
	{"field name DEL and line separator", doc("\"a\x7f\u2028\":1", rule()), `["a\x7f\u2028"]: unknown field`},
	{"field name quote and backslash", doc(`"a\"b\\c":1`, rule()), `["a\"b\\c"]: unknown field`},
	{"field name lone surrogate (gjson decodes it as U+FFFD)", doc(`"\ud800":1`, rule()), `["�"]: unknown field`},
	{"field name empty", doc(`"":1`, rule()), `[""]: unknown field`},
	{"field name long", doc(`"`+strings.Repeat("a", 100)+`":1`, rule()), `["` + strings.Repeat("a", 59) + `"...]: unknown field`},
	{"field name long escaped", doc(`"`+strings.Repeat(`\n`, 40)+`":1`, rule()), `["` + strings.Repeat(`\n`, 29) + `"...]: unknown field`},
	{"field name typo with a newline", doc("", rule(`limit\n`, "1")), `rules[0]["limit\n"]: unknown field (did you mean "limit"?)`},
	{"field name duplicate escaped", doc(`"a\tb":1,"a\tb":2`, rule()), "[\"a\\tb\"]: unknown field\n[\"a\\tb\"]: unknown field"},
	{"value with control characters", doc("", rule("name", `"a\u0007\u009b[2J\u202e"`)), `rules[0].name: "a\a\u009b[2J\u202e" may contain only letters, digits, '-', '_' and '.'`},
	{"value raw DEL", doc("", rule("name", "\"a\x7fb\"")), `rules[0].name: "a\x7fb" may contain only letters, digits, '-', '_' and '.'`},
	{"value object on several lines", doc("", rule("limit", "{\n\t\"a\" : [1, \"x\u2029\"]\n}")), `rules[0].limit: {"a":[1,"x\u2029"]} is not an integer`},
	{"value object cut", doc("", rule("limit", `{"aaaaaaaaaaaaaaaaaaaa":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}`)), `rules[0].limit: {"aaaaaaaaaaaaaaaaaaaa":"bbbbbbbbbbbb... is not an integer`},
	{"value long number", doc("", rule("limit", strings.Repeat("9", 50))), `rules[0].limit: ` + strings.Repeat("9", 37) + `... is out of range 1..1000000000`},
	{"value long string cut", doc("", rule("window", `"`+strings.Repeat("\u00e9", 30)+`"`)), `rules[0].window: "` + strings.Repeat("é", 17) + `"... is not a duration`},
	{"enum value with a newline", doc(`"failure_mode":"open\nrules[0].limit: x"`, rule()), `failure_mode: "open\nrules[0].limit: x" is not one of open, closed, local`},
	{"method with a newline", doc("", rule("match", `{"methods":["GET\nX"]}`)), `rules[0].match.methods[0]: "GET\nX" is not an HTTP method`},
	{"header name with a newline", doc("", rule("key", `[{"header":"x\r\ny"}]`)), `rules[0].key[0].header: "x\r\ny" is not a header name`},

	// Several problems at once: all reported, in document order.
	{"all errors collected", doc(`"response":{"status":1000}`,
		rule("name", `"a"`, "window", `"10x"`),
		rule("name", `"b"`, "limit", `0`, "key", `[]`),
		rule("name", `"a"`, "algorithm", `"x"`)),
		"rules[0].window: \"10x\" is not a duration\n" +
			"rules[1].key: must not be empty\n" +
			"rules[1].limit: 0 is out of range 1..1000000000\n" +
			"rules[2].name: duplicate rule name \"a\" (also rules[0])\n" +
			"rules[2].algorithm: \"x\" is not one of token_bucket, leaky_bucket, fixed_window, sliding_log, sliding_window, concurrency\n" +
			"response.status: 1000 is out of range 200..599"},
}

func TestParseErrors(t *testing.T) {
	seen := map[string]bool{}
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			if seen[tc.name] {
				t.Fatalf("duplicate test name")
			}
			seen[tc.name] = true
			c, err := Parse([]byte(tc.json))
			if err == nil {
				t.Fatalf("Parse(%s) succeeded, want error %q", tc.json, tc.want)
			}
			if c != nil {
				t.Errorf("Parse returned a config with an error")
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("Parse(%.200s)\n got: %s\nwant: %s", tc.json, got, tc.want)
			}
			var errs Errors
			if !errors.As(err, &errs) || len(errs) != strings.Count(tc.want, "\n")+1 {
				t.Errorf("error is %T with %d entries, want Errors with one per line", err, len(errs))
			}
		})
	}
}

// TestParseByteOrderMark: one UTF-8 byte-order mark before the text is
// ignored (RFC 8259, section 8.1), for both builds; what follows it is
// parsed as if it were not there.
func TestParseByteOrderMark(t *testing.T) {
	for _, in := range []string{designExample, doc("", rule()), " \n" + doc("", rule("name", `"a"`)) + "\n"} {
		for _, b := range []Build{BuildLocal, BuildRedis} {
			want, werr := ParseFor([]byte(in), b)
			got, err := ParseFor([]byte(ByteOrderMark+in), b)
			if werr != nil || err != nil || len(got.Rules) != len(want.Rules) || got.Rules[0].Summary() != want.Rules[0].Summary() {
				t.Errorf("%v: %.40q with a byte-order mark: %v, without: %v", b, in, err, werr)
			}
		}
	}
	if s := TrimByteOrderMark([]byte("\xef\xbb{}")); string(s) != "\xef\xbb{}" {
		t.Errorf("half a mark trimmed: %q", s)
	}
}

func TestParseTooLarge(t *testing.T) {
	data := []byte(doc(`"response":{"body":"`+strings.Repeat("b", MaxConfigSize)+`"}`, rule()))
	_, err := Parse(data)
	want := "configuration: " + strconv.Itoa(len(data)) + " bytes is more than the limit of " + strconv.Itoa(MaxConfigSize)
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
}

func TestParseErrorsCapped(t *testing.T) {
	rules := make([]string, 70)
	for i := range rules {
		rules[i] = `{}` // five "is required" errors each
	}
	_, err := Parse([]byte(doc("", rules...)))
	var errs Errors
	if !errors.As(err, &errs) {
		t.Fatalf("got %v", err)
	}
	if len(errs) != MaxErrors+1 {
		t.Fatalf("got %d entries, want %d", len(errs), MaxErrors+1)
	}
	if got, want := errs[MaxErrors].Error(), "configuration: and 300 more errors"; got != want {
		t.Errorf("last entry %q, want %q", got, want)
	}
	if got, want := errs[0].Error(), "rules[0].name: is required"; got != want {
		t.Errorf("first entry %q, want %q", got, want)
	}
}

func TestErrorPathAndMessage(t *testing.T) {
	_, err := Parse([]byte(doc("", rule(), rule("name", `"b"`, "window", `"10x"`))))
	var errs Errors
	if !errors.As(err, &errs) || len(errs) != 1 {
		t.Fatalf("got %v", err)
	}
	if errs[0].Path != "rules[1].window" || errs[0].Msg != `"10x" is not a duration` {
		t.Errorf("got path %q msg %q", errs[0].Path, errs[0].Msg)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse([]byte(doc("", rule("algorithm", `"token_bucket"`))))
	if err != nil {
		t.Fatal(err)
	}
	if c.Response != (Response{Status: 429, Body: "rate limited\n", Headers: HeadersBoth, GRPCStatus: 8}) {
		t.Errorf("response %+v", c.Response)
	}
	if c.FailureMode != FailOpen || c.ClientIP.XFFTrustedHops != 0 || c.Redis != nil || c.HasRedisRules() {
		t.Errorf("top-level defaults: %+v", c)
	}
	if len(c.Rules) != 1 {
		t.Fatalf("%d rules", len(c.Rules))
	}
	r := c.Rules[0]
	if r.Burst != 10 || r.Backend != BackendLocal || r.Mode != ModeEnforce || r.MaxKeys != DefaultMaxKeys || !r.Match.IsZero() {
		t.Errorf("rule defaults: %+v", r)
	}
	if r.Limiter == nil || r.Limiter.Kind() != algorithms.TokenBucket {
		t.Fatalf("limiter %v", r.Limiter)
	}
	if p := r.Limiter.Params(); p != (algorithms.Params{Limit: 10, Window: time.Second, Burst: 10}) {
		t.Errorf("limiter params %+v", p)
	}
	// An explicit "local" failure mode parses with a Redis rule; redis defaults.
	c, err = Parse([]byte(doc(`"failure_mode":"local",`+redisObj, rule("backend", `"redis"`))))
	if err != nil {
		t.Fatal(err)
	}
	if c.FailureMode != FailLocal || !c.HasRedisRules() {
		t.Errorf("failure mode %v, redis rules %v", c.FailureMode, c.HasRedisRules())
	}
	if *c.Redis != (Redis{Cluster: "redis", TimeoutMS: 50, Instances: 1}) {
		t.Errorf("redis %+v", *c.Redis)
	}
	// An RLS rule: in both builds (sluice.wasm has the rls backend), with
	// the Redis scripts' bounds and a local fallback; rls defaults.
	for _, b := range []Build{BuildLocal, BuildRedis} {
		c, err = ParseFor([]byte(doc(`"failure_mode":"local",`+rlsObj, rule("backend", `"rls"`))), b)
		if err != nil {
			t.Fatalf("%v: %v", b, err)
		}
		if !c.HasRLSRules() || c.HasRedisRules() || c.Rules[0].Backend != BackendRLS || c.Rules[0].Fallback == nil {
			t.Errorf("%v: rls rules %v, rule %+v", b, c.HasRLSRules(), c.Rules[0])
		}
		if *c.RLS != (RLS{Cluster: "rls", Domain: "edge", TimeoutMS: 100, Instances: 1}) {
			t.Errorf("rls %+v", *c.RLS)
		}
	}
}

// designExample is the configuration shown in DESIGN.md.
const designExample = `{
  "rules": [{
    "name": "api-per-key",
    "match": {"path_prefix": "/api/", "methods": ["GET", "POST"],
              "headers": [{"name": "x-tenant", "exact": "acme"}]},
    "key": [{"header": "x-api-key"}],
    "algorithm": "token_bucket",
    "limit": 100, "window": "1m", "burst": 20,
    "backend": "local",
    "mode": "enforce"
  }],
  "response": {"status": 429, "body": "rate limited\n", "headers": "both"},
  "failure_mode": "open",
  "client_ip": {"xff_trusted_hops": 0},
  "redis": {"cluster": "outbound|6379||redis.default.svc.cluster.local", "timeout_ms": 50}
}`

func TestParseDesignExample(t *testing.T) {
	c, err := Parse([]byte(designExample))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Rules: []*Rule{{
			Name: "api-per-key",
			Match: Match{PathPrefix: "/api/", Methods: []string{"GET", "POST"},
				Headers: []HeaderMatch{{Name: "x-tenant", Exact: "acme"}}},
			Key:       []KeyPart{{Header: "x-api-key"}},
			Algorithm: algorithms.TokenBucket,
			Limit:     100, Window: time.Minute, Burst: 20,
			MaxKeys: DefaultMaxKeys,
		}},
		Response: Response{Status: 429, Body: "rate limited\n", GRPCStatus: 8},
		Redis:    &Redis{Cluster: "outbound|6379||redis.default.svc.cluster.local", TimeoutMS: 50, Instances: 1},
	}
	got := *c
	got.Rules = nil
	w := *want
	w.Rules = nil
	if got.Response != w.Response || got.FailureMode != w.FailureMode || got.ClientIP != w.ClientIP || *got.Redis != *w.Redis {
		t.Errorf("top level\n got %+v\nwant %+v", got, w)
	}
	r := c.Rules[0]
	if r.Limiter == nil || r.Limiter.Params() != (algorithms.Params{Limit: 100, Window: time.Minute, Burst: 20}) {
		t.Errorf("limiter %v", r.Limiter)
	}
	r2 := *r
	r2.Limiter = nil
	if !rulesEqual(&r2, want.Rules[0]) {
		t.Errorf("rule\n got %+v\nwant %+v", r2, *want.Rules[0])
	}
	const summary = `api-per-key: token_bucket 100/1m burst 20 key=header:x-api-key match=path_prefix:/api/ methods:GET,POST header:x-tenant="acme" local enforce`
	if s := r.Summary(); s != summary {
		t.Errorf("summary\n got %s\nwant %s", s, summary)
	}
}

func rulesEqual(a, b *Rule) bool {
	if a.Index != b.Index || a.Name != b.Name || a.Algorithm != b.Algorithm || a.Limit != b.Limit ||
		a.Window != b.Window || a.Burst != b.Burst || a.Backend != b.Backend || a.Mode != b.Mode ||
		a.MaxKeys != b.MaxKeys || a.Match.PathPrefix != b.Match.PathPrefix ||
		strings.Join(a.Match.Methods, ",") != strings.Join(b.Match.Methods, ",") ||
		len(a.Match.Headers) != len(b.Match.Headers) || len(a.Key) != len(b.Key) {
		return false
	}
	for i := range a.Match.Headers {
		if a.Match.Headers[i] != b.Match.Headers[i] {
			return false
		}
	}
	for i := range a.Key {
		if a.Key[i] != b.Key[i] {
			return false
		}
	}
	return true
}

func TestParseEveryFeature(t *testing.T) {
	data := doc(`"failure_mode":"local","response":{"status":503,"body":"","headers":"none","grpc_status":14},"client_ip":{"xff_trusted_hops":2,"proxy_appends_xff":true},`+
		`"redis":{"cluster":"redis","timeout_ms":20,"instances":3,"username":"u","password":"p"}`,
		rule("name", `"ip"`, "key", `[{"remote_ip":true,"ipv6_prefix":64},{"method":true},{"path":true}]`,
			"algorithm", `"leaky_bucket"`, "burst", `5`, "window", `"1m30s"`, "mode", `"shadow"`, "max_keys", `500`),
		rule("name", `"q"`, "key", `[{"query":"k"},{"cookie":"sid"},{"header":"X-Api-Key"}]`,
			"algorithm", `"sliding_window"`, "limit", `1000`, "window", `"1d"`, "backend", `"redis"`,
			"match", `{"methods":["delete"],"headers":[{"name":":Authority","exact":"a.example"}]}`),
		rule("name", `"log"`, "algorithm", `"sliding_log"`, "limit", `10000`, "window", `"500ms"`))
	c, err := Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if c.FailureMode != FailLocal || c.ClientIP != (ClientIP{XFFTrustedHops: 2, ProxyAppendsXFF: true}) || c.ClientIP.XFFPosition() != 3 ||
		c.Response != (Response{Status: 503, Body: "", Headers: HeadersNone, GRPCStatus: 14}) ||
		*c.Redis != (Redis{Cluster: "redis", TimeoutMS: 20, Instances: 3, Username: "u", Password: "p"}) {
		t.Errorf("top level %+v %+v", c, *c.Redis)
	}
	want := []string{
		"ip: leaky_bucket 10/1m30s burst 5 key=remote_ip/64+method+path match=all local shadow max_keys=500",
		`q: sliding_window 1000/1d key=query:k+cookie:sid+header:x-api-key match=methods:DELETE header::authority="a.example" redis enforce`,
		"log: sliding_log 10000/500ms key=remote_ip match=all local enforce",
	}
	for i, r := range c.Rules {
		if r.Index != i {
			t.Errorf("rule %d has index %d", i, r.Index)
		}
		if s := r.Summary(); s != want[i] {
			t.Errorf("summary %d\n got %s\nwant %s", i, s, want[i])
		}
		if r.Limiter == nil || r.Limiter.Kind() != r.Algorithm {
			t.Errorf("rule %d limiter %v", i, r.Limiter)
		}
	}
	if c.Rules[2].Burst != 10000 {
		t.Errorf("window algorithm burst %d, want limit", c.Rules[2].Burst)
	}
}

func TestDuration(t *testing.T) {
	good := map[string]time.Duration{
		"500ms":    500 * time.Millisecond,
		"1s":       time.Second,
		"1m":       time.Minute,
		"1h":       time.Hour,
		"1d":       24 * time.Hour,
		"1m30s":    90 * time.Second,
		"1d2h3m4s": 26*time.Hour + 3*time.Minute + 4*time.Second,
		"1s5ms":    time.Second + 5*time.Millisecond,
		"0s":       0,
		"90s":      90 * time.Second,
	}
	for s, want := range good {
		d, ok := ParseDuration(s)
		if !ok || d != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", s, d, ok, want)
		}
	}
	for _, s := range []string{"", "s", "1", "1x", "1S", "1.5s", "-1s", "+1s", "1m1m", "1s1m", "1ms1s", "1 s", " 1s", "1us", "1ns", "1msx", "9223372036854775807ms", "9999999999999999999s"} {
		if d, ok := ParseDuration(s); ok {
			t.Errorf("ParseDuration(%q) = %v, want failure", s, d)
		}
	}
	for d, want := range map[time.Duration]string{
		time.Second: "1s", 90 * time.Second: "1m30s", 500 * time.Millisecond: "500ms",
		25 * time.Hour: "1d1h", 24 * time.Hour: "1d", time.Microsecond: "1µs", 0: "0s",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
	// FormatDuration output parses back to the same value.
	for _, d := range []time.Duration{1, 999, 1000, 61001, 86400001} {
		d *= time.Millisecond
		if back, ok := ParseDuration(FormatDuration(d)); !ok || back != d {
			t.Errorf("round trip %v -> %q -> %v", d, FormatDuration(d), back)
		}
	}
}

func TestEnumStrings(t *testing.T) {
	if BackendRedis.String() != "redis" || ModeShadow.String() != "shadow" || FailClosed.String() != "closed" ||
		HeadersLegacy.String() != "legacy" || Mode(9).String() != "unknown(9)" {
		t.Error("enum names")
	}
}
