package usage

import (
	"math"
	"strings"
	"testing"
	"unsafe"
)

// meterAll runs a fresh Meter over chunks.
func meterAll(t testing.TB, p Provider, w Weights, lim Limits, mode Mode, chunks ...[]byte) Result {
	m, err := NewMeter(p, w, lim)
	if err != nil {
		t.Fatal(err)
	}
	m.Start(mode)
	for _, c := range chunks {
		m.Write(c)
	}
	return m.Finish()
}

var (
	unit   = Weights{W: [NumFields]int64{Total: 1}}
	priced = Weights{W: [NumFields]int64{Input: 1, Output: 4}}
)

type meterCase struct {
	name string
	p    Provider
	ct   string
	body string
	w    Weights
	want Result
}

func found(vals ...int64) (u Usage) {
	for f := range vals {
		if vals[f] >= 0 {
			u.Values[f], u.Status[f] = vals[f], Found
		}
	}
	return u
}

var meterCases = []meterCase{
	{"openai chat json", OpenAI, "application/json", openAIChatJSON, priced, Result{
		Mode: ModeJSON, Usage: found(1117, 46, 1163, 1024), Seen: true, Cost: 1117 + 4*46}},
	{"openai chat json cached discount", OpenAI, "application/json; charset=utf-8", openAIChatJSON,
		// (prompt - cached) × 1 + cached × 0.1 + completion × 4, in tenths
		Weights{W: [NumFields]int64{Input: 10, CacheRead: -9, Output: 40}, Div: 10}, Result{
			Mode: ModeJSON, Usage: found(1117, 46, 1163, 1024), Seen: true, Cost: 380}}, // (11170 - 9216 + 1840) / 10 = 379.4 → 380
	{"openai chat stream", OpenAI, "text/event-stream", openAIChatStream, unit, Result{
		Mode: ModeSSE, Usage: found(19, 10, 29, 0), Seen: true, Cost: 29, Events: 6, Done: true}},
	{"openai chat stream crlf", OpenAI, "text/event-stream", crlf(openAIChatStream, "\r\n"), unit, Result{
		Mode: ModeSSE, Usage: found(19, 10, 29, 0), Seen: true, Cost: 29, Events: 6, Done: true}},
	{"openai chat stream cr", OpenAI, "Text/Event-Stream", crlf(openAIChatStream, "\r"), unit, Result{
		Mode: ModeSSE, Usage: found(19, 10, 29, 0), Seen: true, Cost: 29, Events: 6, Done: true}},
	{"openai stream without usage", OpenAI, "text/event-stream",
		strings.Replace(openAIChatStream, openAIChatStream[strings.Index(openAIChatStream, `data: {"id":"chatcmpl-C3y1","object":"chat.completion.chunk","created":1754312400,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_5e10f5d6a9","choices":[],`):strings.Index(openAIChatStream, "data: [DONE]")], "", 1),
		unit, Result{Mode: ModeSSE, Events: 5, Done: true}},
	{"openai stream cut before done", OpenAI, "text/event-stream", openAIChatStream[:strings.Index(openAIChatStream, "data: [DONE]")], unit, Result{
		Mode: ModeSSE, Usage: found(19, 10, 29, 0), Seen: true, Cost: 29, Events: 5}},
	{"openai stream cut in usage", OpenAI, "text/event-stream", openAIChatStream[:strings.Index(openAIChatStream, `"total_tokens":29`)], unit, Result{
		Mode: ModeSSE, Usage: found(19, 10, -1, -1), Events: 5, BadEvents: 1}},
	{"openai responses json", OpenAI, "application/json", openAIResponsesJSON, priced, Result{
		Mode: ModeJSON, Usage: found(36, 87, 123, 0), Seen: true, Cost: 36 + 4*87}},
	{"openai responses stream", OpenAI, "text/event-stream", openAIResponsesStream, priced, Result{
		Mode: ModeSSE, Usage: found(300, 2, 302, 256), Seen: true, Cost: 308, Events: 3, Done: true}},
	{"anthropic json", Anthropic, "application/json", anthropicJSON,
		Weights{W: [NumFields]int64{Input: 1, CacheWrite: 1, CacheRead: 1, Output: 1}}, Result{
			Mode: ModeJSON, Usage: found(2095, 503, -1, 1800, 120), Seen: true, Cost: 2095 + 503 + 1800 + 120}},
	{"anthropic json total unweighted", Anthropic, "application/json", anthropicJSON, unit, Result{
		Mode: ModeJSON, Usage: found(2095, 503, -1, 1800, 120)}},
	{"anthropic stream", Anthropic, "text/event-stream", anthropicStream, priced, Result{
		Mode: ModeSSE, Usage: found(472, 15, -1, 2048, 0), Seen: true, Cost: 472 + 4*15, Events: 8, Done: true}},
	{"anthropic stream cut after start", Anthropic, "text/event-stream", anthropicStream[:strings.Index(anthropicStream, "event: content_block_delta")], priced, Result{
		Mode: ModeSSE, Usage: found(472, 2, -1, 2048, 0), Seen: true, Cost: 472 + 4*2, Events: 3}},
	{"anthropic stream bom crlf", Anthropic, "text/event-stream", "\xEF\xBB\xBF" + crlf(anthropicStream, "\r\n"), priced, Result{
		Mode: ModeSSE, Usage: found(472, 15, -1, 2048, 0), Seen: true, Cost: 472 + 4*15, Events: 8, Done: true}},
	{"error page", OpenAI, "application/json", "<html><body>502 Bad Gateway</body></html>", unit, Result{
		Mode: ModeJSON, Doc: DocMalformed}},
	{"error json", Anthropic, "application/json", `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`, priced, Result{
		Mode: ModeJSON}},
	{"empty body", OpenAI, "application/json", "", unit, Result{Mode: ModeJSON, Doc: DocEmpty}},
	{"empty stream", OpenAI, "text/event-stream", ": keepalive\n\n", unit, Result{Mode: ModeSSE, Doc: DocEmpty}},
	{"usage as string", OpenAI, "application/json", `{"usage":{"prompt_tokens":"5","completion_tokens":2,"total_tokens":7}}`, priced, Result{
		Mode: ModeJSON, Usage: Usage{Values: [NumFields]int64{Output: 2, Total: 7}, Status: [NumFields]Status{NotInteger, Found, Found}}, Seen: true, Cost: 8}},
	{"usage negative", OpenAI, "application/json", `{"usage":{"total_tokens":-7}}`, unit, Result{
		Mode: ModeJSON, Usage: Usage{Status: [NumFields]Status{Total: OutOfRange}}}},
	{"usage overflowing", OpenAI, "application/json", `{"usage":{"total_tokens":92233720368547758070}}`, unit, Result{
		Mode: ModeJSON, Usage: Usage{Status: [NumFields]Status{Total: OutOfRange}}}},
	{"cost saturates", OpenAI, "application/json", `{"usage":{"total_tokens":9223372036854775807}}`,
		Weights{W: [NumFields]int64{Total: 3}}, Result{
			Mode: ModeJSON, Usage: found(-1, -1, math.MaxInt64), Seen: true, Cost: math.MaxInt64, Saturated: true}},
	{"cost exact near max", OpenAI, "application/json", `{"usage":{"total_tokens":9223372036854775807,"prompt_tokens":9223372036854775807}}`,
		Weights{W: [NumFields]int64{Total: 3, Input: -2}}, Result{
			Mode: ModeJSON, Usage: found(math.MaxInt64, -1, math.MaxInt64), Seen: true, Cost: math.MaxInt64}},
	{"cost clamps at 0", OpenAI, "application/json", `{"usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":20}}}`,
		Weights{W: [NumFields]int64{Input: 1, CacheRead: -1}}, Result{
			Mode: ModeJSON, Usage: found(10, -1, -1, 20), Seen: true, Cost: 0}},
	{"stream bad event is counted", OpenAI, "text/event-stream", "data: {oops}\n\ndata: {\"usage\":{\"total_tokens\":3}}\n\ndata: [DONE]\n\n", unit, Result{
		Mode: ModeSSE, Usage: found(-1, -1, 3), Seen: true, Cost: 3, Events: 3, BadEvents: 1, Done: true}},
	{"stream [DONE] variants are bad", OpenAI, "text/event-stream", "data: [DONE] \n\ndata: [DONE]\ndata:\n\n", unit, Result{
		Mode: ModeSSE, Events: 2, BadEvents: 2}},
	{"anthropic [DONE] is bad", Anthropic, "text/event-stream", "data: [DONE]\n\n", unit, Result{
		Mode: ModeSSE, Events: 1, BadEvents: 1}},
	{"stream last usage wins", Anthropic, "text/event-stream",
		"data: {\"usage\":{\"output_tokens\":5}}\n\ndata: {\"usage\":{\"output_tokens\":\"x\"}}\n\ndata: {\"usage\":{\"output_tokens\":9}}\n\ndata: {\"usage\":null}\n\n",
		priced, Result{Mode: ModeSSE, Usage: found(-1, 9), Seen: true, Cost: 36, Events: 4}},
	{"not metered", OpenAI, "text/plain", "usage: 5", unit, Result{Doc: DocEmpty}},
}

func (c meterCase) want2() Result {
	w := c.want
	if w.Mode == ModeSSE && w.Events == 0 {
		w.Doc = DocEmpty
	}
	return w
}

func TestMeter(t *testing.T) {
	for _, c := range meterCases {
		t.Run(c.name, func(t *testing.T) {
			mode := ModeFor(c.ct)
			in := []byte(c.body)
			want := c.want2()
			if got := meterAll(t, c.p, c.w, Limits{}, mode, in); got != want {
				t.Fatalf("whole:\n got %+v\nwant %+v", got, want)
			}
			for k := 0; k <= len(in); k++ {
				if got := meterAll(t, c.p, c.w, Limits{}, mode, in[:k], in[k:]); got != want {
					t.Fatalf("split at %d:\n got %+v\nwant %+v", k, got, want)
				}
			}
			chunks := make([][]byte, len(in))
			for i := range in {
				chunks[i] = in[i : i+1]
			}
			if got := meterAll(t, c.p, c.w, Limits{}, mode, chunks...); got != want {
				t.Fatalf("bytewise:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestMeterReuse(t *testing.T) {
	m, err := NewMeter(OpenAI, priced, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		m.Start(ModeSSE)
		m.Write([]byte(openAIChatStream))
		if r := m.Finish(); r.Cost != 19+40 || !r.Done || r != m.Finish() {
			t.Fatal(r)
		}
		m.Write([]byte("data: {\"usage\":{\"total_tokens\":1}}\n\n")) // after Finish: ignored
		if r := m.Finish(); r.Cost != 59 {
			t.Fatal(r)
		}
		m.Start(ModeJSON)
		m.Write([]byte(openAIChatJSON))
		if r := m.Finish(); r.Cost != 1117+4*46 || r.Doc != DocOK {
			t.Fatal(r)
		}
	}
}

func TestMeterLimits(t *testing.T) {
	r := meterAll(t, OpenAI, unit, Limits{MaxBodyBytes: 100}, ModeJSON, []byte(openAIChatJSON))
	if r.Doc != DocTooLarge || r.Seen {
		t.Fatal(r)
	}
	// A Responses stream whose response.completed event is over the event
	// bound: skipped, counted, and its usage (after the bound) not seen.
	r = meterAll(t, OpenAI, unit, Limits{MaxEventBytes: 200}, ModeSSE, []byte(openAIResponsesStream))
	if r.Events != 3 || r.SkippedEvents != 1 || r.Seen || !r.Done || r.BadEvents != 1 {
		t.Fatalf("%+v", r)
	}
	r = meterAll(t, OpenAI, unit, Limits{MaxLineBytes: 100}, ModeSSE, []byte(openAIChatStream))
	if r.SkippedEvents != 5 || r.Seen || !r.Done {
		t.Fatalf("%+v", r)
	}
}

func TestModeFor(t *testing.T) {
	for ct, want := range map[string]Mode{
		"application/json":                  ModeJSON,
		"Application/JSON; charset=utf-8":   ModeJSON,
		" application/json ;charset=UTF-8":  ModeJSON,
		"application/problem+json":          ModeJSON,
		"text/event-stream":                 ModeSSE,
		"text/event-stream; charset=utf-8":  ModeSSE,
		"TEXT/EVENT-STREAM":                 ModeSSE,
		"text/plain":                        ModeNone,
		"application/jsonl":                 ModeNone,
		"application/x-ndjson":              ModeNone,
		"application/+json":                 ModeNone,
		"":                                  ModeNone,
		"text/event-stream-ish":             ModeNone,
		"multipart/form-data; boundary=abc": ModeNone,
	} {
		if got := ModeFor(ct); got != want {
			t.Errorf("ModeFor(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestWeights(t *testing.T) {
	bad := []Weights{
		{W: [NumFields]int64{Input: MaxWeight + 1}},
		{W: [NumFields]int64{Output: -MaxWeight - 1}},
		{Div: -1},
		{Div: MaxWeight + 1},
	}
	for _, w := range bad {
		if w.Validate() == nil {
			t.Errorf("%+v validates", w)
		}
		if _, err := NewMeter(OpenAI, w, Limits{}); err == nil {
			t.Errorf("NewMeter(%+v) succeeded", w)
		}
	}
	if _, err := NewMeter(0, unit, Limits{}); err == nil {
		t.Error("NewMeter(0) succeeded")
	}
	max := [NumFields]int64{MaxWeight, MaxWeight, MaxWeight, MaxWeight, MaxWeight}
	cases := []struct {
		w     Weights
		u     Usage
		cost  int64
		satur bool
	}{
		{Weights{W: [NumFields]int64{1, 1}, Div: 3}, found(1, 1), 1, false},
		{Weights{W: [NumFields]int64{1, 1}, Div: 2}, found(1, 1), 1, false},
		{Weights{W: [NumFields]int64{1, 1}, Div: 2}, found(1, 2), 2, false},
		{Weights{W: [NumFields]int64{1, 1}}, found(1, -1), 1, false},
		{Weights{W: [NumFields]int64{Output: 0}}, found(5, 5), 0, false},
		{Weights{W: max, Div: MaxWeight}, found(math.MaxInt64, 0, 0, 0, 0), math.MaxInt64, false},
		{Weights{W: max, Div: MaxWeight}, found(math.MaxInt64, 1, 0, 0, 0), math.MaxInt64, true},
		{Weights{W: max}, found(math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64), math.MaxInt64, true},
		{Weights{W: [NumFields]int64{-MaxWeight, -MaxWeight, -MaxWeight, -MaxWeight, MaxWeight}},
			found(math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64, math.MaxInt64), 0, false},
		{Weights{W: [NumFields]int64{MaxWeight, -MaxWeight}, Div: MaxWeight}, found(math.MaxInt64, math.MaxInt64-5), 5, false},
		{Weights{W: [NumFields]int64{3, -1}, Div: 2}, found(1, 2), 1, false}, // 0.5 → 1
	}
	for _, c := range cases {
		cost, sat := c.w.Cost(&c.u)
		if cost != c.cost || sat != c.satur {
			t.Errorf("%+v on %+v: %d %v, want %d %v", c.w, c.u.Values, cost, sat, c.cost, c.satur)
		}
	}
}

func TestMeterAllocs(t *testing.T) {
	for _, c := range []struct {
		p    Provider
		mode Mode
		body string
	}{
		{OpenAI, ModeJSON, openAIChatJSON},
		{OpenAI, ModeSSE, openAIChatStream},
		{OpenAI, ModeSSE, openAIResponsesStream},
		{Anthropic, ModeSSE, "\xEF\xBB\xBF" + crlf(anthropicStream, "\r\n")},
		{Anthropic, ModeJSON, anthropicJSON},
	} {
		body := []byte(c.body)
		var chunks [][]byte
		for i := 0; i < len(body); i += 13 {
			chunks = append(chunks, body[i:min(i+13, len(body))])
		}
		m, err := NewMeter(c.p, priced, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		var r Result
		allocs := testing.AllocsPerRun(100, func() {
			m.Start(c.mode)
			for _, ch := range chunks {
				m.Write(ch)
			}
			r = m.Finish()
		})
		if allocs != 0 {
			t.Errorf("%v %v: %v allocations per body", c.p, c.mode, allocs)
		}
		if !r.Seen {
			t.Errorf("%v %v: %+v", c.p, c.mode, r)
		}
		if ModeFor("text/event-stream; charset=utf-8") != ModeSSE {
			t.Fatal("ModeFor")
		}
		var mode Mode
		if n := testing.AllocsPerRun(100, func() { mode = ModeFor("Application/Problem+JSON; charset=utf-8") }); n != 0 || mode != ModeJSON {
			t.Errorf("ModeFor: %v allocations", n)
		}
	}
}

// TestMeterEndlessStream: a stream that never ends keeps a fixed-size state
// (the Meter is a plain struct; nothing grows) and allocation-free chunks,
// and the usage it reports is the last.
func TestMeterEndlessStream(t *testing.T) {
	m, err := NewMeter(Anthropic, priced, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(ModeSSE)
	ev := []byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"more and more\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n")
	endless := []byte("data: " + strings.Repeat("{\"a\":[", 10) + strings.Repeat("x", 4000))
	n := 0
	allocs := testing.AllocsPerRun(20000, func() {
		m.Write(ev)
		n += len(ev)
	})
	if allocs != 0 {
		t.Fatal(allocs)
	}
	allocs = testing.AllocsPerRun(2000, func() { m.Write(endless) }) // 8 MB on one line
	if allocs != 0 {
		t.Fatal(allocs)
	}
	r := m.Finish()
	if r.Events != 40002+1 || r.SkippedEvents != 1 || !r.Seen || r.Values[Output] != 7 || r.Done {
		t.Fatalf("%+v", r)
	}
}

// TestStateSize: the whole state is a fixed-size struct, small enough to
// keep one per request.
func TestStateSize(t *testing.T) {
	e, s, m := unsafe.Sizeof(Extractor{}), unsafe.Sizeof(Splitter{}), unsafe.Sizeof(Meter{})
	t.Logf("Extractor %d B, Splitter %d B, Meter %d B", e, s, m)
	if e > 512 || s > 256 || m > 1024 {
		t.Fatalf("state grew: Extractor %d B, Splitter %d B, Meter %d B", e, s, m)
	}
}

// NewFieldMeter: one path, read from a JSON body or from every event of a stream (the last
// value wins), costing it once; an absent field is not Seen.
func TestFieldMeter(t *testing.T) {
	m, err := NewFieldMeter("usage.units", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(ModeJSON)
	m.Write([]byte(`{"id":"x","usage":{"units":`))
	m.Write([]byte(`42,"other":7}}`))
	if r := m.Finish(); !r.Seen || r.Cost != 42 {
		t.Fatalf("JSON: %+v", r)
	}
	m.Start(ModeSSE)
	m.Write([]byte("data: {\"usage\":{\"units\":5}}\n\ndata: {\"usage\":{\"units\":9}}\n\ndata: [DONE]\n\n"))
	if r := m.Finish(); !r.Seen || r.Cost != 9 || !r.Done || r.BadEvents != 0 {
		t.Fatalf("SSE: %+v", r)
	}
	m.Start(ModeJSON)
	m.Write([]byte(`{"usage":{"tokens":3}}`))
	if r := m.Finish(); r.Seen || r.Cost != 0 {
		t.Fatalf("absent: %+v", r)
	}
	if _, err := NewFieldMeter("a[0]", Limits{}); err == nil {
		t.Fatal("a path with an index compiled")
	}
}
