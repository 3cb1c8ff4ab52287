package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Identity through `sluice serve`: Envoy's own rate-limit filter behind jwt_authn, its
// route's descriptor taken from the verified claim (the rate_limits action "metadata",
// source DYNAMIC), against `sluice serve --config` in envoyproxy/ratelimit's format with a
// descriptor per subject and a per-value one for tenant acme (the most specific wins).
func TestEnvoyRateLimitFilterJWTClaims(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		domain := rlsName(tg, "jwt")
		cfgPath := filepath.Join(t.TempDir(), "ratelimit.yaml")
		cfg := "domain: " + domain + `
descriptors:
  - key: sub
    rate_limit: {unit: year, requests_per_unit: 3}
  - key: sub
    value: acme
    rate_limit: {unit: year, requests_per_unit: 10}
`
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		srv := startServe(t, c, "--config", cfgPath)
		s := newJWTSigner(t)
		render := renderRLSEnvoy(rlsBootstrap{Name: "ratelimit filter, jwt claims", RLSPort: srv.port,
			RateLimit: &rateLimitFilter{Domain: domain, FailureModeDeny: true}})
		e := startEnvoy(t, tg, 4, func(site EnvoySite) ([]byte, error) {
			y, err := render(site)
			if err != nil {
				return nil, err
			}
			out := string(y)
			const action = "- request_headers: {header_name: x-api-key, descriptor_key: api_key}"
			const filter = "          - name: envoy.filters.http.ratelimit\n"
			if !strings.Contains(out, action) || !strings.Contains(out, filter) {
				t.Fatal("rls.yaml.tmpl changed: no request_headers action or ratelimit filter to replace")
			}
			out = strings.Replace(out, action, `- metadata:
                        descriptor_key: sub
                        metadata_key:
                          key: envoy.filters.http.jwt_authn
                          path: [{key: payload}, {key: sub}]
                        source: DYNAMIC`, 1)
			var jwt strings.Builder
			for _, l := range strings.Split(jwtAuthnFilter(s.jwks()), "\n") {
				jwt.WriteString("          " + l + "\n")
			}
			out = strings.Replace(out, filter, jwt.String()+filter, 1)
			return []byte(out), nil
		})
		url := envoyProxy(t, e).url
		for _, c := range []struct {
			sub  string
			want int
		}{{"alice-" + domain, 3}, {"bob-" + domain, 3}, {"acme", 10}} {
			hdr := map[string]string{"authorization": "Bearer " + s.token(t, map[string]any{"sub": c.sub})}
			got := burstCount(t, url, 24, hdr)
			if got[200] != c.want || got[429] != 24-c.want {
				t.Errorf("sub %s: %v, want %d admitted", c.sub, got, c.want)
			}
			t.Logf("sub %s: admitted %d of 24 (configured %d)", c.sub, got[200], c.want)
		}
	})
}

// Plans on backend "rls": sluice.wasm in two Envoys sends each request's plan parameters in
// its inline descriptor to `sluice serve`; the fleet admits exactly each key's entry.
func TestEnvoyRLSPlans(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		srv := startServe(t, c, "--inline-domains", rlsDomain)
		rule := rlsName(tg, "plans")
		cfg := rlsPluginConfig(rlsDomain, 2, "closed", fmt.Sprintf(`{"name":%q,"key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":3,"window":"365d","backend":"rls",
   "overrides":{"by":{"header":"x-api-key"},"values":{"acme":7,"big":{"limit":20}}}}`, rule))
		_, urls := startRLSEnvoys(t, tg, 2, 2, srv, rule, cfg)
		for key, want := range map[string]int{"plain-" + rule: 3, "acme": 7, "big": 20} {
			n := tally(rlsBurst(t, urls, 60, 16, key))
			if n[200] != want || n[429] != 60-want {
				t.Errorf("%s: %v, want %d admitted across 2 Envoys", key, n, want)
			}
			t.Logf("%s: admitted %d of 60 over 2 Envoys (configured %d)", key, n[200], want)
		}
	})
}
