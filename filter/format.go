package filter

// Number formatting for the per-request path. strconv's general formatter
// costs several times more than a plain digit loop in the compiled module
// (about 120 ns per call under wazero); these produce the same text as
// strconv.AppendInt(dst, v, 10) and strconv.AppendUint(dst, v, 16).

// appendInt appends the decimal form of v.
//
// The digits are produced with 32-bit arithmetic, two at a time from a table:
// wasm has no 64-bit multiply-high, so the Go compiler cannot turn a 64-bit
// division by 10 into a multiplication there and each digit cost two 64-bit
// divide instructions (appendRateLimitHeaders, which formats two numbers per
// admitted request, was the guest's most expensive function). A 32-bit
// division by a constant becomes a multiplication. Values of 2³² and more
// split off their low nine digits first.
func appendInt(dst []byte, v int64) []byte {
	u := uint64(v)
	if v < 0 {
		dst = append(dst, '-')
		u = -u
	}
	var b [20]byte
	i := len(b)
	for u >= 1<<32 {
		q := u / 1e9 // at most two 64-bit divisions for any int64
		i = putDigits(&b, i, uint32(u-q*1e9), 9)
		u = q
	}
	i = putDigits(&b, i, uint32(u), 0)
	return append(dst, b[i:]...)
}

// putDigits writes the decimal digits of x in front of b[i:], at least min of
// them (leading zeros), and returns the new start.
func putDigits(b *[20]byte, i int, x uint32, min int) int {
	end := i
	for x >= 100 {
		d := x % 100 * 2
		x /= 100
		i -= 2
		b[i], b[i+1] = digitPairs[d], digitPairs[d+1]
	}
	if x >= 10 {
		d := x * 2
		i -= 2
		b[i], b[i+1] = digitPairs[d], digitPairs[d+1]
	} else {
		i--
		b[i] = byte('0' + x)
	}
	for end-i < min {
		i--
		b[i] = '0'
	}
	return i
}

const digitPairs = "00010203040506070809" +
	"10111213141516171819" +
	"20212223242526272829" +
	"30313233343536373839" +
	"40414243444546474849" +
	"50515253545556575859" +
	"60616263646566676869" +
	"70717273747576777879" +
	"80818283848586878889" +
	"90919293949596979899"

// appendHex appends the lower-case hexadecimal form of v.
func appendHex(dst []byte, v uint64) []byte {
	const digits = "0123456789abcdef"
	var b [16]byte
	i := len(b)
	for v >= 16 {
		i--
		b[i] = digits[v&15]
		v >>= 4
	}
	i--
	b[i] = digits[v]
	return append(dst, b[i:]...)
}
