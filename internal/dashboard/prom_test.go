package dashboard

import (
	"math"
	"strings"
	"testing"
)

func TestParseTextTrickyInput(t *testing.T) {
	text := strings.Join([]string{
		"# HELP sluice_host_workers Workers (one VM each).",
		"# TYPE sluice_host_workers gauge",
		"sluice_host_workers 2",
		"",
		"   # an indented comment",
		"# TYPE sluice_per_client_denied counter",
		"sluice_per_client_denied 17",
		`sluice_host_worker_memory_bytes{worker="1"} 2.5e+06`,
		`sluice_host_worker_memory_bytes{ worker = "0" , } 1048576 1700000000000`,
		`quoted{path="/a\"b\\c\nd",method="GET"} 3`,
		`sorted{b="2",a="1"} 4`,
		`nan_metric NaN`,
		`pinf +Inf`,
		`ninf -Inf`,
		"tabbed\t5\t",
		`with_colon:total{le="+Inf"} 6`,
		// Malformed lines: each is skipped.
		`9starts_with_digit 1`,
		`no_value`,
		`bad_value twelve`,
		`bad_ts 1 soon`,
		`too_many 1 2 3`,
		`unterminated{a="x 1`,
		`bad_escape{a="\t"} 1`,
		`no_quotes{a=x} 1`,
		`dup{a="1",a="2"} 1`,
		`glued{a="1"}1`,
		`label_digit{1a="x"} 1`,
		`missing_comma{a="1" b="2"} 1`,
		`{a="1"} 1`,
		`trailing_backslash{a="\`,
		"after_errors 7",
	}, "\n")
	samples, errs := ParseText([]byte(text))
	got := map[string]float64{}
	for _, s := range samples {
		got[s.Key()] = s.Value
	}
	want := map[string]float64{
		"sluice_host_workers":                         2,
		"sluice_per_client_denied":                    17,
		`sluice_host_worker_memory_bytes{worker="1"}`: 2.5e6,
		`sluice_host_worker_memory_bytes{worker="0"}`: 1048576,
		`quoted{method="GET",path="/a\"b\\c\nd"}`:     3,
		`sorted{a="1",b="2"}`:                         4,
		"pinf":                                        math.Inf(1),
		"ninf":                                        math.Inf(-1),
		"tabbed":                                      5,
		`with_colon:total{le="+Inf"}`:                 6,
		"after_errors":                                7,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if v, ok := got["nan_metric"]; !ok || !math.IsNaN(v) {
		t.Errorf("nan_metric = %v, %v; want NaN", v, ok)
	}
	if len(samples) != len(want)+1 {
		t.Errorf("%d samples, want %d: %v", len(samples), len(want)+1, got)
	}
	// The unescaped label value is available as such.
	for _, s := range samples {
		if s.Name == "quoted" {
			if v, _ := s.Label("path"); v != "/a\"b\\c\nd" {
				t.Errorf("path label = %q", v)
			}
			if _, ok := s.Label("nope"); ok {
				t.Error("Label found a missing label")
			}
		}
	}
	wantErrs := []struct {
		line int
		msg  string
	}{
		{17, "no metric name"},
		{18, `no value after "no_value"`},
		{19, `value "twelve" is not a number`},
		{20, `timestamp "soon" is not an integer`},
		{21, "want a value and an optional timestamp"},
		{22, `unterminated value of label "a"`},
		{23, `bad escape \t in label "a"`},
		{24, `want a quoted value for label "a"`},
		{25, `duplicate label "a"`},
		{26, `no value after "glued"`},
		{27, "bad label name at column 13"},
		{28, `want , or } after label "a"`},
		{29, "no metric name"},
		{30, `unterminated value of label "a"`},
	}
	if len(errs) != len(wantErrs) {
		t.Fatalf("%d errors, want %d: %v", len(errs), len(wantErrs), errs)
	}
	for i, w := range wantErrs {
		if errs[i].Line != w.line || errs[i].Msg != w.msg {
			t.Errorf("error %d = %v, want line %d: %s", i, errs[i], w.line, w.msg)
		}
	}
}

func TestParseTextBoundsErrors(t *testing.T) {
	text := strings.Repeat("garbage line here\n", 100) + "ok 1\n"
	samples, errs := ParseText([]byte(text))
	if len(samples) != 1 || samples[0].Name != "ok" {
		t.Fatalf("samples %v", samples)
	}
	if len(errs) != MaxLineErrors {
		t.Fatalf("%d errors, want %d", len(errs), MaxLineErrors)
	}
	if !strings.HasSuffix(errs[len(errs)-1].Msg, "(and 80 more malformed lines)") {
		t.Errorf("last error %q", errs[len(errs)-1].Msg)
	}
}

func TestParseTextOverlongLine(t *testing.T) {
	text := "a 1\nhuge " + strings.Repeat("9", 2<<20) + "\nb 2\n"
	samples, errs := ParseText([]byte(text))
	if len(samples) != 1 || samples[0].Name != "a" || len(errs) != 1 || errs[0].Line != 2 {
		t.Fatalf("samples %v errs %v", samples, errs)
	}
}

func TestSampleKeyEscapesLikeTheInput(t *testing.T) {
	in := `m{z="q\"uote",a="back\\slash",n="new\nline"} 1`
	samples, errs := ParseText([]byte(in))
	if len(errs) != 0 || len(samples) != 1 {
		t.Fatal(samples, errs)
	}
	key := samples[0].Key()
	if key != `m{a="back\\slash",n="new\nline",z="q\"uote"}` {
		t.Fatalf("key %s", key)
	}
	// The key is itself valid exposition text for the same series.
	again, errs := ParseText([]byte(key + " 2"))
	if len(errs) != 0 || len(again) != 1 || again[0].Key() != key {
		t.Fatalf("round trip: %v %v", again, errs)
	}
}

func TestPromName(t *testing.T) {
	for in, want := range map[string]string{
		"sluice.per-client.denied":    "sluice_per_client_denied",
		"sluice.api v2.shadow_denied": "sluice_api_v2_shadow_denied",
		"sluice.ünï.allowed":          "sluice___n___allowed", // byte-wise, like the host
		"9lives":                      "_lives",
		"ok:name_1":                   "ok:name_1",
	} {
		if got := PromName(in); got != want {
			t.Errorf("PromName(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzParseText(f *testing.F) {
	f.Add([]byte("a 1\n# TYPE a counter\nb{c=\"d\\\"\"} NaN 12\n"))
	f.Add([]byte(`x{a="\`))
	f.Add([]byte("{}} {\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		samples, errs := ParseText(data)
		if len(errs) > MaxLineErrors {
			t.Fatalf("%d errors", len(errs))
		}
		for _, s := range samples {
			// Every accepted sample's key parses back to the same series.
			again, e := ParseText([]byte(s.Key() + " 0"))
			if len(e) != 0 || len(again) != 1 || again[0].Key() != s.Key() {
				t.Fatalf("key %q does not round-trip: %v %v", s.Key(), again, e)
			}
		}
	})
}
