package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

// `sluice run`'s counterpart of Envoy's jwt_authn in front of the filter: with --jwt-jwks it
// verifies the request's bearer token against a local JSON Web Key Set and hands its payload
// to the filter as the dynamic metadata jwt_authn writes with payload_in_metadata: "payload"
// (namespace envoy.filters.http.jwt_authn), so that one configuration keyed on
// {"metadata": {"namespace": "envoy.filters.http.jwt_authn", "path": "payload.sub"}} runs the
// same in Envoy and in sluice run. As jwt_authn with "requires" a provider: a request without
// a valid token is answered 401 before the filter (with --jwt-optional, one without any token
// goes on without metadata; a bad token is still 401).

// jwtNamespace is jwt_authn's metadata namespace.
const jwtNamespace = "envoy.filters.http.jwt_authn"

// jwtClockSkew is jwt_authn's default clock_skew_seconds.
const jwtClockSkew = 60 * time.Second

// maxJWTLen bounds a token (Envoy's own header limit is 60 KiB).
const maxJWTLen = 16 << 10

// jwtFlags are the command-line flags of the verifier.
type jwtFlags struct {
	jwks, issuer, audience string
	optional               bool
}

func (f *jwtFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.jwks, "jwt-jwks", "", "a JSON Web Key Set file (RS256/384/512, ES256/384 keys): verify the bearer token of every request as Envoy's jwt_authn does and give its payload to the filter as the metadata envoy.filters.http.jwt_authn / payload; a request without a valid token gets 401")
	fs.StringVar(&f.issuer, "jwt-issuer", "", "with --jwt-jwks: the iss a token must carry (empty: any)")
	fs.StringVar(&f.audience, "jwt-audience", "", "with --jwt-jwks: an aud a token must carry (empty: any)")
	fs.BoolVar(&f.optional, "jwt-optional", false, "with --jwt-jwks: a request without a token goes on, without metadata (a bad token is still 401)")
}

// handler wraps next with the verifier when --jwt-jwks is given.
func (f *jwtFlags) handler(next http.Handler) (http.Handler, error) {
	if f.jwks == "" {
		if f.issuer != "" || f.audience != "" || f.optional {
			return nil, errors.New("--jwt-issuer, --jwt-audience and --jwt-optional need --jwt-jwks")
		}
		return next, nil
	}
	data, err := os.ReadFile(f.jwks)
	if err != nil {
		return nil, fmt.Errorf("--jwt-jwks: %v", err)
	}
	keys, err := parseJWKS(data)
	if err != nil {
		return nil, fmt.Errorf("--jwt-jwks %s: %v", f.jwks, err)
	}
	v := &jwtVerifier{keys: keys, issuer: f.issuer, audience: f.audience, now: time.Now}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			if f.optional {
				next.ServeHTTP(w, r)
				return
			}
			http.Error(w, "Jwt is missing", http.StatusUnauthorized)
			return
		}
		payload, err := v.verify(tok)
		if err != nil {
			http.Error(w, "Jwt verification fails", http.StatusUnauthorized)
			return
		}
		md := host.Metadata{jwtNamespace: {"payload": payload}}
		next.ServeHTTP(w, r.WithContext(host.WithMetadata(r.Context(), md)))
	}), nil
}

// jwk is one public key of a set.
type jwk struct {
	kid string
	pub crypto.PublicKey
}

// parseJWKS reads the RSA and EC (P-256, P-384) signing keys of a JSON Web Key Set; other
// keys are ignored, a set with none usable is an error.
func parseJWKS(data []byte) ([]jwk, error) {
	var set struct {
		Keys []struct {
			Kty, Kid, Use, N, E, Crv, X, Y string
		} `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, err
	}
	b := base64.RawURLEncoding
	var keys []jwk
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		switch k.Kty {
		case "RSA":
			n, err1 := b.DecodeString(k.N)
			e, err2 := b.DecodeString(k.E)
			if err1 != nil || err2 != nil || len(n) == 0 || len(e) == 0 || len(e) > 4 {
				return nil, fmt.Errorf("keys[%d]: bad RSA key", i)
			}
			keys = append(keys, jwk{k.Kid, &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}})
		case "EC":
			var c elliptic.Curve
			switch k.Crv {
			case "P-256":
				c = elliptic.P256()
			case "P-384":
				c = elliptic.P384()
			default:
				continue
			}
			x, err1 := b.DecodeString(k.X)
			y, err2 := b.DecodeString(k.Y)
			n := (c.Params().BitSize + 7) / 8
			if err1 != nil || err2 != nil || len(x) != n || len(y) != n {
				return nil, fmt.Errorf("keys[%d]: bad EC key", i)
			}
			pub, err := ecdsa.ParseUncompressedPublicKey(c, append(append([]byte{4}, x...), y...))
			if err != nil {
				return nil, fmt.Errorf("keys[%d]: bad EC key: %v", i, err)
			}
			keys = append(keys, jwk{k.Kid, pub})
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no RSA or EC (P-256, P-384) signing key")
	}
	return keys, nil
}
