package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// mutation is one change to a valid document and the errors it alone
// causes.
type mutation struct {
	rule   int    // which rule: 0 or 1; -1 for the top level
	field  string // replaced (or added) field
	value  string // raw JSON
	errors []string
}

// severalMutations change different fields of one valid document, each
// causing its own errors: whichever of them are applied together, Parse
// reports every error of each (sluice check promises every error at
// once). Rule 0 is a sliding_log rule, rule 1 a token_bucket rule.
var severalMutations = []mutation{
	{0, "burst", `5`, []string{`rules[0].burst: applies only to token_bucket and leaky_bucket, not sliding_log`}},
	{0, "limit", `20000`, []string{`rules[0].limit: must be at most 10000 for sliding_log`}},
	{0, "window", `"10x"`, []string{`rules[0].window: "10x" is not a duration`}},
	{0, "name", `"a b"`, []string{`rules[0].name: "a b" may contain only letters, digits, '-', '_' and '.'`}},
	{0, "key", `[{"header":"a b","query":"k"}]`, []string{
		`rules[0].key[0].header: "a b" is not a header name`,
		`rules[0].key[0]: has several sources ("header", "query"); use one per key part`}},
	{0, "missing_key", `"sometimes"`, []string{`rules[0].missing_key: "sometimes" is not one of skip, shared, deny`}},
	{0, "match", `{"headers":[{"name":"x","exact":"1","absent":true}],"methods":[]}`, []string{
		`rules[0].match.methods: must not be empty (omit it to match every method)`,
		`rules[0].match.headers[0].absent: cannot be combined with "exact": a header that is absent has no value; give one of them`}},
	{0, "lease", `5`, []string{`rules[0].lease: applies only to backend "redis" or "rls": a local rule is decided in this proxy's shared data already`}},
	{1, "burst", `0`, []string{`rules[1].burst: 0 is out of range 1..1000000000`}},
	{1, "mode", `"loud"`, []string{`rules[1].mode: "loud" is not one of enforce, shadow`}},
	{1, "max_keys", `0`, []string{`rules[1].max_keys: 0 is out of range 1..1000000`}},
	{1, "key", `[{"ipv6_prefix":200,"remote_ip":false}]`, []string{
		`rules[1].key[0].remote_ip: must be true (remove the key part instead)`,
		`rules[1].key[0].ipv6_prefix: 200 is out of range 1..128`}},
	{-1, "response", `{"status":1000,"headers":"all"}`, []string{
		`response.status: 1000 is out of range 200..599`,
		`response.headers: "all" is not one of both, draft, legacy, none`}},
	{-1, "failure_mode", `"local"`, []string{`failure_mode: "local" needs at least one rule with backend "redis" or "rls"`}},
}

func applyMutations(ms []mutation) string {
	r0 := []string{"algorithm", `"sliding_log"`, "limit", `100`}
	r1 := []string{"name", `"t"`, "algorithm", `"token_bucket"`, "burst", `5`}
	var top []string
	for _, m := range ms {
		switch m.rule {
		case 0:
			r0 = append(r0, m.field, m.value)
		case 1:
			r1 = append(r1, m.field, m.value)
		default:
			top = append(top, `"`+m.field+`":`+m.value)
		}
	}
	return doc(strings.Join(top, ","), rule(r0...), rule(r1...))
}

// TestEveryErrorAtOnce applies every subset of severalMutations (16,383
// documents, each field alone and with every combination of the others)
// and compares the errors with the union of their own.
func TestEveryErrorAtOnce(t *testing.T) {
	if _, err := Parse([]byte(applyMutations(nil))); err != nil {
		t.Fatalf("base document: %v", err)
	}
	n := len(severalMutations)
	for set := 1; set < 1<<n; set++ {
		var ms []mutation
		var want []string
		for i, m := range severalMutations {
			if set&(1<<i) != 0 {
				ms = append(ms, m)
				want = append(want, m.errors...)
			}
		}
		data := applyMutations(ms)
		_, err := Parse([]byte(data))
		var errs Errors
		if !errors.As(err, &errs) {
			t.Fatalf("%s: %v, want %d errors", data, err, len(want))
		}
		got := make([]string, len(errs))
		for i, e := range errs {
			got[i] = e.Error()
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s\n got:\n  %s\nwant:\n  %s", data, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
	}
}
