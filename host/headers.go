package host

import (
	"strings"
)

// headerMap is an ordered multimap with lower-case keys, as Envoy's header maps.
type headerMap struct {
	kv [][2]string
	// edited is set when an entry is replaced or removed, or the whole map is set; a map
	// that is not edited holds its original entries followed by the ones the guest added,
	// so the net/http path copies back only the additions (or nothing).
	edited bool
}

// lowerBytes returns b lower-cased as a new string (one allocation).
func lowerBytes(b []byte) string {
	for i := 0; i < len(b); i++ {
		if c := b[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(string(b))
		}
	}
	return string(b)
}

func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// eqFold compares an ASCII key case-insensitively with a lower-case name.
func eqFold(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

func (m *headerMap) getBytes(key []byte) (string, bool) {
	for _, p := range m.kv {
		if eqFold(key, p[0]) {
			return p[1], true
		}
	}
	return "", false
}

func (m *headerMap) get(name string) (string, bool) {
	return m.getBytes([]byte(lower(name)))
}

func (m *headerMap) getOr(name, def string) string {
	if v, ok := m.get(name); ok {
		return v
	}
	return def
}

func (m *headerMap) add(key, value string) {
	m.kv = append(m.kv, [2]string{lower(key), value})
}

// replace sets the first entry named key to value and removes the others; adds when absent.
func (m *headerMap) replace(key, value string) {
	key = lower(key)
	found := false
	out := m.kv[:0]
	for _, p := range m.kv {
		if p[0] == key {
			if found {
				continue
			}
			found = true
			p[1] = value
		}
		out = append(out, p)
	}
	m.kv = out
	m.edited = true
	if !found {
		m.kv = append(m.kv, [2]string{key, value})
	}
}

func (m *headerMap) removeBytes(key []byte) {
	out := m.kv[:0]
	for _, p := range m.kv {
		if !eqFold(key, p[0]) {
			out = append(out, p)
		}
	}
	for i := len(out); i < len(m.kv); i++ {
		m.kv[i] = [2]string{}
	}
	if len(out) != len(m.kv) {
		m.edited = true
	}
	m.kv = out
}

// regular returns the entries that are not pseudo-headers, as a new slice.
func (m *headerMap) regular() [][2]string {
	out := make([][2]string, 0, len(m.kv))
	for _, p := range m.kv {
		if !strings.HasPrefix(p[0], ":") {
			out = append(out, p)
		}
	}
	return out
}
