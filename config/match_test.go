package config

import (
	"strings"
	"testing"
)

func TestMatches(t *testing.T) {
	c, err := Parse([]byte(doc("",
		rule("name", `"all"`),
		rule("name", `"api"`, "match", `{"path_prefix":"/api/","methods":["get","POST"],"headers":[{"name":"X-Tenant","exact":"acme"},{"name":"x-empty","exact":""}]}`),
	)))
	if err != nil {
		t.Fatal(err)
	}
	all, api := &c.Rules[0].Match, &c.Rules[1].Match
	if api.Methods[0] != "GET" || api.Headers[0].Name != "x-tenant" {
		t.Fatalf("not compiled: %+v", api)
	}
	headers := map[string]string{"x-tenant": "acme", "x-empty": ""}
	lookup := func(name string) (string, bool) { v, ok := headers[name]; return v, ok }

	cases := []struct {
		method, path string
		hdr          map[string]string
		want         bool
	}{
		{"GET", "/api/users", headers, true},
		{"get", "/api/users", headers, true}, // methods compare case-insensitively
		{"POST", "/api/", headers, true},
		{"GET", "/api/users?page=2", headers, true},
		{"GET", "/api?x=/api/", headers, false}, // the query string is not part of the path
		{"GET", "/api#/api/", headers, false},
		{"GET", "/api", headers, false}, // "/api/" is a prefix of the path, not the reverse
		{"GET", "/API/users", headers, false},
		{"PUT", "/api/users", headers, false},
		{"GET", "/api/users", map[string]string{"x-tenant": "acme"}, false},                // x-empty missing
		{"GET", "/api/users", map[string]string{"x-tenant": "Acme", "x-empty": ""}, false}, // values are exact
		{"GET", "/api/users", map[string]string{"x-tenant": "acme ", "x-empty": ""}, false},
		{"GET", "/other", headers, false},
		{"", "", nil, false},
	}
	for _, tc := range cases {
		headers = tc.hdr
		if got := api.Matches(tc.method, tc.path, lookup); got != tc.want {
			t.Errorf("api.Matches(%q, %q, %v) = %v, want %v", tc.method, tc.path, tc.hdr, got, tc.want)
		}
		if !all.Matches(tc.method, tc.path, lookup) {
			t.Errorf("the zero match refused %q %q", tc.method, tc.path)
		}
	}
	if api.Matches("GET", "/api/x", nil) {
		t.Error("a nil header lookup satisfied a header condition")
	}
	if !all.Matches("GET", "/", nil) {
		t.Error("the zero match needs headers")
	}
}

func TestMatchesPathOnly(t *testing.T) {
	m := Match{PathPrefix: "/v1"}
	for path, want := range map[string]bool{"/v1": true, "/v1/x": true, "/v10": true, "/v": false, "": false, "?/v1": false} {
		if got := m.Matches("GET", path, nil); got != want {
			t.Errorf("Matches(%q) = %v, want %v", path, got, want)
		}
	}
}

// A rule on /h applies to every spelling of /h that Envoy's normalize_path
// and merge_slashes (and so the upstream) resolve to /h — the bypasses of
// the path-normalisation bypasses — and not to paths that only look similar.
func TestMatchesNormalizedPath(t *testing.T) {
	m := Match{PathPrefix: "/h"}
	for _, path := range []string{"/h", "/%68", "//h", "/./h", "/x/../h", "/h/../h", "/%2568/../h", "/%2e/h", "\\h", "/..;x/h", "h", "/h?x=/y", "/H/../h"} {
		if !m.Matches("GET", path, nil) {
			t.Errorf("Matches(%q) = false; its normal form is %q", path, NormalizePath(path))
		}
		if !m.MatchesNormal("GET", NormalizePath(path), nil) {
			t.Errorf("MatchesNormal(NormalizePath(%q) = %q) = false", path, NormalizePath(path))
		}
	}
	// %2F is not a slash (Envoy's default, KEEP_UNCHANGED): "..%2F.." is one segment.
	for _, path := range []string{"/%2568", "/x%2Fh", "/x/..%2f../h", "/H", "/%48", "/x/h", "/.h", "", "/?h"} {
		if m.Matches("GET", path, nil) {
			t.Errorf("Matches(%q) = true; its normal form is %q", path, NormalizePath(path))
		}
	}
	// Longer than Matches' stack buffer: still right.
	long := "/" + strings.Repeat("x/", 400) + strings.Repeat("../", 400) + "h"
	if !m.Matches("GET", long, nil) {
		t.Errorf("Matches(long) = false")
	}
}

func TestMatchesDoesNotAllocate(t *testing.T) {
	m := Match{PathPrefix: "/api/", Methods: []string{"GET", "POST"}, Headers: []HeaderMatch{{Name: "x-tenant", Exact: "acme"}}}
	lookup := func(name string) (string, bool) {
		if name == "x-tenant" {
			return "acme", true
		}
		return "", false
	}
	var ok bool
	allocs := testing.AllocsPerRun(1000, func() {
		ok = m.Matches("POST", "/api/users?q=1", lookup)
		ok = ok && m.Matches("POST", "//api/x/../%75sers", lookup)
		ok = ok && m.MatchesNormal("POST", "/api/users", lookup)
	})
	if !ok || allocs != 0 {
		t.Errorf("Matches = %v with %v allocs/op, want true with 0", ok, allocs)
	}
}

func BenchmarkMatches(b *testing.B) {
	m := Match{PathPrefix: "/api/", Methods: []string{"GET", "POST"}, Headers: []HeaderMatch{{Name: "x-tenant", Exact: "acme"}}}
	lookup := func(name string) (string, bool) { return "acme", true }
	b.ReportAllocs()
	for b.Loop() {
		m.Matches("POST", "/api/users?q=1", lookup)
	}
}
