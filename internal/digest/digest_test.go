package digest

import (
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// Known answers (FIPS 180-4's examples), and agreement with crypto/sha1 and
// crypto/sha256 on every length from 0 to 300 bytes (each padding case, one
// to five blocks) and on random messages up to 10 KB.
func TestDigests(t *testing.T) {
	for _, tc := range []struct{ in, sha1, sha256 string }{
		{"", "da39a3ee5e6b4b0d3255bfef95601890afd80709", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "a9993e364706816aba3e25717850c26c9cd0d89d", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", "84983e441c3bd26ebaae4aa1f95129e5e54670f1",
			"248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
	} {
		if s := SHA1([]byte(tc.in)); hex.EncodeToString(s[:]) != tc.sha1 {
			t.Errorf("SHA1(%q) = %x", tc.in, s)
		}
		if s := SHA256([]byte(tc.in)); hex.EncodeToString(s[:]) != tc.sha256 {
			t.Errorf("SHA256(%q) = %x", tc.in, s)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	check := func(b []byte) {
		if SHA1(b) != sha1.Sum(b) {
			t.Fatalf("SHA1 differs from crypto/sha1 on %d bytes", len(b))
		}
		if SHA256(b) != sha256.Sum256(b) {
			t.Fatalf("SHA256 differs from crypto/sha256 on %d bytes", len(b))
		}
	}
	for n := 0; n <= 300; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		check(b)
	}
	for i := 0; i < 200; i++ {
		b := make([]byte, r.IntN(10240))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		check(b)
	}
}

// A digest allocates nothing (a key's is computed per request).
func TestDigestAllocatesNothing(t *testing.T) {
	b := make([]byte, 200)
	if n := testing.AllocsPerRun(100, func() { _ = SHA256(b); _ = SHA1(b[:57]) }); n != 0 {
		t.Errorf("%v allocations per digest", n)
	}
}
