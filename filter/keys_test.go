package filter

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/proxywasm"
)

func TestParseHostIP(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{"10.0.0.1:1234", "10.0.0.1", true},
		{"10.0.0.1", "10.0.0.1", true},
		{"[2001:db8::1]:443", "2001:db8::1", true},
		{"[2001:db8::1]", "2001:db8::1", true},
		{"2001:db8::1", "2001:db8::1", true},
		{"::1", "::1", true},
		{"[::ffff:192.0.2.1]:80", "192.0.2.1", true},
		{"[fe80::1%eth0]:80", "fe80::1", true},
		{"", "", false},
		{"[2001:db8::1", "", false},
		{"example.com:80", "", false},
		{"10.0.0.256:1", "", false},
		{":80", "", false},
		{"[]:80", "", false},
	} {
		ip, ok := parseHostIP([]byte(c.in))
		if ok != c.ok || ok && ip.String() != c.want {
			t.Errorf("parseHostIP(%q) = %v %v, want %q %v", c.in, ip, ok, c.want, c.ok)
		}
	}
}

func TestXFFEntryFromRight(t *testing.T) {
	for _, c := range []struct {
		xff  []string // X-Forwarded-For headers, in order
		pos  int
		want string
		ok   bool
	}{
		{[]string{"1.1.1.1, 9.9.9.9"}, 1, "9.9.9.9", true}, // no guessing: the right-most is the right-most
		{[]string{"1.1.1.1, 9.9.9.9"}, 2, "1.1.1.1", true},
		{[]string{"1.1.1.1, 9.9.9.9"}, 3, "", false},
		{[]string{"6.6.6.6,3.3.3.3, 4.4.4.4"}, 2, "3.3.3.3", true},
		{[]string{" [2001:db8::7]:9 "}, 1, "[2001:db8::7]:9", true},
		{[]string{",,"}, 1, "", true},
		{[]string{"garbage, 3.3.3.3"}, 2, "garbage", true},
		{[]string{""}, 1, "", false},
		{nil, 1, "", false},
		// Several X-Forwarded-For headers read as one list, in order, as
		// Envoy joins them: the forged first header does not hide the
		// entries after it.
		{[]string{"6.6.6.6", "1.1.1.1"}, 1, "1.1.1.1", true},
		{[]string{"6.6.6.6", "1.1.1.1"}, 2, "6.6.6.6", true},
		{[]string{"5.5.5.5, 6.6.6.6", "1.1.1.1, 2.2.2.2"}, 3, "6.6.6.6", true},
		{[]string{"5.5.5.5, 6.6.6.6", "", "1.1.1.1"}, 2, "6.6.6.6", true}, // empty values are not entries
	} {
		var kv [][2]string
		kv = append(kv, [2]string{":path", "/"})
		for _, v := range c.xff {
			kv = append(kv, [2]string{"x-forwarded-for", v}, [2]string{"x-other", "7.7.7.7"})
		}
		e, ok := xffEntryFromRight(proxywasm.AppendPairs(nil, kv), c.pos)
		if ok != c.ok || string(e) != c.want {
			t.Errorf("xffEntryFromRight(%q, %d) = %q %v, want %q %v", c.xff, c.pos, e, ok, c.want, c.ok)
		}
	}
	// Header names compare without ASCII case; malformed serializations are
	// no entry, never a panic.
	good := proxywasm.AppendPairs(nil, [][2]string{{"X-Forwarded-For", "1.1.1.1"}})
	if e, ok := xffEntryFromRight(good, 1); !ok || string(e) != "1.1.1.1" {
		t.Errorf("mixed-case name: %q %v", e, ok)
	}
	for i := 0; i < len(good); i++ {
		if e, ok := xffEntryFromRight(good[:i], 1); ok {
			t.Errorf("truncated to %d bytes: %q", i, e)
		}
	}
	if _, ok := xffEntryFromRight([]byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0}, 1); ok {
		t.Error("huge count accepted")
	}
}

// clientIP takes the configured entry, whatever the addresses say: a client
// at the trusted proxy's own address (same host, SNAT) that writes its own
// X-Forwarded-For entry does not get it used (the forged-entry bypass: the
// old filter skipped a right-most entry equal to the peer, guessing it was
// Envoy's append).
func TestClientIPNeverGuesses(t *testing.T) {
	h := filtertest.NewHost()
	h.Properties = map[string]string{propSourceAddress: "10.0.0.5:4000"} // the trusted proxy
	r := &request{}
	for _, c := range []struct {
		pos  int
		xff  []string
		want string
	}{
		// sluice run / use_remote_address false: nothing appended by this
		// proxy; the proxy in front (10.0.0.5) appended its peer, which is
		// itself: the forged entry left of it is never used.
		{1, []string{"203.0.113.7, 10.0.0.5"}, "10.0.0.5"},
		{1, []string{"203.0.113.7", "10.0.0.5"}, "10.0.0.5"},
		// Envoy with use_remote_address: this proxy appended the peer too.
		{2, []string{"203.0.113.7, 10.0.0.5, 10.0.0.5"}, "10.0.0.5"},
		{2, []string{"198.51.100.1, 10.0.0.5"}, "198.51.100.1"},
		// Too few entries, or not an address: the peer.
		{2, []string{"10.0.0.5"}, "10.0.0.5"},
		{1, []string{"not-an-ip"}, "10.0.0.5"},
		{1, nil, "10.0.0.5"},
		// Configured off: the peer, whatever the header says.
		{0, []string{"203.0.113.7"}, "10.0.0.5"},
	} {
		h.ReqHeaders = nil
		for _, v := range c.xff {
			h.ReqHeaders = append(h.ReqHeaders, [2]string{"x-forwarded-for", v})
		}
		r.reset(h)
		ip, ok := clientIP(r, c.pos)
		if !ok || ip.String() != c.want {
			t.Errorf("pos %d, X-Forwarded-For %q: %v %v, want %s", c.pos, c.xff, ip, ok, c.want)
		}
	}
}

// The path key part is the normalized path: every spelling of one path is
// one key, and the query is not part of it.
func TestPathKeyNormalized(t *testing.T) {
	h := filtertest.NewHost()
	r := &request{}
	parts := []config.KeyPart{{Path: true}}
	key := func(path string) ([]byte, bool) {
		h.ReqHeaders = [][2]string{{":path", path}}
		r.reset(h)
		return appendKey(nil, parts, r, 0)
	}
	want, _ := key("/h")
	for _, p := range []string{"/%68", "//h", "/./h", "/x/../h", "/h/../h", "/%2568/../h", "/h?x=1", "/h#f"} {
		if k, ok := key(p); !ok || !bytes.Equal(k, want) {
			t.Errorf("path %q: key %q %v, want %q", p, k, ok, want)
		}
	}
	if k, _ := key("/%2568"); bytes.Equal(k, want) {
		t.Error("/%2568 (the text /%68) has the key of /h")
	}
	if _, ok := key(""); ok {
		t.Error("an empty :path has a key")
	}
}

func TestQueryParam(t *testing.T) {
	for _, c := range []struct {
		path, name, want string
		ok               bool
	}{
		{"/a?k=v", "k", "v", true},
		{"/a?x=1&k=v&k=w", "k", "v", true},
		{"/a?kk=1&k=2", "k", "2", true},
		{"/a?k", "k", "", false},
		{"/a?k=", "k", "", false},
		{"/a?k=v#frag", "k", "v", true},
		{"/a#?k=v", "k", "", false},
		{"/a", "k", "", false},
		{"/a?%6B=v", "k", "v", true},
		{"/a?a+b=v", "a b", "v", true},
		{"/a?&&k=v", "k", "v", true},
	} {
		v, ok := queryParam([]byte(c.path), c.name)
		if ok != c.ok || string(v) != c.want {
			t.Errorf("queryParam(%q, %q) = %q %v, want %q %v", c.path, c.name, v, ok, c.want, c.ok)
		}
	}
}

func TestCookieValue(t *testing.T) {
	for _, c := range []struct {
		h, name, want string
		ok            bool
	}{
		{"s=1", "s", "1", true},
		{"a=1; s=2", "s", "2", true},
		{"a=1;s=2;s=3", "s", "2", true},
		{`s="q"`, "s", "q", true},
		{"xs=1", "s", "", false},
		{"s=", "s", "", false},
		{"s", "s", "", false},
		{"", "s", "", false},
		{" s = v ", "s", "v", true},
	} {
		v, ok := cookieValue([]byte(c.h), c.name)
		if ok != c.ok || string(v) != c.want {
			t.Errorf("cookieValue(%q, %q) = %q %v, want %q %v", c.h, c.name, v, ok, c.want, c.ok)
		}
	}
}

func TestAppendUnescaped(t *testing.T) {
	for in, want := range map[string]string{
		"abc": "abc", "a%41": "aA", "a+b": "a b", "%zz": "%zz", "%4": "%4", "100%": "100%", "%e2%82%ac": "€",
	} {
		got := appendUnescaped(nil, []byte(in))
		var n int
		for n = 0; got[n]&0x80 != 0; n++ {
		}
		if string(got[n+1:]) != want || int(got[0]) != len(want) {
			t.Errorf("appendUnescaped(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMaskIP(t *testing.T) {
	ip := netip.MustParseAddr("2001:db8:1:2:3:4:5:6")
	if got := maskIP(ip, 48).String(); got != "2001:db8:1::" {
		t.Errorf("maskIP /48 = %s", got)
	}
	if got := maskIP(ip, 0); got != ip {
		t.Errorf("maskIP 0 = %s", got)
	}
	v4 := netip.MustParseAddr("192.0.2.9")
	if got := maskIP(v4, 64); got != v4 {
		t.Errorf("IPv4 masked: %s", got)
	}
}

// Distinct parts never produce the same key (the encoding is tagged and
// length-prefixed).
func TestKeyEncodingUnambiguous(t *testing.T) {
	h := filtertest.NewHost()
	r := &request{}
	key := func(parts []config.KeyPart, hdrs ...string) []byte {
		h.ReqHeaders = nil
		for i := 0; i+1 < len(hdrs); i += 2 {
			h.ReqHeaders = append(h.ReqHeaders, [2]string{hdrs[i], hdrs[i+1]})
		}
		r.reset(h)
		k, ok := appendKey(nil, parts, r, 0)
		if !ok {
			t.Fatalf("no key for %v", hdrs)
		}
		return k
	}
	two := []config.KeyPart{{Header: "a"}, {Header: "b"}}
	if bytes.Equal(key(two, "a", "x", "b", "yz"), key(two, "a", "xy", "b", "z")) {
		t.Error("a=x,b=yz and a=xy,b=z share a key")
	}
	if bytes.Equal(key([]config.KeyPart{{Header: "a"}}, "a", "v"), key([]config.KeyPart{{Header: "b"}}, "b", "v")) {
		// Same kind, same value, different header names: the same key is
		// fine (they belong to different rules, hence different slots).
		t.Log("same value under two header names gives one key (rules are separate)")
	}
	if bytes.Equal(key([]config.KeyPart{{Header: "a"}}, "a", "/p"), key([]config.KeyPart{{Path: true}}, ":path", "/p")) {
		t.Error("a header and a path with the same bytes share a key")
	}
}

// FuzzRequest drives the whole request path with arbitrary header values,
// addresses and paths: it must never panic, and a decision is always
// reached (the request continues or is rejected).
func FuzzRequest(f *testing.F) {
	f.Add("10.0.0.1:1", "/api?k=v", "k=v; s=1", "1.1.1.1, 2.2.2.2", "key")
	f.Add("[::1]:80", "/%zz?%=&&==", "=;;=", ",,,", "\x00\xff")
	f.Add("", "", "", "", "")
	cfg := `{"rules":[
	  {"name":"a","match":{"path_prefix":"/api"},"key":[{"remote_ip":true,"ipv6_prefix":56},{"query":"k"}],"algorithm":"sliding_log","limit":3,"window":"1h"},
	  {"name":"b","key":[{"cookie":"s"},{"header":"x-k"},{"path":true},{"method":true}],"algorithm":"leaky_bucket","limit":2,"window":"1s","max_keys":4}],
	  "client_ip":{"xff_trusted_hops":2}}`
	f.Fuzz(func(t *testing.T, src, path, cookie, xff, hk string) {
		h := filtertest.NewHost()
		h.Now_ = 1_700_000_000_000_000_000
		w := filtertest.NewWorker(h, NewVM(h))
		if !w.Start(cfg) {
			t.Fatal(h.Logs)
		}
		for i := 0; i < 3; i++ {
			r := w.Do(filtertest.Request{Source: src, Path: path, Method: strings.ToUpper(hk),
				Headers: [][2]string{{"cookie", cookie}, {"x-forwarded-for", xff}, {"x-k", hk}}})
			if r.Status != 200 && r.Status != 429 {
				t.Fatalf("status %d", r.Status)
			}
			if r.Action != abi.ActionContinue && r.Status == 200 || r.Action != abi.ActionPause && r.Status == 429 {
				t.Fatalf("action %v with status %d", r.Action, r.Status)
			}
		}
		for _, l := range h.Logs {
			if strings.Contains(l.Msg, "panic") {
				t.Fatalf("recovered panic: %s", l.Msg)
			}
		}
	})
}

// The peer parsed last is reused only for the same host part: a sequence of
// different, repeated and bad source addresses gives each its own address.
func TestPeerCache(t *testing.T) {
	h := filtertest.NewHost()
	r := &request{}
	for _, c := range []struct {
		src  string
		want string // "" = no address
	}{
		{"10.0.0.1:1000", "10.0.0.1"},
		{"10.0.0.1:2000", "10.0.0.1"},
		{"10.0.0.2:1000", "10.0.0.2"},
		{"10.0.0.1", "10.0.0.1"},
		{"bogus:1", ""},
		{"bogus:2", ""},
		{"", ""},
		{"[::ffff:10.0.0.1]:5", "10.0.0.1"},
		{"[2001:db8::1]:5", "2001:db8::1"},
		{"[2001:db8::1", ""},
		{"10.0.0.1:1000", "10.0.0.1"},
	} {
		h.Properties = map[string]string{}
		if c.src != "" {
			h.Properties[propSourceAddress] = c.src
		}
		r.reset(h)
		ip, ok := r.peer()
		got := ""
		if ok {
			got = ip.String()
		}
		if got != c.want {
			t.Errorf("source %q: peer %q, want %q", c.src, got, c.want)
		}
		if wantIP, wantOK := parseHostIP([]byte(c.src)); wantOK != ok || wantIP != ip {
			t.Errorf("source %q: peer (%v, %v) differs from parseHostIP (%v, %v)", c.src, ip, ok, wantIP, wantOK)
		}
	}
}

// What a missing key part is (config.KeyPart; the rule's missing_key then
// decides): a header absent or empty, a query parameter absent or whose first
// occurrence is empty, a cookie absent or empty, no client address; a key of
// several parts is missing when any part is.
func TestKeyMissing(t *testing.T) {
	h := filtertest.NewHost()
	r := &request{}
	for _, tc := range []struct {
		parts   []config.KeyPart
		path    string
		source  string
		hdrs    [][2]string
		present bool
	}{
		{[]config.KeyPart{{Header: "x-k"}}, "/", "", nil, false},
		{[]config.KeyPart{{Header: "x-k"}}, "/", "", [][2]string{{"x-k", ""}}, false},
		{[]config.KeyPart{{Header: "x-k"}}, "/", "", [][2]string{{"x-k", " "}}, true},
		{[]config.KeyPart{{Query: "k"}}, "/p", "", nil, false},
		{[]config.KeyPart{{Query: "k"}}, "/p?k", "", nil, false},
		{[]config.KeyPart{{Query: "k"}}, "/p?k=&k=1", "", nil, false},
		{[]config.KeyPart{{Query: "k"}}, "/p?k=1&k=", "", nil, true},
		{[]config.KeyPart{{Cookie: "s"}}, "/", "", [][2]string{{"cookie", "s="}}, false},
		{[]config.KeyPart{{Cookie: "s"}}, "/", "", [][2]string{{"cookie", `s=""`}}, false},
		{[]config.KeyPart{{Cookie: "s"}}, "/", "", [][2]string{{"cookie", "s=1"}}, true},
		{[]config.KeyPart{{RemoteIP: true}}, "/", "", nil, false},
		{[]config.KeyPart{{RemoteIP: true}}, "/", "10.0.0.1:1", nil, true},
		{[]config.KeyPart{{RemoteIP: true}, {Header: "x-k"}}, "/", "10.0.0.1:1", nil, false},
		{[]config.KeyPart{{Header: "x-k"}, {RemoteIP: true}}, "/", "", [][2]string{{"x-k", "v"}}, false},
		{[]config.KeyPart{{Header: "x-k"}, {RemoteIP: true}}, "/", "10.0.0.1:1", [][2]string{{"x-k", "v"}}, true},
	} {
		h.ReqHeaders = append([][2]string{{":path", tc.path}}, tc.hdrs...)
		h.Properties = map[string]string{}
		if tc.source != "" {
			h.Properties[propSourceAddress] = tc.source
		}
		r.reset(h)
		k, ok := appendKey(nil, tc.parts, r, 0)
		if ok != tc.present {
			t.Errorf("%+v path %q source %q headers %v: present %v, want %v", tc.parts, tc.path, tc.source, tc.hdrs, ok, tc.present)
		}
		if ok && (len(k) == 0 || k[0] == tagMissing || bytes.Equal(k, sharedKey[:])) {
			t.Errorf("key %q can be taken for the shared key", k)
		}
	}
}

// No request's key is the shared key (missing_key "shared"): every key starts
// with a part tag, whatever the values, including a NUL byte or nothing at all.
func TestSharedKeyNeverARealKey(t *testing.T) {
	h := filtertest.NewHost()
	r := &request{}
	all := []config.KeyPart{{Header: "x-k"}, {Query: "q"}, {Cookie: "c"}, {Path: true}, {Method: true}, {RemoteIP: true}}
	for _, v := range []string{"\x00", "%00", "+", "a"} {
		h.ReqHeaders = [][2]string{{":path", "/" + v + "?q=" + v}, {":method", v}, {"x-k", v}, {"cookie", "c=" + v}}
		h.Properties = map[string]string{propSourceAddress: "10.0.0.1:1"}
		for _, p := range all {
			r.reset(h)
			k, ok := appendKey(nil, []config.KeyPart{p}, r, 0)
			if ok && (k[0] == tagMissing || bytes.Equal(k, sharedKey[:])) {
				t.Errorf("%+v with %q: key %q", p, v, k)
			}
		}
	}
}
