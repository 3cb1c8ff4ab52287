// Package resp encodes Redis commands and decodes Redis replies in the RESP2
// wire format (https://redis.io/docs/latest/develop/reference/protocol-spec/).
//
// It is written for the Wasm guest: it imports only small standard packages,
// the encoder appends to a caller-owned buffer and never allocates when the
// buffer has room, and the decoder never panics on any input — malformed,
// truncated or unexpected bytes yield an error that says where and why.
package resp

import "strconv"

// AppendArrayHeader appends the header of an array of n elements ("*n\r\n").
func AppendArrayHeader(dst []byte, n int) []byte {
	dst = append(dst, '*')
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '\r', '\n')
}

// AppendBulkHeader appends the header of a bulk string of n bytes ("$n\r\n").
// The caller then appends exactly n bytes and a CRLF (see AppendCRLF); this
// lets a caller write a bulk string in pieces without building it first.
func AppendBulkHeader(dst []byte, n int) []byte {
	dst = append(dst, '$')
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, '\r', '\n')
}

// AppendCRLF appends the "\r\n" terminator.
func AppendCRLF(dst []byte) []byte { return append(dst, '\r', '\n') }

// AppendBulkString appends s as a bulk string.
func AppendBulkString(dst []byte, s string) []byte {
	dst = AppendBulkHeader(dst, len(s))
	dst = append(dst, s...)
	return append(dst, '\r', '\n')
}

// AppendBulk appends b as a bulk string.
func AppendBulk(dst []byte, b []byte) []byte {
	dst = AppendBulkHeader(dst, len(b))
	dst = append(dst, b...)
	return append(dst, '\r', '\n')
}

// AppendBulkInt appends the decimal form of n as a bulk string (how Redis
// expects numeric command arguments).
func AppendBulkInt(dst []byte, n int64) []byte {
	if uint64(n) < 10 {
		return append(dst, '$', '1', '\r', '\n', byte('0'+n), '\r', '\n')
	}
	// The digits and the final CRLF are written from the end of tmp, then
	// the header and they are appended: no strconv, and digits in 32 bits
	// when they fit (the Wasm guest pays dearly for 64-bit division).
	var tmp [22]byte
	i := len(tmp) - 2
	tmp[i], tmp[i+1] = '\r', '\n'
	u := uint64(n)
	if n < 0 {
		u = -u
	}
	for u >= 1<<32 {
		q := u / 10
		i--
		tmp[i] = byte('0' + u - q*10)
		u = q
	}
	for v := uint32(u); ; {
		q := v / 10
		i--
		tmp[i] = byte('0' + v - q*10)
		if v = q; v == 0 {
			break
		}
	}
	if n < 0 {
		i--
		tmp[i] = '-'
	}
	if l := len(tmp) - 2 - i; l < 10 {
		dst = append(dst, '$', byte('0'+l), '\r', '\n')
	} else {
		dst = append(dst, '$', byte('0'+l/10), byte('0'+l%10), '\r', '\n')
	}
	return append(dst, tmp[i:]...)
}

// AppendValue appends v in wire form. It is the inverse of Decode for every
// value Decode returns. A Value of an unknown Type is encoded as a null bulk
// string.
func AppendValue(dst []byte, v Value) []byte {
	switch v.Type {
	case SimpleString, Error:
		dst = append(dst, byte(v.Type))
		dst = append(dst, v.Str...)
		return append(dst, '\r', '\n')
	case Integer:
		dst = append(dst, ':')
		dst = strconv.AppendInt(dst, v.Int, 10)
		return append(dst, '\r', '\n')
	case BulkString:
		if v.Null {
			return append(dst, "$-1\r\n"...)
		}
		return AppendBulk(dst, v.Str)
	case Array:
		if v.Null {
			return append(dst, "*-1\r\n"...)
		}
		dst = AppendArrayHeader(dst, len(v.Elems))
		for _, e := range v.Elems {
			dst = AppendValue(dst, e)
		}
		return dst
	}
	return append(dst, "$-1\r\n"...)
}
