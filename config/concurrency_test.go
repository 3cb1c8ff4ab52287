package config

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// conc is a concurrency rule (rule's defaults without a window) with kv.
func conc(kv ...string) string {
	return rule(append([]string{"algorithm", `"concurrency"`, "window", ""}, kv...)...)
}

// TestConcurrencyParse: "algorithm": "concurrency" takes a limit, an
// optional retry_after and delay, and refuses the fields of rate rules.
func TestConcurrencyParse(t *testing.T) {
	ok := []struct {
		json    string
		retry   time.Duration
		delay   Delay
		summary string
	}{
		{doc("", conc()), time.Second, Delay{}, "r: concurrency 10 in flight, retry_after=1s key=remote_ip"},
		{doc("", conc("retry_after", `"30s"`)), 30 * time.Second, Delay{}, "concurrency 10 in flight, retry_after=30s "},
		{doc("", conc("delay", `{"max":"5s","max_held":20}`)), time.Second, Delay{5 * time.Second, 20}, " queue<=5s queued<=20/worker"},
		{doc("", conc("mode", `"shadow"`, "max_keys", `7`, "backend", `"local"`)), time.Second, Delay{}, "local shadow max_keys=7"},
		{doc(redisObj, conc("backend", `"redis"`)), time.Second, Delay{}, " redis enforce"},
	}
	for _, tc := range ok {
		c, err := Parse([]byte(tc.json))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tc.json, err)
		}
		r := c.Rules[0]
		if !r.IsConcurrency() || r.Algorithm != algorithms.Concurrency || r.Limit != 10 || r.Burst != 10 || r.Window != 0 {
			t.Fatalf("%s: rule %+v", tc.json, r)
		}
		if r.Concurrency.RetryAfter != tc.retry || r.Delay != tc.delay {
			t.Errorf("%s: retry %v delay %+v", tc.json, r.Concurrency.RetryAfter, r.Delay)
		}
		l, ok := r.Limiter.(*algorithms.ConcurrencyLimiter)
		if !ok || l.RetryAfter() != tc.retry || l.Params().Limit != 10 {
			t.Errorf("%s: limiter %#v", tc.json, r.Limiter)
		}
		if got := r.Summary(); !strings.Contains(got, tc.summary) {
			t.Errorf("summary %q does not contain %q", got, tc.summary)
		}
	}
	bad := []struct{ name, json, want string }{
		{"window", doc("", conc("window", `"1s"`)), `rules[0].window: does not apply to "concurrency": an in-flight limit has no window`},
		{"burst", doc("", conc("burst", `3`)), `rules[0].burst: does not apply to "concurrency"`},
		{"cost", doc("", conc("cost", `{"request":2}`)), `rules[0].cost: does not apply to "concurrency"`},
		{"lease", doc(redisObj, conc("lease", `2`)), `rules[0].lease: does not apply to "concurrency"`},
		{"no limit", doc("", conc("limit", "")), `rules[0].limit: is required`},
		{"limit 0", doc("", conc("limit", `0`)), `rules[0].limit: 0 is out of range 1..1000000000`},
		{"rls delay", doc(`"rls":{"cluster":"c","domain":"d"}`, conc("backend", `"rls"`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply to a concurrency rule on backend "rls"`},
		{"redis delay", doc(redisObj, conc("backend", `"redis"`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply to a concurrency rule on backend "redis"`},
		{"bad backend", doc("", conc("backend", `"x"`)), `rules[0].backend: "x" is not one of local, redis, rls`},
		{"retry 0", doc("", conc("retry_after", `"0s"`)), `rules[0].retry_after: "0s" is not longer than zero`},
		{"retry number", doc("", conc("retry_after", `5`)), `rules[0].retry_after: 5 is not a string`},
		{"retry on rate rule", doc("", rule("retry_after", `"1s"`)), `rules[0].retry_after: applies only to "algorithm": "concurrency"`},
		{"delay shadow", doc("", conc("mode", `"shadow"`, "delay", `{"max":"1s"}`)), `rules[0].delay: does not apply in mode "shadow"`},
		{"delay long", doc("", conc("delay", `{"max":"2m"}`)), `rules[0].delay.max: "2m" is longer than the maximum 1m`},
		{"delay no max", doc("", conc("delay", `{"max_held":3}`)), `rules[0].delay.max: is required`},
		{"delay max_held", doc("", conc("delay", `{"max":"1s","max_held":0}`)), `rules[0].delay.max_held: 0 is out of range 1..100000`},
		{"no key", doc("", conc("key", "")), `rules[0].key: is required`},
	}
	for _, tc := range bad {
		_, err := Parse([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %s\n got %v\nwant %s", tc.name, tc.json, err, tc.want)
		}
	}
}
