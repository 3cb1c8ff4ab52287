package resp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestAppendCommand(t *testing.T) {
	got := AppendCommand(nil, "EVALSHA", "abc", "1", "k{x}")
	want := "*4\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n1\r\n$4\r\nk{x}\r\n"
	if string(got) != want {
		t.Fatalf("got %q want %q", got, want)
	}
	got = AppendCommandBytes([]byte("prefix"), []byte("GET"), []byte{})
	if string(got) != "prefix*2\r\n$3\r\nGET\r\n$0\r\n\r\n" {
		t.Fatalf("got %q", got)
	}
	got = AppendBulkInt(AppendArrayHeader(nil, 2), -9223372036854775808)
	got = AppendBulkInt(got, 42)
	if string(got) != "*2\r\n$20\r\n-9223372036854775808\r\n$2\r\n42\r\n" {
		t.Fatalf("got %q", got)
	}
	// Piecewise bulk string.
	got = AppendCRLF(append(AppendBulkHeader(nil, 5), "ab"+"cde"...))
	if string(got) != "$5\r\nabcde\r\n" {
		t.Fatalf("got %q", got)
	}
}

func TestAppendCommandZeroAlloc(t *testing.T) {
	buf := make([]byte, 0, 256)
	key := []byte("sluice:{r:k}:tb")
	allocs := testing.AllocsPerRun(1000, func() {
		b := AppendCommand(buf[:0], "EVALSHA", "0123456789abcdef0123456789abcdef01234567", "1")
		b = AppendArrayHeader(b[:0], 4)
		b = AppendBulkString(b, "EVALSHA")
		b = AppendBulk(b, key)
		b = AppendBulkInt(b, 3600000000)
		b = AppendCommandBytes(b, key, key)
		_ = b
	})
	if allocs != 0 {
		t.Fatalf("encoding allocated %v times per run, want 0", allocs)
	}
}

func TestDecodeValues(t *testing.T) {
	cases := []struct {
		in   string
		want Value
	}{
		{"+OK\r\n", Value{Type: SimpleString, Str: []byte("OK")}},
		{"+\r\n", Value{Type: SimpleString, Str: []byte("")}},
		{"-ERR bad thing\r\n", Value{Type: Error, Str: []byte("ERR bad thing")}},
		{":0\r\n", Value{Type: Integer}},
		{":-42\r\n", Value{Type: Integer, Int: -42}},
		{":9223372036854775807\r\n", Value{Type: Integer, Int: 9223372036854775807}},
		{":-9223372036854775808\r\n", Value{Type: Integer, Int: -9223372036854775808}},
		{"$5\r\nhe\r\no\r\n", Value{Type: BulkString, Str: []byte("he\r\no")}},
		{"$0\r\n\r\n", Value{Type: BulkString, Str: []byte("")}},
		{"$-1\r\n", Value{Type: BulkString, Null: true}},
		{"*-1\r\n", Value{Type: Array, Null: true}},
		{"*0\r\n", Value{Type: Array, Elems: []Value{}}},
		{"*3\r\n:1\r\n$-1\r\n*2\r\n+a\r\n-NOSCRIPT x\r\n", Value{Type: Array, Elems: []Value{
			{Type: Integer, Int: 1},
			{Type: BulkString, Null: true},
			{Type: Array, Elems: []Value{{Type: SimpleString, Str: []byte("a")}, {Type: Error, Str: []byte("NOSCRIPT x")}}},
		}}},
	}
	var d Decoder
	for _, c := range cases {
		v, n, err := d.Decode([]byte(c.in + "trailing"))
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if n != len(c.in) {
			t.Errorf("%q: consumed %d, want %d", c.in, n, len(c.in))
		}
		if !equal(v, c.want) {
			t.Errorf("%q: got %+v want %+v", c.in, v, c.want)
		}
		// Round trip.
		if got := AppendValue(nil, v); string(got) != c.in {
			t.Errorf("AppendValue(%q) = %q", c.in, got)
		}
	}
}

func equal(a, b Value) bool {
	if a.Type != b.Type || a.Null != b.Null || a.Int != b.Int || !bytes.Equal(a.Str, b.Str) ||
		(a.Str == nil) != (b.Str == nil) || len(a.Elems) != len(b.Elems) || (a.Elems == nil) != (b.Elems == nil) {
		return false
	}
	for i := range a.Elems {
		if !equal(a.Elems[i], b.Elems[i]) {
			return false
		}
	}
	return true
}

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		in        string
		truncated bool
		msg       string
	}{
		{"", true, "missing reply at offset 0"},
		{"+OK", true, "line has no CRLF"},
		{"+OK\r", true, "line ends without LF"},
		{"+OK\rx", false, "CR not followed by LF"},
		{"+O\nK\r\n", false, "LF without CR"},
		{":\r\n", false, "bad integer"},
		{":12a\r\n", false, "bad integer"},
		{":+1\r\n", false, "bad integer"},
		{":9223372036854775808\r\n", false, "bad integer"},
		{":-9223372036854775809\r\n", false, "bad integer"},
		{":99999999999999999999\r\n", false, "bad integer"},
		{"$-2\r\n", false, "bad bulk string length"},
		{"$536870913\r\n", false, "bad bulk string length"},
		{"$5\r\nabc", true, "bulk string shorter than its length"},
		{"$5\r\nabcde", true, "bulk string shorter than its length"},
		{"$3\r\nabcde\r\n", false, "bulk string not terminated by CRLF"},
		{"*-2\r\n", false, "bad array length"},
		{"*2\r\n:1\r\n", true, "array has fewer elements than its length"},
		{"*1000000000\r\n:1\r\n", true, "array has fewer elements than its length"},
		{"*2\r\n:1\r\n:x\r\n", false, "bad integer at offset 9"},
		{"?what\r\n", false, "unexpected type byte '?'"},
		{"_\r\n", false, "RESP3 type '_' is not supported"},
		{"%1\r\n+a\r\n+b\r\n", false, "RESP3 type '%' is not supported"},
		{strings.Repeat("*1\r\n", MaxDepth+1) + ":1\r\n", false, "arrays nested too deeply"},
	}
	for _, c := range cases {
		_, _, err := Decode([]byte(c.in))
		if err == nil {
			t.Errorf("%q: no error", c.in)
			continue
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: error %q does not mention %q", c.in, err, c.msg)
		}
		want := ErrMalformed
		if c.truncated {
			want = ErrTruncated
		}
		if !errors.Is(err, want) {
			t.Errorf("%q: error %v is not %v", c.in, err, want)
		}
	}
	// Nesting exactly MaxDepth deep is fine.
	if _, _, err := Decode([]byte(strings.Repeat("*1\r\n", MaxDepth) + ":1\r\n")); err != nil {
		t.Errorf("depth %d: %v", MaxDepth, err)
	}
}

func TestParseRejectsTrailingBytes(t *testing.T) {
	if _, err := Parse([]byte(":1\r\n:2\r\n")); err == nil || !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v", err)
	}
	v, err := Parse([]byte(":7\r\n"))
	if err != nil || v.Int != 7 {
		t.Fatalf("got %+v %v", v, err)
	}
}

// Every proper prefix of a valid reply is reported as truncated.
func TestDecodeEveryPrefixIsTruncated(t *testing.T) {
	full := "*4\r\n:1\r\n$3\r\nabc\r\n*2\r\n+OK\r\n$-1\r\n-MOVED 1 127.0.0.1:7000\r\n"
	for i := 0; i < len(full); i++ {
		_, _, err := Decode([]byte(full[:i]))
		if !errors.Is(err, ErrTruncated) {
			t.Errorf("prefix %q: got %v, want truncated", full[:i], err)
		}
	}
	if _, n, err := Decode([]byte(full)); err != nil || n != len(full) {
		t.Fatalf("full: %d %v", n, err)
	}
}

func TestDecoderReuseZeroAlloc(t *testing.T) {
	in := []byte("*6\r\n:1\r\n:100\r\n:99\r\n:36000000\r\n:0\r\n*2\r\n:5\r\n$2\r\nab\r\n")
	var d Decoder
	if _, _, err := d.Decode(in); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		v, _, err := d.Decode(in)
		if err != nil || len(v.Elems) != 6 || v.Elems[5].Elems[1].Str[1] != 'b' {
			panic("bad decode")
		}
	})
	if allocs != 0 {
		t.Fatalf("Decode allocated %v times per run, want 0", allocs)
	}
}

// A later decode through the same Decoder must not corrupt the caller's view
// of an earlier, smaller reply only through documented reuse: values decoded
// from the same bytes twice are equal.
func TestDecoderReuseIsConsistent(t *testing.T) {
	var d Decoder
	a := []byte("*2\r\n*1\r\n:1\r\n*2\r\n:2\r\n:3\r\n")
	v1, _, _ := d.Decode(a)
	want := Value{Type: Array, Elems: []Value{
		{Type: Array, Elems: []Value{{Type: Integer, Int: 1}}},
		{Type: Array, Elems: []Value{{Type: Integer, Int: 2}, {Type: Integer, Int: 3}}},
	}}
	if !equal(v1, want) {
		t.Fatalf("got %+v", v1)
	}
	if _, _, err := d.Decode([]byte("*1\r\n:9\r\n")); err != nil {
		t.Fatal(err)
	}
	v2, _, _ := d.Decode(a)
	if !equal(v2, want) {
		t.Fatalf("second decode got %+v", v2)
	}
}

func TestClassify(t *testing.T) {
	cases := map[string]ErrorCode{
		"NOSCRIPT No matching script. Please use EVAL.":   CodeNoScript,
		"MOVED 3999 127.0.0.1:6381":                       CodeMoved,
		"ASK 3999 127.0.0.1:6381":                         CodeAsk,
		"CLUSTERDOWN The cluster is down":                 CodeClusterDown,
		"TRYAGAIN Multiple keys request during rehashing": CodeTryAgain,
		"LOADING Redis is loading the dataset in memory":  CodeLoading,
		"BUSY Redis is busy running a script.":            CodeBusy,
		"WRONGTYPE Operation against a key":               CodeWrongType,
		"NOAUTH Authentication required.":                 CodeNoAuth,
		"WRONGPASS invalid username-password pair":        CodeWrongPass,
		"NOPERM this user has no permissions":             CodeNoPerm,
		"READONLY You can't write against a replica.":     CodeReadOnly,
		"CROSSSLOT Keys in request don't hash":            CodeCrossSlot,
		"OOM command not allowed":                         CodeOOM,
		"ERR unknown command":                             CodeErr,
		"NOSCRIPTX":                                       CodeOther,
		"":                                                CodeOther,
		"moved 1 a:1":                                     CodeOther,
	}
	for msg, want := range cases {
		if got := Classify([]byte(msg)); got != want {
			t.Errorf("Classify(%q) = %v, want %v", msg, got, want)
		}
	}
	v, _, _ := Decode([]byte("-NOSCRIPT No matching script\r\n"))
	var re *ReplyError
	if err := v.Err(); !errors.As(err, &re) || re.Code != CodeNoScript || err.Error() != "redis: NOSCRIPT No matching script" {
		t.Fatalf("Err() = %v", err)
	}
	if (Value{Type: Integer}).Err() != nil {
		t.Fatal("non-error value has Err")
	}
	if CodeClusterDown.String() != "CLUSTERDOWN" || CodeOther.String() != "OTHER" || ErrorCode(200).String() != "OTHER" {
		t.Fatal("String")
	}
}

func TestRedirect(t *testing.T) {
	code, slot, addr, ok := Redirect([]byte("MOVED 3999 127.0.0.1:6381"))
	if !ok || code != CodeMoved || slot != 3999 || string(addr) != "127.0.0.1:6381" {
		t.Fatalf("got %v %d %q %v", code, slot, addr, ok)
	}
	code, slot, addr, ok = Redirect([]byte("ASK 0 [::1]:7000"))
	if !ok || code != CodeAsk || slot != 0 || string(addr) != "[::1]:7000" {
		t.Fatalf("got %v %d %q %v", code, slot, addr, ok)
	}
	for _, bad := range []string{"MOVED", "MOVED ", "MOVED 16384 a:1", "MOVED -1 a:1", "MOVED x a:1", "MOVED 1", "MOVED 1 ", "ERR x", "MOVEDX 1 a:1"} {
		if _, _, _, ok := Redirect([]byte(bad)); ok {
			t.Errorf("Redirect(%q) ok", bad)
		}
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		"+OK\r\n", "-NOSCRIPT No matching script\r\n", "-MOVED 3999 127.0.0.1:6381\r\n",
		":1\r\n", ":-9223372036854775808\r\n", "$5\r\nhello\r\n", "$-1\r\n", "$0\r\n\r\n",
		"*-1\r\n", "*0\r\n", "*6\r\n:1\r\n:100\r\n:99\r\n:36000000\r\n:0\r\n:0\r\n",
		"*2\r\n*1\r\n:1\r\n$-1\r\n", "*3\r\n:1\r\n", "$10\r\nabc\r\n", "%1\r\n+a\r\n+b\r\n",
		"*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n", "*999999999999\r\n", "$999999999999999999999\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var d Decoder
		v, n, err := d.Decode(in)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) || (!errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed)) {
				t.Fatalf("error of wrong kind: %v", err)
			}
			if se.Offset < 0 || se.Offset > len(in) {
				t.Fatalf("offset %d out of range", se.Offset)
			}
			return
		}
		if n <= 0 || n > len(in) {
			t.Fatalf("consumed %d of %d", n, len(in))
		}
		// Re-encoding the decoded value and decoding it again gives the
		// same value.
		out := AppendValue(nil, v)
		v2, n2, err := Decode(out)
		if err != nil || n2 != len(out) || !equal(v, v2) {
			t.Fatalf("round trip of %q: %q %v", in[:n], out, err)
		}
		if v.Type == Error {
			Redirect(v.Str)
			_ = v.Err()
		}
	})
}

var sink Value

func BenchmarkEncodeEvalSHA(b *testing.B) {
	buf := make([]byte, 0, 256)
	key := []byte("sluice:{api-per-key:203.0.113.7}:tb")
	b.ReportAllocs()
	for b.Loop() {
		p := AppendArrayHeader(buf[:0], 8)
		p = AppendBulkString(p, "EVALSHA")
		p = AppendBulkString(p, "0123456789abcdef0123456789abcdef01234567")
		p = AppendBulkString(p, "1")
		p = AppendBulk(p, key)
		p = AppendBulkInt(p, 100)
		p = AppendBulkInt(p, 3600000000)
		p = AppendBulkInt(p, 100)
		p = AppendBulkInt(p, 1)
		buf = p
	}
}

func BenchmarkDecodeDecision(b *testing.B) {
	in := []byte("*6\r\n:1\r\n:100\r\n:99\r\n:36000000\r\n:0\r\n:0\r\n")
	var d Decoder
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		v, _, err := d.Decode(in)
		if err != nil {
			b.Fatal(err)
		}
		sink = v
	}
}

func BenchmarkDecodeBulk4K(b *testing.B) {
	in := AppendBulk(nil, bytes.Repeat([]byte("x"), 4096))
	var d Decoder
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		v, _, err := d.Decode(in)
		if err != nil {
			b.Fatal(err)
		}
		sink = v
	}
}

// Helpers for the tests: the package itself encodes commands piece by piece (the guest
// appends into reused buffers) and decodes with a Decoder it keeps.

// Decode decodes the first reply in b with a fresh Decoder.
func Decode(b []byte) (Value, int, error) {
	var d Decoder
	return d.Decode(b)
}

// AppendCommand appends a command: an array of bulk strings, one per argument.
func AppendCommand(dst []byte, args ...string) []byte {
	dst = AppendArrayHeader(dst, len(args))
	for _, a := range args {
		dst = AppendBulkString(dst, a)
	}
	return dst
}

// AppendCommandBytes is AppendCommand for byte-slice arguments.
func AppendCommandBytes(dst []byte, args ...[]byte) []byte {
	dst = AppendArrayHeader(dst, len(args))
	for _, a := range args {
		dst = AppendBulk(dst, a)
	}
	return dst
}
