package config

import (
	"errors"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	f.Add([]byte(designExample))
	for _, tc := range errorCases {
		if len(tc.json) < 4096 {
			f.Add([]byte(tc.json))
		}
	}
	f.Add([]byte(doc(`"failure_mode":"local",`+redisObj, rule("backend", `"redis"`, "key", `[{"remote_ip":true,"ipv6_prefix":48},{"cookie":"c"}]`))))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			var errs Errors
			if c != nil || !errors.As(err, &errs) || len(errs) == 0 || len(errs) > MaxErrors+1 {
				t.Fatalf("bad failure: config %v, error %T %v", c, err, err)
			}
			for _, e := range errs {
				if e.Msg == "" || strings.Contains(e.Msg, "\n") && e.Path != "" {
					t.Fatalf("bad entry %q", e.Error())
				}
			}
			return
		}
		checkInvariants(t, c)
	})
}

// checkInvariants asserts what every successfully parsed Config promises.
func checkInvariants(t *testing.T, c *Config) {
	t.Helper()
	if len(c.Rules) == 0 {
		t.Fatal("no rules")
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
		if s := r.Summary(); !strings.HasPrefix(s, r.Name+": ") || strings.ContainsAny(s, "\r\n") {
			t.Fatalf("summary %q", s)
		}
		r.Match.Matches("GET", "/", func(string) (string, bool) { return "", true })
	}
}
