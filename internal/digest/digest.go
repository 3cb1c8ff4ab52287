// Package digest computes SHA-1 and SHA-256 (FIPS 180-4) without the
// crypto packages: the Wasm module needs a script's SHA-1 for EVALSHA and a
// SHA-256 of unusual key parts, and importing crypto/sha1 and crypto/sha256
// brings the whole FIPS 140 module (its self-tests, AES, DRBG) into the
// module Envoy compiles at every start. Not for secrets: no constant-time
// concerns, no streaming interface.
package digest

import (
	"encoding/binary"
	"math/bits"
)

// tail is the message's last partial block with its padding (0x80, zeros
// to 56 mod 64, the length in bits, big-endian): one or two blocks, on
// the stack (no allocation: a key's digest is computed per request).
func tail(msg []byte) ([128]byte, int) {
	var t [128]byte
	r := len(msg) % 64
	copy(t[:], msg[len(msg)-r:])
	t[r] = 0x80
	n := 64
	if r >= 56 {
		n = 128
	}
	binary.BigEndian.PutUint64(t[n-8:], uint64(len(msg))*8)
	return t, n
}

func put32(dst []byte, h []uint32) {
	for i, v := range h {
		binary.BigEndian.PutUint32(dst[4*i:], v)
	}
}

// SHA1 is the SHA-1 digest of msg.
func SHA1(msg []byte) [20]byte {
	h := [5]uint32{0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0}
	sha1Blocks(&h, msg[:len(msg)-len(msg)%64])
	t, n := tail(msg)
	sha1Blocks(&h, t[:n])
	var out [20]byte
	put32(out[:], h[:])
	return out
}

func sha1Blocks(h *[5]uint32, p []byte) {
	var w [80]uint32
	for off := 0; off < len(p); off += 64 {
		for t := 0; t < 16; t++ {
			w[t] = binary.BigEndian.Uint32(p[off+4*t:])
		}
		for t := 16; t < 80; t++ {
			w[t] = bits.RotateLeft32(w[t-3]^w[t-8]^w[t-14]^w[t-16], 1)
		}
		a, b, c, d, e := h[0], h[1], h[2], h[3], h[4]
		for t := 0; t < 80; t++ {
			var f, k uint32
			switch {
			case t < 20:
				f, k = (b&c)|(^b&d), 0x5A827999
			case t < 40:
				f, k = b^c^d, 0x6ED9EBA1
			case t < 60:
				f, k = (b&c)|(b&d)|(c&d), 0x8F1BBCDC
			default:
				f, k = b^c^d, 0xCA62C1D6
			}
			tmp := bits.RotateLeft32(a, 5) + f + e + k + w[t]
			e, d, c, b, a = d, c, bits.RotateLeft32(b, 30), a, tmp
		}
		h[0] += a
		h[1] += b
		h[2] += c
		h[3] += d
		h[4] += e
	}
}

var k256 = [64]uint32{
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

// SHA256 is the SHA-256 digest of msg.
func SHA256(msg []byte) [32]byte {
	h := [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
	sha256Blocks(&h, msg[:len(msg)-len(msg)%64])
	t, n := tail(msg)
	sha256Blocks(&h, t[:n])
	var out [32]byte
	put32(out[:], h[:])
	return out
}

func sha256Blocks(h *[8]uint32, p []byte) {
	var w [64]uint32
	for off := 0; off < len(p); off += 64 {
		for t := 0; t < 16; t++ {
			w[t] = binary.BigEndian.Uint32(p[off+4*t:])
		}
		for t := 16; t < 64; t++ {
			s0 := bits.RotateLeft32(w[t-15], -7) ^ bits.RotateLeft32(w[t-15], -18) ^ (w[t-15] >> 3)
			s1 := bits.RotateLeft32(w[t-2], -17) ^ bits.RotateLeft32(w[t-2], -19) ^ (w[t-2] >> 10)
			w[t] = w[t-16] + s0 + w[t-7] + s1
		}
		a, b, c, d, e, f, g, hh := h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
		for t := 0; t < 64; t++ {
			s1 := bits.RotateLeft32(e, -6) ^ bits.RotateLeft32(e, -11) ^ bits.RotateLeft32(e, -25)
			ch := (e & f) ^ (^e & g)
			t1 := hh + s1 + ch + k256[t] + w[t]
			s0 := bits.RotateLeft32(a, -2) ^ bits.RotateLeft32(a, -13) ^ bits.RotateLeft32(a, -22)
			maj := (a & b) ^ (a & c) ^ (b & c)
			t2 := s0 + maj
			hh, g, f, e, d, c, b, a = g, f, e, d+t1, c, b, a, t1+t2
		}
		h[0] += a
		h[1] += b
		h[2] += c
		h[3] += d
		h[4] += e
		h[5] += f
		h[6] += g
		h[7] += hh
	}
}
