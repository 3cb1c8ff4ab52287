package rls

import "testing"

// The stat key of a lookup, as envoyproxy/ratelimit names the limit's
// statistics (config_impl.go GetLimit): the configured full key; with
// detailed_metric the request's entries; with value_to_metric the
// request's value at each level that sets it (a key-only match gets none
// without it, a wildcard match keeps its pattern, share_threshold keeps
// its pattern even with value_to_metric).
func TestStatKeys(t *testing.T) {
	c := parse(t, `
domain: sk
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: user
        value: "a*"
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: team
        value: "t*"
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: org
        value: "o*"
        share_threshold: true
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: exact
        value: yes
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: det
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	for _, tc := range []struct {
		entries     []string
		stat        string
		fromRequest bool
	}{
		{[]string{"plain", "x"}, "sk.plain", false},
		{[]string{"route", "api", "method", "GET"}, "sk.route_api.method", true},
		{[]string{"route", "api", "user", "alice"}, "sk.route_api.user_alice", true},
		{[]string{"route", "api", "team", "tango"}, "sk.route_api.team_t*", true},
		{[]string{"route", "api", "org", "oslo"}, "sk.route_api.org_o*", true},
		{[]string{"route", "api", "exact", "yes"}, "sk.route_api.exact_yes", true},
		{[]string{"det", "v1"}, "sk.det_v1", true},
	} {
		m, err := c.lookup("sk", desc(tc.entries...))
		if err != nil || m == nil {
			t.Fatalf("%v: %v %v", tc.entries, m, err)
		}
		if m.stat != tc.stat || m.fromRequest != tc.fromRequest {
			t.Errorf("%v: stat %q (from the request %v), want %q (%v)", tc.entries, m.stat, m.fromRequest, tc.stat, tc.fromRequest)
		}
	}
}
