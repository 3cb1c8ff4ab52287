package filter

// Number formatting for the per-request path. strconv's general formatter
// costs several times more than a plain digit loop in the compiled module
// (about 120 ns per call under wazero); these produce the same text as
// strconv.AppendInt(dst, v, 10) and strconv.AppendUint(dst, v, 16).

// appendInt appends the decimal form of v.
func appendInt(dst []byte, v int64) []byte {
	u := uint64(v)
	if v < 0 {
		dst = append(dst, '-')
		u = -u
	}
	var b [20]byte
	i := len(b)
	for u >= 10 {
		i--
		b[i] = byte('0' + u%10)
		u /= 10
	}
	i--
	b[i] = byte('0' + u)
	return append(dst, b[i:]...)
}

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
