package config

import (
	"strings"
	"testing"
)

// TestLeaseParse: "lease" is accepted on backend redis and rls rules of
// token_bucket and fixed_window, within the burst/limit, and refused with a
// reason everywhere else.
func TestLeaseParse(t *testing.T) {
	ok := []struct{ json, summary string }{
		{doc(redisObj, rule("backend", `"redis"`, "algorithm", `"token_bucket"`, "burst", `20`, "lease", `20`)), "lease=20"},
		{doc(redisObj, rule("backend", `"redis"`, "algorithm", `"fixed_window"`, "lease", `10`)), "lease=10"},
		{doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"token_bucket"`, "burst", `20`, "lease", `20`)), "lease=20"},
		{doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"fixed_window"`, "lease", `10`)), "lease=10"},
	}
	for _, tc := range ok {
		c, err := Parse([]byte(tc.json))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tc.json, err)
		}
		if got := c.Rules[0].Summary(); !strings.HasSuffix(got, " "+tc.summary) {
			t.Errorf("summary %q does not end with %q", got, tc.summary)
		}
	}
	c, err := Parse([]byte(doc(redisObj, rule("backend", `"redis"`, "algorithm", `"fixed_window"`))))
	if err != nil || c.Rules[0].Lease != 0 || strings.Contains(c.Rules[0].Summary(), "lease") {
		t.Fatalf("no lease: %v %+v", err, c)
	}
	bad := []struct{ name, json, want string }{
		{"local", doc("", rule("algorithm", `"fixed_window"`, "lease", `5`)), `rules[0].lease: applies only to backend "redis" or "rls": a local rule is decided in this proxy's shared data already`},
		{"rls sliding_log", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"sliding_log"`, "lease", `5`)), `rules[0].lease: applies only to token_bucket and fixed_window, not sliding_log: `},
		{"rls over limit", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"fixed_window"`, "lease", `11`)), `rules[0].lease: must not exceed the limit (10)`},
		{"sliding_window", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"sliding_window"`, "lease", `5`)), `rules[0].lease: applies only to token_bucket and fixed_window, not sliding_window: `},
		{"leaky_bucket", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"leaky_bucket"`, "lease", `5`)), `not leaky_bucket`},
		{"sliding_log", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"sliding_log"`, "lease", `5`)), `not sliding_log`},
		{"over limit", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"fixed_window"`, "lease", `11`)), `rules[0].lease: must not exceed the limit (10): no lease can be larger than the window's quota`},
		{"over burst", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"token_bucket"`, "burst", `4`, "lease", `5`)), `rules[0].lease: must not exceed the burst (4): no lease can be larger than the bucket`},
		{"zero", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"fixed_window"`, "lease", `0`)), `rules[0].lease: `},
		{"string", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"fixed_window"`, "lease", `"5"`)), `rules[0].lease: `},
	}
	for _, tc := range bad {
		_, err := Parse([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Parse error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
