package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var b64u = base64.RawURLEncoding

type testSigner struct {
	rsa *rsa.PrivateKey
	ec  *ecdsa.PrivateKey
}

func newTestSigner(t testing.TB) *testSigner {
	r, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	e, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &testSigner{rsa: r, ec: e}
}

func (s *testSigner) jwks() string {
	ec, err := s.ec.PublicKey.Bytes() // 0x04, X, Y
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf(`{"keys":[{"kty":"RSA","kid":"r","n":%q,"e":%q},{"kty":"EC","kid":"e","crv":"P-256","x":%q,"y":%q},{"kty":"oct","k":"x"}]}`,
		b64u.EncodeToString(s.rsa.N.Bytes()), b64u.EncodeToString(big.NewInt(int64(s.rsa.E)).Bytes()),
		b64u.EncodeToString(ec[1:33]), b64u.EncodeToString(ec[33:]))
}

// sign makes a token with alg RS256 (kid r) or ES256 (kid e).
func (s *testSigner) sign(t testing.TB, alg string, claims map[string]any) string {
	t.Helper()
	body, _ := json.Marshal(claims)
	kid := "r"
	if alg == "ES256" {
		kid = "e"
	}
	in := b64u.EncodeToString([]byte(`{"alg":"`+alg+`","kid":"`+kid+`"}`)) + "." + b64u.EncodeToString(body)
	sum := sha256.Sum256([]byte(in))
	var sig []byte
	var err error
	if alg == "ES256" {
		r, ss, e := ecdsa.Sign(rand.Reader, s.ec, sum[:])
		err = e
		sig = append(r.FillBytes(make([]byte, 32)), ss.FillBytes(make([]byte, 32))...)
	} else {
		sig, err = rsa.SignPKCS1v15(rand.Reader, s.rsa, crypto.SHA256, sum[:])
	}
	if err != nil {
		t.Fatal(err)
	}
	return in + "." + b64u.EncodeToString(sig)
}

func TestJWTVerify(t *testing.T) {
	s := newTestSigner(t)
	keys, err := parseJWKS([]byte(s.jwks()))
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys %d, %v", len(keys), err)
	}
	now := time.Unix(1_800_000_000, 0)
	v := &jwtVerifier{keys: keys, issuer: "iss", audience: "api", now: func() time.Time { return now }}
	ok := map[string]any{"iss": "iss", "aud": []any{"x", "api"}, "sub": "alice", "exp": 1_800_000_030, "nbf": 1_800_000_050}
	for _, alg := range []string{"RS256", "ES256"} {
		p, err := v.verify(s.sign(t, alg, ok))
		if err != nil || p["sub"] != "alice" {
			t.Errorf("%s: %v %v", alg, p, err)
		}
	}
	other := newTestSigner(t)
	for name, tok := range map[string]string{
		"expired":       s.sign(t, "RS256", map[string]any{"iss": "iss", "aud": "api", "exp": 1_799_999_900}),
		"not yet":       s.sign(t, "RS256", map[string]any{"iss": "iss", "aud": "api", "nbf": 1_800_000_100}),
		"issuer":        s.sign(t, "RS256", map[string]any{"iss": "other", "aud": "api"}),
		"audience":      s.sign(t, "ES256", map[string]any{"iss": "iss", "aud": "web"}),
		"other key":     other.sign(t, "RS256", map[string]any{"iss": "iss", "aud": "api"}),
		"other ec key":  other.sign(t, "ES256", map[string]any{"iss": "iss", "aud": "api"}),
		"not a token":   "abc",
		"two parts":     "a.b",
		"four parts":    "a.b.c.d",
		"bad base64":    "!!.!!.!!",
		"alg none":      b64u.EncodeToString([]byte(`{"alg":"none"}`)) + "." + b64u.EncodeToString([]byte(`{"iss":"iss"}`)) + ".",
		"exp string":    s.sign(t, "RS256", map[string]any{"iss": "iss", "aud": "api", "exp": "soon"}),
		"payload array": s.sign(t, "RS256", nil),
	} {
		if p, err := v.verify(tok); err == nil {
			t.Errorf("%s: verified %v", name, p)
		}
	}
	for _, bad := range []string{`{`, `{"keys":[]}`, `{"keys":[{"kty":"RSA","n":"!","e":"AQAB"}]}`} {
		if _, err := parseJWKS([]byte(bad)); err == nil {
			t.Errorf("JWKS %s accepted", bad)
		}
	}
}

// sluice run --jwt-jwks: limits per verified subject, 8 workers, a forged header changing
// nothing, no token or a bad one answered 401 before the filter.
func TestRunJWTClaims(t *testing.T) {
	s := newTestSigner(t)
	dir := t.TempDir()
	jwks := filepath.Join(dir, "jwks.json")
	cfgFile := filepath.Join(dir, "config.json")
	os.WriteFile(jwks, []byte(s.jwks()), 0o644)
	os.WriteFile(cfgFile, []byte(`{"rules":[
	  {"name":"per-sub","key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],"missing_key":"deny","algorithm":"fixed_window","limit":3,"window":"1h"},
	  {"name":"free","match":{"metadata":[{"namespace":"envoy.filters.http.jwt_authn","path":"payload.plan","exact":"free"}]},
	   "key":[{"metadata":{"namespace":"envoy.filters.http.jwt_authn","path":"payload.sub"}}],"algorithm":"fixed_window","limit":2,"window":"1h"}]}`), 0o644)
	rs, _, _ := startTestRun(t, runConfig{wasm: buildWasm(t, "../sluice-wasm"), configPath: cfgFile, workers: 8, clusters: clusterFlag{},
		jwt: jwtFlags{jwks: jwks, issuer: "iss"}})
	base := "http://" + rs.listenAddr
	for _, c := range []struct {
		name   string
		claims map[string]any
		want   int
	}{
		{"pro", map[string]any{"iss": "iss", "sub": "alice", "plan": "pro"}, 3},
		{"free", map[string]any{"iss": "iss", "sub": "bob", "plan": "free"}, 2},
		{"no sub", map[string]any{"iss": "iss", "plan": "pro"}, 0},
	} {
		tok := s.sign(t, "RS256", c.claims)
		counts := map[int]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := 0; i < 24; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				resp, _ := httpGetNoFatal(base+"/api", "Authorization", "Bearer "+tok, "x-sub", fmt.Sprint("forged", i))
				mu.Lock()
				counts[resp]++
				mu.Unlock()
			}(i)
		}
		wg.Wait()
		if counts[200] != c.want || counts[429] != 24-c.want {
			t.Errorf("%s: %v, want %d admitted", c.name, counts, c.want)
		}
	}
	if resp, _ := httpGet(t, base+"/api"); resp.StatusCode != 401 {
		t.Errorf("no token: %d, want 401", resp.StatusCode)
	}
	if resp, _ := httpGet(t, base+"/api", "Authorization", "Bearer "+newTestSigner(t).sign(t, "RS256", map[string]any{"iss": "iss", "sub": "m"})); resp.StatusCode != 401 {
		t.Errorf("unsigned token: %d, want 401", resp.StatusCode)
	}
}

func httpGetNoFatal(url string, hdr ...string) (int, error) {
	req, _ := http.NewRequest("GET", url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Any token is refused or verified, never a panic.
func FuzzJWTVerify(f *testing.F) {
	s := newTestSigner(f)
	keys, err := parseJWKS([]byte(s.jwks()))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(s.sign(f, "RS256", map[string]any{"sub": "a"}))
	f.Add(s.sign(f, "ES256", map[string]any{"sub": "a", "exp": "x"}))
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJFUzI1NiJ9.e30.")
	v := &jwtVerifier{keys: keys, issuer: "", now: func() time.Time { return time.Unix(1_800_000_000, 0) }}
	f.Fuzz(func(t *testing.T, tok string) {
		v.verify(tok)
	})
}
