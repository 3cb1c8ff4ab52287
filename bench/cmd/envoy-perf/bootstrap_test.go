package main

import (
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Every configuration renders a bootstrap Envoy's v3 schema accepts, with the filter it names.
func TestBootstrapEveryConfig(t *testing.T) {
	for _, c := range []struct {
		config string
		deny   bool
		want   string
	}{
		{"none", false, ""},
		{"noop", false, "root_id: noop"},
		{"native", false, "envoy.filters.http.local_ratelimit"},
		{"native", true, "fill_interval: 3600s"},
		{"sluice", false, "root_id: sluice"},
		{"sluice", true, `\"limit\":1,`},
	} {
		y, err := renderBootstrap(options{config: c.config, deny: c.deny, headers: "both"}, "/tmp/sluice.wasm", 18080)
		if err != nil {
			t.Fatalf("%s: %v", c.config, err)
		}
		b, err := envoyproc.ParseBootstrap(y)
		if err != nil {
			t.Fatalf("%s deny=%v: %v\n%s", c.config, c.deny, err, y)
		}
		if err := envoyproc.ValidateAnys(b); err != nil {
			t.Fatalf("%s deny=%v: %v", c.config, c.deny, err)
		}
		if c.want != "" && !strings.Contains(string(y), c.want) {
			t.Errorf("%s deny=%v: no %q in\n%s", c.config, c.deny, c.want, y)
		}
		if c.config == "none" && (strings.Contains(string(y), "local_ratelimit") || strings.Contains(string(y), "wasm.v3")) {
			t.Errorf("none: a filter besides the router:\n%s", y)
		}
	}
}
