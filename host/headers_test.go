package host

import (
	"fmt"
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

// Repeated inline headers reach the module joined, as Envoy's codecs add them; others stay
// separate entries and the getter returns the first (observed on Envoy 1.36.4 and 1.40.0).
func TestRepeatedInlineHeadersJoined(t *testing.T) {
	kv := [][2]string{{":path", "/"}, {"x-forwarded-for", "1.1.1.1"}, {"x-custom", "a"}, {"user-agent", "u1"},
		{"x-forwarded-for", "2.2.2.2"}, {"cookie", "a=1"}, {"x-custom", "b"}, {"user-agent", "u2"}, {"cookie", "b=2"}, {"authorization", "x"}, {"authorization", "y"}}
	got := joinInline(append([][2]string(nil), kv...), false, false)
	want := [][2]string{{":path", "/"}, {"x-forwarded-for", "1.1.1.1,2.2.2.2"}, {"x-custom", "a"}, {"user-agent", "u1,u2"},
		{"cookie", "a=1"}, {"x-custom", "b"}, {"cookie", "b=2"}, {"authorization", "x,y"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("HTTP/1.1 request:\n got %v\nwant %v", got, want)
	}
	got = joinInline(append([][2]string(nil), kv...), false, true)
	if c := (&headerMap{kv: got}).getOr("cookie", ""); c != "a=1; b=2" {
		t.Errorf("HTTP/2 cookie = %q, want a=1; b=2", c)
	}
	resp := joinInline([][2]string{{"set-cookie", "a"}, {"set-cookie", "b"}, {"cache-control", "x"}, {"cache-control", "y"}, {"x-forwarded-for", "p"}, {"x-forwarded-for", "q"}}, true, false)
	if fmt.Sprint(resp) != fmt.Sprint([][2]string{{"set-cookie", "a"}, {"set-cookie", "b"}, {"cache-control", "x,y"}, {"x-forwarded-for", "p"}, {"x-forwarded-for", "q"}}) {
		t.Errorf("response: %v", resp)
	}
	// Through Exchange: kitchen's /set-pairs sends the module's pairs upstream as they are.
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	var seen [][2]string
	mustExchange(t, h, &Request{Path: "/set-pairs", Headers: [][2]string{{"X-Forwarded-For", "1.1.1.1"}, {"x-custom", "a"}, {"x-forwarded-for", "2.2.2.2"}, {"x-custom", "b"}}},
		func(r *Request) *Response { seen = r.Headers; return nil })
	m := headerMap{kv: seen}
	if v, _ := m.get("x-forwarded-for"); v != "1.1.1.1,2.2.2.2" {
		t.Errorf("x-forwarded-for = %q (headers %v)", v, seen)
	}
	n := 0
	for _, p := range seen {
		if p[0] == "x-custom" {
			n++
		}
	}
	if n != 2 {
		t.Errorf("x-custom entries = %d, want 2 (headers %v)", n, seen)
	}
}
