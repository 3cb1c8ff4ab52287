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
