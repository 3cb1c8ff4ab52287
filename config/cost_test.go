package config

import (
	"strings"
	"testing"
	"time"
)

// TestCostParse: "cost" takes a reservation (a number, a request header or a
// query parameter, with a default) and, on a token or leaky bucket, how the
// response settles it; everything else is refused with its reason.
func TestCostParse(t *testing.T) {
	tb := func(cost string, more ...string) string {
		return doc("", rule(append([]string{"algorithm", `"token_bucket"`, "limit", `10000`, "window", `"1m"`, "cost", cost}, more...)...))
	}
	ok := []struct {
		json    string
		check   func(c *Cost) bool
		summary string
	}{
		{tb(`{"request":100}`), func(c *Cost) bool { return c.Request.Fixed == 100 && c.Response == nil }, "cost=100"},
		{tb(`{"request":{"header":"X-Max-Tokens","default":500}}`), func(c *Cost) bool { return c.Request.Header == "x-max-tokens" && c.Request.Default == 500 }, "cost=header:x-max-tokens|500"},
		{tb(`{"request":{"query":"n","default":1},"response":{"header":"x-usage"}}`), func(c *Cost) bool { return c.Request.Query == "n" && c.Response.Header == "x-usage" }, "cost=query:n|1 settle=header:x-usage no_usage=reservation"},
		{tb(`{"request":1000,"response":{"json":"usage.total_tokens"},"no_usage":"refund"}`), func(c *Cost) bool { return c.Response.JSON == "usage.total_tokens" && c.NoUsage == NoUsageRefund }, "settle=json:usage.total_tokens no_usage=refund"},
		{tb(`{"request":1000,"response":{"usage":"openai"}}`), func(c *Cost) bool { return c.Response.Weights == [5]int64{0, 0, 1, 0, 0} && c.Response.Divisor == 1 }, "settle=usage:openai(total)"},
		{tb(`{"request":1000,"response":{"usage":"anthropic"}}`), func(c *Cost) bool { return c.Response.Weights == [5]int64{1, 1, 0, 1, 1} }, "settle=usage:anthropic(input+output+cache_read+cache_write)"},
		{tb(`{"request":1000,"response":{"usage":"openai","weights":{"input":1,"output":4,"cache_read":-1},"divisor":2}}`), func(c *Cost) bool { return c.Response.Weights == [5]int64{1, 4, 0, -1, 0} && c.Response.Divisor == 2 }, "settle=usage:openai(input+4*output+-1*cache_read)/2"},
		{doc("", rule("algorithm", `"leaky_bucket"`, "cost", `{"request":2,"response":{"header":"x-cost"}}`)), func(c *Cost) bool { return c.Response != nil }, "cost=2 settle=header:x-cost"},
		{doc("", rule("algorithm", `"sliding_log"`, "cost", `{"request":{"header":"x-n","default":1}}`)), func(c *Cost) bool { return c.Response == nil }, "cost=header:x-n|1"},
		{doc(redisObj, rule("backend", `"redis"`, "algorithm", `"token_bucket"`, "limit", `1000000`, "window", `"1s"`, "cost", `{"request":{"header":"x-max-tokens","default":100},"response":{"usage":"openai"}}`)), func(c *Cost) bool { return c.Response != nil }, "settle=usage:openai(total)"},
		{doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"leaky_bucket"`, "cost", `{"request":5,"response":{"header":"x-cost"}}`)), func(c *Cost) bool { return c.Response != nil }, "cost=5 settle=header:x-cost"},
		{doc(redisObj, rule("backend", `"redis"`, "algorithm", `"fixed_window"`, "cost", `{"request":{"query":"n","default":1}}`)), func(c *Cost) bool { return c.Response == nil }, "cost=query:n|1"},
		{tb(`{"request":{"json":"max_tokens","default":1000},"response":{"usage":"openai"}}`), func(c *Cost) bool {
			return c.Request.JSON == "max_tokens" && c.Request.MaxBody == DefaultMaxBody && c.Request.BodyTimeout == DefaultBodyTimeout
		}, "cost=json:max_tokens|1000 body<=65536B/1s settle=usage:openai(total)"},
		{tb(`{"request":{"json":"params.budget","default":5,"max_body":4096,"body_timeout":"250ms"}}`), func(c *Cost) bool {
			return c.Request.JSON == "params.budget" && c.Request.MaxBody == 4096 && c.Request.BodyTimeout == 250*time.Millisecond
		}, "cost=json:params.budget|5 body<=4096B/250ms"},
	}
	for _, tc := range ok {
		c, err := Parse([]byte(tc.json))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tc.json, err)
		}
		if c.Rules[0].Cost == nil || !tc.check(c.Rules[0].Cost) {
			t.Errorf("%s: cost %+v", tc.json, c.Rules[0].Cost)
		}
		if got := c.Rules[0].Summary(); !strings.Contains(got, tc.summary) {
			t.Errorf("summary %q does not contain %q", got, tc.summary)
		}
	}
	bad := []struct{ name, json, want string }{
		{"no request", tb(`{}`), `rules[0].cost.request: is required`},
		{"zero", tb(`{"request":0}`), `rules[0].cost.request: 0 is out of range 1..1000000000`},
		{"two sources", tb(`{"request":{"header":"a","query":"b","default":1}}`), `rules[0].cost.request: needs exactly one of a number, "header", "query" or "json"`},
		{"no default", tb(`{"request":{"header":"a"}}`), `rules[0].cost.request.default: is required`},
		{"bad query", tb(`{"request":{"query":"a=b","default":1}}`), `rules[0].cost.request.query: "a=b" is not a query parameter name`},
		{"request json array", tb(`{"request":{"json":"messages[0]","default":1}}`), `rules[0].cost.request.json: "messages[0]" has an array index`},
		{"json no default", tb(`{"request":{"json":"max_tokens"}}`), `rules[0].cost.request.default: is required`},
		{"max_body huge", tb(`{"request":{"json":"max_tokens","default":1,"max_body":2000000}}`), `rules[0].cost.request.max_body: 2000000 is out of range 1..1048576`},
		{"body_timeout alone", tb(`{"request":{"header":"a","default":1,"body_timeout":"1s"}}`), `rules[0].cost.request.body_timeout: applies only with "json"`},
		{"body_timeout long", tb(`{"request":{"json":"a","default":1,"body_timeout":"2m"}}`), `rules[0].cost.request.body_timeout: "2m" is not between 1ms and 1m`},
		{"max_body alone", tb(`{"request":{"header":"a","default":1,"max_body":10}}`), `rules[0].cost.request.max_body: applies only with "json"`},
		{"fixed_window settle", doc("", rule("algorithm", `"fixed_window"`, "cost", `{"request":1,"response":{"header":"x"}}`)), `rules[0].cost.response: cannot be settled: fixed_window holds at most limit per window`},
		{"too fast", doc("", rule("algorithm", `"token_bucket"`, "limit", `1000000000`, "window", `"1ms"`, "cost", `{"request":1,"response":{"header":"x"}}`)), `rules[0].cost.response: cannot be settled: token_bucket settles only at a rate of at most one cost unit per nanosecond`},
		{"two responses", tb(`{"request":1,"response":{"header":"x","json":"a"}}`), `rules[0].cost.response: needs exactly one of "header", "json" or "usage"`},
		{"bad provider", tb(`{"request":1,"response":{"usage":"gemini"}}`), `rules[0].cost.response.usage: "gemini" is not one of openai, anthropic`},
		{"weights alone", tb(`{"request":1,"response":{"header":"x","weights":{"input":1}}}`), `rules[0].cost.response.weights: applies only with "usage"`},
		{"unknown weight", tb(`{"request":1,"response":{"usage":"openai","weights":{"reasoning":1}}}`), `rules[0].cost.response.weights.reasoning: `},
		{"huge weight", tb(`{"request":1,"response":{"usage":"openai","weights":{"input":4294967297}}}`), `rules[0].cost.response.weights.input: 4294967297 is out of range`},
		{"divisor 0", tb(`{"request":1,"response":{"usage":"openai","divisor":0}}`), `rules[0].cost.response.divisor: 0 is out of range`},
		{"array path", tb(`{"request":1,"response":{"json":"choices[0].usage"}}`), `rules[0].cost.response.json: "choices[0].usage" has an array index`},
		{"empty key", tb(`{"request":1,"response":{"json":"usage..total"}}`), `rules[0].cost.response.json: "usage..total" has an empty key`},
		{"deep path", tb(`{"request":1,"response":{"json":"a.b.c.d.e.f.g.h.i"}}`), `has more than 8 keys`},
		{"non-ASCII key", tb(`{"request":1,"response":{"json":"usage.tötal"}}`), `rules[0].cost.response.json: "usage.tötal" has a key that is not printable ASCII`},
		{"non-ASCII key", tb(`{"request":1,"response":{"json":"usage.tötal"}}`), `rules[0].cost.response.json: "usage.tötal" has a key that is not printable ASCII`},
		{"no_usage alone", tb(`{"request":1,"no_usage":"refund"}`), `rules[0].cost.no_usage: applies only with "response"`},
		{"no_usage bad", tb(`{"request":1,"response":{"header":"x"},"no_usage":"free"}`), `rules[0].cost.no_usage: "free" is not one of reservation, refund`},
		{"redis too fast", doc(redisObj, rule("backend", `"redis"`, "algorithm", `"token_bucket"`, "limit", `2000000`, "window", `"1s"`, "cost", `{"request":1,"response":{"header":"x"}}`)),
			`rules[0].cost.response: cannot be settled: token_bucket settles on backend "redis" only at a rate of at most one cost unit per microsecond`},
		{"rls lease", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"token_bucket"`, "lease", `10`, "cost", `{"request":1}`)), `rules[0].cost: does not apply with "lease"`},
		{"rls window", doc(rlsObj, rule("backend", `"rls"`, "algorithm", `"sliding_window"`, "cost", `{"request":1,"response":{"header":"x"}}`)), `rules[0].cost.response: cannot be settled: sliding_window`},
		{"delay", tb(`{"request":1,"response":{"header":"x"}}`, "delay", `{"max":"1s"}`), `rules[0].cost: "response" does not apply with "delay"`},
	}
	for _, tc := range bad {
		_, err := Parse([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Parse error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
