package e2e

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Limits that follow the client: sluice keyed on the claims Envoy's jwt_authn verified (its
// dynamic metadata), in real Envoy, with a local JWKS and tokens the test signs.

// jwtSigner signs RS256 tokens with a key generated for the test.
type jwtSigner struct {
	key *rsa.PrivateKey
}

func newJWTSigner(t testing.TB) *jwtSigner {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return &jwtSigner{key: k}
}

var b64 = base64.RawURLEncoding

// jwks is the public key as a JSON Web Key Set.
func (s *jwtSigner) jwks() string {
	e := big.NewInt(int64(s.key.E)).Bytes()
	return fmt.Sprintf(`{"keys":[{"kty":"RSA","alg":"RS256","use":"sig","kid":"k1","n":%q,"e":%q}]}`,
		b64.EncodeToString(s.key.N.Bytes()), b64.EncodeToString(e))
}

// token signs claims (iss and a distant exp added).
func (s *jwtSigner) token(t testing.TB, claims map[string]any) string {
	t.Helper()
	c := map[string]any{"iss": jwtIssuer, "exp": 4102444800}
	for k, v := range claims {
		c[k] = v
	}
	body, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	signing := b64.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT","kid":"k1"}`)) + "." + b64.EncodeToString(body)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + b64.EncodeToString(sig)
}

const jwtIssuer = "https://issuer.sluice.test"

// jwtAuthnFilter is jwt_authn requiring a token of the local JWKS on every route, its
// payload in the dynamic metadata under "payload".
func jwtAuthnFilter(jwks string) string {
	return `- name: envoy.filters.http.jwt_authn
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
    providers:
      test:
        issuer: ` + jwtIssuer + `
        local_jwks: {inline_string: ` + fmt.Sprintf("%q", jwks) + `}
        payload_in_metadata: payload
        forward: true
    rules:
    - match: {prefix: /}
      requires: {provider_name: test}`
}

// identityConfig: per subject 3 an hour; the free plan 2 an hour; a numeric claim n = 42
// limits to 1. A request without a subject is refused (missing_key deny).
const identityConfig = `{"rules":[
  {"name":"per-sub","key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],
   "missing_key":"deny","algorithm":"fixed_window","limit":3,"window":"1h"},
  {"name":"free","match":{"metadata":[{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan","exact":"free"}]},
   "key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],"algorithm":"fixed_window","limit":2,"window":"1h"},
  {"name":"n42","match":{"metadata":[{"namespace":"envoy.filters.http.jwt_authn","path":"payload.n","exact":"42"}]},
   "key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],"algorithm":"fixed_window","limit":1,"window":"1h"}
]}`

// burstCount sends n requests at once (8 at a time) with the headers and counts the answers
// by status.
func burstCount(t *testing.T, url string, n int, hdr map[string]string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	counts := map[int]int{}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			req, _ := http.NewRequest("GET", url+"/api/x", nil)
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			req.Header.Set("x-sub", fmt.Sprint("forged-", i)) // never the key
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			counts[resp.StatusCode]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	return counts
}

func TestEnvoyJWTClaims(t *testing.T) {
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		s := newJWTSigner(t)
		e := startEnvoyAs(t, tg, artWasm, 8, func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "jwt-claims", Config: identityConfig, CatchAll: true,
				ExactBalance: true, BeforeSluice: jwtAuthnFilter(s.jwks())})
		})
		url, err := e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		bearer := func(claims map[string]any) map[string]string {
			return map[string]string{"authorization": "Bearer " + s.token(t, claims)}
		}
		for _, c := range []struct {
			name   string
			claims map[string]any
			want   int
		}{
			{"pro subject", map[string]any{"sub": "alice", "plan": "pro"}, 3},
			{"free subject", map[string]any{"sub": "bob", "plan": "free"}, 2},
			{"numeric claim 42", map[string]any{"sub": "dave", "n": 42}, 1},
			{"numeric claim 41", map[string]any{"sub": "erin", "n": 41}, 3},
			{"no subject", map[string]any{"plan": "pro"}, 0},
		} {
			got := burstCount(t, url, 24, bearer(c.claims))
			if got[200] != c.want || got[429] != 24-c.want {
				t.Errorf("%s: %v, want %d admitted and the rest 429", c.name, got, c.want)
			}
			t.Logf("%s: admitted %d of 24 (configured %d)", c.name, got[200], c.want)
		}
		// A token the JWKS did not sign never reaches sluice: jwt_authn answers 401.
		forged := newJWTSigner(t)
		if got := burstCount(t, url, 4, map[string]string{"authorization": "Bearer " + forged.token(t, map[string]any{"sub": "mallory"})}); got[401] != 4 {
			t.Errorf("forged token: %v, want 401", got)
		}
	})
}

// headerToMetadataFilter writes x-user (a string) and x-level (a number) into the dynamic
// metadata namespace acme.auth as top-level keys, removing the headers.
const headerToMetadataFilter = `- name: envoy.filters.http.header_to_metadata
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
    request_rules:
    - header: x-user
      on_header_present: {metadata_namespace: acme.auth, key: user, type: STRING}
      remove: true
    - header: x-level
      on_header_present: {metadata_namespace: acme.auth, key: level, type: NUMBER}
      remove: true`

// Top-level metadata keys, strings and numbers, in both artifacts: what the dynamic module's
// ABI reads (it has no getter for nested fields; a nested path is missing there).
func TestEnvoyMetadataTopLevel(t *testing.T) {
	cfg := `{"rules":[
  {"name":"per-user","key":[{"metadata":{"namespace":"acme.auth","path":"user"}}],"missing_key":"deny","algorithm":"fixed_window","limit":3,"window":"1h"},
  {"name":"level42","match":{"metadata":[{"namespace":"acme.auth","path":"level","exact":"42"}]},
   "key":[{"metadata":{"namespace":"acme.auth","path":"user"}}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		e := startEnvoyAs(t, tg, a, 8, func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "metadata-top-level", Config: cfg, CatchAll: true,
				ExactBalance: true, BeforeSluice: headerToMetadataFilter})
		})
		url, err := e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			hdr  map[string]string
			want int
		}{
			{"user a", map[string]string{"x-user": "a"}, 3},
			{"user b level 42", map[string]string{"x-user": "b", "x-level": "42"}, 1},
			{"user c level 7", map[string]string{"x-user": "c", "x-level": "7"}, 3},
			{"no user", nil, 0},
		} {
			got := burstCount(t, url, 16, c.hdr)
			if got[200] != c.want || got[429] != 16-c.want {
				t.Errorf("%s: %v, want %d admitted and the rest 429", c.name, got, c.want)
			}
		}
	})
}

// plansConfig: per subject, the limit of its plan (free 3, pro 6 an hour; no plan: free),
// tenant "acme" overridden to 10.
const plansConfig = `{"rules":[{"name":"tenant","key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],
  "algorithm":"fixed_window","limit":1,"window":"1h","missing_key":"deny",
  "plans":{"by":{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan"}},"values":{"free":3,"pro":6},"default":"free"},
  "overrides":{"by":{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}},"values":{"acme":10}}}]}`

// Free and pro plans and one overridden tenant behind jwt_authn, 8 workers, a burst per
// tenant: each admitted exactly its limit; the headers report it.
func TestEnvoyJWTPlans(t *testing.T) {
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		s := newJWTSigner(t)
		e := startEnvoyAs(t, tg, artWasm, 8, func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "jwt-plans", Config: plansConfig, CatchAll: true,
				ExactBalance: true, BeforeSluice: jwtAuthnFilter(s.jwks())})
		})
		url, err := e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name   string
			claims map[string]any
			want   int
		}{
			{"free tenant", map[string]any{"sub": "t-free", "plan": "free"}, 3},
			{"pro tenant", map[string]any{"sub": "t-pro", "plan": "pro"}, 6},
			{"tenant without a plan", map[string]any{"sub": "t-none"}, 3},
			{"overridden tenant", map[string]any{"sub": "acme", "plan": "free"}, 10},
		} {
			hdr := map[string]string{"authorization": "Bearer " + s.token(t, c.claims)}
			got := burstCount(t, url, 32, hdr)
			if got[200] != c.want || got[429] != 32-c.want {
				t.Errorf("%s: %v, want %d admitted", c.name, got, c.want)
			}
			t.Logf("%s: admitted %d of 32 (configured %d)", c.name, got[200], c.want)
			req, _ := http.NewRequest("GET", url+"/api/x", nil)
			req.Header.Set("authorization", hdr["authorization"])
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if p, want := resp.Header.Get("ratelimit-policy"), fmt.Sprintf(`"tenant";q=%d;w=3600`, c.want); p != want {
				t.Errorf("%s: RateLimit-Policy %q, want %q", c.name, p, want)
			}
		}
	})
}

// Plans from a top-level metadata key and an override by header, in both artifacts.
func TestEnvoyPlansBothArtifacts(t *testing.T) {
	cfg := `{"rules":[{"name":"tenant","key":[{"metadata":{"namespace":"acme.auth","path":"user"}}],"missing_key":"deny",
  "algorithm":"token_bucket","limit":2,"window":"1h",
  "plans":{"by":{"metadata":{"namespace":"acme.auth","path":"plan"}},"values":{"free":2,"pro":{"limit":5,"burst":5}},"default":"free"},
  "overrides":{"by":{"header":"x-api-key"},"values":{"vip":9}}}]}`
	const filters = `- name: envoy.filters.http.header_to_metadata
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
    request_rules:
    - header: x-user
      on_header_present: {metadata_namespace: acme.auth, key: user, type: STRING}
      remove: true
    - header: x-plan
      on_header_present: {metadata_namespace: acme.auth, key: plan, type: STRING}
      remove: true`
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		e := startEnvoyAs(t, tg, a, 8, func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "plans", Config: cfg, CatchAll: true, ExactBalance: true, BeforeSluice: filters})
		})
		url, err := e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			hdr  map[string]string
			want int
		}{
			{"free", map[string]string{"x-user": "a", "x-plan": "free"}, 2},
			{"pro", map[string]string{"x-user": "b", "x-plan": "pro"}, 5},
			{"no plan", map[string]string{"x-user": "c"}, 2},
			{"override", map[string]string{"x-user": "d", "x-plan": "pro", "x-api-key": "vip"}, 9},
		} {
			if got := burstCount(t, url, 24, c.hdr); got[200] != c.want || got[429] != 24-c.want {
				t.Errorf("%s: %v, want %d admitted", c.name, got, c.want)
			}
		}
	})
}

// A table of 100,000 overrides loads in Envoy (every VM parses it) and applies.
func TestEnvoyLargeOverrides(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"rules":[{"name":"keys","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":2,"window":"1h",
  "overrides":{"by":{"header":"x-api-key"},"values":{`)
	for i := 0; i < 100_000; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"key-%06d":%d`, i, 3+i%5)
	}
	b.WriteString(`}}}]}`)
	cfg := b.String()
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		start := time.Now()
		e := startEnvoyAs(t, tg, a, 2, func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "large-overrides", Config: cfg, CatchAll: true})
		})
		t.Logf("%s: ready in %v with a %d-byte configuration", a.name, time.Since(start).Round(time.Millisecond), len(cfg))
		url, err := e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]int{"key-077777": 3 + 77777%5, "key-000001": 4, "not-listed": 2} {
			if got := burstCount(t, url, 10, map[string]string{"x-api-key": key}); got[200] != want {
				t.Errorf("%s: %v, want %d admitted", key, got, want)
			}
		}
	})
}

// An xDS (LDS) update of the overrides: the VMs are kept and so are the counts; the new
// table applies to new connections.
func TestEnvoyReloadPlans(t *testing.T) {
	cfg := func(acme int) string {
		return fmt.Sprintf(`{"rules":[{"name":"tenant","key":[{"header":"x-tenant"}],"algorithm":"fixed_window","limit":2,"window":"1h",
  "overrides":{"by":{"header":"x-tenant"},"values":{"acme":%d,"probe-v%d":7}}}]}`, acme, acme)
	}
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		const workers = 2
		l := startLDSEnvoy(t, tg, workers, "", cfg(5), "--drain-time-s", "1")
		e := l.e
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		p := envoyProxy(t, e)
		c := newClient(1)
		c.Transport.(*http.Transport).DisableKeepAlives = true
		send := func(tenant string) *http.Response {
			t.Helper()
			req, _ := http.NewRequestWithContext(ctx, "GET", p.url+"/", nil)
			req.Header.Set("x-tenant", tenant)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp
		}
		for i := 0; i < 3; i++ {
			if r := send("acme"); r.StatusCode != 200 {
				t.Fatalf("acme %d: %d", i, r.StatusCode)
			}
		}
		checkVMs(t, e, "start", workers+3, workers+2)
		l.push("2", cfg(4))
		waitStat(ctx, t, e, "listener_manager.lds.update_success", 2)
		for deadline := time.Now().Add(20 * time.Second); ; {
			if send("probe-v4").Header.Get("ratelimit-policy") == `"tenant";q=7;w=3600` {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the new overrides did not serve within 20s")
			}
			time.Sleep(50 * time.Millisecond)
		}
		ok := 0
		for i := 0; i < 4; i++ {
			if r := send("acme"); r.StatusCode == 200 {
				ok++
				if pol := r.Header.Get("ratelimit-policy"); pol != `"tenant";q=4;w=3600` {
					t.Errorf("acme's policy %q after the update", pol)
				}
			}
		}
		if ok != 1 {
			t.Errorf("acme after its override went from 5 to 4: %d more admitted, want 1 (its 3 kept)", ok)
		}
		waitStat(ctx, t, e, "listener_manager.total_filter_chains_draining", 0)
		checkVMs(t, e, "after the update", workers+4, workers+2)
	})
}
