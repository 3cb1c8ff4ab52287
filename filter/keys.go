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
	host    abi.Host
	have    uint8
	method  []byte
	path    []byte
	source  []byte
	xff     []byte
	cookie  []byte
	headerF func(string) (string, bool) // r.header, bound once

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
	haveXFF
	haveCookie
)

func (r *request) reset(h abi.Host) {
	r.host = h
	r.have = 0
	if r.headerF == nil {
		r.headerF = r.header
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
func (r *request) getXFF() []byte    { return r.fetch(haveXFF, &r.xff, "x-forwarded-for") }
func (r *request) getCookie() []byte { return r.fetch(haveCookie, &r.cookie, "cookie") }

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

// Key part tags, so that parts of different kinds never collide.
const (
	tagIP byte = iota + 1
	tagHeader
	tagQuery
	tagCookie
	tagPath
	tagMethod
)

// appendKey appends the key of parts for the current request to dst. ok is
// false when a part is missing (the rule does not apply): no client
// address, an absent or empty header, query parameter or cookie. Each part
// is written as tag, length, bytes, so the encoding is unambiguous.
func appendKey(dst []byte, parts []config.KeyPart, r *request, xffHops int) ([]byte, bool) {
	for i := range parts {
		p := &parts[i]
		switch {
		case p.RemoteIP:
			ip, ok := clientIP(r, xffHops)
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
			path := r.getPath()
			if len(path) == 0 {
				return dst, false
			}
			for j, c := range path {
				if c == '?' || c == '#' {
					path = path[:j]
					break
				}
			}
			dst = appendPart(dst, tagPath, path)
		case p.Method:
			m := r.getMethod()
			if len(m) == 0 {
				return dst, false
			}
			dst = appendPart(dst, tagMethod, m)
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

// clientIP returns the client address. With xffHops > 0 it is the
// hops-th entry from the right of X-Forwarded-For (each trusted proxy in
// front appends the address of its peer). An Envoy with use_remote_address
// appends its own peer before filters run: a rightmost entry equal to the
// peer (source.address) is that append and is skipped. Without xffHops, or
// when the header has too few entries or an unparsable one, the client is
// the peer itself.
func clientIP(r *request, xffHops int) (netip.Addr, bool) {
	peer, peerOK := r.peer()
	if xffHops > 0 {
		if ip, ok := xffEntry(r.getXFF(), xffHops, peer, peerOK); ok {
			return ip, true
		}
	}
	return peer, peerOK
}

func xffEntry(xff []byte, hops int, peer netip.Addr, peerOK bool) (netip.Addr, bool) {
	end := len(xff)
	first := true
	for i := len(xff) - 1; i >= -1; i-- {
		if i >= 0 && xff[i] != ',' {
			continue
		}
		entry := trimSpace(xff[i+1 : end])
		end = i
		if first {
			first = false
			if ip, ok := parseHostIP(entry); ok && peerOK && ip == peer {
				continue // appended by this proxy
			}
		}
		hops--
		if hops == 0 {
			return parseHostIP(entry)
		}
	}
	return netip.Addr{}, false
}

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
