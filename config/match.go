package config

import "strings"

// Matches reports whether a request is selected by m. method is the
// request's :method, path its :path (the query string and any fragment are
// ignored: path_prefix is compared with the path before the first '?' or
// '#'), and header looks up a request header by its lower-case name.
// Methods compare case-insensitively, the path prefix and header values
// exactly (byte for byte). The zero Match matches every request. Matches does
// not allocate.
func (m *Match) Matches(method, path string, header func(name string) (string, bool)) bool {
	if m.PathPrefix != "" {
		if i := strings.IndexAny(path, "?#"); i >= 0 {
			path = path[:i]
		}
		if !strings.HasPrefix(path, m.PathPrefix) {
			return false
		}
	}
	if len(m.Methods) > 0 {
		found := false
		for _, x := range m.Methods {
			if strings.EqualFold(x, method) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	for i := range m.Headers {
		h := &m.Headers[i]
		if header == nil {
			return false
		}
		v, ok := header(h.Name)
		if !ok || v != h.Exact {
			return false
		}
	}
	return true
}

// IsZero reports whether m matches every request.
func (m *Match) IsZero() bool {
	return m.PathPrefix == "" && len(m.Methods) == 0 && len(m.Headers) == 0 && len(m.Routes) == 0
}
