package algorithms

import (
	"errors"
	"fmt"
	"testing"
)

// corrupt formats as fmt.Errorf("%w: "+format, ErrCorruptState, args...) does, for the verbs
// and argument types its callers use, and wraps ErrCorruptState.
func TestCorruptFormatsAsFmt(t *testing.T) {
	cases := []struct {
		format string
		args   []any
	}{
		{"%d bytes is too short", []any{3}},
		{"unsupported version %d", []any{byte(7)}},
		{"state of kind %d, want %s", []any{byte(2), TokenBucket}},
		{"%s state of %d bytes, want %d", []any{SlidingLog, 40, 26}},
		{"token_bucket time %d out of range", []any{int64(-5)}},
		{"token_bucket tokens %d+%d/%d exceed burst %d", []any{uint64(1 << 63), uint64(0), int64(1e9), uint32(10)}},
		{"sliding_window counters %d, %d out of range", []any{int32(-1), uint16(65535)}},
		{"leaky_bucket fraction %d >= limit %d", []any{uint(9), int8(-8)}},
		{"named %s", []any{"x"}},
		{"no verbs", nil},
	}
	for _, c := range cases {
		err := corrupt(c.format, c.args...)
		want := fmt.Errorf("%w: "+c.format, append([]any{ErrCorruptState}, c.args...)...)
		if err.Error() != want.Error() {
			t.Errorf("corrupt(%q): %q, want %q", c.format, err, want)
		}
		if !errors.Is(err, ErrCorruptState) {
			t.Errorf("corrupt(%q) does not wrap ErrCorruptState", c.format)
		}
	}
}
