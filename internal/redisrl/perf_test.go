package redisrl

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// The per-request pieces of a Redis-backed decision in the guest: the key,
// the EVALSHA and the reply (filter/redis_backend.go).

var (
	benchBytes  []byte
	benchResult Result
	benchBatch  Batch
)

func BenchmarkAppendKey(b *testing.B) {
	buf := make([]byte, 0, MaxKeyLen)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendKey(buf[:0], algorithms.FixedWindow, "api-per-key", "203.0.113.7")
	}
	benchBytes = buf
}

func BenchmarkAppendEvalSHA(b *testing.B) {
	buf := make([]byte, 0, 512)
	r := Request{Kind: algorithms.FixedWindow, Params: algorithms.Params{Limit: 100, Window: time.Minute},
		Key: []byte("sluice:{api-per-key|203.0.113.7}:fw2"), Cost: 1}
	b.ReportAllocs()
	for b.Loop() {
		buf = r.AppendEvalSHA(buf[:0])
	}
	benchBytes = buf
}

func BenchmarkAppendEvalSHABatch(b *testing.B) {
	buf := make([]byte, 0, 512)
	r := Request{Kind: algorithms.TokenBucket, Params: algorithms.Params{Limit: 1000, Window: time.Second, Burst: 50},
		Key: []byte("sluice:{api-per-key|203.0.113.7}:tb2"), Cost: 1, N: 3}
	b.ReportAllocs()
	for b.Loop() {
		buf = r.AppendEvalSHA(buf[:0])
	}
	benchBytes = buf
}

var benchReply = []byte("*7\r\n:1\r\n:100\r\n:99\r\n:59123456\r\n:0\r\n:1764556800123456\r\n:17\r\n")

// BenchmarkParseReply is what the guest does with a single decision's
// reply (filter's redisState.onReply).
func BenchmarkParseReply(b *testing.B) {
	var d resp.Decoder
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if benchResult, err = ParseReplyBytes(&d, benchReply); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseBatchReply is what the guest does with a queued key's
// reply (filter's redisState.onQueueReply).
func BenchmarkParseBatchReply(b *testing.B) {
	var d resp.Decoder
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if benchBatch, err = ParseBatchReplyBytes(&d, benchReply, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseReplyGeneric is the path of any reply fastInts does not
// read: resp's decoder, then ParseReply.
func BenchmarkParseReplyGeneric(b *testing.B) {
	var d resp.Decoder
	b.ReportAllocs()
	for b.Loop() {
		v, err := d.Parse(benchReply)
		if err != nil {
			b.Fatal(err)
		}
		if benchResult, err = ParseReply(v); err != nil {
			b.Fatal(err)
		}
	}
}

// refBulk and refCall are the commands as the wire format spells them,
// written plainly (strconv, one argument at a time): the bytes the
// package sent before its per-request work was cut, which it must keep.
func refBulk(dst []byte, s string) []byte {
	dst = append(dst, '$')
	dst = strconv.AppendInt(dst, int64(len(s)), 10)
	return append(append(append(dst, "\r\n"...), s...), "\r\n"...)
}

func refCall(cmd, script string, key []byte, args ...int64) []byte {
	dst := append([]byte{'*'}, strconv.Itoa(4+len(args))...)
	dst = append(dst, "\r\n"...)
	dst = refBulk(dst, cmd)
	dst = refBulk(dst, script)
	dst = refBulk(dst, "1")
	dst = refBulk(dst, string(key))
	for _, a := range args {
		dst = refBulk(dst, strconv.FormatInt(a, 10))
	}
	return dst
}

// TestCommandBytesUnchanged pins the bytes of the decision and lease
// commands against refCall over a table of requests.
func TestCommandBytesUnchanged(t *testing.T) {
	kinds := []algorithms.Kind{algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.FixedWindow,
		algorithms.SlidingLog, algorithms.SlidingWindow}
	params := []algorithms.Params{
		{Limit: 1, Window: time.Microsecond},
		{Limit: 100, Window: time.Minute, Burst: 20},
		{Limit: 9, Window: 10 * time.Second, Burst: 10},
		{Limit: 4294967295, Window: 4294967296 * time.Microsecond, Burst: 4294967296},
		{Limit: 1 << 53, Window: 1<<53*time.Microsecond + 999, Burst: 999999999999999999},
		{Limit: math.MaxInt64, Window: time.Duration(math.MaxInt64), Burst: math.MaxInt64},
	}
	refunds := []*Result{nil, {Stamp: 1764556800123456, Ref: 17}, {Stamp: 0, Ref: 0}, {Stamp: 9, Ref: 10}}
	counts := []int64{1, 7, 10, 99, 100, 1000000000, math.MaxInt64}
	nows := []int64{0, 1, -1, 1764556800123456, math.MinInt64}
	ns := []int64{0, 1, 2, 10, 128}
	key := []byte("sluice:{api-per-key|203.0.113.7}:tb2")
	var buf []byte
	cases := 0
	for _, k := range kinds {
		s := ScriptFor(k)
		for pi, p := range params {
			burst := p.Limit
			if p.Burst != 0 && (k == algorithms.TokenBucket || k == algorithms.LeakyBucket) {
				burst = p.Burst
			}
			win := int64(p.Window / time.Microsecond)
			for i := range 8 {
				r := Request{Kind: k, Params: p, Key: key, Cost: counts[(i+pi)%len(counts)],
					Now: nows[(i+2*pi)%len(nows)], N: ns[(i+pi)%len(ns)], Refund: refunds[i%len(refunds)]}
				args := []int64{p.Limit, win, burst, r.Cost, r.Now}
				switch {
				case r.Refund != nil:
					args = append(args, 1, r.Refund.Stamp, r.Refund.Ref)
				case r.N > 1:
					args = append(args, 0, 0, 0, r.N)
				default:
					args = append(args, 0, 0, 0)
				}
				if buf = r.AppendEvalSHA(buf[:0]); !bytes.Equal(buf, refCall("EVALSHA", s.SHA1, key, args...)) {
					t.Fatalf("%+v: EVALSHA\n%q\nwant\n%q", r, buf, refCall("EVALSHA", s.SHA1, key, args...))
				}
				if buf = r.AppendEval(buf[:0]); !bytes.Equal(buf, refCall("EVAL", s.Source, key, args...)) {
					t.Fatalf("%+v: EVAL differs", r)
				}
				cases++
			}
		}
	}
	for _, k := range []algorithms.Kind{algorithms.TokenBucket, algorithms.FixedWindow} {
		for i, p := range params {
			r := LeaseRequest{Kind: k, Params: p, Key: key, N: counts[i], Instances: int64(i), Now: nows[i%len(nows)],
				Return: i%2 == 1, Stamp: nows[(i+3)%len(nows)]}
			burst, alg := p.Limit, "fw"
			if k == algorithms.TokenBucket {
				alg = "tb"
				if p.Burst > 0 {
					burst = p.Burst
				}
			}
			ret := int64(0)
			if r.Return {
				ret = 1
			}
			want := refCall("EVALSHA", LeaseScript.SHA1, key, p.Limit, int64(p.Window/time.Microsecond), burst, r.N, r.Now,
				ret, r.Stamp, max(r.Instances, 1))
			want = refBulk(want, alg)
			want[2] = '3' // 13 elements: refCall counted 12, without alg
			if buf = r.AppendEvalSHA(buf[:0]); !bytes.Equal(buf, want) {
				t.Fatalf("%+v: lease EVALSHA\n%q\nwant\n%q", r, buf, want)
			}
			cases++
		}
	}
	if cases != 5*len(params)*8+2*len(params) {
		t.Fatalf("%d cases", cases)
	}
}

// TestKeyTemplate holds KeyTemplate.Append to AppendKey.
func TestKeyTemplate(t *testing.T) {
	parts := []string{"", "a", "api-per-key", "203.0.113.7", "with space", "x{y}", "p|q", "#", "é",
		strings.Repeat("k", maxRawPart), strings.Repeat("k", maxRawPart+1), "\x00", "\x7f~!"}
	var buf []byte
	for k := algorithms.Kind(0); k <= algorithms.SlidingWindow+1; k++ {
		for _, rule := range parts {
			tpl := NewKeyTemplate(k, rule)
			for _, key := range parts {
				want := AppendKey(nil, k, rule, key)
				if buf = tpl.Append(buf[:0], key); !bytes.Equal(buf, want) {
					t.Fatalf("%v %q %q: %q, want %q", k, rule, key, buf, want)
				}
			}
		}
	}
	var zero KeyTemplate
	if got, want := zero.Append(nil, "k"), AppendKey(nil, 0, "", "k"); !bytes.Equal(got, want) {
		t.Fatalf("zero template: %q, want %q", got, want)
	}
	tpl := NewKeyTemplate(algorithms.FixedWindow, "api-per-key")
	buf = make([]byte, 0, MaxKeyLen)
	if a := testing.AllocsPerRun(100, func() { buf = tpl.Append(buf[:0], "203.0.113.7") }); a != 0 {
		t.Fatalf("Append allocated %v times", a)
	}
}

// checkSameParse holds ParseReplyBytes and ParseBatchReplyBytes to the
// decoder followed by ParseReply / ParseBatchReply for one input.
func checkSameParse(t *testing.T, in []byte) {
	t.Helper()
	var d, d2 resp.Decoder
	got, err := ParseReplyBytes(&d, in)
	var want Result
	v, werr := d2.Parse(in)
	if werr == nil {
		want, werr = ParseReply(v)
	}
	if got != want || (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("%q: ParseReplyBytes %+v %v, want %+v %v", in, got, err, want, werr)
	}
	for _, n := range []int64{1, 2, 5} {
		gb, err := ParseBatchReplyBytes(&d, in, n)
		var wb Batch
		v, werr := d2.Parse(in)
		if werr == nil {
			wb, werr = ParseBatchReply(v, n)
		}
		if gb != wb || (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
			t.Fatalf("%q n=%d: ParseBatchReplyBytes %+v %v, want %+v %v", in, n, gb, err, wb, werr)
		}
	}
}

var sameParseSeeds = []string{
	"*7\r\n:1\r\n:100\r\n:99\r\n:59123456\r\n:0\r\n:1764556800123456\r\n:17\r\n",
	"*7\r\n:0\r\n:100\r\n:0\r\n:3600000000\r\n:36000000\r\n:1700000000000000\r\n:0\r\n",
	"*7\r\n:2\r\n:100\r\n:97\r\n:5\r\n:0\r\n:1\r\n:3\r\n",
	"*7\r\n:1\r\n:100\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
	"*7\r\n:1\r\n:100\r\n:1\r\n:9223372036854775807\r\n:0\r\n:0\r\n:0\r\n",
	"*7\r\n:1\r\n:100\r\n:1\r\n:999999999999999999\r\n:0\r\n:0\r\n:0\r\n",
	"*7\r\n:1\r\n:100\r\n:1\r\n:9999999999999999999\r\n:0\r\n:0\r\n:0\r\n",
	"*7\r\n:1\r\n:0100\r\n:00\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
	"*7\r\n:1\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\r\n+OK\r\n",
	"*7\r\n:1\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\r",
	"*7\r\n:1\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:\r\n",
	"*7\r\n:1\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\n\n",
	"*7\r\n:1\r\n$3\r\n100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\r\n",
	"*6\r\n:1\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n",
	"*8\r\n:1\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\r\n:1\r\n",
	"*07\r\n:1\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\r\n",
	"-NOSCRIPT No matching script. Please use EVAL.\r\n",
	"-ERR x\r\n", "*-1\r\n", ":1\r\n", "", "*7\r\n", "*7\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n",
}

func TestParseReplyBytesSame(t *testing.T) {
	for _, s := range sameParseSeeds {
		checkSameParse(t, []byte(s))
	}
	var d resp.Decoder
	if a := testing.AllocsPerRun(100, func() { benchResult, _ = ParseReplyBytes(&d, benchReply) }); a != 0 {
		t.Fatalf("ParseReplyBytes allocated %v times", a)
	}
}

func FuzzParseReplyBytes(f *testing.F) {
	for _, s := range sameParseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkSameParse)
}

// BenchmarkKeyTemplate is the key as the guest builds it (the rule's
// template built at configure).
func BenchmarkKeyTemplate(b *testing.B) {
	buf := make([]byte, 0, MaxKeyLen)
	tpl := NewKeyTemplate(algorithms.FixedWindow, "api-per-key")
	b.ReportAllocs()
	for b.Loop() {
		buf = tpl.Append(buf[:0], "203.0.113.7")
	}
	benchBytes = buf
}
