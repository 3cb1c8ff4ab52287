package usage

// Default bounds of a Splitter (see Limits).
const (
	DefaultMaxLineBytes  = 1 << 20 // 1 MiB
	DefaultMaxEventBytes = 8 << 20 // 8 MiB
	// MaxEventType is the longest event type kept; a longer one is marked
	// truncated and matches no name.
	MaxEventType = 32
)

// Event describes one event of a text/event-stream at its end.
type Event struct {
	// Type is the value of the event's last "event:" field (empty when none,
	// which the spec calls "message"). It aliases the Splitter's buffer: it is
	// valid only during the Dispatch call.
	Type []byte
	// TypeTruncated: the type was longer than MaxEventType; Type holds its start.
	TypeTruncated bool
	// DataBytes is the length of the event's data as given to Data (the data
	// lines joined with "\n"), up to where it was cut off.
	DataBytes int64
	// Skipped: a line of the event was longer than the line bound, or its data
	// longer than the event bound; the data past that point was not given to
	// Data (what was given stands).
	Skipped bool
	// Incomplete: the stream ended before the blank line that ends the event
	// (its last line may lack its line end too).
	Incomplete bool
}

// Sink receives what a Splitter finds.
type Sink interface {
	// Data is a piece of the current event's data, in order: the values of its
	// "data" fields with "\n" between them (not after the last). A piece
	// aliases the input or a static buffer: it must not be kept or modified.
	Data(p []byte)
	// Dispatch ends an event that had at least one "data" field.
	Dispatch(ev Event)
}

// splitter states
const (
	ssBOM       uint8 = iota // at the start of the stream: maybe a BOM
	ssLineStart              // at the start of a line
	ssField                  // in a field name
	ssSpace                  // just after the colon: one space is dropped
	ssValue                  // in a field's value
	ssIgnore                 // the rest of the line does not matter
)

// field kinds
const (
	fOther uint8 = iota
	fData
	fEvent
)

var (
	bom     = [3]byte{0xEF, 0xBB, 0xBF}
	newline = []byte{'\n'}
)

// Splitter splits a text/event-stream, fed in chunks split at any byte, into
// events, following the WHATWG HTML "event stream interpretation": an
// optional UTF-8 BOM at the very start is dropped; lines end at CRLF, LF or
// CR (a CRLF split across chunks is one line end); a line starting with ':'
// is a comment; "field:value" drops one space after the colon, a line
// without a colon is a field with an empty value; "data" values are joined
// with "\n"; the last "event" value is the type; "id", "retry" and unknown
// fields are ignored; a blank line ends the event, which is dispatched only
// if it had a "data" field. It never buffers data: values go to the Sink as
// they arrive. Its state is fixed-size and Write never allocates.
//
// Bounds: a line longer than MaxLineBytes, or an event whose data exceeds
// MaxEventBytes, marks the event Skipped: the rest of that line (or data) is
// dropped unread, and the event still ends at its blank line, so one huge or
// endless line costs no memory and the events after it are read normally.
//
// One deliberate departure from the spec: when the stream ends inside an
// event (no final blank line), the spec discards that event; Close
// dispatches it marked Incomplete and lets the Sink decide, because a
// budget would rather count usage the upstream did report (Meter treats it
// as any other event: what its JSON committed counts).
type Splitter struct {
	MaxLineBytes  int64 // 0 means DefaultMaxLineBytes
	MaxEventBytes int64 // 0 means DefaultMaxEventBytes

	state   uint8
	bomN    uint8 // BOM bytes matched so far
	lastCR  bool
	field   [5]byte
	fieldN  uint8 // bytes of the field name; > 5: not one we know
	kind    uint8
	lineLen int64

	dataLines int64
	dataBytes int64
	skipped   bool
	typ       [MaxEventType]byte
	typN      int
	typTrunc  bool

	// Events counts dispatched events; SkippedEvents those among them marked Skipped.
	Events, SkippedEvents int64
}

// Reset readies s for a new stream (the bounds are kept).
func (s *Splitter) Reset() {
	*s = Splitter{MaxLineBytes: s.MaxLineBytes, MaxEventBytes: s.MaxEventBytes}
}

func (s *Splitter) maxLine() int64 {
	if s.MaxLineBytes > 0 {
		return s.MaxLineBytes
	}
	return DefaultMaxLineBytes
}

func (s *Splitter) maxEvent() int64 {
	if s.MaxEventBytes > 0 {
		return s.MaxEventBytes
	}
	return DefaultMaxEventBytes
}

// Write reads the next chunk of the stream.
func (s *Splitter) Write(p []byte, sink Sink) {
	for s.state == ssBOM && len(p) > 0 {
		if p[0] != bom[s.bomN] {
			// Not a BOM: what matched so far is content.
			n := s.bomN
			s.state = ssLineStart
			s.write(bom[:n], sink)
			break
		}
		p = p[1:]
		if s.bomN++; s.bomN == 3 {
			s.state = ssLineStart
		}
	}
	s.write(p, sink)
}

func (s *Splitter) write(p []byte, sink Sink) {
	i := 0
	for i < len(p) {
		c := p[i]
		if c == '\n' || c == '\r' {
			i++
			if c == '\n' && s.lastCR {
				s.lastCR = false
				continue
			}
			s.lastCR = c == '\r'
			s.endLine(sink)
			continue
		}
		s.lastCR = false
		// The run of bytes up to the next line end.
		j := i
		for j < len(p) && p[j] != '\n' && p[j] != '\r' {
			j++
		}
		s.run(p[i:j], sink)
		i = j
	}
}

// run handles bytes of one line, without line ends.
func (s *Splitter) run(p []byte, sink Sink) {
	if s.state == ssIgnore {
		return
	}
	over := false
	if allow := s.maxLine() - s.lineLen; int64(len(p)) > allow {
		p, over = p[:allow], true
	}
	s.lineLen += int64(len(p))
	s.line(p, sink)
	if over && s.state != ssIgnore {
		// The line is too long. A comment or an ignored field does not
		// matter; a "data" or "event" line, or a field name this long, marks
		// the event Skipped. Either way the rest of the line is dropped.
		if s.state == ssField || s.state == ssLineStart || s.kind != fOther {
			s.skipped = true
		}
		s.state = ssIgnore
	}
}

func (s *Splitter) line(p []byte, sink Sink) {
	for len(p) > 0 {
		switch s.state {
		case ssLineStart:
			if p[0] == ':' {
				s.state = ssIgnore // a comment
				return
			}
			s.fieldN = 0
			s.state = ssField
		case ssField:
			j := 0
			for j < len(p) && p[j] != ':' {
				j++
			}
			s.fieldName(p[:j])
			if j == len(p) {
				return
			}
			p = p[j+1:]
			s.beginValue(sink)
			s.state = ssSpace
		case ssSpace:
			if p[0] == ' ' {
				p = p[1:]
			}
			s.state = ssValue
		case ssValue:
			s.value(p, sink)
			return
		default:
			return
		}
	}
}

func (s *Splitter) fieldName(p []byte) {
	for _, c := range p {
		if s.fieldN < uint8(len(s.field)) {
			s.field[s.fieldN] = c
		}
		if s.fieldN <= uint8(len(s.field)) {
			s.fieldN++
		}
	}
}

// beginValue is called when the field name is complete.
func (s *Splitter) beginValue(sink Sink) {
	name := s.field[:min(int(s.fieldN), len(s.field))]
	switch {
	case s.fieldN == 4 && string(name) == "data":
		s.kind = fData
		if s.dataLines > 0 {
			s.data(newline, sink)
		}
		s.dataLines++
	case s.fieldN == 5 && string(name) == "event":
		s.kind = fEvent
		s.typN = 0
		s.typTrunc = false
	default:
		s.kind = fOther
	}
}

func (s *Splitter) data(p []byte, sink Sink) {
	if s.skipped {
		return // the rest of a skipped event is not given
	}
	if int64(len(p)) > s.maxEvent()-s.dataBytes {
		s.skipped = true
		p = p[:s.maxEvent()-s.dataBytes]
	}
	s.dataBytes += int64(len(p))
	if len(p) > 0 {
		sink.Data(p)
	}
}

func (s *Splitter) value(p []byte, sink Sink) {
	switch s.kind {
	case fData:
		s.data(p, sink)
	case fEvent:
		n := copy(s.typ[s.typN:], p)
		s.typN += n
		if n < len(p) {
			s.typTrunc = true
		}
	}
}

func (s *Splitter) endLine(sink Sink) {
	switch s.state {
	case ssLineStart:
		s.dispatch(sink, false)
	case ssField:
		s.beginValue(sink) // a field without a colon: empty value
	}
	s.state = ssLineStart
	s.lineLen = 0
}

func (s *Splitter) dispatch(sink Sink, incomplete bool) {
	if s.dataLines > 0 {
		s.Events++
		if s.skipped {
			s.SkippedEvents++
		}
		sink.Dispatch(Event{
			Type:          s.typ[:s.typN],
			TypeTruncated: s.typTrunc,
			DataBytes:     s.dataBytes,
			Skipped:       s.skipped,
			Incomplete:    incomplete,
		})
	}
	s.dataLines, s.dataBytes, s.skipped = 0, 0, false
	s.typN, s.typTrunc = 0, false
}

// Close ends the stream: a last line without its line end is taken as ended,
// and an event without its blank line is dispatched marked Incomplete.
func (s *Splitter) Close(sink Sink) {
	if s.state == ssBOM {
		s.state = ssLineStart
		s.write(bom[:s.bomN], sink)
	}
	if s.state != ssLineStart {
		s.endLine(sink)
	}
	s.dispatch(sink, true)
}
