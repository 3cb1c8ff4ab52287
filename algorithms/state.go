package algorithms

import (
	"encoding/binary"
	"math/bits"
	"strconv"
)

// stateVersion is the first byte of every encoded state. Bump it when the
// layout of any algorithm's state changes; old states then decode as
// corrupt (a key starts fresh) instead of being misread.
const stateVersion = 1

// headerSize is the version byte plus the Kind byte.
const headerSize = 2

// corrupt returns an error that wraps ErrCorruptState: "corrupt rate-limit state: " and
// format with its %d and %s verbs replaced by args, as fmt.Errorf would give it (the
// package does not import fmt: in the Wasm guest fmt and the reflect it needs are ~0.2 MB
// of code that wazero compiles at every start).
func corrupt(format string, args ...any) error {
	b := append([]byte(ErrCorruptState.Error()), ": "...)
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) || len(args) == 0 {
			b = append(b, format[i])
			continue
		}
		i++
		b = appendArg(b, args[0])
		args = args[1:]
	}
	return corruptError(b)
}

// appendArg formats one argument of corrupt: an integer in decimal, a string, or the
// String() of a value that has one (%d of an integer kind such as Kind gives its number:
// corrupt's callers pass such values as integers for %d and as themselves for %s).
func appendArg(b []byte, a any) []byte {
	switch v := a.(type) {
	case int:
		return strconv.AppendInt(b, int64(v), 10)
	case int8:
		return strconv.AppendInt(b, int64(v), 10)
	case int16:
		return strconv.AppendInt(b, int64(v), 10)
	case int32:
		return strconv.AppendInt(b, int64(v), 10)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case uint:
		return strconv.AppendUint(b, uint64(v), 10)
	case uint8:
		return strconv.AppendUint(b, uint64(v), 10)
	case uint16:
		return strconv.AppendUint(b, uint64(v), 10)
	case uint32:
		return strconv.AppendUint(b, uint64(v), 10)
	case uint64:
		return strconv.AppendUint(b, v, 10)
	case string:
		return append(b, v...)
	case interface{ String() string }:
		return append(b, v.String()...)
	}
	return append(b, "%!(unsupported)"...)
}

// corruptError is corrupt's error.
type corruptError string

func (e corruptError) Error() string { return string(e) }
func (e corruptError) Unwrap() error { return ErrCorruptState }

// checkHeader validates the version and kind bytes and, when size >= 0, the
// exact length.
func checkHeader(state []byte, k Kind, size int) error {
	if len(state) < headerSize {
		return corrupt("%d bytes is too short", len(state))
	}
	if state[0] != stateVersion {
		return corrupt("unsupported version %d", state[0])
	}
	if Kind(state[1]) != k {
		return corrupt("state of kind %d, want %s", state[1], k)
	}
	if size >= 0 && len(state) != size {
		return corrupt("%s state of %d bytes, want %d", k, len(state), size)
	}
	return nil
}

func appendHeader(dst []byte, k Kind) []byte { return append(dst, stateVersion, byte(k)) }

func appendU64(dst []byte, v uint64) []byte { return binary.LittleEndian.AppendUint64(dst, v) }

func getU64(b []byte, off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }

// u128 is an unsigned 128-bit integer, for products such as
// Burst × Window that do not fit 64 bits.
type u128 struct{ hi, lo uint64 }

func mul(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, _ := bits.Add64(x.hi, y.hi, c)
	return u128{hi, lo}
}

func (x u128) add64(y uint64) u128 { return x.add(u128{0, y}) }

// sub returns x - y; callers guarantee x >= y.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, _ := bits.Sub64(x.hi, y.hi, b)
	return u128{hi, lo}
}

func (x u128) less(y u128) bool { return x.hi < y.hi || (x.hi == y.hi && x.lo < y.lo) }

func (x u128) isZero() bool { return x.hi == 0 && x.lo == 0 }

// div returns x / d and x % d; ok is false when the quotient does not fit
// 64 bits. d must not be 0.
func (x u128) div(d uint64) (q, r uint64, ok bool) {
	if x.hi == 0 {
		// The usual case (a product that fits 64 bits): one machine division, where
		// bits.Div64 is a long routine on targets without a 128-bit divide (wasm).
		return x.lo / d, x.lo % d, true
	}
	if x.hi >= d {
		return 0, 0, false
	}
	q, r = bits.Div64(x.hi, x.lo, d)
	return q, r, true
}

// divCeil returns ⌈x / d⌉; ok is false when it does not fit 64 bits.
func (x u128) divCeil(d uint64) (uint64, bool) {
	q, r, ok := x.div(d)
	if !ok {
		return 0, false
	}
	if r != 0 {
		if q == ^uint64(0) {
			return 0, false
		}
		q++
	}
	return q, true
}
