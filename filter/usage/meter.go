package usage

import (
	"errors"
	"math"
	"math/bits"
)

// Field is a token count a format reports.
type Field uint8

const (
	// Input: OpenAI prompt_tokens / input_tokens (cached tokens included);
	// Anthropic input_tokens (cache reads and writes not included).
	Input Field = iota
	// Output: OpenAI completion_tokens / output_tokens; Anthropic output_tokens.
	Output
	// Total: OpenAI total_tokens. Anthropic reports none (it stays Absent).
	Total
	// CacheRead: OpenAI *_tokens_details.cached_tokens (a part of Input);
	// Anthropic cache_read_input_tokens (not a part of Input).
	CacheRead
	// CacheWrite: Anthropic cache_creation_input_tokens; OpenAI reports none.
	CacheWrite
	// NumFields is the number of fields.
	NumFields
)

var fieldNames = [NumFields]string{"input", "output", "total", "cache_read", "cache_write"}

func (f Field) String() string {
	if f < NumFields {
		return fieldNames[f]
	}
	return "field?"
}

// Provider names a response format.
type Provider uint8

const (
	// OpenAI: Chat Completions and Responses, JSON and streamed.
	OpenAI Provider = iota + 1
	// Anthropic: Messages, JSON and streamed.
	Anthropic
)

// format is one provider's table: which paths feed which field, and what
// ends its stream.
type format struct {
	paths *Paths
	field [MaxPaths]Field
	// doneData: an event whose data is exactly "[DONE]" ends the stream; it
	// is not JSON and is not counted as a bad event.
	doneData bool
	endTypes []string // event types that end the stream
}

type entry struct {
	path  string
	field Field
}

func newFormat(doneData bool, endTypes []string, entries ...entry) *format {
	f := &format{doneData: doneData, endTypes: endTypes}
	paths := make([]string, len(entries))
	for i, e := range entries {
		paths[i] = e.path
		f.field[i] = e.field
	}
	f.paths = MustCompile(paths...)
	return f
}

// The tables. Within one JSON document, when two paths of one field are both
// present, the one listed first wins.
var (
	openAIFormat = newFormat(true,
		[]string{"response.completed", "response.incomplete", "response.failed"},
		// Chat Completions (a body, or a stream chunk with include_usage).
		entry{"usage.prompt_tokens", Input},
		entry{"usage.completion_tokens", Output},
		entry{"usage.total_tokens", Total},
		entry{"usage.prompt_tokens_details.cached_tokens", CacheRead},
		// Responses, a body.
		entry{"usage.input_tokens", Input},
		entry{"usage.output_tokens", Output},
		entry{"usage.input_tokens_details.cached_tokens", CacheRead},
		// Responses, streamed: response.completed (or .incomplete, .failed).
		entry{"response.usage.input_tokens", Input},
		entry{"response.usage.output_tokens", Output},
		entry{"response.usage.total_tokens", Total},
		entry{"response.usage.input_tokens_details.cached_tokens", CacheRead},
	)
	anthropicFormat = newFormat(false,
		[]string{"message_stop"},
		// A body, and the message_delta event.
		entry{"usage.input_tokens", Input},
		entry{"usage.output_tokens", Output},
		entry{"usage.cache_read_input_tokens", CacheRead},
		entry{"usage.cache_creation_input_tokens", CacheWrite},
		// The message_start event.
		entry{"message.usage.input_tokens", Input},
		entry{"message.usage.output_tokens", Output},
		entry{"message.usage.cache_read_input_tokens", CacheRead},
		entry{"message.usage.cache_creation_input_tokens", CacheWrite},
	)
)

// Mode is how a body is read.
type Mode uint8

const (
	// ModeNone: the body is not read; Finish reports nothing seen.
	ModeNone Mode = iota
	// ModeJSON: the body is one JSON document.
	ModeJSON
	// ModeSSE: the body is a text/event-stream whose events' data are JSON.
	ModeSSE
)

// ModeFor picks the Mode for a Content-Type header value: ModeJSON for
// application/json and any application/*+json, ModeSSE for
// text/event-stream, ModeNone otherwise. Parameters (charset...) are ignored;
// the comparison ignores case. It does not allocate.
func ModeFor(contentType string) Mode {
	s := contentType
	for i := 0; i < len(s); i++ {
		if s[i] == ';' {
			s = s[:i]
			break
		}
	}
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	switch {
	case equalFold(s, "application/json"):
		return ModeJSON
	case equalFold(s, "text/event-stream"):
		return ModeSSE
	case len(s) > len("application/")+len("+json") &&
		equalFold(s[:len("application/")], "application/") &&
		equalFold(s[len(s)-len("+json"):], "+json"):
		return ModeJSON
	}
	return ModeNone
}

// equalFold compares s with the lower-case ASCII t, ignoring ASCII case.
func equalFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != t[i] {
			return false
		}
	}
	return true
}

// MaxWeight bounds the weights and the divisor, so that the weighted sum of
// NumFields int64 counts fits 128 bits with room to spare: the sum is exact.
const MaxWeight = 1 << 32

// Weights turn usage into a cost: cost = ⌈Σ W[f] × count[f] / Div⌉ over the
// fields Found, computed exactly (128-bit), then rounded up once, clamped
// below at 0 and saturated at math.MaxInt64. Weights are integers over one
// divisor so that prices such as 0.1 are exact (a float is not) and the
// arithmetic is the same everywhere; rounding up once, at the end, never
// makes a fractional cost free. A negative weight is allowed (OpenAI counts
// cached tokens inside Input: Input×10 + CacheRead×(-9), Div 10 charges a
// cached token 0.1). With Div 0 or 1 there is no rounding.
type Weights struct {
	W   [NumFields]int64
	Div int64
}

var errWeight = errors.New("usage: a weight or the divisor is beyond MaxWeight, or the divisor is negative")

// Validate reports whether the weights are usable.
func (w Weights) Validate() error {
	for _, x := range w.W {
		if x > MaxWeight || x < -MaxWeight {
			return errWeight
		}
	}
	if w.Div < 0 || w.Div > MaxWeight {
		return errWeight
	}
	return nil
}

// Usage is the token counts found, by field.
type Usage struct {
	Values [NumFields]int64
	// Status: Found (Values holds the count), Absent, or NotInteger /
	// OutOfRange when the only values seen were unusable (Values is 0).
	Status [NumFields]Status
}

// Cost applies w (which must Validate) to the Found fields of u. saturated
// reports a cost above math.MaxInt64, returned as math.MaxInt64.
func (w Weights) Cost(u *Usage) (cost int64, saturated bool) {
	var posHi, posLo, negHi, negLo uint64
	for f, x := range w.W {
		if x == 0 || u.Status[f] != Found {
			continue
		}
		a := uint64(x)
		if x < 0 {
			a = uint64(-x)
		}
		hi, lo := bits.Mul64(a, uint64(u.Values[f]))
		var c uint64
		if x > 0 {
			posLo, c = bits.Add64(posLo, lo, 0)
			posHi += hi + c
		} else {
			negLo, c = bits.Add64(negLo, lo, 0)
			negHi += hi + c
		}
	}
	if posHi < negHi || (posHi == negHi && posLo <= negLo) {
		return 0, false
	}
	lo, b := bits.Sub64(posLo, negLo, 0)
	hi := posHi - negHi - b
	d := uint64(1)
	if w.Div > 1 {
		d = uint64(w.Div)
	}
	if hi >= d {
		return math.MaxInt64, true
	}
	q, r := bits.Div64(hi, lo, d)
	if r != 0 {
		q++
	}
	if q > math.MaxInt64 || q == 0 && r != 0 {
		return math.MaxInt64, true
	}
	return int64(q), false
}

// Limits bound what a Meter reads. Zero values mean: no limit on a JSON
// body (the state is fixed-size whatever its length), and the Splitter's
// defaults for lines and events.
type Limits struct {
	MaxBodyBytes  int64 // ModeJSON: bytes beyond it are not read (DocTooLarge)
	MaxLineBytes  int64 // ModeSSE: see Splitter
	MaxEventBytes int64 // ModeSSE: see Splitter
}

// Result is a Meter's answer at the end of a body.
type Result struct {
	Mode Mode
	Usage
	// Seen: at least one field with a non-zero weight was Found. When false
	// the caller applies its own rule (the body reported no usable usage).
	Seen bool
	// Cost is the weighted sum (see Weights); 0 when nothing was Found.
	Cost      int64
	Saturated bool // the cost was above math.MaxInt64
	// Doc is the verdict on a JSON body (ModeJSON). In ModeSSE it is DocEmpty
	// when no event had data, DocOK otherwise: the events' own verdicts are
	// counted in BadEvents.
	Doc DocStatus
	// ModeSSE only: events dispatched; events whose data was not a complete,
	// well-formed JSON document, nor empty, nor "[DONE]" (BadEvents); events
	// cut by a size bound (SkippedEvents); and whether the stream's end marker
	// was seen (Done: OpenAI's "data: [DONE]" or response.completed /
	// .incomplete / .failed event, Anthropic's message_stop event).
	Events, BadEvents, SkippedEvents int64
	Done                             bool
}

// Meter reads one response body at a time, in chunks, and returns its cost.
// After NewMeter, Start, Write and Finish do not allocate. Not safe for
// concurrent use; reuse it for the next body with Start.
type Meter struct {
	f   *format
	w   Weights
	lim Limits

	mode     Mode
	ext      Extractor
	sse      Splitter
	doneN    int // bytes of "[DONE]" matched by the event's data; -1: not it
	u        Usage
	bad      int64
	done     bool
	finished bool
	res      Result
}

var errProvider = errors.New("usage: unknown provider")

// NewMeter returns a Meter for provider p's format, costing with w.
func NewMeter(p Provider, w Weights, lim Limits) (*Meter, error) {
	m := &Meter{w: w, lim: lim}
	switch p {
	case OpenAI:
		m.f = openAIFormat
	case Anthropic:
		m.f = anthropicFormat
	default:
		return nil, errProvider
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	m.Start(ModeNone)
	return m, nil
}

// NewFieldMeter returns a Meter that reads one field, the dotted path (see
// Compile), as the Total of any body — a JSON document, or each event of a
// stream (the last value found wins; an event whose data is "[DONE]" ends
// the stream as OpenAI's does) — costing it once (Weights: Total 1).
func NewFieldMeter(path string, lim Limits) (*Meter, error) {
	paths, err := Compile(path)
	if err != nil {
		return nil, err
	}
	f := &format{paths: paths, doneData: true}
	f.field[0] = Total
	m := &Meter{f: f, lim: lim}
	m.w.W[Total] = 1
	m.Start(ModeNone)
	return m, nil
}

// Start readies m for a new body read in mode (see ModeFor).
func (m *Meter) Start(mode Mode) {
	m.mode = mode
	m.ext.Reset(m.f.paths, 0)
	if mode == ModeJSON {
		m.ext.limit = m.lim.MaxBodyBytes
	}
	m.sse.MaxLineBytes = m.lim.MaxLineBytes
	m.sse.MaxEventBytes = m.lim.MaxEventBytes
	m.sse.Reset()
	m.doneN = 0
	m.u = Usage{}
	m.bad = 0
	m.done = false
	m.finished = false
}

// Write reads the next chunk of the body.
func (m *Meter) Write(p []byte) {
	if m.finished {
		return
	}
	switch m.mode {
	case ModeJSON:
		m.ext.Write(p)
	case ModeSSE:
		m.sse.Write(p, (*meterSink)(m))
	}
}

// Finish ends the body and returns the answer; called again, it returns the
// same answer.
func (m *Meter) Finish() Result {
	if m.finished {
		return m.res
	}
	m.finished = true
	r := Result{Mode: m.mode, Doc: DocEmpty}
	switch m.mode {
	case ModeJSON:
		r.Doc = m.ext.Finish()
		m.fold()
	case ModeSSE:
		m.sse.Close((*meterSink)(m))
		r.Events, r.SkippedEvents = m.sse.Events, m.sse.SkippedEvents
		r.BadEvents, r.Done = m.bad, m.done
		if r.Events > 0 {
			r.Doc = DocOK
		}
	}
	r.Usage = m.u
	for f, x := range m.w.W {
		if x != 0 && r.Status[f] == Found {
			r.Seen = true
		}
	}
	r.Cost, r.Saturated = m.w.Cost(&r.Usage)
	m.res = r
	return r
}

// fold merges what the extractor holds into m.u: per field, the first path
// (in table order) Found in this document; a Found value replaces an
// earlier one (counts are cumulative: the last report wins), an unusable
// one is noted only where nothing was Found yet.
func (m *Meter) fold() {
	var doc Usage
	for i := 0; i < m.f.paths.n; i++ {
		v, st := m.ext.Value(i)
		f := m.f.field[i]
		switch {
		case st == Absent:
		case st == Found && doc.Status[f] != Found:
			doc.Values[f], doc.Status[f] = v, Found
		case doc.Status[f] == Absent:
			doc.Status[f] = st
		}
	}
	for f := range doc.Status {
		switch st := doc.Status[f]; {
		case st == Found:
			m.u.Values[f], m.u.Status[f] = doc.Values[f], Found
		case st != Absent && m.u.Status[f] != Found:
			m.u.Status[f] = st
		}
	}
}

const doneMarker = "[DONE]"

// meterSink is the Meter as the Splitter's Sink (kept off Meter's API).
type meterSink Meter

func (s *meterSink) Data(p []byte) {
	m := (*Meter)(s)
	if m.doneN >= 0 {
		if m.doneN+len(p) <= len(doneMarker) && string(p) == doneMarker[m.doneN:m.doneN+len(p)] {
			m.doneN += len(p)
		} else {
			m.doneN = -1
		}
	}
	m.ext.Write(p)
}

func (s *meterSink) Dispatch(ev Event) {
	m := (*Meter)(s)
	if m.f.doneData && m.doneN == len(doneMarker) {
		m.done = true
	} else {
		switch m.ext.Finish() {
		case DocOK, DocEmpty:
		default:
			m.bad++
		}
		// What an event committed counts, even if the event is bad, skipped
		// or cut short (see the package doc).
		m.fold()
	}
	if !ev.TypeTruncated {
		for _, t := range m.f.endTypes {
			if string(ev.Type) == t {
				m.done = true
			}
		}
	}
	m.ext.Reset(m.f.paths, 0)
	m.doneN = 0
}
