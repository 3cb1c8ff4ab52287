package config

import (
	"strings"
	"testing"
)

func TestCountParse(t *testing.T) {
	c, err := Parse([]byte(doc("", rule("algorithm", `"token_bucket"`, "count", `{"status":[401,"5xx"],"header":{"name":"X-Login","exact":"failed"}}`))))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Rules[0]
	if r.Cost == nil || r.Cost.Request.Fixed != 1 || r.Cost.Response == nil || r.Cost.Response.Count == nil {
		t.Fatalf("cost %+v", r.Cost)
	}
	cnt := r.Cost.Response.Count
	for s, want := range map[int]bool{401: true, 400: false, 500: true, 599: true, 200: false, -1: false, 1000: false} {
		if cnt.MatchesStatus(s) != want {
			t.Errorf("status %d: %v", s, !want)
		}
	}
	if !cnt.MatchesHeader([]byte("failed"), true) || cnt.MatchesHeader([]byte("ok"), true) || cnt.MatchesHeader(nil, false) {
		t.Error("header condition")
	}
	if s := r.Summary(); !strings.Contains(s, `cost=1 settle=count=status:401,5xx+header:x-login="failed" no_usage=reservation`) {
		t.Errorf("summary %q", s)
	}
	// With a reservation from cost.request.
	c, err = Parse([]byte(doc("", rule("algorithm", `"leaky_bucket"`, "cost", `{"request":3}`, "count", `{"header":{"name":"x-f"}}`))))
	if err != nil || c.Rules[0].Cost.Request.Fixed != 3 || !c.Rules[0].Cost.Response.Count.MatchesStatus(200) {
		t.Fatalf("%v %+v", err, c)
	}
}

func TestCountErrors(t *testing.T) {
	for _, tc := range []struct {
		extra []string
		want  string
	}{
		{[]string{"count", `{}`}, `rules[0].count: needs "status" or "header": what a counted response is`},
		{[]string{"count", `{"status":[401]}`, "algorithm", `"sliding_log"`}, `rules[0].count: cannot be refunded: sliding_log cannot give an admission back: its entries are times, so the log cannot name which entry was the request's; use sliding_window, whose give-back is exact`},
		{[]string{"count", `{"status":[]}`}, `rules[0].count.status: must not be empty (omit it to count any status)`},
		{[]string{"count", `{"status":[99]}`}, `rules[0].count.status[0]: 99 is out of range 100..599`},
		{[]string{"count", `{"status":["6xx"]}`}, `rules[0].count.status[0]: "6xx" is not a status (100..599) or a class ("4xx")`},
		{[]string{"count", `{"header":{"exact":"a"}}`}, `rules[0].count.header.name: is required`},
		{[]string{"count", `{"status":[401]}`, "cost", `{"request":1,"response":{"header":"x-c"}}`}, `rules[0].count: does not apply with "cost.response": the response either costs the reservation or nothing`},
	} {
		kv := append([]string{"algorithm", `"token_bucket"`}, tc.extra...)
		_, err := Parse([]byte(doc("", rule(kv...))))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v\n got: %v\nwant: %s", tc.extra, err, tc.want)
		}
	}
}

// count on the window algorithms: the admission is given back to its window.
func TestCountWindows(t *testing.T) {
	for _, alg := range []string{"fixed_window", "sliding_window"} {
		c, err := Parse([]byte(doc("", rule("algorithm", `"`+alg+`"`, "limit", "5", "window", `"15m"`, "count", `{"status":[401,403]}`))))
		if err != nil {
			t.Fatalf("%s: %v", alg, err)
		}
		r := c.Rules[0]
		if r.Cost == nil || r.Cost.Request.Fixed != 1 || r.Cost.Response == nil || !r.Cost.Response.Count.MatchesStatus(401) || r.Cost.Response.Count.MatchesStatus(200) {
			t.Fatalf("%s: %+v", alg, r.Cost)
		}
	}
}
