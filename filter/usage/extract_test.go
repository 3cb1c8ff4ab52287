package usage

import (
	"strings"
	"testing"
)

var testPaths = MustCompile("usage.total_tokens", "usage.prompt_tokens", "max_tokens", "a.b.c", "a.b", "x")

type want struct {
	path string
	v    int64
	st   Status
}

func extractAll(p *Paths, chunks ...[]byte) (*Extractor, DocStatus) {
	e := NewExtractor(p)
	for _, c := range chunks {
		e.Write(c)
	}
	return e, e.Finish()
}

func indexOf(p *Paths, path string) int {
	for i := 0; i < p.Len(); i++ {
		if p.Path(i) == path {
			return i
		}
	}
	panic("no path " + path)
}

func TestExtractOddInputs(t *testing.T) {
	cases := []struct {
		name string
		in   string
		doc  DocStatus
		want []want // paths not listed must be Absent
	}{
		{"integer", `{"usage":{"total_tokens":12}}`, DocOK, []want{{"usage.total_tokens", 12, Found}}},
		{"zero", `{"max_tokens":0}`, DocOK, []want{{"max_tokens", 0, Found}}},
		{"minus zero", `{"max_tokens":-0}`, DocOK, []want{{"max_tokens", 0, Found}}},
		{"max int64", `{"max_tokens":9223372036854775807}`, DocOK, []want{{"max_tokens", 9223372036854775807, Found}}},
		{"overflow", `{"max_tokens":9223372036854775808}`, DocOK, []want{{"max_tokens", 0, OutOfRange}}},
		{"huge", `{"max_tokens":` + strings.Repeat("9", 5000) + `}`, DocOK, []want{{"max_tokens", 0, OutOfRange}}},
		{"negative", `{"max_tokens":-5}`, DocOK, []want{{"max_tokens", 0, OutOfRange}}},
		{"min int64", `{"max_tokens":-9223372036854775808}`, DocOK, []want{{"max_tokens", 0, OutOfRange}}},
		{"fraction", `{"max_tokens":12.0}`, DocOK, []want{{"max_tokens", 0, NotInteger}}},
		{"exponent", `{"max_tokens":1e3}`, DocOK, []want{{"max_tokens", 0, NotInteger}}},
		{"exponent sign", `{"max_tokens":1E+3}`, DocOK, []want{{"max_tokens", 0, NotInteger}}},
		{"negative fraction", `{"max_tokens":-1.5e-3}`, DocOK, []want{{"max_tokens", 0, NotInteger}}},
		{"string", `{"usage":{"total_tokens":"12"}}`, DocOK, []want{{"usage.total_tokens", 0, NotInteger}}},
		{"bool", `{"max_tokens":true}`, DocOK, []want{{"max_tokens", 0, NotInteger}}},
		{"false", `{"max_tokens":false}`, DocOK, []want{{"max_tokens", 0, NotInteger}}},
		{"null leaf", `{"max_tokens":null}`, DocOK, nil},
		{"null usage", `{"usage":null}`, DocOK, nil},
		{"usage is a number", `{"usage":5}`, DocOK, nil},
		{"usage is an array", `{"usage":[{"total_tokens":5}]}`, DocOK, nil},
		{"object leaf", `{"a":{"b":{"c":{"d":1}}}}`, DocOK, []want{{"a.b.c", 0, NotInteger}, {"a.b", 0, NotInteger}}},
		{"array leaf", `{"x":[1]}`, DocOK, []want{{"x", 0, NotInteger}}},
		{"prefix and leaf", `{"a":{"b":7}}`, DocOK, []want{{"a.b", 7, Found}}},
		{"duplicate last wins", `{"max_tokens":1,"max_tokens":2}`, DocOK, []want{{"max_tokens", 2, Found}}},
		{"duplicate to invalid", `{"max_tokens":1,"max_tokens":"2"}`, DocOK, []want{{"max_tokens", 0, NotInteger}}},
		{"duplicate parent replaces", `{"usage":{"total_tokens":5,"prompt_tokens":3},"usage":{"prompt_tokens":4}}`, DocOK,
			[]want{{"usage.prompt_tokens", 4, Found}}},
		{"duplicate parent null", `{"usage":{"total_tokens":5},"usage":null}`, DocOK, nil},
		{"not at top", `{"usage":{"usage":{"total_tokens":5}},"y":{"max_tokens":3}}`, DocOK, nil},
		{"in an array", `[{"max_tokens":3}]`, DocOK, nil},
		{"escaped key", `{"\u0075sage":{"total\u005ftokens":8},"max\/tokens":1}`, DocOK, []want{{"usage.total_tokens", 8, Found}}},
		{"escaped non-ascii key", `{"max_tokens\u00e9":1}`, DocOK, nil},
		{"key case", `{"Max_Tokens":1}`, DocOK, nil},
		{"longer key", `{"max_tokensX":1,"max_token":2}`, DocOK, nil},
		{"long key", `{"` + strings.Repeat("k", 100000) + `":1,"x":2}`, DocOK, []want{{"x", 2, Found}}},
		{"whitespace", " \t\r\n{ \"x\" \n: \t 42 \r\n} \n", DocOK, []want{{"x", 42, Found}}},
		{"top number", `42`, DocOK, nil},
		{"top string", `"x"`, DocOK, nil},
		{"empty", ``, DocEmpty, nil},
		{"only whitespace", " \n\t\r ", DocEmpty, nil},
		{"truncated", `{"usage":{"total_tokens":12`, DocMalformed, nil},
		{"truncated after value", `{"max_tokens":12,"usage":{"total_tokens":1`, DocMalformed, []want{{"max_tokens", 12, Found}}},
		{"garbage after value", `{"max_tokens":12,"x":1 oops`, DocMalformed, []want{{"max_tokens", 12, Found}, {"x", 1, Found}}},
		{"not json", `<html>502 Bad Gateway</html>`, DocMalformed, nil},
		{"trailing comma", `{"x":1,}`, DocMalformed, []want{{"x", 1, Found}}},
		{"two values", `{"x":1} {"x":2}`, DocMalformed, []want{{"x", 1, Found}}},
		{"leading zero", `{"x":01}`, DocMalformed, nil},
		{"bad escape", `{"s":"\x"}`, DocMalformed, nil},
		{"bad unicode", `{"s":"\u12G4"}`, DocMalformed, nil},
		{"control char", "{\"s\":\"a\nb\"}", DocMalformed, nil},
		{"single quotes", `{'x':1}`, DocMalformed, nil},
		{"bare word", `{"x":tru}`, DocMalformed, nil},
		{"plus number", `{"x":+1}`, DocMalformed, nil},
		{"dot number", `{"x":.5}`, DocMalformed, nil},
		{"bom", "\xEF\xBB\xBF{\"x\":1}", DocMalformed, nil},
		{"mismatched", `{"x":[1}`, DocMalformed, []want{{"x", 0, NotInteger}}},
		{"mismatched close", `[{"x":1]`, DocMalformed, nil},
		{"number then junk", `{"x":1x}`, DocMalformed, nil},
		{"deep", strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1), DocTooDeep, nil},
		{"deep enough", strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth), DocOK, nil},
		{"deep after value", `{"x":3,"y":` + strings.Repeat(`{"y":`, 1000), DocTooDeep, []want{{"x", 3, Found}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := []byte(c.in)
			check := func(how string, e *Extractor, doc DocStatus) {
				t.Helper()
				if doc != c.doc {
					t.Errorf("%s: doc %v, want %v", how, doc, c.doc)
				}
				for i := 0; i < testPaths.Len(); i++ {
					w := want{path: testPaths.Path(i)}
					for _, x := range c.want {
						if x.path == w.path {
							w = x
						}
					}
					if v, st := e.Value(i); v != w.v || st != w.st {
						t.Errorf("%s: %s = %d %v, want %d %v", how, w.path, v, st, w.v, w.st)
					}
				}
			}
			e, doc := extractAll(testPaths, in)
			check("whole", e, doc)
			if len(in) < 2000 {
				for k := 0; k <= len(in); k++ {
					e, doc := extractAll(testPaths, in[:k], in[k:])
					check("split", e, doc)
				}
			}
			chunks := make([][]byte, len(in))
			for i := range in {
				chunks[i] = in[i : i+1]
			}
			e, doc = extractAll(testPaths, chunks...)
			check("bytewise", e, doc)
		})
	}
}

func TestCompile(t *testing.T) {
	bad := [][]string{
		nil,
		{""},
		{"usage."},
		{".usage"},
		{"a..b"},
		{"choices[0].x"},
		{"a\x00b"},
		{"caf\xc3\xa9"},
		{strings.Repeat("k", MaxSegmentLen+1)},
		{"a.b.c.d.e.f.g.h.i"},
		{"x", "x"},
		make([]string, MaxPaths+1),
	}
	for _, b := range bad {
		if _, err := Compile(b...); err == nil {
			t.Errorf("Compile(%q) succeeded", b)
		}
	}
	many := make([]string, MaxPaths)
	for i := range many {
		many[i] = "k" + string(rune('a'+i%26)) + strings.Repeat("z", i/26) + ".a.b.c.d.e.f." + strings.Repeat("v", MaxSegmentLen)
	}
	p, err := Compile(many...)
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	doc.WriteString("{")
	for i, s := range many {
		if i > 0 {
			doc.WriteString(",")
		}
		parts := strings.Split(s, ".")
		for _, k := range parts[:len(parts)-1] {
			doc.WriteString(`"` + k + `":{`)
		}
		doc.WriteString(`"` + parts[len(parts)-1] + `":` + string(rune('0'+i%10)))
		doc.WriteString(strings.Repeat("}", len(parts)-1))
	}
	doc.WriteString("}")
	e, d := extractAll(p, []byte(doc.String()))
	if d != DocOK {
		t.Fatal(d)
	}
	for i := range many {
		if v, st := e.Value(i); st != Found || v != int64(i%10) {
			t.Errorf("path %d: %d %v", i, v, st)
		}
	}
}

func TestExtractLimit(t *testing.T) {
	in := []byte(`{"max_tokens":12,"x":3}`)
	for limit := int64(1); limit <= int64(len(in))+1; limit++ {
		e := NewExtractor(testPaths)
		e.Reset(testPaths, limit)
		for i := range in {
			e.Write(in[i : i+1])
		}
		doc := e.Finish()
		switch {
		case limit >= int64(len(in)):
			if doc != DocOK {
				t.Errorf("limit %d: %v", limit, doc)
			}
		default:
			if doc != DocTooLarge {
				t.Errorf("limit %d: %v", limit, doc)
			}
			if e.Bytes() != limit {
				t.Errorf("limit %d: read %d bytes", limit, e.Bytes())
			}
		}
		// max_tokens counts once its number is complete: the ',' was read.
		_, st := e.Value(indexOf(testPaths, "max_tokens"))
		if (st == Found) != (limit >= 17) {
			t.Errorf("limit %d: max_tokens %v", limit, st)
		}
	}
}

// chunked feeds r to e in pieces of n bytes from one reused buffer.
func feed(e interface{ Write([]byte) }, buf []byte, total int, fill func([]byte, int)) {
	for off := 0; off < total; off += len(buf) {
		n := min(len(buf), total-off)
		fill(buf[:n], off)
		e.Write(buf[:n])
	}
}

func TestExtractHostileBodies(t *testing.T) {
	p := MustCompile("usage.total_tokens")
	buf := make([]byte, 64<<10)

	t.Run("10MB whitespace", func(t *testing.T) {
		e := NewExtractor(p)
		feed(e, buf, 10<<20, func(b []byte, _ int) {
			for i := range b {
				b[i] = " \n\t\r"[i%4]
			}
		})
		if doc := e.Finish(); doc != DocEmpty {
			t.Fatal(doc)
		}
	})

	t.Run("whitespace then usage", func(t *testing.T) {
		e := NewExtractor(p)
		feed(e, buf, 10<<20, func(b []byte, _ int) {
			for i := range b {
				b[i] = ' '
			}
		})
		e.Write([]byte(`{"usage":{"total_tokens":7}}`))
		if doc := e.Finish(); doc != DocOK {
			t.Fatal(doc)
		}
		if v, st := e.Value(0); v != 7 || st != Found {
			t.Fatal(v, st)
		}
	})

	t.Run("52MB string then usage", func(t *testing.T) {
		const pat = "ab{}[]:,\\\"\\n0" // escapes stay whole: pieces are whole patterns
		e := NewExtractor(p)
		e.Write([]byte(`{"content":"`))
		feed(e, make([]byte, len(pat)*5000), len(pat)<<22, func(b []byte, _ int) {
			for i := range b {
				b[i] = pat[i%len(pat)]
			}
		})
		e.Write([]byte(`","usage":{"total_tokens":99}}`))
		if doc := e.Finish(); doc != DocOK {
			t.Fatal(doc)
		}
		if v, st := e.Value(0); v != 99 || st != Found {
			t.Fatal(v, st)
		}
	})

	t.Run("endless nesting", func(t *testing.T) {
		e := NewExtractor(p)
		feed(e, buf, 10<<20, func(b []byte, _ int) {
			for i := range b {
				b[i] = '['
			}
		})
		if doc := e.Finish(); doc != DocTooDeep {
			t.Fatal(doc)
		}
		if e.Bytes() >= 1<<20 { // it stopped reading at the first chunk
			t.Fatal(e.Bytes())
		}
	})

	t.Run("endless array", func(t *testing.T) {
		e := NewExtractor(p)
		e.Write([]byte(`{"usage":{"total_tokens":5},"a":[`))
		feed(e, buf, 20<<20, func(b []byte, _ int) {
			for i := range b {
				b[i] = "1,{},"[i%5]
			}
		})
		if doc := e.Doc(); doc != DocOK {
			t.Fatal(doc)
		}
		if doc := e.Finish(); doc != DocMalformed {
			t.Fatal(doc)
		}
		if v, st := e.Value(0); v != 5 || st != Found {
			t.Fatal(v, st)
		}
	})

	t.Run("random bytes", func(t *testing.T) {
		// A xorshift stream: never panics, stops at the first bad byte.
		x := uint64(88172645463325252)
		e := NewExtractor(p)
		feed(e, buf, 1<<20, func(b []byte, _ int) {
			for i := range b {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				b[i] = byte(x)
			}
		})
		if doc := e.Finish(); doc == DocOK {
			t.Fatal(doc)
		}
	})
}

func TestExtractAllocs(t *testing.T) {
	body := []byte(openAIChatJSON)
	var chunks [][]byte
	for i := 0; i < len(body); i += 7 {
		chunks = append(chunks, body[i:min(i+7, len(body))])
	}
	p := MustCompile("usage.total_tokens", "usage.prompt_tokens_details.cached_tokens")
	e := NewExtractor(p)
	allocs := testing.AllocsPerRun(200, func() {
		e.Reset(p, 0)
		for _, c := range chunks {
			e.Write(c)
		}
		if e.Finish() != DocOK {
			t.Fatal("not ok")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per body", allocs)
	}
	if v, _ := e.Value(0); v != 1163 {
		t.Fatal(v)
	}
	if v, _ := e.Value(1); v != 1024 {
		t.Fatal(v)
	}
}

func TestExtractRequestReservation(t *testing.T) {
	p := MustCompile("max_tokens", "max_completion_tokens", "max_output_tokens", "stream_options.include_usage")
	req := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"say \"max_tokens\": 1"}],"max_completion_tokens":2048,"stream":true,"stream_options":{"include_usage":true}}`)
	e, doc := extractAll(p, req)
	if doc != DocOK {
		t.Fatal(doc)
	}
	got := [4]Status{}
	for i := range got {
		_, got[i] = e.Value(i)
	}
	if got != [4]Status{Absent, Found, Absent, NotInteger} {
		t.Fatal(got)
	}
	if v, _ := e.Value(1); v != 2048 {
		t.Fatal(v)
	}
}
