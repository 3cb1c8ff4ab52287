//go:build wasip1 || sluice_jsonv

package jsonv

// Result is the value type config works with: Value here (in the Wasm guest, or with the
// build tag sluice_jsonv).
type Result = Value

// Type is Result's JSON type.
type Type = Kind

// The types.
const (
	Null   = KindNull
	False  = KindFalse
	Number = KindNumber
	String = KindString
	True   = KindTrue
	JSON   = KindJSON
)

// ValidBytes reports whether data is one JSON value.
func ValidBytes(data []byte) bool { return Valid(data) }

// ParseBytes returns the document's root value.
func ParseBytes(data []byte) Result { return Parse(data) }
