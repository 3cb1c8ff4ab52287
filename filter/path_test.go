package filter_test

import (
	"testing"

	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// A path_prefix rule applies to every spelling of the path that Envoy's
// normalize_path + merge_slashes (and so the upstream) resolve into it — the
// path-normalisation bypasses — and the path key part counts them as one path; in
// the three hosts (native fake, proxytest emulator, embedded host).
func TestPathNormalizedForMatchAndKey(t *testing.T) {
	variants := []string{"/h", "/%68", "//h", "/./h", "/x/../h", "/h/../h", "/%2568/../h", "/%2e/h", "/..;x/h?q=1"}
	t.Run("path_prefix", func(t *testing.T) {
		cfg := `{"rules":[{"name":"h","match":{"path_prefix":"/h"},"key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
		forEachTarget(t, cfg, func(t *testing.T, tg target) {
			for i, p := range variants {
				want := 429
				if i == 0 {
					want = 200
				}
				if r := tg.do(filtertest.Request{Source: "10.1.0.1:1", Path: p}); r.Status != want {
					t.Errorf("%s: status %d, want %d", p, r.Status, want)
				}
			}
			// Not /h once normalized: the rule does not apply.
			for _, p := range []string{"/%2568", "/x%2Fh", "/H", "/x/h"} {
				if r := tg.do(filtertest.Request{Source: "10.1.0.1:1", Path: p}); r.Status != 200 {
					t.Errorf("%s: status %d, want 200", p, r.Status)
				}
			}
		})
	})
	t.Run("path-key", func(t *testing.T) {
		cfg := `{"rules":[{"name":"per-path","key":[{"path":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
		forEachTarget(t, cfg, func(t *testing.T, tg target) {
			for i, p := range variants {
				want := 429
				if i == 0 {
					want = 200
				}
				if r := tg.do(filtertest.Request{Source: "10.1.0.2:1", Path: p}); r.Status != want {
					t.Errorf("%s: status %d, want %d", p, r.Status, want)
				}
			}
			if r := tg.do(filtertest.Request{Source: "10.1.0.2:1", Path: "/%2568"}); r.Status != 200 {
				t.Errorf("/%%2568 (the text /%%68) shares /h's key: %d", r.Status)
			}
		})
	})
}
