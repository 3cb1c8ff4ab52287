package config

import (
	"slices"
	"testing"
)

// TestMissingKeyAndAbsent: "missing_key" takes skip (the default), shared and
// deny; a match.headers entry can test that a header is absent.
func TestMissingKeyAndAbsent(t *testing.T) {
	c, err := Parse([]byte(doc(rlsObj,
		rule("name", `"skip"`, "key", `[{"header":"x-api-key"}]`),
		rule("name", `"skip2"`, "missing_key", `"skip"`),
		rule("name", `"shared"`, "missing_key", `"shared"`, "key", `[{"header":"x-api-key"},{"remote_ip":true}]`),
		rule("name", `"deny"`, "missing_key", `"deny"`, "backend", `"rls"`, "mode", `"shadow"`),
		rule("name", `"keyless"`, "match", `{"headers":[{"name":"X-Api-Key","absent":true},{"name":"x-tenant","exact":""}]}`))))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []MissingKey{MissingSkip, MissingSkip, MissingShared, MissingDeny, MissingSkip} {
		if got := c.Rules[i].MissingKey; got != want {
			t.Errorf("rule %d: missing_key %v, want %v", i, got, want)
		}
	}
	if got := c.Rules[4].Match.Headers; !slices.Equal(got, []HeaderMatch{{Name: "x-api-key", Absent: true}, {Name: "x-tenant", Exact: ""}}) {
		t.Errorf("headers %+v", got)
	}
	for i, want := range []string{
		"skip: fixed_window 10/1s key=header:x-api-key match=all local enforce",
		"skip2: fixed_window 10/1s key=remote_ip match=all local enforce",
		"shared: fixed_window 10/1s key=header:x-api-key+remote_ip missing_key=shared match=all local enforce",
		"deny: fixed_window 10/1s key=remote_ip missing_key=deny match=all rls shadow",
		`keyless: fixed_window 10/1s key=remote_ip match=header:x-api-key:absent header:x-tenant="" local enforce`,
	} {
		if got := c.Rules[i].Summary(); got != want {
			t.Errorf("summary %d\n got %s\nwant %s", i, got, want)
		}
	}
	if MissingShared.String() != "shared" || MissingDeny.String() != "deny" || MissingSkip.String() != "skip" {
		t.Error("missing_key names")
	}
}

// TestAbsentMatches: "absent" holds when the header is not in the request
// or its value is empty (what a header key part treats as missing).
func TestAbsentMatches(t *testing.T) {
	m := Match{Headers: []HeaderMatch{{Name: "x-api-key", Absent: true}}}
	for _, tc := range []struct {
		hdrs map[string]string
		want bool
	}{
		{nil, true},
		{map[string]string{"x-other": "1"}, true},
		{map[string]string{"x-api-key": ""}, true},
		{map[string]string{"x-api-key": "k"}, false},
		{map[string]string{"x-api-key": " "}, false},
	} {
		h := func(name string) (string, bool) { v, ok := tc.hdrs[name]; return v, ok }
		if got := m.Matches("GET", "/", h); got != tc.want {
			t.Errorf("headers %v: %v, want %v", tc.hdrs, got, tc.want)
		}
	}
	if !m.Matches("GET", "/", nil) {
		t.Error("no header lookup: the header is absent")
	}
}

func TestMissingKeyAndAbsentErrors(t *testing.T) {
	for _, tc := range []struct{ name, json, want string }{
		{"missing_key unknown", doc("", rule("missing_key", `"allow"`)), `rules[0].missing_key: "allow" is not one of skip, shared, deny`},
		{"missing_key not a string", doc("", rule("missing_key", `true`)), `rules[0].missing_key: true is not a string`},
		{"absent with exact", doc("", rule("match", `{"headers":[{"name":"a","exact":"b","absent":true}]}`)),
			`rules[0].match.headers[0].absent: cannot be combined with "exact": a header that is absent has no value; give one of them`},
		{"absent with exact first", doc("", rule("match", `{"headers":[{"absent":true,"name":"a","exact":""}]}`)),
			`rules[0].match.headers[0].absent: cannot be combined with "exact": a header that is absent has no value; give one of them`},
		{"absent false", doc("", rule("match", `{"headers":[{"name":"a","absent":false}]}`)),
			`rules[0].match.headers[0].absent: must be true (use "exact" to match a value)`},
		{"absent not a boolean", doc("", rule("match", `{"headers":[{"name":"a","absent":"yes"}]}`)),
			`rules[0].match.headers[0].absent: "yes" is not a boolean`},
		{"absent without name", doc("", rule("match", `{"headers":[{"absent":true}]}`)), `rules[0].match.headers[0].name: is required`},
		{"absent duplicate header", doc("", rule("match", `{"headers":[{"name":"a","absent":true},{"name":"A","exact":"1"}]}`)),
			`rules[0].match.headers[1].name: duplicate header "a"`},
		{"neither exact nor absent", doc("", rule("match", `{"headers":[{"name":"a"}]}`)),
			`rules[0].match.headers[0].exact: is required (or "absent": true to match a request without the header)`},
		{"absent typo", doc("", rule("match", `{"headers":[{"name":"a","absnet":true}]}`)),
			"rules[0].match.headers[0].absnet: unknown field (did you mean \"absent\"?)\n" +
				`rules[0].match.headers[0].exact: is required (or "absent": true to match a request without the header)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.json))
			if err == nil || c != nil {
				t.Fatalf("Parse(%s) = %v, %v; want error", tc.json, c, err)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("Parse(%s)\n got: %s\nwant: %s", tc.json, got, tc.want)
			}
		})
	}
}
