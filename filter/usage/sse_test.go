package usage

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

type gotEvent struct {
	Type       string
	Trunc      bool
	Data       string
	Skipped    bool
	Incomplete bool
}

type collect struct {
	cur    []byte
	events []gotEvent
}

func (c *collect) Data(p []byte) { c.cur = append(c.cur, p...) }

func (c *collect) Dispatch(ev Event) {
	if int64(len(c.cur)) != ev.DataBytes {
		panic("DataBytes differs from the data given")
	}
	c.events = append(c.events, gotEvent{string(ev.Type), ev.TypeTruncated, string(c.cur), ev.Skipped, ev.Incomplete})
	c.cur = c.cur[:0]
}

func splitAll(lineMax, eventMax int64, chunks ...[]byte) []gotEvent {
	s := Splitter{MaxLineBytes: lineMax, MaxEventBytes: eventMax}
	s.Reset()
	c := &collect{}
	for _, p := range chunks {
		s.Write(p, c)
	}
	s.Close(c)
	return c.events
}

// refSSE is a plain, whole-buffer reading of the WHATWG event stream rules,
// with this package's bounds and its one departure (an unfinished last event
// is dispatched, marked Incomplete).
func refSSE(in []byte, lineMax, eventMax int) []gotEvent {
	if lineMax <= 0 {
		lineMax = DefaultMaxLineBytes
	}
	if eventMax <= 0 {
		eventMax = DefaultMaxEventBytes
	}
	in = bytes.TrimPrefix(in, []byte("\xEF\xBB\xBF"))
	var lines []string
	for len(in) > 0 {
		i := bytes.IndexAny(in, "\r\n")
		if i < 0 {
			lines = append(lines, string(in))
			break
		}
		lines = append(lines, string(in[:i]))
		if in[i] == '\r' && i+1 < len(in) && in[i+1] == '\n' {
			i++
		}
		in = in[i+1:]
	}
	var out []gotEvent
	var data, typ string
	var dataLines int
	var skipped bool
	appendData := func(s string) {
		if skipped {
			return
		}
		if len(data)+len(s) > eventMax {
			s = s[:eventMax-len(data)]
			skipped = true
		}
		data += s
	}
	dispatch := func(incomplete bool) {
		if dataLines > 0 {
			trunc := len(typ) > MaxEventType
			if trunc {
				typ = typ[:MaxEventType]
			}
			out = append(out, gotEvent{typ, trunc, data, skipped, incomplete})
		}
		data, typ, dataLines, skipped = "", "", 0, false
	}
	for _, line := range lines {
		if line == "" {
			dispatch(false)
			continue
		}
		over := len(line) > lineMax
		if over {
			line = line[:lineMax]
		}
		if line[0] == ':' {
			continue
		}
		i := strings.IndexByte(line, ':')
		if i < 0 {
			if over {
				skipped = true // a field name cut by the bound
				continue
			}
			i = len(line)
			line += ":"
		}
		field, value := line[:i], line[i+1:]
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "data":
			if dataLines > 0 {
				appendData("\n")
			}
			dataLines++
			appendData(value)
		case "event":
			typ = value
		default:
			continue
		}
		if over {
			skipped = true
		}
	}
	dispatch(true)
	return out
}

func checkSplits(t *testing.T, in []byte, lineMax, eventMax int64, want []gotEvent) {
	t.Helper()
	if got := splitAll(lineMax, eventMax, in); !reflect.DeepEqual(got, want) {
		t.Fatalf("whole:\n got %+v\nwant %+v", got, want)
	}
	for k := 0; k <= len(in); k++ {
		if got := splitAll(lineMax, eventMax, in[:k], in[k:]); !reflect.DeepEqual(got, want) {
			t.Fatalf("split at %d:\n got %+v\nwant %+v", k, got, want)
		}
	}
	chunks := make([][]byte, len(in))
	for i := range in {
		chunks[i] = in[i : i+1]
	}
	if got := splitAll(lineMax, eventMax, chunks...); !reflect.DeepEqual(got, want) {
		t.Fatalf("bytewise:\n got %+v\nwant %+v", got, want)
	}
}

func TestSplitter(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []gotEvent
	}{
		{"one", "data: {\"a\":1}\n\n", []gotEvent{{Data: `{"a":1}`}}},
		{"no space", "data:x\n\n", []gotEvent{{Data: "x"}}},
		{"two spaces", "data:  x\n\n", []gotEvent{{Data: " x"}}},
		{"joined", "data: a\ndata:b\ndata\n\n", []gotEvent{{Data: "a\nb\n"}}},
		{"empty data", "data:\n\n", []gotEvent{{Data: ""}}},
		{"type", "event: message_start\ndata: x\n\n", []gotEvent{{Type: "message_start", Data: "x"}}},
		{"last type wins", "event: a\nevent: b\ndata: x\n\n", []gotEvent{{Type: "b", Data: "x"}}},
		{"type resets", "event: a\ndata: x\n\ndata: y\n\n", []gotEvent{{Type: "a", Data: "x"}, {Data: "y"}}},
		{"no data no event", "event: a\nid: 3\nretry: 10\n\ndata: y\n\n", []gotEvent{{Data: "y"}}},
		{"comments", ": ping\n:\ndata: x\n: mid\ndata: y\n\n", []gotEvent{{Data: "x\ny"}}},
		{"unknown fields", "foo: 1\ndata2: z\nDATA: q\ndata: x\n\n", []gotEvent{{Data: "x"}}},
		{"crlf", "event: e\r\ndata: x\r\n\r\ndata: y\r\n\r\n", []gotEvent{{Type: "e", Data: "x"}, {Data: "y"}}},
		{"cr", "data: x\r\rdata: y\r\r", []gotEvent{{Data: "x"}, {Data: "y"}}},
		{"mixed", "data: a\rdata: b\r\ndata: c\n\r\n", []gotEvent{{Data: "a\nb\nc"}}},
		{"lf cr is two ends", "data: a\n\rdata: b\n\n", []gotEvent{{Data: "a"}, {Data: "b"}}},
		{"bom", "\xEF\xBB\xBFdata: x\n\n", []gotEvent{{Data: "x"}}},
		{"bom once", "\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\ndata: y\n\n", []gotEvent{{Data: "y"}}},
		{"half bom", "\xEF\xBBdata: x\n\ndata: y\n\n", []gotEvent{{Data: "y"}}},
		{"unfinished", "data: x\n\ndata: y\n", []gotEvent{{Data: "x"}, {Data: "y", Incomplete: true}}},
		{"unfinished line", "data: x\n\ndata: {\"a\"", []gotEvent{{Data: "x"}, {Data: `{"a"`, Incomplete: true}}},
		{"colon in value", "data: a:b\n\n", []gotEvent{{Data: "a:b"}}},
		{"long type", "event: " + strings.Repeat("t", 40) + "\ndata: x\n\n",
			[]gotEvent{{Type: strings.Repeat("t", MaxEventType), Trunc: true, Data: "x"}}},
		{"empty", "", nil},
		{"blank lines", "\n\n\r\n\r", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if ref := refSSE([]byte(c.in), 0, 0); !reflect.DeepEqual(ref, c.want) {
				t.Fatalf("reference:\n got %+v\nwant %+v", ref, c.want)
			}
			checkSplits(t, []byte(c.in), 0, 0, c.want)
		})
	}
}

func TestSplitterBounds(t *testing.T) {
	in := []byte("data: 0123456789\n\n" + // 16-byte line: over a 15-byte bound
		"data: ok\n\n" +
		": a long comment, never mind\n" +
		"data: 01234\ndata: 56789\n\n" + // 11 bytes of data: over a 10-byte bound
		"data:0123456789\n\n" + // 10 bytes: just fits
		"0123456789abcdef\ndata: next\n\n") // a long field name
	want := []gotEvent{
		{Data: "012345678", Skipped: true},
		{Data: "ok"},
		{Data: "01234\n5678", Skipped: true},
		{Data: "0123456789"},
		{Data: "", Skipped: true}, // once skipped, no more of its data is given
	}
	if ref := refSSE(in, 15, 10); !reflect.DeepEqual(ref, want) {
		t.Fatalf("reference:\n got %+v\nwant %+v", ref, want)
	}
	checkSplits(t, in, 15, 10, want)
	var s Splitter
	s.MaxLineBytes, s.MaxEventBytes = 15, 10
	s.Reset()
	c := &collect{}
	s.Write(in, c)
	s.Close(c)
	if s.Events != 5 || s.SkippedEvents != 3 {
		t.Fatal(s.Events, s.SkippedEvents)
	}
}

// TestSplitterEndless: a stream that never ends (one endless line, then
// endless events) keeps a fixed state and keeps working.
func TestSplitterEndless(t *testing.T) {
	var s Splitter
	s.Reset()
	n := 0
	sink := &countSink{}
	buf := bytes.Repeat([]byte("x"), 64<<10)
	s.Write([]byte("data: "), sink)
	for i := 0; i < 1600; i++ { // 100 MiB on one line
		s.Write(buf, sink)
		n += len(buf)
	}
	if sink.data > DefaultMaxLineBytes {
		t.Fatalf("%d bytes of an endless line given", sink.data)
	}
	s.Write([]byte("\n\ndata: y\n\n"), sink)
	if s.Events != 2 || s.SkippedEvents != 1 || sink.events != 2 {
		t.Fatal(s.Events, s.SkippedEvents, sink.events)
	}
}

type countSink struct{ data, events int }

func (c *countSink) Data(p []byte)  { c.data += len(p) }
func (c *countSink) Dispatch(Event) { c.events++ }
