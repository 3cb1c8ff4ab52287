package host

import (
	"net/http"
	"testing"
)

// The net/http path copies back only the headers a filter added when it neither replaced
// nor removed any: headerMap.edited and onlyAdded decide that.
func TestHeaderMapEdited(t *testing.T) {
	base := func() *headerMap {
		return &headerMap{kv: [][2]string{{":status", "200"}, {"content-type", "text/plain"}, {"x-a", "1"}}}
	}
	m := base()
	if !onlyAdded(m, 3) {
		t.Error("untouched map: onlyAdded false")
	}
	m.add("ratelimit", "r=1")
	if m.edited || !onlyAdded(m, 3) {
		t.Error("after add: want onlyAdded")
	}
	m.add(":status", "201")
	if onlyAdded(m, 3) {
		t.Error("an added pseudo-header must take the full path")
	}

	m = base()
	m.replace("x-a", "2")
	if !m.edited || onlyAdded(m, 3) {
		t.Error("after replace: want edited")
	}
	m = base()
	m.removeBytes([]byte("x-missing"))
	if m.edited {
		t.Error("removing an absent header edited the map")
	}
	m.removeBytes([]byte("X-A"))
	if !m.edited || len(m.kv) != 2 || onlyAdded(m, 3) {
		t.Errorf("after remove: edited %v kv %v", m.edited, m.kv)
	}
}

func TestLowerBytes(t *testing.T) {
	for in, want := range map[string]string{"": "", "x-key": "x-key", "X-Key": "x-key", "RATELIMIT": "ratelimit"} {
		if got := lowerBytes([]byte(in)); got != want {
			t.Errorf("lowerBytes(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCanonicalKey(t *testing.T) {
	h := &Host{}
	for i := 0; i < 2; i++ {
		for _, n := range []string{"ratelimit", "x-ratelimit-remaining", "retry-after", "content-type"} {
			if got, want := h.canonicalKey(n), http.CanonicalHeaderKey(n); got != want {
				t.Errorf("canonicalKey(%q) = %q, want %q", n, got, want)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { h.canonicalKey("ratelimit-policy") }); n != 0 {
		t.Errorf("cached lookup: %v allocations", n)
	}
	for i := 0; i < 2*maxCanonicalKeys; i++ {
		n := "x-h" + itoa(uint64(i))
		if got, want := h.canonicalKey(n), http.CanonicalHeaderKey(n); got != want {
			t.Fatalf("canonicalKey(%q) = %q, want %q", n, got, want)
		}
	}
	if m := h.canon.Load(); len(*m) > maxCanonicalKeys {
		t.Errorf("cache holds %d names, bound %d", len(*m), maxCanonicalKeys)
	}
}

func TestParsePairsRoundTrip(t *testing.T) {
	for _, kv := range [][][2]string{
		nil,
		{{"a", "1"}},
		{{":status", "429"}, {"retry-after", "7"}, {"", ""}, {"x-empty", ""}, {"k", "v\x00w"}},
	} {
		b := SerializePairs(kv)
		got, ok := ParsePairs(b)
		if !ok || len(got) != len(kv) {
			t.Fatalf("ParsePairs(SerializePairs(%q)) = %q, %v", kv, got, ok)
		}
		for i := range kv {
			if got[i] != kv[i] {
				t.Errorf("pair %d: %q, want %q", i, got[i], kv[i])
			}
		}
		// Every truncation is rejected (or, for the empty prefix, empty).
		for n := 1; n < len(b)-1; n++ {
			if p, ok := ParsePairs(b[:n]); ok && len(kv) > 0 {
				t.Errorf("truncated to %d of %d bytes: accepted %q", n, len(b), p)
			}
		}
	}
	// Sizes that overflow the buffer.
	bad := SerializePairs([][2]string{{"a", "b"}})
	bad[4] = 0xff
	if _, ok := ParsePairs(bad); ok {
		t.Error("oversized name accepted")
	}
}

func FuzzParsePairs(f *testing.F) {
	f.Add(SerializePairs([][2]string{{"a", "1"}, {"bb", "22"}}))
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		kv, ok := ParsePairs(b)
		if !ok {
			return
		}
		if again, ok := ParsePairs(SerializePairs(kv)); !ok || len(again) != len(kv) {
			t.Fatalf("re-serialization of %q does not parse", kv)
		}
	})
}
