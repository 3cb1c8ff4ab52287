package jsonv

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/sluice-proxy/sluice/config/configtest"
)

// same reports how v differs from gjson's r ("" if it does not).
func same(v Value, r gjson.Result) string {
	var d []string
	if int(v.Type) != int(r.Type) {
		d = append(d, "Type")
	}
	if v.Raw != r.Raw {
		d = append(d, "Raw")
	}
	if v.Str != r.Str {
		d = append(d, "Str")
	}
	if v.Num != r.Num && !(math.IsNaN(v.Num) && math.IsNaN(r.Num)) {
		d = append(d, "Num")
	}
	if v.Index != r.Index {
		d = append(d, "Index")
	}
	if v.Exists() != r.Exists() || v.IsObject() != r.IsObject() || v.IsArray() != r.IsArray() {
		d = append(d, "Exists/IsObject/IsArray")
	}
	if v.String() != r.String() {
		d = append(d, "String()")
	}
	return strings.Join(d, ", ")
}

// compare checks that Valid agrees with gjson.ValidBytes on data and, for a valid document,
// that every value reached by ForEach, Array and Get agrees with gjson's.
func compare(t *testing.T, data []byte) {
	t.Helper()
	ok := Valid(data)
	if ok != gjson.ValidBytes(data) {
		t.Fatalf("%q: Valid %v, gjson.ValidBytes %v", data, ok, !ok)
	}
	if !ok {
		walkInvalid(Parse(data), 0) // unspecified results, but no panic
		return
	}
	var walk func(path string, v Value, r gjson.Result)
	walk = func(path string, v Value, r gjson.Result) {
		if d := same(v, r); d != "" {
			t.Fatalf("%q at %s: %s differ: %+v, gjson %+v", data, path, d, v, r)
		}
		var keys []Value
		var vals []Value
		v.ForEach(func(k, x Value) bool { keys, vals = append(keys, k), append(vals, x); return true })
		n := 0
		r.ForEach(func(k, x gjson.Result) bool {
			if n >= len(vals) {
				t.Fatalf("%q at %s: ForEach gave %d members, gjson more", data, path, len(vals))
			}
			if d := same(keys[n], k); d != "" {
				t.Fatalf("%q at %s: key %d: %s differ: %+v, gjson %+v", data, path, n, d, keys[n], k)
			}
			if v.Type == KindJSON {
				walk(path+"/"+k.String(), vals[n], x)
			} else if d := same(vals[n], x); d != "" { // a scalar passes itself
				t.Fatalf("%q at %s: ForEach value: %s differ", data, path, d)
			}
			n++
			return true
		})
		if n != len(vals) {
			t.Fatalf("%q at %s: ForEach gave %d members, gjson %d", data, path, len(vals), n)
		}
		a, ra := v.Array(), r.Array()
		if len(a) != len(ra) {
			t.Fatalf("%q at %s: Array has %d, gjson %d", data, path, len(a), len(ra))
		}
		for i := range a {
			if d := same(a[i], ra[i]); d != "" {
				t.Fatalf("%q at %s: Array()[%d]: %s differ: %+v, gjson %+v", data, path, i, d, a[i], ra[i])
			}
		}
		names := []string{"name", "backend", "x", "rules"}
		for _, k := range keys {
			if k.Type == KindString && isPlainName(k.Str) {
				names = append(names, k.Str)
			}
		}
		for _, name := range names {
			if d := same(v.Get(name), r.Get(name)); d != "" {
				t.Fatalf("%q at %s: Get(%q): %s differ: %+v, gjson %+v", data, path, name, d, v.Get(name), r.Get(name))
			}
		}
	}
	walk("", Parse(data), gjson.ParseBytes(data))
}

// walkInvalid reads everything Parse gave for an invalid document.
func walkInvalid(v Value, depth int) {
	_ = v.String()
	v.Get("name")
	v.Array()
	if depth > 8 {
		return
	}
	v.ForEach(func(k, x Value) bool {
		_ = k.String()
		if x.Type == KindJSON {
			walkInvalid(x, depth+1)
		}
		return true
	})
}

// isPlainName reports whether a gjson path of name is name itself: config asks Get only
// for such names (gjson would read others as paths).
func isPlainName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return !(name[0] >= '0' && name[0] <= '9') // "0" would index an array
}

var cases = []string{
	``, ` `, `{}`, `[]`, ` { } `, "\t[\n]\r", `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{,"a":1}`, `{"a":1 "b":2}`,
	`[1,2,]`, `[,1]`, `[1 2]`, `{"a":[1,{"b":null}],"c":"d"}`, `"x"`, `  "x"  `, `1`, ` -0 `, `-`, `01`, `1.`, `1.5`,
	`1e`, `1e+`, `1E-7`, `-1.5e10`, `1.0e+2`, `true`, `false`, `null`, `tru`, `nul`, `nulll`, `truefalse`, `[true,false,null]`,
	`"\u00e9"`, `"\ud83d\ude00"`, `"\ud800"`, `"\ud800x"`, `"\ud800\u0041"`, `"\udc00"`, `"\ud800\ud800\udc00"`, `"a\"b\\c\/d\b\f\n\r\t"`,
	`"\x"`, `"\u12"`, `"\u12G4"`, "\"a\tb\"", "\"\x7f\"", "\"\xff\"", `{"\u0062ackend":"redis","backend":"local"}`,
	`{"name":"a","name":"b"}`, `{"a":{"name":1}}`, `[{"name":1},{"name":2}]`, `{"a":"}"}`, `{"a":"\\"}`, `{"a":"\\\""}`,
	`[[[[]]]]`, `[[[[]]]`, `{"a":{"b":{"c":[1,2,{"d":"e"}]}}}  `, `{"a":1}x`, `{"a":1}{}`, `[1]]`, `{"rules":[{"name":"r","limit":5}]}`,
	`{"limit":1.0,"n":-0.0,"big":123456789012345678901234567890,"e":1e400}`,
}

func TestSameAsGjson(t *testing.T) {
	for _, c := range cases {
		compare(t, []byte(c))
	}
	// The repository's example configurations.
	var files []string
	for _, glob := range []string{"../../../envoy/*.json", "../../../cmd/sluice/*.json", "../../../cmd/sluice/testdata/check/*.json"} {
		more, _ := filepath.Glob(glob)
		files = append(files, more...)
	}
	if len(files) == 0 {
		t.Fatal("no example configurations found")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		compare(t, b)
	}
}

// The generated corpus the config tests and `sluice check`'s tests judge: Value reads it as
// gjson does, hostile mutations included.
func TestSameAsGjsonOnGenerated(t *testing.T) {
	for _, c := range append(configtest.Valid(), configtest.Boundaries()...) {
		compare(t, c.JSON)
	}
	for _, c := range configtest.Mutations(3, 2000) {
		compare(t, c.JSON)
	}
}

func FuzzSameAsGjson(f *testing.F) {
	for _, c := range cases {
		f.Add([]byte(c))
	}
	for _, c := range configtest.Mutations(5, 100) {
		f.Add(c.JSON)
	}
	f.Fuzz(func(t *testing.T, data []byte) { compare(t, data) })
}
