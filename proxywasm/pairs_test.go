package proxywasm

import (
	"fmt"
	"testing"
)

func TestPairsEncoding(t *testing.T) {
	kv := [][2]string{{"retry-after", "3"}, {"", ""}, {"x", "a\x00b"}, {":path", "/x"}}
	// count, 4 × (name size, value size), then NUL-terminated data.
	want := "\x04\x00\x00\x00" +
		"\x0b\x00\x00\x00\x01\x00\x00\x00" + "\x00\x00\x00\x00\x00\x00\x00\x00" + "\x01\x00\x00\x00\x03\x00\x00\x00" + "\x05\x00\x00\x00\x02\x00\x00\x00" +
		"retry-after\x003\x00" + "\x00\x00" + "x\x00a\x00b\x00" + ":path\x00/x\x00"
	b := AppendPairs(nil, kv)
	if string(b) != want {
		t.Fatalf("AppendPairs = %q\nwant          %q", b, want)
	}
	if PairsSize(kv) != len(want) {
		t.Errorf("PairsSize = %d, want %d", PairsSize(kv), len(want))
	}
	hs := make([]Header, len(kv))
	for i, p := range kv {
		hs[i] = Header{p[0], []byte(p[1])}
	}
	if h := AppendHeaders([]byte("pre"), hs); string(h) != "pre"+want {
		t.Fatalf("AppendHeaders = %q, want the same bytes as AppendPairs", h)
	}
	back, ok := ParsePairs(b)
	if !ok || fmt.Sprint(back) != fmt.Sprint(kv) {
		t.Fatalf("ParsePairs = %q, %v", back, ok)
	}
	if got, ok := ParsePairs(nil); !ok || len(got) != 0 {
		t.Errorf("empty map: %v %v", got, ok)
	}
	// Every truncation is rejected.
	for n := 1; n < len(b); n++ {
		if p, ok := ParsePairs(b[:n]); ok {
			t.Errorf("truncated to %d of %d bytes: accepted %q", n, len(b), p)
		}
	}
}

func TestParsePairsMalformed(t *testing.T) {
	for _, b := range []string{
		"\x01",
		"\x01\x00",
		"\x01\x00\x00\x00",
		"\x05\x00\x00\x00",
		"\xff\xff\xff\xff\x00\x00\x00\x00",
		"\x01\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00ab",
		"\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\x7f\x00",
		"\x01\x00\x00\x00\xff\x00\x00\x00\x00\x00\x00\x00a\x00",
	} {
		if _, ok := ParsePairs([]byte(b)); ok {
			t.Errorf("accepted %q", b)
		}
	}
}

func FuzzParsePairs(f *testing.F) {
	f.Add(AppendPairs(nil, [][2]string{{"a", "1"}, {"bb", "22"}}))
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0})
	f.Add([]byte("\x02\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		kv, ok := ParsePairs(b)
		if !ok {
			return
		}
		again, ok := ParsePairs(AppendPairs(nil, kv))
		if !ok || fmt.Sprint(again) != fmt.Sprint(kv) {
			t.Fatalf("re-serialization of %q gives %q, %v", kv, again, ok)
		}
	})
}

func TestStatusString(t *testing.T) {
	if StatusCASMismatch.String() != "CAS_MISMATCH" || Status(99).String() != "STATUS_99" || StatusOK.String() != "OK" {
		t.Error(StatusCASMismatch.String(), Status(99).String())
	}
}
