package rlswire

import (
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/algorithms"
)

func TestParseToken(t *testing.T) {
	for in, want := range map[string]bool{"0:1:2": true, "3:-1:-2": true, "0:1": false, "0:1:2:3": false, "-1:1:2": false,
		":1:2": false, "0:1:x": false, "0:99999999999999999999:1": false, "": false, "0:1:2 ": false, "+1:1:2": false,
		"1048576:0:0": true, "1048577:0:0": false, "0:--1:2": false, "0:1:": false} {
		if _, _, _, ok := ParseToken([]byte(in)); ok != want {
			t.Errorf("ParseToken(%q) ok %v", in, ok)
		}
	}
	i, x, y, ok := ParseToken([]byte("7:-12:34"))
	if !ok || i != 7 || x != -12 || y != 34 {
		t.Errorf("ParseToken: %d %d %d %v", i, x, y, ok)
	}
}

func TestParsePair(t *testing.T) {
	for in, want := range map[string]bool{"0:0": true, "5:3": true, "5": false, "5:": false, ":5": false, "-1:2": false,
		"1:-2": false, "1:2:3": false, "x:1": false, "1:99999999999999999999": false, "+1:2": true} {
		if _, _, ok := ParsePair(in); ok != want {
			t.Errorf("ParsePair(%q) ok %v", in, ok)
		}
	}
}

// What one side appends, the other parses back.
func TestRoundTrip(t *testing.T) {
	for _, v := range [][3]int64{{0, 0, 0}, {3, 1700000000000000, 42}, {MaxTokenIndex, 1<<63 - 1e6, 1}} {
		tok := AppendToken(nil, int(v[0]), v[1], v[2])
		if want := strconv.FormatInt(v[0], 10) + ":" + strconv.FormatInt(v[1], 10) + ":" + strconv.FormatInt(v[2], 10); string(tok) != want {
			t.Errorf("AppendToken = %q, want %q", tok, want)
		}
		i, x, y, ok := ParseToken(tok)
		if !ok || int64(i) != v[0] || x != v[1] || y != v[2] {
			t.Errorf("ParseToken(%q) = %d %d %d %v", tok, i, x, y, ok)
		}
		p := AppendPair(nil, v[1], v[2])
		if x, y, ok := ParsePair(string(p)); !ok || x != v[1] || y != v[2] {
			t.Errorf("ParsePair(%q) = %d %d %v", p, x, y, ok)
		}
	}
}

// The guest's side appends into a reused buffer and parses without allocating.
func TestGuestSideAllocs(t *testing.T) {
	buf := make([]byte, 0, 64)
	tok := []byte("2:1700000000000000:17")
	if n := testing.AllocsPerRun(100, func() {
		buf = AppendPair(buf[:0], 1700000000000000, 40)
		ParseToken(tok)
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

func TestParseIndexed(t *testing.T) {
	for in, want := range map[string]bool{"0:0": true, "3:250000": true, "0": false, "0:": false, ":1": false, "-1:2": false,
		"1:-2": false, "1:+2": false, "1:2:3": false, "1:2 ": false, "1048576:1": true, "1048577:1": false,
		"0:999999999999999999": true, "0:1000000000000000000": false, "": false} {
		if _, _, ok := ParseIndexed([]byte(in)); ok != want {
			t.Errorf("ParseIndexed(%q) ok %v", in, ok)
		}
	}
	for _, v := range [][2]int64{{0, 0}, {5, 3_000_000}, {MaxTokenIndex, 999_999_999_999_999_999}} {
		b := AppendIndexed(nil, int(v[0]), v[1])
		if i, x, ok := ParseIndexed(b); !ok || int64(i) != v[0] || x != v[1] {
			t.Errorf("ParseIndexed(%q) = %d %d %v", b, i, x, ok)
		}
	}
	b := []byte("2:250000")
	if n := testing.AllocsPerRun(100, func() { ParseIndexed(b) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

func TestParseDelta(t *testing.T) {
	for in, want := range map[string]int64{"1": 1, "-1": -1, "250": 250, "-1000000000000": -1e12, "1000000000000": 1e12,
		"0": 0, "-0": 0, "01": 0, "+1": 0, "": 0, "-": 0, "1000000000001": 0, "--1": 0, "1 ": 0, "1x": 0, "99999999999999999999": 0} {
		got, ok := ParseDelta(in)
		if ok != (want != 0) || got != want {
			t.Errorf("ParseDelta(%q) = %d %v, want %d", in, got, ok, want)
		}
	}
	if MaxSettle != algorithms.MaxSettle {
		t.Errorf("MaxSettle %d, algorithms.MaxSettle %d", int64(MaxSettle), int64(algorithms.MaxSettle))
	}
}

func TestInFlightValue(t *testing.T) {
	v := string(AppendInFlight(nil, 'a', 0xdeadbeef01, 1, 10000))
	if v != "a:deadbeef01:1:10000" {
		t.Fatal(v)
	}
	if op, h, n, ttl, ok := ParseInFlight(v); !ok || op != 'a' || h != 0xdeadbeef01 || n != 1 || ttl != 10000 {
		t.Fatal(op, h, n, ttl, ok)
	}
	if _, _, n, _, ok := ParseInFlight("w:1:0:5"); !ok || n != 0 {
		t.Fatal("renew of 0")
	}
	for _, bad := range []string{"", "a:1:1", "x:1:1:1", "a::1:1", "a:g:1:1", "a:1:0:1", "r:1:-1:1", "a:1:1:0", "a:1:1:3600001",
		"a:12345678901234567:1:1", "a:1:1:1:1", "aa:1:1:1"} {
		if _, _, _, _, ok := ParseInFlight(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}
