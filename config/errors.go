package config

import "strings"

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
