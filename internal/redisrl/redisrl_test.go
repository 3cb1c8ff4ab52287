package redisrl

import (
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/internal/resp"
)

func TestScripts(t *testing.T) {
	seen := map[string]bool{}
	for _, k := range algorithms.Kinds {
		s := ScriptFor(k)
		if s == nil || s.Kind != k {
			t.Fatalf("no script for %v", k)
		}
		sum := sha1.Sum([]byte(s.Source))
		if s.SHA1 != hex.EncodeToString(sum[:]) || seen[s.SHA1] {
			t.Errorf("%v: bad or duplicate SHA1 %s", k, s.SHA1)
		}
		seen[s.SHA1] = true
		if !strings.Contains(s.Source, "redis.call('TIME')") || !(strings.Contains(s.Source, "PEXPIRE") || strings.Contains(s.Source, "'PX'")) {
			t.Errorf("%v: script does not read TIME or set an expiry", k)
		}
		// No closure is created per decision: a function defined in the
		// script is allocated again on every EVALSHA. The one exception is
		// a peek's read-only redis.call, made for peeks only.
		peek := strings.Index(s.Source, "if op == '4' then")
		if n := strings.Count(s.Source, "function"); n > 1 || n == 1 && (peek < 0 || strings.Index(s.Source, "function") < peek) {
			t.Errorf("%v: script defines a function outside a peek", k)
		}
	}
	if ScriptFor(0) != nil || ScriptFor(99) != nil {
		t.Error("script for an invalid kind")
	}
}

func TestKeys(t *testing.T) {
	k := AppendKey(nil, algorithms.TokenBucket, "api-per-key", "203.0.113.7")
	if string(k) != "sluice:{api-per-key|203.0.113.7}:tb2" {
		t.Fatalf("got %q", k)
	}
	// Lease keys keep v1's names (their state is still a hash).
	if k := AppendLeaseKey(nil, algorithms.FixedWindow, "r", "k"); string(k) != "sluice:{r|k}:fwl" || len(k) > MaxLeaseKeyLen {
		t.Fatalf("lease key %q", k)
	}
	if k := AppendLeaseKey(nil, algorithms.TokenBucket, "r", "k"); string(k) != "sluice:{r|k}:tbl" {
		t.Fatalf("lease key %q", k)
	}
	if KeyLen(algorithms.TokenBucket, "api-per-key", "203.0.113.7") != len(k) {
		t.Fatal("KeyLen")
	}
	// IPv6 and header values with ':' stay readable.
	if k := AppendKey(nil, algorithms.FixedWindow, "r", "2001:db8::1"); string(k) != "sluice:{r|2001:db8::1}:fw2" {
		t.Fatalf("got %q", k)
	}
	// Unsafe or long parts are hashed: bounded, tag intact, unambiguous.
	long := strings.Repeat("x", 10_000)
	cases := [][2]string{
		{"r", long}, {"r", "a}b"}, {"r", "a{b"}, {"r", "a|b"}, {"a|b", "c"}, {"a", "b|c"}, {"r", "#x"},
		{"r", "with space"}, {"r", "\x00\xff"}, {"r", ""}, {"", "k"}, {strings.Repeat("r", 97), "k"},
	}
	keys := map[string]bool{}
	for _, c := range cases {
		for _, kind := range algorithms.Kinds {
			key := AppendKey(nil, kind, c[0], c[1])
			if len(key) > MaxKeyLen || KeyLen(kind, c[0], c[1]) != len(key) {
				t.Errorf("%q: key of %d bytes (max %d, KeyLen %d)", c, len(key), MaxKeyLen, KeyLen(kind, c[0], c[1]))
			}
			s := string(key)
			open, close := strings.IndexByte(s, '{'), strings.IndexByte(s, '}')
			if open != len("sluice:") || close != strings.LastIndexByte(s, '}') || strings.Count(s, "{") != 1 {
				t.Errorf("%q: hash tag broken in %q", c, s)
			}
			if keys[s] {
				t.Errorf("%q: key %q collides", c, s)
			}
			keys[s] = true
			// Every algorithm's key of one (rule, key) pair is in the same slot.
			if redistest.Slot(s) != redistest.Slot(string(AppendKey(nil, algorithms.TokenBucket, c[0], c[1]))) {
				t.Errorf("%q: %v key in another slot", c, kind)
			}
		}
	}
}

func TestCommands(t *testing.T) {
	r := &Request{Kind: algorithms.LeakyBucket, Params: algorithms.Params{Limit: 100, Window: time.Hour, Burst: 20},
		Key: []byte("sluice:{r|k}:lb"), Cost: 1}
	v, err := resp.Parse(r.AppendEvalSHA(nil))
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, e := range v.Elems {
		args = append(args, string(e.Str))
	}
	want := []string{"EVALSHA", ScriptFor(algorithms.LeakyBucket).SHA1, "1", "sluice:{r|k}:lb", "100", "3600000000", "20", "1", "0", "0", "0", "0"}
	if strings.Join(args, " ") != strings.Join(want, " ") {
		t.Fatalf("EVALSHA args %q\nwant %q", args, want)
	}
	// Refund of an earlier admission; burst is ignored by window algorithms.
	r = &Request{Kind: algorithms.SlidingLog, Params: algorithms.Params{Limit: 5, Window: time.Second, Burst: 9},
		Key: []byte("k"), Cost: 2, Now: 77, Refund: &Result{Stamp: 1234, Ref: 3}}
	v, err = resp.Parse(r.AppendEval(nil))
	if err != nil {
		t.Fatal(err)
	}
	args = args[:0]
	for _, e := range v.Elems {
		args = append(args, string(e.Str))
	}
	want = []string{"EVAL", ScriptFor(algorithms.SlidingLog).Source, "1", "k", "5", "1000000", "5", "2", "77", "1", "1234", "3"}
	if strings.Join(args, "|") != strings.Join(want, "|") {
		t.Fatalf("EVAL args %q", args[2:])
	}
	if got := (&Request{Kind: 0}).AppendEvalSHA([]byte("x")); string(got) != "x" {
		t.Fatal("unknown kind appended something")
	}
}

func TestBuildCommandZeroAlloc(t *testing.T) {
	buf := make([]byte, 0, 512)
	keyBuf := make([]byte, 0, MaxKeyLen)
	allocs := testing.AllocsPerRun(1000, func() {
		key := AppendKey(keyBuf[:0], algorithms.SlidingWindow, "api-per-key", "203.0.113.7")
		r := Request{Kind: algorithms.SlidingWindow, Params: algorithms.Params{Limit: 100, Window: time.Minute}, Key: key, Cost: 1}
		buf = r.AppendEvalSHA(buf[:0])
	})
	if allocs != 0 {
		t.Fatalf("building a command allocated %v times, want 0", allocs)
	}
}

func TestParseReply(t *testing.T) {
	good := "*7\r\n:0\r\n:100\r\n:0\r\n:3600000000\r\n:36000000\r\n:1700000000000000\r\n:0\r\n"
	v, _ := resp.Parse([]byte(good))
	res, err := ParseReply(v)
	want := Result{Decision: algorithms.Decision{Limit: 100, ResetAfter: time.Hour, RetryAfter: 36 * time.Second}, Stamp: 1700000000000000}
	if err != nil || res != want {
		t.Fatalf("got %+v %v", res, err)
	}
	bad := map[string]string{
		":1\r\n":             "a integer instead of an array",
		"*-1\r\n":            "array instead of an array",
		"$-1\r\n":            "bulk string instead",
		"*2\r\n:1\r\n:1\r\n": "2 elements instead of 7",
		"*7\r\n:1\r\n:100\r\n$2\r\n99\r\n:0\r\n:0\r\n:0\r\n:0\r\n":             "element 2 is a bulk string",
		"*7\r\n:2\r\n:100\r\n:99\r\n:0\r\n:0\r\n:0\r\n:0\r\n":                  "allowed is 2",
		"*7\r\n:1\r\n:0\r\n:0\r\n:0\r\n:0\r\n:0\r\n:0\r\n":                     "limit is 0",
		"*7\r\n:1\r\n:100\r\n:101\r\n:0\r\n:0\r\n:0\r\n:0\r\n":                 "remaining 101 outside 0..100",
		"*7\r\n:1\r\n:100\r\n:-1\r\n:0\r\n:0\r\n:0\r\n:0\r\n":                  "remaining -1",
		"*7\r\n:1\r\n:100\r\n:1\r\n:-5\r\n:0\r\n:0\r\n:0\r\n":                  "reset/retry after out of range",
		"*7\r\n:1\r\n:100\r\n:1\r\n:9223372036854775807\r\n:0\r\n:0\r\n:0\r\n": "out of range",
		"*7\r\n:1\r\n:100\r\n:1\r\n:5\r\n:5\r\n:0\r\n:0\r\n":                   "retry after on an admitted request",
		"*7\r\n:0\r\n:100\r\n:0\r\n:5\r\n:0\r\n:0\r\n:0\r\n":                   "no retry after on a denied request",
		"*7\r\n:1\r\n:100\r\n:1\r\n:5\r\n:0\r\n:-1\r\n:0\r\n":                  "negative stamp or ref",
	}
	for in, msg := range bad {
		v, err := resp.Parse([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		_, err = ParseReply(v)
		if !errors.Is(err, ErrBadReply) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%q: %v, want %q", in, err, msg)
		}
	}
	for in, code := range map[string]resp.ErrorCode{
		"-NOSCRIPT No matching script. Please use EVAL.\r\n": resp.CodeNoScript,
		"-MOVED 12 127.0.0.1:7000\r\n":                       resp.CodeMoved,
		"-CLUSTERDOWN The cluster is down\r\n":               resp.CodeClusterDown,
		"-ERR sluice: bad arguments\r\n":                     resp.CodeErr,
	} {
		v, _ := resp.Parse([]byte(in))
		_, err := ParseReply(v)
		var re *resp.ReplyError
		if !errors.As(err, &re) || re.Code != code || IsNoScript(err) != (code == resp.CodeNoScript) {
			t.Errorf("%q: %v", in, err)
		}
	}
}

func FuzzParseReply(f *testing.F) {
	f.Add([]byte("*7\r\n:1\r\n:100\r\n:99\r\n:36000000\r\n:0\r\n:1700000000000000\r\n:1\r\n"))
	f.Add([]byte("*7\r\n:0\r\n:100\r\n:0\r\n:3600000000\r\n:36000000\r\n:1700000000000000\r\n:0\r\n"))
	f.Add([]byte("-NOSCRIPT No matching script. Please use EVAL.\r\n"))
	f.Add([]byte("*7\r\n:1\r\n$-1\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var d resp.Decoder
		v, err := d.Parse(in)
		if err != nil {
			return
		}
		res, err := ParseReply(v)
		if err != nil {
			return
		}
		// Whatever passes is a coherent decision.
		if res.Limit < 1 || res.Remaining < 0 || res.Remaining > res.Limit || res.ResetAfter < 0 ||
			res.RetryAfter < 0 || res.Allowed == (res.RetryAfter > 0) {
			t.Fatalf("incoherent result %+v from %q", res, in)
		}
	})
}

// KeyLen returns the length of the key AppendKey builds (the tests hold AppendKey to it).
func KeyLen(k algorithms.Kind, rule, key string) int {
	return len(keyPrefix) + partLen(rule) + 1 + partLen(key) + 2 + len(ScriptFor(k).suffix)
}
