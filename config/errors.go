package config

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Error is one configuration problem. Path is the JSON path of the offending
// value ("rules[2].window"), empty for the document itself.
type Error struct {
	Path string
	Msg  string
}

// Error returns "PATH: MSG", or "configuration: MSG" when Path is empty.
func (e *Error) Error() string {
	p := e.Path
	if p == "" {
		p = "configuration"
	}
	return p + ": " + e.Msg
}

// Errors is every problem found in one configuration, in document order.
// Parse returns it (as an error) whenever it fails; use errors.As to reach
// the individual entries.
type Errors []*Error

// Error joins the entries, one per line.
func (es Errors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// MaxErrors caps the number of entries Parse reports; when more problems are
// found the last entry says how many were left out.
const MaxErrors = 50

// How input is echoed in messages. A configuration is untrusted text that
// ends up in terminals (sluice check) and in the proxy's log, so nothing from
// it is written raw unless it is plain: every string is quoted and escaped
// the way strconv.Quote does (no control character, no DEL, no invalid UTF-8,
// no non-printing rune such as U+2028 or a bidirectional override), and long
// input is cut. A message therefore never contains a byte below 0x20 or 0x7f,
// and Errors.Error() has exactly one '\n' between entries and none inside.
//
// Paths name object members with a dot when the name is plain (letters,
// digits, '_' and '-', at most maxPlainName bytes) and otherwise in brackets
// with the quoted name, as in JavaScript: `rules[0].match["x\ny"]`,
// `["a b"]` at the top level. A quoted string cut short is followed by
// "..." outside its quotes: `"aaaa"...` is a value that starts with aaaa.

const (
	maxPlainName  = 64 // bytes of a field name written bare in a path
	maxQuotedName = 64 // bytes of a quoted field name in a path
	maxShownValue = 40 // bytes of a bad value shown in a message
)

// Quote returns s quoted and escaped for a message: strconv.Quote of s, or
// of its longest prefix that fits in limit bytes (quotes included) followed
// by "..." when s is longer. A limit below 8 is taken as 8.
func Quote(s string, limit int) string {
	limit = max(limit, 8)
	q := strconv.Quote(s)
	if len(q) <= limit {
		return q
	}
	// The escaped form of s[:cut] grows with cut: find the longest prefix,
	// cut at a rune start, whose quoted form and "..." fit.
	for cut := min(len(s), limit); cut > 0; cut-- {
		if cut == len(s) || utf8.RuneStart(s[cut]) {
			if q = strconv.Quote(s[:cut]); len(q)+3 <= limit {
				return q + "..."
			}
		}
	}
	return `""...`
}

// fieldPath returns the path of member name of the object at path (""
// for the document): path.name when name is plain, else path["name"].
func fieldPath(path, name string) string {
	if plainName(name) {
		if path == "" {
			return name
		}
		return path + "." + name
	}
	return path + "[" + Quote(name, maxQuotedName) + "]"
}

// plainName reports whether name can be written bare in a path.
func plainName(name string) bool {
	if name == "" || len(name) > maxPlainName {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// plainText returns s bare when every byte is printable ASCII other than
// space, '"' and '\\', and Quote(s, limit) otherwise (for names and values
// in one-line summaries, where a bare value must not look like syntax).
func plainText(s string, limit int) string {
	if s != "" && len(s) <= limit {
		plain := true
		for i := 0; i < len(s); i++ {
			if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
				plain = false
				break
			}
		}
		if plain {
			return s
		}
	}
	return Quote(s, limit)
}
