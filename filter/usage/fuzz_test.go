package usage

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

var fuzzPaths = MustCompile("a", "a.b", "a.b.c", "b", "x.y", `q"`, "usage.total_tokens", "usage.prompt_tokens", "max_tokens", `k\`)

// oracle reads valid JSON with encoding/json and says what each path holds
// under this package's rules.
func oracle(t *testing.T, data []byte, p *Paths) (st [MaxPaths]Status, vals [MaxPaths]int64) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var root any
	if err := d.Decode(&root); err != nil {
		t.Fatalf("oracle: %v", err)
	}
	for i := 0; i < p.Len(); i++ {
		cur := root
		for _, k := range strings.Split(p.Path(i), ".") {
			m, ok := cur.(map[string]any)
			if !ok {
				cur = nil
				break
			}
			cur = m[k]
		}
		switch v := cur.(type) {
		case nil:
		case json.Number:
			s := string(v)
			if strings.ContainsAny(s, ".eE") {
				st[i] = NotInteger
				break
			}
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				st[i] = OutOfRange
				break
			}
			st[i], vals[i] = Found, n
		default:
			st[i] = NotInteger
		}
	}
	return st, vals
}

// depth is the deepest nesting in valid JSON.
func depth(data []byte) int {
	d, max, in, esc := 0, 0, false, false
	for _, c := range data {
		switch {
		case in && esc:
			esc = false
		case in && c == '\\':
			esc = true
		case in && c == '"':
			in = false
		case in:
		case c == '"':
			in = true
		case c == '[' || c == '{':
			d++
			max = maxInt(max, d)
		case c == ']' || c == '}':
			d--
		}
	}
	return max
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

type snapshot struct {
	doc  DocStatus
	st   [MaxPaths]Status
	vals [MaxPaths]int64
}

func snap(e *Extractor, doc DocStatus) snapshot {
	s := snapshot{doc: doc}
	for i := 0; i < e.p.Len(); i++ {
		s.vals[i], s.st[i] = e.Value(i)
	}
	return s
}

func fuzzSeeds(f *testing.F) {
	for _, s := range []string{
		openAIChatJSON, openAIResponsesJSON, anthropicJSON,
		`{"a":{"b":{"c":1}},"b":-0,"x":{"y":1e3}}`,
		`{"a":1,"a":{"b":2},"a":{"b":{"c":"3"}}}`,
		`{"\u0061":{"\u0062":7},"q\"":5,"\u00e9":3,"é":4,"k\\":6}`,
		`{"max_tokens":9223372036854775808,"usage":{"total_tokens":12.0}}`,
		`[{"a":1},{"b":[{"a":2}]}]`,
		`{"a":[1,2,{"b":3}],"b":true,"x":null}`,
		`  "str\u12ab\n"  `, `-0.5e-7`, `0`, `{}`, `[]`, ``, ` `, `{"a":01}`, `{"a":1,}`, `nul`,
		strings.Repeat("[", 300) + strings.Repeat("]", 300),
	} {
		f.Add([]byte(s), uint16(len(s)/2))
	}
}

// FuzzExtract compares the Extractor with encoding/json on valid JSON, checks
// that it accepts exactly the JSON encoding/json accepts (up to MaxDepth),
// that chunking never changes its answer, and that nothing panics.
func FuzzExtract(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		e := NewExtractor(fuzzPaths)
		e.Write(data)
		whole := snap(e, e.Finish())

		k := int(cut) % (len(data) + 1)
		e.Reset(fuzzPaths, 0)
		e.Write(data[:k])
		e.Write(data[k:])
		if s := snap(e, e.Finish()); s != whole {
			t.Fatalf("split at %d: %+v, whole %+v", k, s, whole)
		}
		e.Reset(fuzzPaths, 0)
		for i := range data {
			e.Write(data[i : i+1])
		}
		if s := snap(e, e.Finish()); s != whole {
			t.Fatalf("bytewise: %+v, whole %+v", s, whole)
		}

		valid := json.Valid(data)
		switch whole.doc {
		case DocOK:
			if !valid {
				t.Fatalf("accepted invalid JSON")
			}
			st, vals := oracle(t, data, fuzzPaths)
			if st != whole.st || vals != whole.vals {
				t.Fatalf("got %v %v\nwant %v %v", whole.st[:fuzzPaths.Len()], whole.vals[:fuzzPaths.Len()], st[:fuzzPaths.Len()], vals[:fuzzPaths.Len()])
			}
		case DocEmpty:
			if len(bytes.Trim(data, " \t\r\n")) != 0 {
				t.Fatalf("empty but not whitespace")
			}
		case DocTooDeep:
			if valid && depth(data) <= MaxDepth {
				t.Fatalf("too deep at depth %d", depth(data))
			}
		default:
			if valid {
				t.Fatalf("refused valid JSON: %v", whole.doc)
			}
		}
	})
}

// FuzzSplitter compares the Splitter with the whole-buffer reference under
// small bounds, checks chunking, and runs both formats' Meters on the input
// (as a stream and as a body) for panics.
func FuzzSplitter(f *testing.F) {
	for _, s := range []string{openAIChatStream, anthropicStream, openAIResponsesStream,
		crlf(anthropicStream, "\r\n"), crlf(openAIChatStream, "\r"), "\xEF\xBB\xBFdata: x\r\n\r\n",
		"data: a\ndata\n: c\nevent:e\n\n", "data: [DONE]\n\n"} {
		f.Add([]byte(s), uint16(len(s)/3), uint8(40), uint8(200))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint16, lineMax, eventMax uint8) {
		lm, em := int64(lineMax)+1, int64(eventMax)+1
		want := refSSE(data, int(lm), int(em))
		if got := splitAll(lm, em, data); !reflect.DeepEqual(got, want) {
			t.Fatalf("whole:\n got %+v\nwant %+v", got, want)
		}
		k := int(cut) % (len(data) + 1)
		if got := splitAll(lm, em, data[:k], data[k:]); !reflect.DeepEqual(got, want) {
			t.Fatalf("split at %d:\n got %+v\nwant %+v", k, got, want)
		}
		for _, p := range []Provider{OpenAI, Anthropic} {
			for _, mode := range []Mode{ModeSSE, ModeJSON} {
				m, _ := NewMeter(p, priced, Limits{MaxLineBytes: lm, MaxEventBytes: em})
				m.Start(mode)
				m.Write(data)
				r1 := m.Finish()
				m.Start(mode)
				m.Write(data[:k])
				m.Write(data[k:])
				if r2 := m.Finish(); r1 != r2 {
					t.Fatalf("%v %v split at %d:\n %+v\n %+v", p, mode, k, r1, r2)
				}
				if r1.Cost < 0 || r1.Seen != (r1.Cost > 0 || r1.Status[Input] == Found || r1.Status[Output] == Found) {
					t.Fatalf("%+v", r1)
				}
			}
		}
	})
}
