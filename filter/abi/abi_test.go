package abi

import (
	"testing"
)

func TestHeaderSerializationRoundTrip(t *testing.T) {
	hs := []Header{{"retry-after", []byte("3")}, {"", nil}, {"x", []byte("a\x00b")}}
	b := SerializeHeaders(nil, hs)
	// count, 3 × (name size, value size), then NUL-terminated data.
	want := "\x03\x00\x00\x00" +
		"\x0b\x00\x00\x00\x01\x00\x00\x00" + "\x00\x00\x00\x00\x00\x00\x00\x00" + "\x01\x00\x00\x00\x03\x00\x00\x00" +
		"retry-after\x003\x00" + "\x00\x00" + "x\x00a\x00b\x00"
	if string(b) != want {
		t.Fatalf("serialized %q\nwant       %q", b, want)
	}
	got, ok := DeserializeHeaders(b)
	if !ok || len(got) != 3 || got[0] != [2]string{"retry-after", "3"} || got[1] != [2]string{"", ""} || got[2] != [2]string{"x", "a\x00b"} {
		t.Errorf("round trip: %q %v", got, ok)
	}
	if got, ok := DeserializeHeaders(nil); !ok || len(got) != 0 {
		t.Errorf("empty map: %v %v", got, ok)
	}
}

func TestDeserializeMalformed(t *testing.T) {
	for _, b := range []string{
		"\x01\x00",
		"\x01\x00\x00\x00",
		"\xff\xff\xff\xff\x00\x00\x00\x00",
		"\x01\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00ab",
		"\x01\x00\x00\x00\x00\x00\x00\x00\xff\xff\xff\x7f\x00",
	} {
		if _, ok := DeserializeHeaders([]byte(b)); ok {
			t.Errorf("accepted %q", b)
		}
	}
}

func FuzzDeserializeHeaders(f *testing.F) {
	f.Add(SerializeHeaders(nil, []Header{{"a", []byte("b")}}))
	f.Add([]byte("\x02\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, ok := DeserializeHeaders(b)
		if !ok {
			return
		}
		in := make([]Header, len(hs))
		for i, h := range hs {
			in[i] = Header{h[0], []byte(h[1])}
		}
		again, ok := DeserializeHeaders(SerializeHeaders(nil, in))
		if !ok || len(again) != len(hs) {
			t.Fatalf("re-serialization failed")
		}
		for i := range hs {
			if again[i] != hs[i] {
				t.Fatalf("pair %d: %q != %q", i, again[i], hs[i])
			}
		}
	})
}

func TestStatusString(t *testing.T) {
	if StatusCasMismatch.String() != "CAS_MISMATCH" || Status(99).String() != "STATUS_99" || Status(0).String() != "OK" {
		t.Error(StatusCasMismatch.String(), Status(99).String())
	}
}
