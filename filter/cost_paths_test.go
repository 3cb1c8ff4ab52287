package filter_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/usage"
)

// TestCostPathsCompile: config accepts a cost.response.json path exactly when
// filter/usage compiles it, so that a configuration sluice check accepts never meets a
// path the filter's meter refuses (the bill would fail at the first settling request).
func TestCostPathsCompile(t *testing.T) {
	paths := []string{
		"usage.total_tokens", "a", "a.b.c.d.e.f.g.h", "a.b.c.d.e.f.g.h.i", "usage..total", ".usage", "usage.",
		"choices[0].usage", "a]", strings.Repeat("k", 64), strings.Repeat("k", 65), "usage.tötal", "usage.\x7f",
		"usage.tab\tkey", "key with spaces", "~!@#$%^&*()", "caf\u00e9",
	}
	for _, p := range paths {
		cfg := `{"rules":[{"name":"r","key":[{"header":"x"}],"algorithm":"token_bucket","limit":100,"window":"1m",` +
			`"cost":{"request":1,"response":{"json":` + jsonString(p) + `}}}]}`
		_, cerr := config.Parse([]byte(cfg))
		_, uerr := usage.Compile(p)
		if (cerr == nil) != (uerr == nil) {
			t.Errorf("path %q: config %v, usage.Compile %v", p, cerr, uerr)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
