package config

import "strings"

// Matches reports whether a request is selected by m. method is the
// request's :method, path its :path as received, and header looks up a
// request header by its lower-case name. path_prefix is compared with the
// normal form of the path (NormalizePath: as Envoy's normalize_path and
// merge_slashes leave it, without query string or fragment), so /%68, //h,
// /./h and /x/../h all start with /h; an empty path matches no path_prefix.
// Methods compare case-insensitively, the path prefix and header values
// exactly (byte for byte); an "absent" header entry holds when the header
// is absent or empty. The zero Match matches every request. Matches
// does not allocate for paths up to 512 bytes; a caller that checks several
// rules normalizes once and uses MatchesNormal.
func (m *Match) Matches(method, path string, header func(name string) (string, bool)) bool {
	if m.PathPrefix != "" {
		path = PathPart(path)
		if path != "" && !PathIsNormal(path) {
			var buf [512]byte
			n := AppendNormalPath(buf[:0], path)
			if len(n) < len(m.PathPrefix) || string(n[:len(m.PathPrefix)]) != m.PathPrefix {
				return false
			}
			return m.matchesRest(method, header)
		}
	}
	return m.MatchesNormal(method, path, header)
}

// MatchesNormal is Matches for a path already in normal form (what
// AppendNormalPath or NormalizePath returns for the request's :path; empty
// when the request has none). It does not allocate.
func (m *Match) MatchesNormal(method, normalPath string, header func(name string) (string, bool)) bool {
	if m.PathPrefix != "" && !strings.HasPrefix(normalPath, m.PathPrefix) {
		return false
	}
	return m.matchesRest(method, header)
}

func (m *Match) matchesRest(method string, header func(name string) (string, bool)) bool {
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
		var v string
		ok := false
		if header != nil {
			v, ok = header(h.Name)
		}
		if h.Absent {
			if ok && v != "" {
				return false
			}
			continue
		}
		if !ok || v != h.Exact {
			return false
		}
	}
	return true
}

// IsZero reports whether m matches every request.
func (m *Match) IsZero() bool {
	return m.PathPrefix == "" && len(m.Methods) == 0 && len(m.Headers) == 0 && len(m.Routes) == 0 && len(m.Values) == 0
}
