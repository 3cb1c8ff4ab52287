package config

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
)

func TestMetadataKeyPart(t *testing.T) {
	c, err := Parse([]byte(doc("", rule("key",
		`[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}},{"attribute":"connection.requested_server_name"}]`))))
	if err != nil {
		t.Fatal(err)
	}
	k := c.Rules[0].Key
	if got, want := k[0].Value.Prop, "metadata\x00filter_metadata\x00envoy.filters.http.jwt_authn\x00payload\x00sub"; got != want {
		t.Errorf("metadata prop %q, want %q", got, want)
	}
	if got, want := k[1].Value.Prop, "connection\x00requested_server_name"; got != want {
		t.Errorf("attribute prop %q, want %q", got, want)
	}
	if got, want := c.Rules[0].Summary(), "key=metadata:envoy.filters.http.jwt_authn:payload.sub+attribute:connection.requested_server_name"; !strings.Contains(got, want) {
		t.Errorf("summary %q lacks %q", got, want)
	}
}

func TestMetadataMatch(t *testing.T) {
	c, err := Parse([]byte(doc("", rule("match", `{"metadata":[
		{"namespace":"jwt","path":"payload.plan","exact":"pro"},
		{"namespace":"jwt","path":"payload.level","exact":"3"},
		{"namespace":"jwt","path":"payload.banned","absent":true}],
		"attributes":[{"name":"xds.route_name","exact":"login"}]}`))))
	if err != nil {
		t.Fatal(err)
	}
	m := &c.Rules[0].Match
	if m.IsZero() || len(m.Values) != 4 {
		t.Fatalf("values %+v", m.Values)
	}
	three := make([]byte, 8)
	binary.LittleEndian.PutUint64(three, math.Float64bits(3))
	vals := map[string][]byte{
		"metadata\x00filter_metadata\x00jwt\x00payload\x00plan":  []byte("pro"),
		"metadata\x00filter_metadata\x00jwt\x00payload\x00level": three,
		"xds\x00route_name": []byte("login"),
	}
	get := func(p string) ([]byte, bool) { v, ok := vals[p]; return v, ok }
	if !m.MatchesValues(get) {
		t.Error("conditions do not hold")
	}
	vals["metadata\x00filter_metadata\x00jwt\x00payload\x00level"] = []byte("3")
	if !m.MatchesValues(get) {
		t.Error("a string 3 does not match exact 3")
	}
	vals["metadata\x00filter_metadata\x00jwt\x00payload\x00banned"] = []byte{1}
	if m.MatchesValues(get) {
		t.Error("absent holds for a present value")
	}
	vals["metadata\x00filter_metadata\x00jwt\x00payload\x00banned"] = nil
	delete(vals, "metadata\x00filter_metadata\x00jwt\x00payload\x00plan")
	if m.MatchesValues(get) {
		t.Error("exact holds for a missing value")
	}
	if s := m.String(); !strings.Contains(s, `metadata:jwt:payload.plan="pro"`) || !strings.Contains(s, "attribute:xds.route_name=\"login\"") || !strings.Contains(s, "metadata:jwt:payload.banned:absent") {
		t.Errorf("String %q", s)
	}
}

func TestMetadataErrors(t *testing.T) {
	for _, tc := range []struct{ key, match, want string }{
		{key: `[{"metadata":{"path":"a"}}]`, want: `rules[0].key[0].metadata.namespace: is required (the filter that wrote the metadata, e.g. "envoy.filters.http.jwt_authn")`},
		{key: `[{"metadata":{"namespace":"n"}}]`, want: `rules[0].key[0].metadata.path: is required (the field within the namespace, e.g. "payload.sub")`},
		{key: `[{"metadata":{"namespace":"n","path":"a..b"}}]`, want: `rules[0].key[0].metadata.path: "a..b" is not a metadata path (field names of 1–256 bytes joined by ".")`},
		{key: `[{"metadata":{"namespace":"n","path":"a.b.c.d.e.f.g.h.i"}}]`, want: `rules[0].key[0].metadata.path: "a.b.c.d.e.f.g.h.i" has more than 8 segments`},
		{key: `[{"metadata":{"namespace":"a b","path":"x"}}]`, want: `rules[0].key[0].metadata.namespace: "a b" is not a metadata namespace (1–256 bytes, no spaces or control characters)`},
		{key: `[{"metadata":{"namespace":"n","path":"x","sub":1}}]`, want: `rules[0].key[0].metadata.sub: unknown field`},
		{key: `[{"metadata":"n"}]`, want: `rules[0].key[0].metadata: "n" is not an object`},
		{key: `[{"attribute":"xds.route"}]`, want: `rules[0].key[0].attribute: "xds.route" is not a supported attribute (` + strings.Join(Attributes, ", ") + `) (did you mean "xds.route_name"?)`},
		{key: `[{"attribute":"xds.route_name","header":"a"}]`, want: `rules[0].key[0]: has several sources ("header", "attribute"); use one per key part`},
		{match: `{"metadata":[]}`, want: `rules[0].match.metadata: must not be empty (omit it to match any metadata)`},
		{match: `{"metadata":[{"namespace":"n","path":"p"}]}`, want: `rules[0].match.metadata[0].exact: is required (or "absent": true to match a request without the value)`},
		{match: `{"metadata":[{"namespace":"n","path":"p","exact":"a","absent":true}]}`, want: `rules[0].match.metadata[0].absent: cannot be combined with "exact"; give one of them`},
		{match: `{"metadata":[{"namespace":"n","path":"p","absent":false}]}`, want: `rules[0].match.metadata[0].absent: must be true (use "exact" to match a value)`},
		{match: `{"attributes":[{"exact":"a"}]}`, want: `rules[0].match.attributes[0].name: is required`},
		{match: `{"attributes":[{"name":"route","exact":"a"}]}`, want: `rules[0].match.attributes[0].name: "route" is not a supported attribute (` + strings.Join(Attributes, ", ") + `)`},
	} {
		var d string
		if tc.key != "" {
			d = doc("", rule("key", tc.key))
		} else {
			d = doc("", rule("match", tc.match))
		}
		_, err := Parse([]byte(d))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%s\n got: %v\nwant: %s", d, err, tc.want)
		}
	}
}

// libsluice.so refuses a nested metadata path: its ABI reads top-level keys only.
func TestMetadataNestedRefusedByDynamicModule(t *testing.T) {
	d := []byte(doc("", rule("key", `[{"metadata":{"namespace":"jwt","path":"payload.sub"}}]`)))
	_, err := ParseFor(d, BuildDynamic)
	want := `rules[0].key[0].metadata.path: "payload.sub" is a nested field: libsluice.so reads only a top-level key of a namespace (sluice.wasm reads nested fields)`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	if _, err := ParseFor(d, BuildLocal); err != nil {
		t.Error(err)
	}
	if _, err := ParseFor([]byte(doc("", rule("key", `[{"metadata":{"namespace":"jwt","path":"sub"}}]`))), BuildDynamic); err != nil {
		t.Error(err)
	}
}
