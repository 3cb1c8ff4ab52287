package filter

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Serialized property paths (each segment followed by NUL, as Envoy and the
// proxytest emulator expect).
const (
	propSourceAddress = "source\x00address"
	propPluginName    = "plugin_name"
)

// request caches what the rules of one request read from the host. Byte
// slices alias host buffers valid for the current callback only.
type request struct {
	host     abi.Host
	have     uint8
	method   []byte
	path     []byte
	normPath []byte // the normal form of path: path's own bytes or pathBuf
	source   []byte
	cookie   []byte
	headerF  func(string) (string, bool) // r.header, bound once
	valueF   func(string) ([]byte, bool) // r.value, bound once (metadata.go)

	// pathBuf holds a normalized path that differs from the request's; it
	// is reused, so only the first such request (or a longer one) allocates.
	pathBuf []byte

	// The client host parsed last, kept across requests (see peer).
	peerHost   []byte
	peerAddr   netip.Addr
	peerOK     bool
	peerCached bool
}

const (
	haveMethod = 1 << iota
	havePath
	haveSource
	haveNormPath
	haveCookie
)

func (r *request) reset(h abi.Host) {
	r.host = h
	r.have = 0
	if r.headerF == nil {
		r.headerF, r.valueF = r.header, r.value
	}
}

func (r *request) fetch(bit uint8, dst *[]byte, name string) []byte {
	if r.have&bit == 0 {
		r.have |= bit
		*dst = nil
		if v, st := r.host.GetHeader(abi.MapRequestHeaders, name); st == abi.StatusOK {
			*dst = v
		}
	}
	return *dst
}

func (r *request) getMethod() []byte { return r.fetch(haveMethod, &r.method, ":method") }
func (r *request) getPath() []byte   { return r.fetch(havePath, &r.path, ":path") }
func (r *request) getCookie() []byte { return r.fetch(haveCookie, &r.cookie, "cookie") }

// getNormPath returns the request's path (before '?' and '#') in normal
// form: as Envoy's normalize_path and merge_slashes leave it, so that
// /%68, //h, /./h and /x/../h are all /h (config.AppendNormalPath). It is
// computed once per request; an already normal path (the common case) is
// returned as is, without copying. Empty when the request has no :path.
func (r *request) getNormPath() []byte {
	if r.have&haveNormPath == 0 {
		r.have |= haveNormPath
		raw := r.getPath()
		p := config.PathPart(unsafeString(raw))
		switch {
		case len(p) == 0:
			r.normPath = nil
		case config.PathIsNormal(p):
			r.normPath = raw[:len(p)]
		default:
			r.pathBuf = config.AppendNormalPath(r.pathBuf[:0], p)
			r.normPath = r.pathBuf
		}
	}
	return r.normPath
}

func (r *request) getSource() []byte {
	if r.have&haveSource == 0 {
		r.have |= haveSource
		r.source = nil
		if v, st := r.host.GetProperty(propSourceAddress); st == abi.StatusOK {
			r.source = v
		}
	}
	return r.source
}

// header looks up a request header for rule matching. The string aliases
// the host buffer and must not be retained.
func (r *request) header(name string) (string, bool) {
	v, st := r.host.GetHeader(abi.MapRequestHeaders, name)
	if st != abi.StatusOK {
		return "", false
	}
	return unsafeString(v), true
}

func unsafeString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// Key part tags, so that parts of different kinds never collide. Every key
// appendKey writes starts with one of tagIP..tagMethod; tagMissing alone is
// the key of a rule's requests missing their key (missing_key "shared").
const (
	tagMissing byte = iota
	tagIP
	tagHeader
	tagQuery
	tagCookie
	tagPath
	tagMethod
)

// appendKey appends the key of parts for the current request to dst. ok is
// false when a part is missing (the rule's missing_key decides: see
// config.KeyPart for what each kind of part misses): no client address, an
// absent or empty header, query parameter or cookie, no :path or :method.
// A key of several parts is missing when any part is. Each part
// is written as tag, length, bytes, so the encoding is unambiguous. xffPos
// is config.ClientIP.XFFPosition: which X-Forwarded-For entry from the
// right is the client (0: source.address).
func appendKey(dst []byte, parts []config.KeyPart, r *request, xffPos int) ([]byte, bool) {
	for i := range parts {
		p := &parts[i]
		switch {
		case p.RemoteIP:
			ip, ok := clientIP(r, xffPos)
			if !ok {
				return dst, false
			}
			ip = maskIP(ip, p.IPv6Prefix)
			dst = append(dst, tagIP)
			if ip.Is4() {
				a := ip.As4()
				dst = append(dst, 4)
				dst = append(dst, a[:]...)
			} else {
				a := ip.As16()
				dst = append(dst, 16)
				dst = append(dst, a[:]...)
			}
		case p.Header != "":
			v, st := r.host.GetHeader(abi.MapRequestHeaders, p.Header)
			if st != abi.StatusOK || len(v) == 0 {
				return dst, false
			}
			dst = appendPart(dst, tagHeader, v)
		case p.Query != "":
			v, ok := queryParam(r.getPath(), p.Query)
			if !ok {
				return dst, false
			}
			dst = append(dst, tagQuery)
			dst = appendUnescaped(dst, v)
		case p.Cookie != "":
			v, ok := cookieValue(r.getCookie(), p.Cookie)
			if !ok {
				return dst, false
			}
			dst = appendPart(dst, tagCookie, v)
		case p.Path:
			path := r.getNormPath()
			if len(path) == 0 {
				return dst, false
			}
			dst = appendPart(dst, tagPath, path)
		case p.Method:
			m := r.getMethod()
			if len(m) == 0 {
				return dst, false
			}
			dst = appendPart(dst, tagMethod, m)
		case !p.Value.IsZero():
			var ok bool
			if dst, ok = appendValuePart(dst, p, r); !ok {
				return dst, false
			}
		default:
			return dst, false
		}
	}
	return dst, true
}

func appendPart(dst []byte, tag byte, v []byte) []byte {
	dst = append(dst, tag)
	dst = binary.AppendUvarint(dst, uint64(len(v)))
	return append(dst, v...)
}

// appendUnescaped appends the form-decoded value (percent escapes, '+' as
// space) with a length prefix, so that "a%41" and "aA" are the same key.
// Malformed escapes are kept literally.
func appendUnescaped(dst []byte, v []byte) []byte {
	n := 0
	for i := 0; i < len(v); i++ {
		if v[i] == '%' && i+2 < len(v) && ishex(v[i+1]) && ishex(v[i+2]) {
			i += 2
		}
		n++
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '%' && i+2 < len(v) && ishex(v[i+1]) && ishex(v[i+2]):
			c = unhex(v[i+1])<<4 | unhex(v[i+2])
			i += 2
		case c == '+':
			c = ' '
		}
		dst = append(dst, c)
	}
	return dst
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// queryParam returns the raw value of the first parameter named name in the
// query string of path. A parameter present with an empty value is missing.
func queryParam(path []byte, name string) ([]byte, bool) {
	q := -1
	for i, c := range path {
		if c == '?' {
			q = i + 1
			break
		}
		if c == '#' {
			return nil, false
		}
	}
	if q < 0 {
		return nil, false
	}
	rest := path[q:]
	for len(rest) > 0 {
		end := len(rest)
		for i, c := range rest {
			if c == '&' || c == '#' {
				end = i
				break
			}
		}
		pair := rest[:end]
		k, v := pair, []byte(nil)
		for i, c := range pair {
			if c == '=' {
				k, v = pair[:i], pair[i+1:]
				break
			}
		}
		if escapedEqual(k, name) {
			return v, len(v) > 0
		}
		if end < len(rest) && rest[end] == '#' {
			break
		}
		if end == len(rest) {
			break
		}
		rest = rest[end+1:]
	}
	return nil, false
}

// escapedEqual reports whether the form-encoded k decodes to name.
func escapedEqual(k []byte, name string) bool {
	j := 0
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c == '%' && i+2 < len(k) && ishex(k[i+1]) && ishex(k[i+2]):
			c = unhex(k[i+1])<<4 | unhex(k[i+2])
			i += 2
		case c == '+':
			c = ' '
		}
		if j >= len(name) || name[j] != c {
			return false
		}
		j++
	}
	return j == len(name)
}

// cookieValue returns the value of the first cookie named name in a Cookie
// header ("a=1; b=2"). Surrounding double quotes are removed; an empty value
// is missing.
func cookieValue(h []byte, name string) ([]byte, bool) {
	for len(h) > 0 {
		end := len(h)
		for i, c := range h {
			if c == ';' {
				end = i
				break
			}
		}
		pair := trimSpace(h[:end])
		for i, c := range pair {
			if c == '=' {
				if unsafeString(trimSpace(pair[:i])) == name {
					v := trimSpace(pair[i+1:])
					if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
						v = v[1 : len(v)-1]
					}
					return v, len(v) > 0
				}
				break
			}
		}
		if end == len(h) {
			break
		}
		h = h[end+1:]
	}
	return nil, false
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// clientIP returns the client address. With xffPos > 0 it is the address
// in the xffPos-th X-Forwarded-For entry from the right (each trusted proxy
// in front appends the address of its peer; config.ClientIP.XFFPosition adds
// one when this proxy appends its own peer before filters run). Which entry
// is configuration, never inferred from address values. Without xffPos, or
// when the header has fewer entries or that one is not an address, the
// client is the peer itself (source.address).
func clientIP(r *request, xffPos int) (netip.Addr, bool) {
	if xffPos > 0 {
		if pairs, st := r.host.GetHeaderPairs(abi.MapRequestHeaders); st == abi.StatusOK {
			if e, ok := xffEntryFromRight(pairs, xffPos); ok {
				if ip, ok := parseHostIP(e); ok {
					return ip, true
				}
			}
		}
	}
	return r.peer()
}

const headerXFF = "x-forwarded-for"

// xffEntryFromRight returns the pos-th entry from the right (1 = right-most)
// of the X-Forwarded-For headers in pairs (the serialization of
// proxy_get_header_map_pairs), whitespace trimmed. Every X-Forwarded-For
// header counts, in order, as if joined by commas: Envoy joins repeated
// X-Forwarded-For headers into one value when it parses a request, while
// other hosts (the embedded one) keep them apart, and a proxy in front may
// add its entry as a header of its own (HAProxy's option forwardfor) —
// reading only the first header would then take a client-written one.
// Empty values are skipped (Envoy does not append them). false when there
// are fewer than pos entries or pairs is malformed.
func xffEntryFromRight(pairs []byte, pos int) ([]byte, bool) {
	it, ok := newPairIter(pairs)
	if !ok {
		return nil, false
	}
	total := 0
	for {
		name, value, more := it.next()
		if !more {
			break
		}
		if len(value) > 0 && asciiEqualFold(name, headerXFF) {
			total += countByte(value, ',') + 1
		}
	}
	if !it.ok() {
		return nil, false
	}
	want := total - pos // 0-based, from the left
	if pos <= 0 || want < 0 {
		return nil, false
	}
	it, _ = newPairIter(pairs)
	for {
		name, value, more := it.next()
		if !more {
			return nil, false
		}
		if len(value) == 0 || !asciiEqualFold(name, headerXFF) {
			continue
		}
		n := countByte(value, ',') + 1
		if want >= n {
			want -= n
			continue
		}
		for start := 0; ; {
			end := start
			for end < len(value) && value[end] != ',' {
				end++
			}
			if want == 0 {
				return trimSpace(value[start:end]), true
			}
			want--
			start = end + 1
		}
	}
}

func countByte(b []byte, c byte) int {
	n := 0
	for _, x := range b {
		if x == c {
			n++
		}
	}
	return n
}

// asciiEqualFold reports whether b equals the lower-case ASCII s, ignoring
// ASCII case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// pairIter walks the serialization of proxy_get_header_map_pairs without
// allocating: a little-endian u32 count, a u32 name size and a u32 value
// size per pair, then each name and value followed by NUL. Malformed input
// ends the walk and makes ok false.
type pairIter struct {
	sizes, data []byte
	bad         bool
}

func newPairIter(b []byte) (pairIter, bool) {
	if len(b) == 0 {
		return pairIter{}, true
	}
	if len(b) < 4 {
		return pairIter{bad: true}, false
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 0 || n > (len(b)-4)/8 {
		return pairIter{bad: true}, false
	}
	return pairIter{sizes: b[4 : 4+8*n], data: b[4+8*n:]}, true
}

func (it *pairIter) next() (name, value []byte, ok bool) {
	if it.bad || len(it.sizes) < 8 {
		return nil, nil, false
	}
	ks := int(binary.LittleEndian.Uint32(it.sizes))
	vs := int(binary.LittleEndian.Uint32(it.sizes[4:]))
	it.sizes = it.sizes[8:]
	if ks < 0 || vs < 0 || ks >= len(it.data) || vs >= len(it.data)-ks-1 {
		it.bad = true
		return nil, nil, false
	}
	name = it.data[:ks]
	value = it.data[ks+1 : ks+1+vs]
	it.data = it.data[ks+1+vs+1:]
	return name, value, true
}

func (it *pairIter) ok() bool { return !it.bad }

// peer returns the address of the connection's peer (source.address). The
// host part parsed last is kept: consecutive requests often come from the
// same client (keep-alive connections, one client behind several), and
// parsing is a large share of a request's work in wasm.
func (r *request) peer() (netip.Addr, bool) {
	h, ok := hostPart(r.getSource())
	if !ok {
		return netip.Addr{}, false
	}
	if r.peerCached && string(h) == string(r.peerHost) {
		return r.peerAddr, r.peerOK
	}
	r.peerAddr, r.peerOK = parseIP(h)
	r.peerHost = append(r.peerHost[:0], h...)
	r.peerCached = true
	return r.peerAddr, r.peerOK
}

// parseHostIP parses "ip", "ip:port", "[ipv6]" or "[ipv6]:port". IPv4-mapped
// IPv6 addresses are unmapped; zones are dropped.
func parseHostIP(b []byte) (netip.Addr, bool) {
	h, ok := hostPart(b)
	if !ok {
		return netip.Addr{}, false
	}
	return parseIP(h)
}

// hostPart returns the address part of "ip", "ip:port", "[ipv6]" or
// "[ipv6]:port"; false for empty input or an unclosed bracket.
func hostPart(b []byte) ([]byte, bool) {
	if len(b) == 0 {
		return nil, false
	}
	if b[0] == '[' {
		for i, c := range b {
			if c == ']' {
				return b[1:i], true
			}
		}
		return nil, false
	}
	colons, last := 0, -1
	for i, c := range b {
		if c == ':' {
			colons++
			last = i
		}
	}
	if colons == 1 {
		b = b[:last]
	}
	return b, true
}

func parseIP(b []byte) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(unsafeString(b))
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.WithZone("").Unmap(), true
}

// maskIP keeps the first bits of an IPv6 address (0 = all); IPv4 addresses
// are kept whole.
func maskIP(ip netip.Addr, bits int) netip.Addr {
	if !ip.Is6() || bits <= 0 || bits >= 128 {
		return ip
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return ip
	}
	return p.Addr()
}
