// Package jsonv is the JSON reader config parses with, on every platform: Value, a small
// reader of our own that answers as github.com/tidwall/gjson does for the part of gjson
// config uses (ValidBytes, ParseBytes, ForEach, Get of a member name, Array; Type, Raw,
// Str, Num, Index), on documents gjson.ValidBytes accepts. `sluice check` and the module
// therefore run the same code.
//
// Why not gjson itself: gjson registers its path modifiers in a package-level map, so
// every program that imports it links github.com/tidwall/pretty, which links
// encoding/json, reflect and fmt — 0.6 MB of the module's 3.1 MB of code, which wazero
// compiles (about 0.7 µs of CPU per byte) before sluice run answers its first request,
// and whose machine code stays resident. config needs none of it: it checks a document,
// then walks it member by member.
//
// gjson stays as the oracle of the tests: TestSameAsGjson and FuzzSameAsGjson hold Value
// to it on every value reached by ForEach, Array and Get.
package jsonv

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Kind is a value's JSON type, numbered as gjson.Type is.
type Kind int

// The kinds, in gjson.Type's order.
const (
	KindNull Kind = iota
	KindFalse
	KindNumber
	KindString
	KindTrue
	KindJSON // an object or an array
)

// Value is one JSON value of a document, as gjson.Result describes it: Raw is its text
// (for the document's root object or array, the rest of the document from its first
// byte, as gjson.Parse gives it), Str a string's decoded text, Num a number's value, Index
// the offset of its first byte in the document. The zero Value is a missing one.
type Value struct {
	Type  Kind
	Raw   string
	Str   string
	Num   float64
	Index int
}

// Valid reports whether data is one JSON value (RFC 8259; bytes of strings are not checked
// as UTF-8), surrounded by nothing but JSON whitespace — what gjson.ValidBytes accepts.
func Valid(data []byte) bool {
	i := skipSpace(data, 0)
	if i == len(data) {
		return false
	}
	// stack holds the open containers' closing bytes; after a value, a container wants
	// ',' or its close.
	var stack []byte
	for {
		// A value starts at i.
		if i == len(data) {
			return false
		}
		switch c := data[i]; {
		case c == '{':
			i = skipSpace(data, i+1)
			if i < len(data) && data[i] == '}' {
				i++
				break
			}
			stack = append(stack, '}')
			var ok bool
			if i, ok = validMemberName(data, i); !ok {
				return false
			}
			continue
		case c == '[':
			i = skipSpace(data, i+1)
			if i < len(data) && data[i] == ']' {
				i++
				break
			}
			stack = append(stack, ']')
			continue
		case c == '"':
			end, ok := validString(data, i+1)
			if !ok {
				return false
			}
			i = end
		case c == '-' || (c >= '0' && c <= '9'):
			end, ok := validNumber(data, i)
			if !ok {
				return false
			}
			i = end
		case c == 't':
			if !hasPrefix(data[i:], "true") {
				return false
			}
			i += 4
		case c == 'f':
			if !hasPrefix(data[i:], "false") {
				return false
			}
			i += 5
		case c == 'n':
			if !hasPrefix(data[i:], "null") {
				return false
			}
			i += 4
		default:
			return false
		}
		// A value ended at i: close containers, or go on to the next element.
		for {
			i = skipSpace(data, i)
			if len(stack) == 0 {
				return i == len(data)
			}
			if i == len(data) {
				return false
			}
			top := stack[len(stack)-1]
			if data[i] == top {
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			if data[i] != ',' {
				return false
			}
			i = skipSpace(data, i+1)
			if top == '}' {
				var ok bool
				if i, ok = validMemberName(data, i); !ok {
					return false
				}
			}
			break
		}
	}
}

// validMemberName checks `"name" :` at i (after whitespace) and returns the index after
// the colon.
func validMemberName(data []byte, i int) (int, bool) {
	if i == len(data) || data[i] != '"' {
		return i, false
	}
	i, ok := validString(data, i+1)
	if !ok {
		return i, false
	}
	i = skipSpace(data, i)
	if i == len(data) || data[i] != ':' {
		return i, false
	}
	return skipSpace(data, i+1), true
}

// validString checks a string's body from i (after the opening quote) and returns the
// index after the closing quote.
func validString(data []byte, i int) (int, bool) {
	for ; i < len(data); i++ {
		switch c := data[i]; {
		case c < ' ':
			return i, false
		case c == '"':
			return i + 1, true
		case c == '\\':
			i++
			if i == len(data) {
				return i, false
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(data) {
					return i, false
				}
				for _, h := range data[i+1 : i+5] {
					if !isHex(h) {
						return i, false
					}
				}
				i += 4
			default:
				return i, false
			}
		}
	}
	return i, false
}

// validNumber checks a number at i: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and
// returns the index after it.
func validNumber(data []byte, i int) (int, bool) {
	if data[i] == '-' {
		i++
	}
	switch {
	case i == len(data) || !isDigit(data[i]):
		return i, false
	case data[i] == '0':
		i++
	default:
		i = skipDigits(data, i)
	}
	if i < len(data) && data[i] == '.' {
		i++
		if i == len(data) || !isDigit(data[i]) {
			return i, false
		}
		i = skipDigits(data, i)
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i == len(data) || !isDigit(data[i]) {
			return i, false
		}
		i = skipDigits(data, i)
	}
	return i, true
}

func skipDigits(data []byte, i int) int {
	for i < len(data) && isDigit(data[i]) {
		i++
	}
	return i
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isHex(c byte) bool {
	return isDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func hasPrefix(b []byte, s string) bool { return len(b) >= len(s) && string(b[:len(s)]) == s }

// Parse returns the document's root value, as gjson.ParseBytes does: a root object or
// array's Raw runs to the document's end. data must be Valid; otherwise the result is
// unspecified (but Parse does not panic).
func Parse(data []byte) Value {
	s := string(data)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case isSpace(c):
			continue
		case c == '{' || c == '[':
			return Value{Type: KindJSON, Raw: s[i:], Index: i}
		default:
			return valueAt(s, i, 0)
		}
	}
	return Value{}
}

// valueAt reads the value that starts at s[i] (valid JSON); base is the offset of s in the
// document.
func valueAt(s string, i, base int) Value {
	if i >= len(s) {
		return Value{}
	}
	end := skipValue(s, i)
	v := Value{Raw: s[i:end], Index: base + i}
	switch c := s[i]; {
	case c == '{' || c == '[':
		v.Type = KindJSON
	case c == '"':
		v.Type = KindString
		v.Str = unquote(v.Raw)
	case c == 't':
		v.Type = KindTrue
	case c == 'f':
		v.Type = KindFalse
	case c == 'n':
		v.Type = KindNull
	default:
		v.Type = KindNumber
		v.Num, _ = strconv.ParseFloat(v.Raw, 64)
	}
	return v
}

// skipValue returns the index after the value that starts at s[i] (valid JSON; on invalid
// input it stops at the end of s).
func skipValue(s string, i int) int {
	if i >= len(s) {
		return len(s)
	}
	switch c := s[i]; {
	case c == '"':
		return skipString(s, i+1)
	case c == '{' || c == '[':
		depth := 0
		for ; i < len(s); i++ {
			switch s[i] {
			case '"':
				i = skipString(s, i+1) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return len(s)
	default: // a number or a literal
		for i++; i < len(s); i++ {
			if c := s[i]; isSpace(c) || c == ',' || c == ']' || c == '}' || c == ':' {
				return i
			}
		}
		return len(s)
	}
}

// skipString returns the index after the closing quote of the string whose body starts
// at s[i].
func skipString(s string, i int) int {
	for ; i < len(s); i++ {
		switch s[i] {
		case '"':
			return i + 1
		case '\\':
			i++
		}
	}
	return len(s)
}

// unquote decodes a string token (with its quotes) of valid JSON. A \u escape of a lone
// surrogate decodes as U+FFFD, as gjson does.
func unquote(raw string) string {
	if len(raw) < 2 || raw[len(raw)-1] != '"' {
		return "" // not a whole string token: only from invalid input
	}
	body := raw[1 : len(raw)-1]
	esc := false
	for i := 0; i < len(body); i++ {
		if body[i] == '\\' {
			esc = true
			break
		}
	}
	if !esc {
		return body
	}
	out := make([]byte, 0, len(body))
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c != '\\' || i+1 == len(body) {
			out = append(out, c)
			continue
		}
		i++
		switch body[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if i+5 > len(body) {
				return string(out)
			}
			r := hex4(body[i+1 : i+5])
			i += 4
			if r >= 0xD800 && r < 0xDC00 && i+7 <= len(body) && body[i+1] == '\\' && body[i+2] == 'u' {
				if r2 := hex4(body[i+3 : i+7]); r2 >= 0xDC00 && r2 < 0xE000 {
					r = utf16.DecodeRune(r, r2)
					i += 6
				}
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\', '/'
			out = append(out, body[i])
		}
	}
	return string(out)
}

// hex4 decodes four hex digits.
func hex4(h string) rune {
	var r rune
	for i := 0; i < 4; i++ {
		c := h[i]
		switch {
		case c >= 'a':
			c -= 'a' - 10
		case c >= 'A':
			c -= 'A' - 10
		default:
			c -= '0'
		}
		r = r<<4 | rune(c)
	}
	return r
}

// Exists reports whether v is a value (not a missing one).
func (v Value) Exists() bool { return v.Type != KindNull || len(v.Raw) != 0 }

// IsObject reports whether v is an object.
func (v Value) IsObject() bool { return v.Type == KindJSON && len(v.Raw) > 0 && v.Raw[0] == '{' }

// IsArray reports whether v is an array.
func (v Value) IsArray() bool { return v.Type == KindJSON && len(v.Raw) > 0 && v.Raw[0] == '[' }

// String is v as gjson.Result.String gives it: a string's text, a number as written (an
// integer) or formatted (any other), "true", "false", an object's or array's text; "" for
// null.
func (v Value) String() string {
	switch v.Type {
	case KindFalse:
		return "false"
	case KindTrue:
		return "true"
	case KindString:
		return v.Str
	case KindJSON:
		return v.Raw
	case KindNumber:
		if v.Raw == "" {
			return strconv.FormatFloat(v.Num, 'f', -1, 64)
		}
		i := 0
		if v.Raw[0] == '-' {
			i++
		}
		for ; i < len(v.Raw); i++ {
			if !isDigit(v.Raw[i]) {
				return strconv.FormatFloat(v.Num, 'f', -1, 64)
			}
		}
		return v.Raw
	}
	return ""
}

// ForEach calls fn with each member of an object (its name as a string Value, with Index)
// or each element of an array (a number Value counting from 0, without Raw), in order,
// until fn returns false. A value that is neither is passed once with a zero key; a missing
// value, never.
func (v Value) ForEach(fn func(key, value Value) bool) {
	if !v.Exists() {
		return
	}
	if v.Type != KindJSON {
		fn(Value{}, v)
		return
	}
	s := v.Raw
	if s == "" {
		return
	}
	obj := s[0] == '{'
	key := Value{Type: KindNumber, Num: -1}
	if obj {
		key = Value{Type: KindString}
	}
	i := 1
	for {
		i = skipSeparators(s, i)
		if i >= len(s) || s[i] == '}' || s[i] == ']' {
			return
		}
		if obj {
			end := skipString(s, i+1)
			key.Raw = s[i:end]
			key.Str = unquote(key.Raw)
			key.Index = v.Index + i
			i = skipSeparators(s, end)
		} else {
			key.Num++
		}
		val := valueAt(s, i, v.Index)
		if !fn(key, val) {
			return
		}
		i += len(val.Raw)
	}
}

// skipSeparators skips whitespace, commas and colons.
func skipSeparators(s string, i int) int {
	for i < len(s) && (s[i] <= ' ' || s[i] == ',' || s[i] == ':') {
		i++
	}
	return i
}

// Get returns the member of an object named name (the first, if it is repeated); a missing
// value with v's Index if there is none or v is not an object. name is a member name, not
// a gjson path: config asks only for plain names.
func (v Value) Get(name string) Value {
	found := Value{Index: v.Index}
	if !v.IsObject() {
		return found
	}
	v.ForEach(func(k, x Value) bool {
		if k.Str == name {
			found = x
			return false
		}
		return true
	})
	return found
}

// Array returns an array's elements; a missing value gives none, any other value itself.
func (v Value) Array() []Value {
	if v.Type == KindNull {
		return []Value{}
	}
	if !v.IsArray() {
		return []Value{v}
	}
	a := []Value{}
	v.ForEach(func(_, x Value) bool {
		a = append(a, x)
		return true
	})
	return a
}
