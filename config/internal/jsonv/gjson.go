//go:build !wasip1 && !sluice_jsonv

package jsonv

import "github.com/tidwall/gjson"

// Result is the value type config works with: gjson.Result here (natively).
type Result = gjson.Result

// Type is Result's JSON type.
type Type = gjson.Type

// The types.
const (
	Null   = gjson.Null
	False  = gjson.False
	Number = gjson.Number
	String = gjson.String
	True   = gjson.True
	JSON   = gjson.JSON
)

// ValidBytes reports whether data is one JSON value.
func ValidBytes(data []byte) bool { return gjson.ValidBytes(data) }

// ParseBytes returns the document's root value.
func ParseBytes(data []byte) Result { return gjson.ParseBytes(data) }
