package rls

import (
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-proxy/sluice/algorithms"
)

func parse(t testing.TB, docs ...string) *Config {
	t.Helper()
	var names []string
	var data [][]byte
	for i, d := range docs {
		names = append(names, "doc"+string(rune('0'+i)))
		data = append(data, []byte(d))
	}
	c, err := ParseConfig(names, data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The examples of envoyproxy/ratelimit's README ("Configuration"
// section), with the limit each descriptor gets there.
const readmeConfig = `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    rate_limit:
      unit: second
      requests_per_unit: 50
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
    descriptors:
      - key: path
        rate_limit:
          unit: minute
          requests_per_unit: 7
  - key: to_cluster
    value: mongo
    descriptors:
      - key: from_cluster
        value: api
        rate_limit:
          unit: hour
          requests_per_unit: 3
  - key: path
    value: files*
    rate_limit:
      unit: day
      requests_per_unit: 20
  - key: path
    value: /api/*/action
    rate_limit:
      unit: week
      requests_per_unit: 21
  - key: path
    rate_limit:
      unit: month
      requests_per_unit: 22
  - key: year
    rate_limit:
      unit: YEAR
      requests_per_unit: 23
  - key: free
    rate_limit:
      unlimited: true
`

func TestLookupMatching(t *testing.T) {
	c := parse(t, readmeConfig)
	cases := []struct {
		name   string
		domain string
		d      *ratelimitv3.RateLimitDescriptor
		want   uint32 // requests_per_unit; 0 = no limit
		window time.Duration
	}{
		{"key and value beat key alone", "mongo_cps", desc("database", "users"), 500, time.Second},
		{"key alone is the default for other values", "mongo_cps", desc("database", "orders"), 50, time.Second},
		{"a limit on a parent applies to a one-entry descriptor", "mongo_cps", desc("remote_address", "10.0.0.1"), 10, time.Second},
		{"nested", "mongo_cps", desc("remote_address", "10.0.0.1", "path", "/x"), 7, time.Minute},
		{"more entries than the configuration", "mongo_cps", desc("database", "users", "x", "y"), 0, 0},
		{"the walk stops at a node without a limit", "mongo_cps", desc("to_cluster", "mongo"), 0, 0},
		{"two levels of values", "mongo_cps", desc("to_cluster", "mongo", "from_cluster", "api"), 3, time.Hour},
		{"a wrong value at the second level", "mongo_cps", desc("to_cluster", "mongo", "from_cluster", "web"), 0, 0},
		{"trailing wildcard", "mongo_cps", desc("path", "files/a.pdf"), 20, 24 * time.Hour},
		{"wildcard matches the empty rest", "mongo_cps", desc("path", "files"), 20, 24 * time.Hour},
		{"middle wildcard", "mongo_cps", desc("path", "/api/v1/action"), 21, 7 * 24 * time.Hour},
		{"middle wildcard needs the suffix", "mongo_cps", desc("path", "/api/v1/other"), 22, 30 * 24 * time.Hour},
		{"unit names are case-insensitive; a year is 365 days", "mongo_cps", desc("year", "x"), 23, 365 * 24 * time.Hour},
		{"unknown key", "mongo_cps", desc("nothing", "x"), 0, 0},
		{"unknown domain", "other", desc("database", "users"), 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := c.lookup(tc.domain, tc.d)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == 0 {
				if m != nil {
					t.Fatalf("got limit %+v, want none", m.limit)
				}
				return
			}
			if m == nil || m.limit.RequestsPerUnit != tc.want || m.limit.Params.Window != tc.window || m.limit.Kind != algorithms.FixedWindow {
				t.Fatalf("got %+v, want %d per %v fixed_window", m, tc.want, tc.window)
			}
		})
	}
	m, err := c.lookup("mongo_cps", desc("free", "x"))
	if err != nil || m == nil || !m.limit.Unlimited {
		t.Fatalf("unlimited: %+v %v", m, err)
	}
}

func TestLookupOverride(t *testing.T) {
	c := parse(t, readmeConfig)
	d := desc("database", "users")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 42, Unit: typev3.RateLimitUnit_HOUR}
	m, err := c.lookup("mongo_cps", d)
	if err != nil || m == nil || !m.override || m.limit.RequestsPerUnit != 42 || m.limit.Params.Window != time.Hour || m.limit.Unit != pb.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("override: %+v %v", m, err)
	}
	// An override applies to a descriptor the configuration does not know,
	// but only in a known domain (as envoyproxy/ratelimit).
	d = desc("anything", "x")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND}
	if m, err := c.lookup("mongo_cps", d); err != nil || m == nil || m.limit.RequestsPerUnit != 1 {
		t.Fatalf("override of an unknown descriptor: %+v %v", m, err)
	}
	if m, err := c.lookup("other", d); err != nil || m != nil {
		t.Fatalf("override in an unknown domain: %+v %v", m, err)
	}
	// The override keeps the algorithm of the configured limit the entries
	// match (burst = the overriding limit), never shadow mode.
	c2 := parse(t, "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 9}\n")
	d2 := desc("k", "v")
	d2.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 50, Unit: typev3.RateLimitUnit_MINUTE}
	if m, err := c2.lookup("d", d2); err != nil || m == nil || m.limit.Kind != algorithms.TokenBucket || m.limit.Shadow ||
		m.limit.Params != (algorithms.Params{Limit: 50, Window: time.Minute, Burst: 50}) {
		t.Fatalf("override of a token_bucket limit: %+v %v", m, err)
	}
	d.Limit.Unit = typev3.RateLimitUnit_UNKNOWN
	if _, err := c.lookup("mongo_cps", d); err == nil || !strings.Contains(err.Error(), "unit UNKNOWN") {
		t.Fatalf("override with unit UNKNOWN: %v", err)
	}
}

func TestConfigAlgorithmAndBurst(t *testing.T) {
	c := parse(t, `
domain: d
descriptors:
  - key: k
    value: tb
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 10}
  - key: k
    value: sw
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window}
  - key: k
    value: 200
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: 010
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: n
    value: yes
    rate_limit: {unit: second, requests_per_unit: 3}
`)
	m, _ := c.lookup("d", desc("k", "tb"))
	if m == nil || m.limit.Kind != algorithms.TokenBucket || m.limit.Params != (algorithms.Params{Limit: 60, Window: time.Minute, Burst: 10}) {
		t.Fatalf("token_bucket: %+v", m)
	}
	m, _ = c.lookup("d", desc("k", "sw"))
	if m == nil || m.limit.Kind != algorithms.SlidingWindow || m.limit.Params.Limit != 5 {
		t.Fatalf("sliding_window: %+v", m)
	}
	// Scalars are read as their text, as envoyproxy/ratelimit's decoder
	// (yaml.v2) does: not as the number or boolean YAML 1.1 would make them.
	for _, tc := range []struct {
		k, v string
		want uint32
	}{{"k", "200", 1}, {"k", "010", 2}, {"n", "yes", 3}} {
		if m, _ = c.lookup("d", desc(tc.k, tc.v)); m == nil || m.limit.RequestsPerUnit != tc.want {
			t.Errorf("%s=%s: %+v, want the limit of %d", tc.k, tc.v, m, tc.want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct{ name, yaml, want string }{
		{"unknown key", "domain: d\ndescriptors:\n  - key: k\n    rate_limt: {unit: second}\n", "unknown key 'rate_limt'"},
		{"unknown key in rate_limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, per: 2}\n", "unknown key 'per'"},
		{"empty domain", "descriptors: []\n", "cannot have empty domain"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "descriptor has empty key"},
		{"invalid unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"},
		{"unlimited with a unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unlimited: true}\n", "should not specify rate limit unit when unlimited"},
		{"duplicate composite key", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n", "duplicate descriptor composite key 'd.k_v'"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n", "replaces should not contain name of same descriptor"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "empty replaces entry"},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "share_threshold can only be used with wildcard"},
		{"unknown algorithm", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcra}\n", "unknown algorithm 'gcra'"},
		{"burst on fixed_window", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 3}\n", "burst applies only to token_bucket and leaky_bucket"},
		{"sliding_log above its limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 20000, algorithm: sliding_log}\n", "limit"},
		{"beyond the scripts' bounds", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 100000000, algorithm: sliding_window}\n", "window is too long"},
		{"negative requests_per_unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "error loading config file"},
		{"not YAML", "domain: [\n", "error loading config file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]string{"f.yaml"}, [][]byte{[]byte(tc.yaml)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "f.yaml: ") {
				t.Fatalf("got %v, want an error of f.yaml containing %q", err, tc.want)
			}
		})
	}
	_, err := ParseConfig([]string{"a", "b"}, [][]byte{[]byte("domain: d\n"), []byte("domain: d\n")})
	if err == nil || !strings.Contains(err.Error(), "b: duplicate domain 'd'") {
		t.Fatalf("duplicate domain: %v", err)
	}
	// MergeDomains (MERGE_DOMAIN_CONFIG): one domain from several files; a
	// composite key defined in two of them is still an error.
	a := []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	b := []byte("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	c, err := ParseConfigWith([]string{"a", "b"}, [][]byte{a, b}, ConfigOptions{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	if ma, _ := c.lookup("d", desc("a", "x")); ma == nil || ma.limit.RequestsPerUnit != 1 {
		t.Fatalf("merged a: %+v", ma)
	}
	if mb, _ := c.lookup("d", desc("b", "x")); mb == nil || mb.limit.RequestsPerUnit != 2 {
		t.Fatalf("merged b: %+v", mb)
	}
	if _, err := ParseConfigWith([]string{"a", "a2"}, [][]byte{a, a}, ConfigOptions{MergeDomains: true}); err == nil ||
		!strings.Contains(err.Error(), "a2: duplicate descriptor composite key 'd.a'") {
		t.Fatalf("merged duplicate key: %v", err)
	}
}

func TestRedisKeyPartUnambiguous(t *testing.T) {
	a := redisKeyPart(entries("a_b", "c"), nil)
	b := redisKeyPart(entries("a", "b_c"), nil)
	c := redisKeyPart(entries("a", "b=c"), nil)
	d := redisKeyPart(entries("a=b", "c"), nil)
	e := redisKeyPart(entries("a", "x", "b", "c"), nil)
	f := redisKeyPart(entries("a", "x&b=c"), nil)
	g := redisKeyPart(entries("p", "files*"), nil)
	h := redisKeyPart(entries("p", "files/a"), []string{"files*"})
	seen := map[string]bool{}
	for _, k := range []string{a, b, c, d, e, f, g, h} {
		if seen[k] {
			t.Fatalf("key part %q produced twice", k)
		}
		seen[k] = true
	}
}
