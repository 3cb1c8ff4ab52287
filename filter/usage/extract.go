package usage

import (
	"math"
	"math/bits"
)

// MaxDepth is the deepest nesting of arrays and objects an Extractor reads;
// the container that would open level MaxDepth+1 stops it with DocTooDeep.
// The nesting costs one bit a level.
const MaxDepth = 256

// Status is what an Extractor found at one path.
type Status uint8

const (
	// Absent: the path is not in the document, its value is null, or a key on
	// the way holds something other than an object (null, a number, an array...).
	Absent Status = iota
	// Found: the value is an integer in [0, math.MaxInt64].
	Found
	// NotInteger: the value is a string (even "12"), a boolean, an object, an
	// array, or a number with a fraction or an exponent (even 12.0 or 1e3).
	NotInteger
	// OutOfRange: the value is an integer below 0 or above math.MaxInt64.
	// ("-0" is 0 and is Found.)
	OutOfRange
)

var statusNames = [...]string{"absent", "found", "not-integer", "out-of-range"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "status?"
}

// DocStatus is the verdict on a whole document.
type DocStatus uint8

const (
	// DocOK: one complete, well-formed JSON value (RFC 8259), whitespace around.
	DocOK DocStatus = iota
	// DocEmpty: nothing but whitespace (or nothing).
	DocEmpty
	// DocMalformed: not JSON, or JSON cut short; reading stopped at the first
	// byte that could not continue a JSON text (or at the end).
	DocMalformed
	// DocTooDeep: nesting beyond MaxDepth; reading stopped there.
	DocTooDeep
	// DocTooLarge: more bytes than the limit given to Reset; reading stopped
	// at the limit.
	DocTooLarge
)

var docNames = [...]string{"ok", "empty", "malformed", "too-deep", "too-large"}

func (d DocStatus) String() string {
	if int(d) < len(docNames) {
		return docNames[d]
	}
	return "doc?"
}

// scanner states
const (
	stValue    uint8 = iota // a value is due
	stArrFirst              // after '[': a value or ']'
	stObjFirst              // after '{': a key or '}'
	stObjKey                // after ',' in an object: a key
	stKey                   // in a key that may match a path
	stKeySkip               // in a key that matches nothing
	stKeyEsc                // after '\' in a key
	stKeyHex                // in \uXXXX in a key
	stColon                 // after a key
	stStr                   // in a string value
	stStrEsc                // after '\' in a string value
	stStrHex                // in \uXXXX in a string value
	stNumMinus              // after '-'
	stNumZero               // after a leading 0
	stNumInt                // in the integer digits
	stNumDot                // after '.'
	stNumFrac               // in the fraction digits
	stNumE                  // after 'e' or 'E'
	stNumESign              // after the exponent's sign
	stNumExp                // in the exponent digits
	stLit                   // in true, false or null
	stAfter                 // after a value inside a container
	stEnd                   // after the top-level value
	stStop                  // stopped: an error, or Finish was called
)

// ws is true for JSON's four whitespace bytes.
var ws = [256]bool{' ': true, '\t': true, '\n': true, '\r': true}

// Extractor reads one JSON document, fed in chunks of any size split at any
// byte, and records the integer at each of its Paths. Its state is a fixed
// size (under 512 bytes): it never buffers the
// document, a key or a string, and Write never allocates. The zero Extractor
// is unusable; call Reset first. Not safe for concurrent use.
type Extractor struct {
	p     *Paths
	limit int64 // bytes allowed; 0 means no limit
	n     int64 // bytes taken so far

	state   uint8
	doc     DocStatus
	started bool // a non-whitespace byte was seen

	depth int
	kinds [MaxDepth / 64]uint64   // bit set: the container at that level is an object
	masks [MaxSegments + 1]uint32 // masks[L]: paths matching the keys down to the object at level L

	leaf, next uint32 // paths for which the coming value is the leaf / must be an object

	cand uint32 // paths the key read so far still matches
	kpos int    // bytes of the key read so far (while cand != 0)

	hexN   uint8 // hex digits read in \uXXXX
	hexVal uint16

	neg, ovf, frac bool
	acc            int64

	lit    string
	litPos uint8

	status [MaxPaths]Status
	vals   [MaxPaths]int64
}

// NewExtractor returns an Extractor Reset for p with no byte limit.
func NewExtractor(p *Paths) *Extractor {
	e := new(Extractor)
	e.Reset(p, 0)
	return e
}

// Reset readies e for a new document read against p; limit > 0 caps the
// document's size in bytes (beyond it: DocTooLarge), 0 means no cap.
func (e *Extractor) Reset(p *Paths, limit int64) {
	e.p = p
	e.limit = limit
	e.n = 0
	e.state = stValue
	e.doc = DocOK
	e.started = false
	e.depth = 0
	e.leaf = 0
	e.next = p.all
	e.cand = 0
	e.kpos = 0
	e.status = [MaxPaths]Status{}
	e.vals = [MaxPaths]int64{}
}

// Value reports the integer at path i (as numbered in Compile) and its Status.
// It may be called at any time; a value counts from the moment it is complete
// (its last digit and the byte after it were read) and stays, whatever comes
// later, unless a later duplicate of a key on its path replaces it (the last
// duplicate wins, as for a JSON object decoded into a map).
func (e *Extractor) Value(i int) (int64, Status) {
	return e.vals[i], e.status[i]
}

// Bytes is the number of bytes taken so far (not counting any beyond the limit).
func (e *Extractor) Bytes() int64 { return e.n }

// Doc is the verdict so far: DocOK until something went wrong; only Finish
// tells an incomplete document from a complete one.
func (e *Extractor) Doc() DocStatus { return e.doc }

func (e *Extractor) fail(d DocStatus) {
	e.doc = d
	e.state = stStop
}

func (e *Extractor) set(m uint32, s Status, v int64) {
	for ; m != 0; m &= m - 1 {
		i := bits.TrailingZeros32(m)
		e.status[i] = s
		e.vals[i] = v
	}
}

// afterValue moves on once a value is complete.
func (e *Extractor) afterValue() {
	if e.depth == 0 {
		e.state = stEnd
	} else {
		e.state = stAfter
	}
}

func (e *Extractor) isObject() bool {
	l := e.depth - 1
	return e.kinds[l>>6]&(1<<(l&63)) != 0
}

// open pushes a container; it reports false when that is too deep.
func (e *Extractor) open(object bool) bool {
	if e.leaf != 0 {
		e.set(e.leaf, NotInteger, 0)
	}
	if e.depth == MaxDepth {
		e.fail(DocTooDeep)
		return false
	}
	l := e.depth
	e.depth++
	if object {
		e.kinds[l>>6] |= 1 << (l & 63)
		e.state = stObjFirst
	} else {
		e.kinds[l>>6] &^= 1 << (l & 63)
		e.state = stArrFirst
	}
	if e.depth <= MaxSegments {
		if object {
			e.masks[e.depth] = e.next
		} else {
			e.masks[e.depth] = 0
		}
	}
	e.leaf, e.next = 0, 0
	return true
}

func (e *Extractor) close() {
	e.depth--
	e.afterValue()
}

// startKey is called after the key's opening quote.
func (e *Extractor) startKey() {
	e.cand = 0
	if e.depth <= MaxSegments {
		e.cand = e.masks[e.depth]
	}
	e.kpos = 0
	if e.cand != 0 {
		e.state = stKey
	} else {
		e.state = stKeySkip
	}
}

// keyByte compares one decoded key byte with the candidates.
func (e *Extractor) keyByte(c byte) {
	k := e.depth - 1
	pos := e.kpos
	for m := e.cand; m != 0; m &= m - 1 {
		i := bits.TrailingZeros32(m)
		s := e.p.segs[i][k]
		if pos >= len(s) || s[pos] != c {
			e.cand &^= 1 << i
		}
	}
	e.kpos++
	if e.cand == 0 {
		e.state = stKeySkip
	}
}

// endKey is called at the key's closing quote.
func (e *Extractor) endKey() {
	e.leaf, e.next = 0, 0
	if e.cand != 0 {
		k := e.depth - 1
		for m := e.cand; m != 0; m &= m - 1 {
			i := bits.TrailingZeros32(m)
			if len(e.p.segs[i][k]) != e.kpos {
				e.cand &^= 1 << i
			}
		}
		// A key on the way to a path, met again, replaces what was found under it.
		e.set(e.cand, Absent, 0)
		e.leaf = e.cand & e.p.leaf[k]
		e.next = e.cand &^ e.p.leaf[k]
		e.cand = 0
	}
	e.state = stColon
}

// delimits reports whether c may follow a number here; a number is
// committed only then.
func (e *Extractor) delimits(c byte) bool {
	switch {
	case ws[c]:
		return true
	case e.depth == 0:
		return false
	case c == ',':
		return true
	case c == '}':
		return e.isObject()
	case c == ']':
		return !e.isObject()
	}
	return false
}

func (e *Extractor) endNumber() {
	if e.leaf != 0 {
		switch {
		case e.frac:
			e.set(e.leaf, NotInteger, 0)
		case e.ovf || (e.neg && e.acc != 0):
			e.set(e.leaf, OutOfRange, 0)
		default:
			e.set(e.leaf, Found, e.acc)
		}
	}
	e.afterValue()
}

func (e *Extractor) startNumber(c byte) {
	e.neg, e.ovf, e.frac, e.acc = false, false, false, 0
	switch {
	case c == '-':
		e.neg = true
		e.state = stNumMinus
	case c == '0':
		e.state = stNumZero
	default:
		e.acc = int64(c - '0')
		e.state = stNumInt
	}
}

func isHex(c byte) bool {
	return c-'0' < 10 || (c|0x20)-'a' < 6
}

func hexVal(c byte) uint16 {
	if c <= '9' {
		return uint16(c - '0')
	}
	return uint16((c | 0x20) - 'a' + 10)
}

// Write reads the next chunk of the document. It never fails: problems are
// recorded (see Doc) and end the reading, after which Write ignores its input.
func (e *Extractor) Write(p []byte) {
	if e.state == stStop {
		return
	}
	over := false
	if e.limit > 0 && int64(len(p)) > e.limit-e.n {
		p = p[:e.limit-e.n]
		over = true
	}
	e.n += int64(len(p))
	e.scan(p)
	if over && e.state != stStop {
		e.fail(DocTooLarge)
	}
}

// scan reads p through the state machine. It is one long function on
// purpose: it is the per-byte loop of every metered response body, and the
// same machine split into a reader per family of states (structure,
// strings, numbers) measured 1.2–1.5× slower on SSE streams in small
// chunks (BenchmarkMeterSSESmallChunks), where the call per state change
// dominates. Each case is one state; the hot runs (string bytes, integer
// digits) are inner loops.
func (e *Extractor) scan(p []byte) {
	i := 0
	for i < len(p) {
		c := p[i]
		switch e.state {
		case stValue:
			if ws[c] {
				i++
				continue
			}
			e.started = true
			switch {
			case c == '{':
				if !e.open(true) {
					return
				}
			case c == '[':
				if !e.open(false) {
					return
				}
			case c == '"':
				e.state = stStr
			case c == '-' || c-'0' < 10:
				e.startNumber(c)
			case c == 't':
				e.lit, e.litPos, e.state = "true", 1, stLit
			case c == 'f':
				e.lit, e.litPos, e.state = "false", 1, stLit
			case c == 'n':
				e.lit, e.litPos, e.state = "null", 1, stLit
			default:
				e.fail(DocMalformed)
				return
			}
			i++

		case stArrFirst:
			if ws[c] {
				i++
				continue
			}
			if c == ']' {
				e.close()
				i++
				continue
			}
			e.state = stValue // the byte is read again as a value

		case stObjFirst, stObjKey:
			if ws[c] {
				i++
				continue
			}
			switch {
			case c == '"':
				e.startKey()
			case c == '}' && e.state == stObjFirst:
				e.close()
			default:
				e.fail(DocMalformed)
				return
			}
			i++

		case stKey:
			switch {
			case c == '"':
				e.endKey()
			case c == '\\':
				e.state = stKeyEsc
			case c < 0x20:
				e.fail(DocMalformed)
				return
			default:
				e.keyByte(c)
			}
			i++

		case stKeySkip, stStr:
			// Skip to the next quote, backslash or control byte.
			j := i
			for j < len(p) {
				b := p[j]
				if b == '"' || b == '\\' || b < 0x20 {
					break
				}
				j++
			}
			if j == len(p) {
				return
			}
			c = p[j]
			i = j + 1
			switch {
			case c == '"':
				if e.state == stKeySkip {
					e.endKey()
				} else {
					if e.leaf != 0 {
						e.set(e.leaf, NotInteger, 0)
					}
					e.afterValue()
				}
			case c == '\\':
				if e.state == stKeySkip {
					e.state = stKeyEsc
				} else {
					e.state = stStrEsc
				}
			default:
				e.fail(DocMalformed)
				return
			}

		case stKeyEsc, stStrEsc:
			key := e.state == stKeyEsc
			var d byte
			switch c {
			case '"', '\\', '/':
				d = c
			case 'b':
				d = '\b'
			case 'f':
				d = '\f'
			case 'n':
				d = '\n'
			case 'r':
				d = '\r'
			case 't':
				d = '\t'
			case 'u':
				e.hexN, e.hexVal = 0, 0
				if key {
					e.state = stKeyHex
				} else {
					e.state = stStrHex
				}
				i++
				continue
			default:
				e.fail(DocMalformed)
				return
			}
			if !key {
				e.state = stStr
			} else if e.cand != 0 {
				e.state = stKey
				e.keyByte(d)
			} else {
				e.state = stKeySkip
			}
			i++

		case stKeyHex, stStrHex:
			if !isHex(c) {
				e.fail(DocMalformed)
				return
			}
			e.hexVal = e.hexVal<<4 | hexVal(c)
			e.hexN++
			i++
			if e.hexN < 4 {
				continue
			}
			if e.state == stStrHex {
				e.state = stStr
			} else if e.cand != 0 {
				e.state = stKey
				if e.hexVal < 0x80 {
					e.keyByte(byte(e.hexVal))
				} else {
					// Path keys are ASCII: any other character ends the match.
					e.cand = 0
					e.state = stKeySkip
				}
			} else {
				e.state = stKeySkip
			}

		case stColon:
			if ws[c] {
				i++
				continue
			}
			if c != ':' {
				e.fail(DocMalformed)
				return
			}
			e.state = stValue
			i++

		case stNumMinus:
			switch {
			case c == '0':
				e.state = stNumZero
			case c-'1' < 9:
				e.acc = int64(c - '0')
				e.state = stNumInt
			default:
				e.fail(DocMalformed)
				return
			}
			i++

		case stNumZero, stNumInt:
			if e.state == stNumInt {
				for i < len(p) && p[i]-'0' < 10 {
					d := int64(p[i] - '0')
					if !e.ovf {
						if e.acc > (math.MaxInt64-d)/10 {
							e.ovf = true
						} else {
							e.acc = e.acc*10 + d
						}
					}
					i++
				}
				if i == len(p) {
					return
				}
				c = p[i]
			}
			switch {
			case c == '.':
				e.state = stNumDot
				i++
			case c == 'e' || c == 'E':
				e.frac = true
				e.state = stNumE
				i++
			default:
				if !e.delimits(c) {
					e.fail(DocMalformed)
					return
				}
				e.endNumber() // the byte is read again after the number
			}

		case stNumDot:
			if c-'0' >= 10 {
				e.fail(DocMalformed)
				return
			}
			e.frac = true
			e.state = stNumFrac
			i++

		case stNumFrac, stNumExp:
			if c-'0' < 10 {
				i++
				continue
			}
			if (c == 'e' || c == 'E') && e.state == stNumFrac {
				e.state = stNumE
				i++
				continue
			}
			if !e.delimits(c) {
				e.fail(DocMalformed)
				return
			}
			e.endNumber()

		case stNumE:
			switch {
			case c == '+' || c == '-':
				e.state = stNumESign
			case c-'0' < 10:
				e.state = stNumExp
			default:
				e.fail(DocMalformed)
				return
			}
			i++

		case stNumESign:
			if c-'0' >= 10 {
				e.fail(DocMalformed)
				return
			}
			e.state = stNumExp
			i++

		case stLit:
			if c != e.lit[e.litPos] {
				e.fail(DocMalformed)
				return
			}
			e.litPos++
			i++
			if int(e.litPos) == len(e.lit) {
				if e.leaf != 0 && e.lit[0] != 'n' {
					e.set(e.leaf, NotInteger, 0)
				}
				e.afterValue()
			}

		case stAfter:
			if ws[c] {
				i++
				continue
			}
			obj := e.isObject()
			switch {
			case c == ',':
				if obj {
					e.state = stObjKey
				} else {
					e.leaf, e.next = 0, 0
					e.state = stValue
				}
			case c == '}' && obj, c == ']' && !obj:
				e.close()
			default:
				e.fail(DocMalformed)
				return
			}
			i++

		case stEnd:
			if !ws[c] {
				e.fail(DocMalformed)
				return
			}
			i++

		default: // stStop
			return
		}
	}
}

// Finish ends the document and returns the verdict. A top-level number is
// complete only here. After Finish, Write ignores its input until Reset.
func (e *Extractor) Finish() DocStatus {
	switch e.state {
	case stStop:
		return e.doc
	case stEnd:
	case stNumZero, stNumInt, stNumFrac, stNumExp:
		if e.depth != 0 {
			e.doc = DocMalformed
			break
		}
		e.endNumber()
	default:
		if e.started {
			e.doc = DocMalformed
		} else {
			e.doc = DocEmpty
		}
	}
	e.state = stStop
	return e.doc
}
