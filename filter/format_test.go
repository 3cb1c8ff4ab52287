package filter

import (
	"math"
	"strconv"
	"testing"
)

func TestAppendIntHex(t *testing.T) {
	ints := []int64{0, 1, 9, 10, 99, 100, 12345, -1, -10, -987654321, math.MaxInt64, math.MinInt64, math.MaxInt32, 1e18,
		// Around appendInt's 32-bit split: the low nine digits keep their zeros.
		math.MaxUint32, math.MaxUint32 + 1, -(math.MaxUint32 + 1), 1e9, 1e10, 5e9 + 7, 1e18 + 1, 1e17 + 1e9, 999999999999, 4294967296000000001}
	for _, v := range ints {
		if got, want := string(appendInt([]byte("x"), v)), strconv.AppendInt([]byte("x"), v, 10); got != string(want) {
			t.Errorf("appendInt(%d) = %q, want %q", v, got, want)
		}
		u := uint64(v)
		if got, want := string(appendHex([]byte("k:"), u)), strconv.AppendUint([]byte("k:"), u, 16); got != string(want) {
			t.Errorf("appendHex(%d) = %q, want %q", u, got, want)
		}
	}
	for v := int64(-1000); v <= 100000; v += 7 {
		if got, want := string(appendInt(nil, v)), strconv.FormatInt(v, 10); got != want {
			t.Fatalf("appendInt(%d) = %q, want %q", v, got, want)
		}
		if got, want := string(appendHex(nil, uint64(v))), strconv.FormatUint(uint64(v), 16); got != want {
			t.Fatalf("appendHex(%d) = %q, want %q", v, got, want)
		}
	}
}

func TestAppendIntAllocs(t *testing.T) {
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() {
		buf = appendInt(buf[:0], 1234567890)
		buf = appendHex(buf, 0xdeadbeef)
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
