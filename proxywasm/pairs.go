package proxywasm

import "encoding/binary"

// The header-map serialization of proxy_get_header_map_pairs, proxy_set_header_map_pairs and
// proxy_send_local_response: a u32 count, then a u32 name size and a u32 value size per pair,
// then each name and each value followed by a NUL byte; little-endian.

// Header is one pair with its value as bytes, so that a guest can format values into
// reused buffers without allocating.
type Header struct {
	Name  string
	Value []byte
}

// AppendHeaders appends the serialization of headers to dst.
func AppendHeaders(dst []byte, headers []Header) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(headers)))
	for i := range headers {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(headers[i].Name)))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(headers[i].Value)))
	}
	for i := range headers {
		dst = append(append(dst, headers[i].Name...), 0)
		dst = append(append(dst, headers[i].Value...), 0)
	}
	return dst
}

// PairsSize is the size of the serialization of kv.
func PairsSize(kv [][2]string) int {
	n := 4
	for _, p := range kv {
		n += 8 + len(p[0]) + 1 + len(p[1]) + 1
	}
	return n
}

// PutPairs writes the serialization of kv into dst, which must be PairsSize(kv) long.
func PutPairs(dst []byte, kv [][2]string) {
	binary.LittleEndian.PutUint32(dst, uint32(len(kv)))
	o := 4
	for _, p := range kv {
		binary.LittleEndian.PutUint32(dst[o:], uint32(len(p[0])))
		binary.LittleEndian.PutUint32(dst[o+4:], uint32(len(p[1])))
		o += 8
	}
	for _, p := range kv {
		o += copy(dst[o:], p[0])
		dst[o] = 0
		o++
		o += copy(dst[o:], p[1])
		dst[o] = 0
		o++
	}
}

// AppendPairs appends the serialization of kv to dst.
func AppendPairs(dst []byte, kv [][2]string) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, PairsSize(kv))...)
	PutPairs(dst[n:], kv)
	return dst
}

// ParsePairs decodes the serialization. Empty input is no pairs; malformed input reports
// false (never a panic). Names and values are substrings of one string (one allocation for
// all of them), and the slice has one spare entry so that a caller may append without
// growing it.
func ParsePairs(b []byte) ([][2]string, bool) {
	if len(b) == 0 {
		return nil, true
	}
	if len(b) < 4 {
		return nil, false
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 0 || n > (len(b)-4)/8 {
		return nil, false
	}
	sizes := b[4:]
	data := 4 + 8*n
	end := data
	for i := 0; i < n; i++ {
		ks := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		vs := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if ks < 0 || vs < 0 || ks > len(b) || vs > len(b) || end+ks+1+vs+1 > len(b) {
			return nil, false
		}
		end += ks + 1 + vs + 1
	}
	all := string(b[data:end])
	out := make([][2]string, 0, n+1)
	o := 0
	for i := 0; i < n; i++ {
		ks := int(binary.LittleEndian.Uint32(sizes[8*i:]))
		vs := int(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		k := all[o : o+ks]
		o += ks + 1
		v := all[o : o+vs]
		o += vs + 1
		out = append(out, [2]string{k, v})
	}
	return out, true
}
