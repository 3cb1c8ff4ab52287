package config

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPlansParse(t *testing.T) {
	c, err := Parse([]byte(doc("", rule("algorithm", `"token_bucket"`, "limit", `100`, "window", `"1m"`,
		"plans", `{"by":{"metadata":{"namespace":"jwt","path":"payload.plan"}},"values":{"free":10,"pro":{"limit":1000,"burst":50},"team":{"window":"1h"}},"default":"free"}`,
		"overrides", `{"by":{"header":"X-Api-Key"},"values":{"acme":{"limit":5000}}}`))))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	free, pro, team := r.Plans.Entries["free"], r.Plans.Entries["pro"], r.Plans.Entries["team"]
	if free.Params.Limit != 10 || free.Params.Burst != 10 || free.Params.Window != time.Minute {
		t.Errorf("free %+v", free.Params)
	}
	if pro.Params.Limit != 1000 || pro.Params.Burst != 50 || team.Params.Window != time.Hour || team.Params.Limit != 100 {
		t.Errorf("pro %+v team %+v", pro.Params, team.Params)
	}
	if r.Plans.Default != free || r.Plans.Lookup([]byte("x"), true) != free || r.Plans.Lookup(nil, false) != free || r.Plans.Lookup([]byte("pro"), true) != pro {
		t.Error("lookup")
	}
	acme := r.Overrides.Entries["acme"]
	if !acme.Override || acme.Limiter.Params().Limit != 5000 || r.Overrides.By.Header != "x-api-key" || r.Overrides.Lookup([]byte("b"), true) != nil {
		t.Errorf("override %+v", acme)
	}
	if s := r.Summary(); !strings.Contains(s, "plans=metadata:jwt:payload.plan(3,default=free) overrides=header:x-api-key(1)") {
		t.Errorf("summary %q", s)
	}
}

// Entries with the same parameters share a limiter; a large table parses.
func TestPlansLargeTable(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"by":{"header":"x-api-key"},"values":{`)
	for i := 0; i < 100_000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"key-` + strconv.Itoa(i) + `":` + strconv.Itoa(1+i%3))
	}
	b.WriteString(`}}`)
	c, err := Parse([]byte(doc("", rule("algorithm", `"fixed_window"`, "overrides", b.String()))))
	if err != nil {
		t.Fatal(err)
	}
	o := c.Rules[0].Overrides
	if len(o.Entries) != 100_000 || o.Entries["key-4"].Limiter != o.Entries["key-1"].Limiter || o.Entries["key-5"].Params.Limit != 3 {
		t.Fatal("entries")
	}
}

func TestPlansErrors(t *testing.T) {
	for _, tc := range []struct{ plans, want string }{
		{`{"values":{"a":1}}`, `rules[0].plans.by: is required: where the request's value comes from (e.g. {"header": "x-api-key"})`},
		{`{"by":{"header":"a","query":"b"},"values":{"a":1}}`, `rules[0].plans.by: needs exactly one of "header", "query", "cookie", "metadata", "attribute"`},
		{`{"by":{"path":true},"values":{"a":1}}`, "rules[0].plans.by.path: unknown field\nrules[0].plans.by: needs exactly one of \"header\", \"query\", \"cookie\", \"metadata\", \"attribute\""},
		{`{"by":{"header":"a"},"values":{}}`, `rules[0].plans.values: must not be empty`},
		{`{"by":{"header":"a"},"values":[]}`, `rules[0].plans.values: [] is not an object`},
		{`{"by":{"header":"a"},"values":{"a":0}}`, `rules[0].plans.values.a: 0 is out of range 1..1000000000`},
		{`{"by":{"header":"a"},"values":{"a":{}}}`, `rules[0].plans.values.a: needs "limit", "window" or "burst"`},
		{`{"by":{"header":"a"},"values":{"a":{"burst":2}}}`, `rules[0].plans.values.a.burst: applies only to token_bucket and leaky_bucket, not fixed_window`},
		{`{"by":{"header":"a"},"values":{"a":{"window":"0s"}}}`, `rules[0].plans.values.a.window: "0s" is not longer than zero`},
		{`{"by":{"header":"a"},"values":{"a":1,"a":2}}`, `rules[0].plans.values.a: duplicate value`},
		{`{"by":{"header":"a"},"values":{"a":1},"default":"b"}`, `rules[0].plans.default: "b" is not one of "values"`},
	} {
		d := doc("", rule("plans", tc.plans))
		_, err := Parse([]byte(d))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s\n got: %v\nwant: %s", tc.plans, err, tc.want)
		}
	}
	_, err := Parse([]byte(doc("", rule("algorithm", `"token_bucket"`, "count", `{"status":[401]}`, "overrides", `{"by":{"header":"a"},"values":{"a":1}}`))))
	if err == nil || err.Error() != `rules[0].overrides: does not apply with "cost", "count", "delay" or "lease"` {
		t.Errorf("with count: %v", err)
	}
	_, err = Parse([]byte(doc("", rule("overrides", `{"by":{"header":"a"},"values":{"a":1},"default":"a"}`))))
	if err == nil || err.Error() != `rules[0].overrides.default: applies only to "plans" (a request without an override gets its plan)` {
		t.Errorf("override default: %v", err)
	}
}
