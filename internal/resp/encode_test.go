package resp

import (
	"bytes"
	"math"
	"strconv"
	"testing"
)

// TestAppendBulkIntBytes holds AppendBulkInt to the bulk string of
// strconv's decimal form around every length and 32-bit boundary.
func TestAppendBulkIntBytes(t *testing.T) {
	ns := []int64{0, 1, 9, math.MaxInt64, math.MinInt64, math.MinInt64 + 1, 1<<32 - 1, 1 << 32, 1<<32 + 1,
		-(1 << 32), -(1<<32 - 1), 1 << 53, 1764556800123456}
	for p := int64(1); p > 0 && p <= math.MaxInt64/10; p *= 10 {
		ns = append(ns, p-1, p, p+1, 10*p-1, -p, -(p - 1), -(p + 1))
	}
	for x := uint64(1); x < 1<<62; x = x*3 + 7 {
		ns = append(ns, int64(x), -int64(x))
	}
	buf := []byte("prefix")
	for _, n := range ns {
		got := AppendBulkInt(buf[:6], n)
		want := AppendBulkString([]byte("prefix"), strconv.FormatInt(n, 10))
		if !bytes.Equal(got, want) {
			t.Fatalf("%d: %q, want %q", n, got, want)
		}
	}
}
