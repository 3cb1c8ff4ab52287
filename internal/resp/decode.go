package resp

import (
	"errors"
	"strconv"
)

// Type is the kind of a RESP2 value: its first byte on the wire.
type Type byte

// The five RESP2 types.
const (
	SimpleString Type = '+'
	Error        Type = '-'
	Integer      Type = ':'
	BulkString   Type = '$'
	Array        Type = '*'
)

// String returns a readable name of t.
func (t Type) String() string {
	switch t {
	case SimpleString:
		return "simple string"
	case Error:
		return "error"
	case Integer:
		return "integer"
	case BulkString:
		return "bulk string"
	case Array:
		return "array"
	}
	return "invalid type"
}

// Value is one decoded reply.
//
// Str aliases the decoded input (no copy is made): it is valid only as long as
// the input buffer is. Elems of arrays returned by a Decoder alias the
// decoder's scratch space and are valid until its next Decode.
type Value struct {
	// Type is the RESP type.
	Type Type
	// Null marks the null bulk string ("$-1") and the null array ("*-1").
	Null bool
	// Int holds the value of an Integer.
	Int int64
	// Str holds the bytes of a SimpleString, Error or BulkString.
	Str []byte
	// Elems holds the elements of an Array.
	Elems []Value
}

// IsError reports whether v is an error reply.
func (v Value) IsError() bool { return v.Type == Error }

// Err returns a *ReplyError describing v if v is an error reply, else nil.
// It copies the message, so the error outlives the input buffer.
func (v Value) Err() error {
	if v.Type != Error {
		return nil
	}
	return &ReplyError{Code: Classify(v.Str), Msg: string(v.Str)}
}

// Limits on what the decoder accepts.
const (
	// MaxBulkLen is the largest bulk string accepted (Redis's own
	// proto-max-bulk-len default).
	MaxBulkLen = 512 << 20
	// MaxDepth is the deepest nesting of arrays accepted.
	MaxDepth = 32
)

// ErrTruncated is wrapped by errors for input that ends before the reply does.
var ErrTruncated = errors.New("resp: truncated reply")

// ErrMalformed is wrapped by errors for input that is not valid RESP2.
var ErrMalformed = errors.New("resp: malformed reply")

// SyntaxError describes why and where decoding failed. It wraps ErrTruncated
// or ErrMalformed.
type SyntaxError struct {
	// Offset is the byte offset in the input where the problem was found.
	Offset int
	// Msg says what is wrong.
	Msg string
	// Truncated is set when more input could have completed the reply.
	Truncated bool
}

func (e *SyntaxError) Error() string {
	kind := "malformed reply"
	if e.Truncated {
		kind = "truncated reply"
	}
	return "resp: " + kind + ": " + e.Msg + " at offset " + strconv.Itoa(e.Offset)
}

// Unwrap returns ErrTruncated or ErrMalformed.
func (e *SyntaxError) Unwrap() error {
	if e.Truncated {
		return ErrTruncated
	}
	return ErrMalformed
}

func malformed(off int, msg string) error { return &SyntaxError{Offset: off, Msg: msg} }
func truncated(off int, msg string) error {
	return &SyntaxError{Offset: off, Msg: msg, Truncated: true}
}

// Decoder decodes replies, reusing its scratch space for array elements
// across calls. The zero Decoder is ready to use. A Decoder is not safe for
// concurrent use.
type Decoder struct {
	slab []Value
	next int
}

// Decode decodes the first reply in b and returns it with the number of bytes
// it occupies. Nested arrays are decoded into the decoder's scratch space,
// which is reused by the next call: once its capacity has grown to fit the
// replies seen, Decode does not allocate.
func (d *Decoder) Decode(b []byte) (Value, int, error) {
	// Pass 1 validates the whole reply and counts the array elements, so
	// that pass 2 can place every element in one slab that never moves.
	n, elems, err := scan(b, 0, 0)
	if err != nil {
		return Value{}, 0, err
	}
	if cap(d.slab) < elems {
		d.slab = make([]Value, elems)
	}
	d.slab = d.slab[:elems]
	clear(d.slab)
	d.next = 0
	v, _ := d.fill(b, 0)
	return v, n, nil
}

// Parse decodes b, which must hold exactly one reply and nothing after it.
func (d *Decoder) Parse(b []byte) (Value, error) {
	v, n, err := d.Decode(b)
	if err != nil {
		return Value{}, err
	}
	if n != len(b) {
		return Value{}, malformed(n, strconv.Itoa(len(b)-n)+" unexpected bytes after the reply")
	}
	return v, nil
}

// Parse decodes b, which must hold exactly one reply, with a fresh Decoder.
func Parse(b []byte) (Value, error) {
	var d Decoder
	return d.Parse(b)
}

// line returns the end of the line starting at off (the index of its '\r')
// and the offset after its CRLF.
func line(b []byte, off int) (end, next int, err error) {
	for i := off; i < len(b); i++ {
		switch b[i] {
		case '\r':
			if i+1 >= len(b) {
				return 0, 0, truncated(i+1, "line ends without LF")
			}
			if b[i+1] != '\n' {
				return 0, 0, malformed(i+1, "CR not followed by LF")
			}
			return i, i + 2, nil
		case '\n':
			return 0, 0, malformed(i, "LF without CR")
		}
	}
	return 0, 0, truncated(len(b), "line has no CRLF")
}

// parseInt parses a signed decimal integer that fills s exactly.
func parseInt(s []byte) (int64, bool) {
	neg := false
	if len(s) > 0 && s[0] == '-' {
		neg, s = true, s[1:]
	}
	if len(s) == 0 || len(s) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if neg {
		if n > 1<<63 {
			return 0, false
		}
		return -int64(n), true
	}
	if n > 1<<63-1 {
		return 0, false
	}
	return int64(n), true
}

// scan validates the reply at off and returns its end offset and how many
// array elements it contains, nested ones included.
func scan(b []byte, off, depth int) (next, elems int, err error) {
	if off >= len(b) {
		return 0, 0, truncated(off, "missing reply")
	}
	t := Type(b[off])
	end, next, err := line(b, off+1)
	if err != nil {
		return 0, 0, err
	}
	body := b[off+1 : end]
	switch t {
	case SimpleString, Error:
		return next, 0, nil
	case Integer:
		if _, ok := parseInt(body); !ok {
			return 0, 0, malformed(off+1, "bad integer")
		}
		return next, 0, nil
	case BulkString:
		n, ok := parseInt(body)
		if !ok || n < -1 || n > MaxBulkLen {
			return 0, 0, malformed(off+1, "bad bulk string length")
		}
		if n == -1 {
			return next, 0, nil
		}
		if int64(len(b)-next) < n+2 {
			return 0, 0, truncated(len(b), "bulk string shorter than its length")
		}
		e := next + int(n)
		if b[e] != '\r' || b[e+1] != '\n' {
			return 0, 0, malformed(e, "bulk string not terminated by CRLF")
		}
		return e + 2, 0, nil
	case Array:
		n, ok := parseInt(body)
		if !ok || n < -1 {
			return 0, 0, malformed(off+1, "bad array length")
		}
		if n == -1 {
			return next, 0, nil
		}
		if depth >= MaxDepth {
			return 0, 0, malformed(off, "arrays nested too deeply")
		}
		// Every element takes at least 3 bytes ("+\r\n"): a longer claim
		// cannot be satisfied by the bytes at hand.
		if n > int64(len(b)-next)/3 {
			return 0, 0, truncated(len(b), "array has fewer elements than its length")
		}
		total := int(n)
		for i := 0; i < int(n); i++ {
			var sub int
			next, sub, err = scan(b, next, depth+1)
			if err != nil {
				return 0, 0, err
			}
			total += sub
		}
		return next, total, nil
	}
	switch b[off] {
	case '_', ',', '#', '!', '=', '(', '%', '~', '|', '>':
		return 0, 0, malformed(off, "RESP3 type "+strconv.QuoteRune(rune(b[off]))+" is not supported")
	}
	return 0, 0, malformed(off, "unexpected type byte "+strconv.QuoteRune(rune(b[off])))
}

// fill decodes the reply at off, which scan has validated.
func (d *Decoder) fill(b []byte, off int) (Value, int) {
	t := Type(b[off])
	end, next, _ := line(b, off+1)
	body := b[off+1 : end]
	v := Value{Type: t}
	switch t {
	case SimpleString, Error:
		v.Str = body
	case Integer:
		v.Int, _ = parseInt(body)
	case BulkString:
		n, _ := parseInt(body)
		if n < 0 {
			v.Null = true
			return v, next
		}
		v.Str = b[next : next+int(n) : next+int(n)]
		next += int(n) + 2
	case Array:
		n, _ := parseInt(body)
		if n < 0 {
			v.Null = true
			return v, next
		}
		if n == 0 {
			v.Elems = []Value{}
			return v, next
		}
		elems := d.slab[d.next : d.next+int(n) : d.next+int(n)]
		d.next += int(n)
		for i := range elems {
			elems[i], next = d.fill(b, next)
		}
		v.Elems = elems
	}
	return v, next
}
