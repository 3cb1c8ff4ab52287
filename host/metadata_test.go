package host

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/sluice-proxy/sluice/proxywasm"
)

// Metadata properties are encoded as Envoy's Context::getProperty encodes them.
func TestMetadataProperty(t *testing.T) {
	md := Metadata{"envoy.filters.http.jwt_authn": {"payload": map[string]any{
		"sub": "alice", "n": 42.0, "admin": true, "groups": []any{"a"}, "org": map[string]any{"id": "acme"}}}}
	p := func(s string) string { return metadataProp + "envoy.filters.http.jwt_authn\x00" + s }
	for _, c := range []struct {
		path string
		want string
		ok   bool
	}{
		{p("payload\x00sub"), "alice", true},
		{p("payload\x00n"), string(binary.LittleEndian.AppendUint64(nil, math.Float64bits(42))), true},
		{p("payload\x00admin"), "\x01", true},
		{p("payload\x00org"), string(proxywasm.AppendPairs(nil, [][2]string{{"id", "acme"}})), true},
		{p("payload\x00org\x00id"), "acme", true},
		{p("payload\x00groups"), string(proxywasm.AppendPairs(nil, [][2]string{{"a", ""}})), true},
		{p("payload\x00groups\x000"), "", false},
		{p("payload\x00sub\x00x"), "", false},
		{p("payload\x00missing"), "", false},
		{metadataProp + "other\x00payload", "", false},
		{"metadata", "", false},
	} {
		s, b, ok := metadataProperty(md, c.path)
		if b != nil {
			s = string(b)
		}
		if ok != c.ok || s != c.want {
			t.Errorf("%q: %q %v, want %q %v", c.path, s, ok, c.want, c.ok)
		}
	}
	if _, _, ok := metadataProperty(nil, p("payload\x00sub")); ok {
		t.Error("nil metadata answered")
	}
	if got := MetadataFrom(WithMetadata(context.Background(), md)); got == nil {
		t.Error("context lost the metadata")
	}
}
