package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"time"
)

// jwtVerifier checks a compact JWS token's signature and its registered claims.
type jwtVerifier struct {
	keys             []jwk
	issuer, audience string
	now              func() time.Time
}

var errBadJWT = errors.New("invalid token")

// verify returns the token's payload when the token is signed by one of the keys (the one
// its kid names, else any that verifies) with RS256/384/512 or ES256/384, is not expired nor
// before its nbf (each within jwtClockSkew), and carries the configured iss and aud.
func (v *jwtVerifier) verify(tok string) (map[string]any, error) {
	if len(tok) > maxJWTLen {
		return nil, errBadJWT
	}
	h64, rest, ok1 := strings.Cut(tok, ".")
	p64, s64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || strings.Contains(s64, ".") {
		return nil, errBadJWT
	}
	b := base64.RawURLEncoding
	hb, err1 := b.DecodeString(h64)
	pb, err2 := b.DecodeString(p64)
	sig, err3 := b.DecodeString(s64)
	if err1 != nil || err2 != nil || err3 != nil {
		return nil, errBadJWT
	}
	var hdr struct{ Alg, Kid string }
	if json.Unmarshal(hb, &hdr) != nil {
		return nil, errBadJWT
	}
	hash, ok := jwtHashes[hdr.Alg]
	if !ok {
		return nil, errBadJWT
	}
	hw := hash.New()
	hw.Write([]byte(tok[:len(h64)+1+len(p64)]))
	sum := hw.Sum(nil)
	verified := false
	for _, k := range v.keys {
		if hdr.Kid != "" && k.kid != "" && k.kid != hdr.Kid {
			continue
		}
		if jwtSignatureOK(hdr.Alg, k.pub, hash, sum, sig) {
			verified = true
			break
		}
	}
	if !verified {
		return nil, errBadJWT
	}
	var claims map[string]any
	if json.Unmarshal(pb, &claims) != nil || claims == nil {
		return nil, errBadJWT
	}
	if !v.claimsOK(claims) {
		return nil, errBadJWT
	}
	return claims, nil
}

var jwtHashes = map[string]crypto.Hash{
	"RS256": crypto.SHA256, "RS384": crypto.SHA384, "RS512": crypto.SHA512,
	"ES256": crypto.SHA256, "ES384": crypto.SHA384,
}

func jwtSignatureOK(alg string, pub crypto.PublicKey, hash crypto.Hash, sum, sig []byte) bool {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return alg[0] == 'R' && rsa.VerifyPKCS1v15(k, hash, sum, sig) == nil
	case *ecdsa.PublicKey:
		n := (k.Curve.Params().BitSize + 7) / 8
		if alg[0] != 'E' || len(sig) != 2*n || (alg == "ES256") != (n == 32) {
			return false
		}
		r, s := new(big.Int).SetBytes(sig[:n]), new(big.Int).SetBytes(sig[n:])
		return ecdsa.Verify(k, sum, r, s)
	}
	return false
}

// claimsOK checks exp, nbf, iss and aud.
func (v *jwtVerifier) claimsOK(c map[string]any) bool {
	now := v.now()
	if exp, ok := c["exp"]; ok {
		f, isNum := exp.(float64)
		if !isNum || now.Add(-jwtClockSkew).After(time.Unix(int64(f), 0)) {
			return false
		}
	}
	if nbf, ok := c["nbf"]; ok {
		f, isNum := nbf.(float64)
		if !isNum || now.Add(jwtClockSkew).Before(time.Unix(int64(f), 0)) {
			return false
		}
	}
	if v.issuer != "" && c["iss"] != v.issuer {
		return false
	}
	if v.audience != "" {
		switch aud := c["aud"].(type) {
		case string:
			return aud == v.audience
		case []any:
			for _, a := range aud {
				if a == v.audience {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return true
}
