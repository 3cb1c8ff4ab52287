package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/config/configtest"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(designExample))
	for _, tc := range errorCases {
		if len(tc.json) < 4096 {
			f.Add([]byte(tc.json))
		}
	}
	f.Add([]byte(doc(`"failure_mode":"local",`+redisObj, rule("backend", `"redis"`, "key", `[{"remote_ip":true,"ipv6_prefix":48},{"cookie":"c"}]`))))
	f.Add([]byte(`{"rules":[` + rule() + `],"_rules_":[{"_match_route_":["a"],"scope":"s","rules":[` + rule() + `]},` +
		`{"_match_domain_":["*.example.com"],"rules":[]},{"_match_service_":["a.b:80"],"_match_route_":["b"],"rules":[` + rule() + `]}]}`))
	for _, c := range append(append(configtest.Valid(), configtest.Boundaries()...), configtest.Mutations(7, 200)...) {
		if len(c.JSON) < 4096 {
			f.Add(c.JSON)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		local, lerr := ParseFor(data, BuildLocal)
		checkErrors(t, err)
		checkErrors(t, lerr)
		// sluice.wasm loads a subset of what sluice-redis.wasm loads:
		// exactly the configurations without Redis rules.
		if lerr == nil && (err != nil || local.HasRedisRules()) || err == nil && !c.HasRedisRules() && lerr != nil {
			t.Fatalf("builds disagree: sluice-redis.wasm %v, sluice.wasm %v", err, lerr)
		}
		if err == nil {
			checkInvariants(t, c)
		}
	})
}

// checkErrors asserts what every error of Parse promises: Errors of at
// most MaxErrors+1 entries, each one line of printable text
// (configtest.CheckText) with a path in the documented syntax.
func checkErrors(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var errs Errors
	if !errors.As(err, &errs) || len(errs) == 0 || len(errs) > MaxErrors+1 {
		t.Fatalf("bad failure: error %T %v", err, err)
	}
	text := err.Error()
	if e := configtest.CheckText(text); e != nil {
		t.Fatal(e)
	}
	if strings.Count(text, "\n") != len(errs)-1 {
		t.Fatalf("%d errors on %d lines:\n%s", len(errs), strings.Count(text, "\n")+1, text)
	}
	for _, e := range errs {
		if e.Msg == "" || strings.Contains(e.Error(), "\n") {
			t.Fatalf("bad entry %q", e.Error())
		}
		if _, _, perr := configtest.PathNames(e.Path); perr != nil {
			t.Fatal(perr)
		}
	}
}

// checkInvariants asserts what every successfully parsed Config promises.
func checkInvariants(t *testing.T, c *Config) {
	t.Helper()
	if len(c.Rules) == 0 && len(c.Scopes) == 0 {
		t.Fatal("no rules")
	}
	for i, s := range c.Scopes {
		if s.Index != i || s.Config == nil || len(s.Config.Scopes) != 0 || checkScopeName(s.Name) != "" ||
			len(s.Routes)+len(s.Domains)+len(s.Services)+len(s.RoutePrefixes) == 0 || strings.ContainsAny(s.Summary(), "\r\n") {
			t.Fatalf("scope %d: %+v", i, s)
		}
		if len(s.Config.Rules) > 0 {
			checkInvariants(t, s.Config)
		}
	}
	if c.Response.Status < 200 || c.Response.Status > 599 || c.Response.Headers > HeadersNone || c.FailureMode > FailLocal {
		t.Fatalf("top level out of range: %+v", c)
	}
	if c.FailureMode == FailLocal && !c.HasRedisRules() {
		t.Fatal("failure_mode local without redis rules")
	}
	if c.Redis != nil && (c.Redis.Cluster == "" || c.Redis.TimeoutMS < 1 || c.Redis.Instances < 1) {
		t.Fatalf("redis %+v", *c.Redis)
	}
	names := map[string]bool{}
	for i, r := range c.Rules {
		if r.Index != i || r.Name == "" || names[r.Name] {
			t.Fatalf("rule %d: index %d name %q", i, r.Index, r.Name)
		}
		names[r.Name] = true
		if r.Limit < 1 || r.Window <= 0 || r.Burst < 1 || r.MaxKeys < 1 || r.MaxKeys > MaxMaxKeys {
			t.Fatalf("rule %d numbers: %+v", i, r)
		}
		if r.Backend == BackendRedis && c.Redis == nil {
			t.Fatal("redis rule without redis")
		}
		if r.Limiter == nil || r.Limiter.Kind() != r.Algorithm {
			t.Fatalf("rule %d limiter %v", i, r.Limiter)
		}
		if len(r.Key) == 0 {
			t.Fatalf("rule %d: empty key", i)
		}
		for _, k := range r.Key {
			n := 0
			for _, set := range []bool{k.RemoteIP, k.Header != "", k.Query != "", k.Cookie != "", k.Path, k.Method} {
				if set {
					n++
				}
			}
			if n != 1 || k.IPv6Prefix != 0 && (!k.RemoteIP || k.IPv6Prefix > 128) || k.Header != strings.ToLower(k.Header) {
				t.Fatalf("rule %d key part %+v", i, k)
			}
		}
		for _, m := range r.Match.Methods {
			if m == "" || m != strings.ToUpper(m) {
				t.Fatalf("method %q", m)
			}
		}
		for _, h := range r.Match.Headers {
			if h.Name == "" || h.Name != strings.ToLower(h.Name) {
				t.Fatalf("header %q", h.Name)
			}
		}
		if s := r.Summary(); !strings.HasPrefix(s, r.Name+": ") || strings.Contains(s, "\n") || configtest.CheckText(s) != nil {
			t.Fatalf("summary %q", s)
		}
		if r.Backend == BackendRedis {
			if RedisParams(r.Algorithm, r.Limiter.Params()) != nil || r.Fallback == nil || r.Fallback.Params() != FallbackParams(r.Limiter.Params(), c.Redis.Instances) {
				t.Fatalf("rule %d: redis rule %+v out of the scripts' bounds or without its fallback", i, r)
			}
		} else if r.Fallback != nil {
			t.Fatalf("rule %d: local rule with a fallback", i)
		}
		r.Match.Matches("GET", "/", func(string) (string, bool) { return "", true })
	}
}
