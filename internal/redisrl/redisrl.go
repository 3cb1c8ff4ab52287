// Package redisrl is the Redis side of sluice's rate limiting: one Lua script
// per algorithm, the commands that run them and the parser of their replies.
//
// Each decision is one round trip: EVALSHA of the algorithm's script on the
// one key of the (rule, key) pair, or EVAL with the source when the node
// answers NOSCRIPT. The script reads the time from Redis TIME, so every
// instance sharing the cluster agrees on it, and gives every key it writes a
// PEXPIRE sized to the moment the key becomes equivalent to a fresh one.
// The semantics are those of package algorithms (exact integer arithmetic in
// microseconds), and a conformance test checks the scripts against it.
// One call may also decide N requests of one cost at one instant
// (Request.N, ParseBatchReply): callers coalesce a hot key's concurrent
// decisions so, exactly as the algorithm decides N requests arriving one
// after the other at that instant. A bucket's call may also shape
// (Request.MaxDelay): the script admits a request that fits within the max
// delay into its slot and replies with the wait (Decision.Delay), exactly
// as algorithms.Shaper.DecideDelay on a clock of whole microseconds; such
// a call decides one request (callers do not coalesce it).
//
// Several rules: the keys of different rules live in different slots (and
// nodes), so no single script can see them all. A request matching several
// Redis rules is decided by all of them in parallel (one round trip of
// latency); if every rule admits it, it is admitted and each rule has been
// charged once. If any rule denies it, it is denied, and every rule that
// admitted it is sent a refund (the same Request with Refund set to that
// rule's Result), which undoes exactly that admission. Until the refund
// lands (about one more round trip) the charge is visible to other requests,
// which can only make them more likely to be denied, never admit one too
// many; a refund that fails leaves the charge in place until the window or
// the key's TTL passes. So every rule admits at most its limit, and a denied
// request ends up charged to no rule.
//
// The package is used by the Wasm guest: it depends only on the standard
// library, algorithms and resp, and building a command does not allocate.
package redisrl

import (
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/digest"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// Script is one algorithm's Lua script.
type Script struct {
	Kind   algorithms.Kind
	Source string // the full Lua text, sent by EVAL
	SHA1   string // hex SHA-1 of Source, sent by EVALSHA
	suffix string // key suffix
	lease  string // lease key suffix (AppendLeaseKey)
	// evalSHAHead is the start of an EVALSHA call of 8, 9 and 10
	// arguments, up to its key: array header, "EVALSHA", SHA1, the key
	// count 1.
	evalSHAHead [3]string
}

var scripts [6]Script

func init() {
	for _, s := range []Script{
		{Kind: algorithms.TokenBucket, Source: tokenBucketBody, suffix: "tb2", lease: "tbl"},
		{Kind: algorithms.LeakyBucket, Source: leakyBucketBody, suffix: "lb2", lease: "lbl"},
		{Kind: algorithms.FixedWindow, Source: fixedWindowBody, suffix: "fw2", lease: "fwl"},
		{Kind: algorithms.SlidingLog, Source: slidingLogBody, suffix: "sl", lease: "sll"},
		{Kind: algorithms.SlidingWindow, Source: slidingWindowBody, suffix: "sw2", lease: "swl"},
	} {
		p := strings.Replace(prelude, "if BURST then B = tonumber(ARGV[3]) end\n", "", 1)
		if s.Kind == algorithms.TokenBucket || s.Kind == algorithms.LeakyBucket {
			p = strings.Replace(prelude, "if BURST then B = tonumber(ARGV[3]) end\n", "B = tonumber(ARGV[3])\n", 1)
			p = strings.Replace(p, "local settles = false\n", "local settles = true\n", 1)
		}
		s.Source = "-- sluice " + s.Kind.String() + " v2\n" + p + s.Source
		sum := digest.SHA1([]byte(s.Source))
		s.SHA1 = hex.EncodeToString(sum[:])
		for i := range s.evalSHAHead {
			s.evalSHAHead[i] = string(appendCallHead(nil, "EVALSHA", s.SHA1, 8+i))
		}
		scripts[s.Kind] = s
	}
}

// ScriptFor returns the script of algorithm k, or nil for an unknown Kind.
func ScriptFor(k algorithms.Kind) *Script {
	if int(k) >= len(scripts) || scripts[k].Source == "" {
		return nil
	}
	return &scripts[k]
}

// The scripts' arithmetic is exact only for parameters within
// config.RedisParams's bounds (a window of whole microseconds, limit or
// burst × window in µs below 2^53). Those bounds live in package config,
// which applies them to every Redis rule, so that `sluice check --redis`
// and the module refuse the same configurations.

// Key layout: "sluice:{<rule>|<key>}:<alg>", <alg> one of tb2, lb2, fw2,
// sw2 (a string value: the "2" marks the layout that replaced v1's hashes,
// whose keys ended in tb, lb, fw, sw) and sl (a sorted set, unchanged
// since v1). The braces make the whole
// (rule, key) pair the cluster hash tag. A part is written as is when it is
// at most maxRawPart bytes of printable ASCII other than the characters
// with a meaning here ({ } | #); otherwise it is replaced by '#' and the
// first 16 bytes of its SHA-256 in hex, so keys are bounded (< 220 bytes),
// never ambiguous and never break the hash tag.
const (
	keyPrefix  = "sluice:{"
	maxRawPart = 96
	hashedPart = 1 + 32
	// MaxKeyLen bounds the length of every key AppendKey builds.
	MaxKeyLen = len(keyPrefix) + 2*maxRawPart + len("|}:tb2")
)

// rawByte marks the bytes a part written as is may hold: printable ASCII
// other than { } | #.
var rawByte = func() (t [256]bool) {
	for c := '!'; c < 0x7f; c++ {
		t[c] = c != '{' && c != '}' && c != '|' && c != '#'
	}
	return t
}()

func rawPart(s string) bool {
	if len(s) > maxRawPart {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !rawByte[s[i]] {
			return false
		}
	}
	return true
}

func appendPart(dst []byte, s string) []byte {
	if rawPart(s) {
		return append(dst, s...)
	}
	sum := digest.SHA256([]byte(s))
	dst = append(dst, '#')
	return hex.AppendEncode(dst, sum[:16])
}

func partLen(s string) int {
	if rawPart(s) {
		return len(s)
	}
	return hashedPart
}

// AppendKey appends the Redis key of a (rule, key) pair for algorithm k.
func AppendKey(dst []byte, k algorithms.Kind, rule, key string) []byte {
	dst = appendKeyHead(dst, rule, key)
	if s := ScriptFor(k); s != nil {
		return append(dst, s.suffix...)
	}
	return append(dst, "xx"...)
}

// KeyTemplate holds the parts of one rule's keys for one algorithm that do
// not depend on the request's key, built once (NewKeyTemplate), so that
// building a key per request (Append) only checks and copies the key.
// The zero KeyTemplate appends what AppendKey appends for rule "" and an
// unknown Kind.
type KeyTemplate struct {
	head string // "sluice:{<rule>|"
	tail string // "}:<alg>"
}

// NewKeyTemplate returns the template of rule's keys for algorithm k.
func NewKeyTemplate(k algorithms.Kind, rule string) KeyTemplate {
	t := KeyTemplate{head: string(appendPart([]byte(keyPrefix), rule)) + "|", tail: "}:xx"}
	if s := ScriptFor(k); s != nil {
		t.tail = "}:" + s.suffix
	}
	return t
}

// Append appends the key of the pair (the template's rule, key): the bytes
// AppendKey appends for them.
func (t *KeyTemplate) Append(dst []byte, key string) []byte {
	if t.head == "" {
		return AppendKey(dst, 0, "", key)
	}
	dst = append(dst, t.head...)
	dst = appendPart(dst, key)
	return append(dst, t.tail...)
}

// appendKeyHead appends a key up to its suffix: "sluice:{<rule>|<key>}:".
func appendKeyHead(dst []byte, rule, key string) []byte {
	dst = append(dst, keyPrefix...)
	dst = appendPart(dst, rule)
	dst = append(dst, '|')
	dst = appendPart(dst, key)
	return append(dst, '}', ':')
}

// Request is one call of a script.
type Request struct {
	Kind   algorithms.Kind
	Params algorithms.Params // Burst 0 means Limit
	// Key is the Redis key (AppendKey).
	Key []byte
	// Cost is the number of units the request takes (>= 1).
	Cost int64
	// Now is the time in Unix microseconds. Zero (always, in production)
	// makes the script read Redis TIME; tests set it to pin instants.
	Now int64
	// Refund, when set, undoes the admission this earlier reply reported
	// (same Kind, Params, Key and Cost) instead of deciding.
	Refund *Result
	// N > 1 decides N requests of Cost each in one call, as if they came
	// one after the other at the same instant (ParseBatchReply reads the
	// reply); 0 and 1 decide one. Not with Refund.
	N int64
	// Settle, when not zero, settles a token budget's reservation instead
	// of deciding (token_bucket and leaky_bucket): delta = actual −
	// reserved, charged when positive (the key may go into debt), refunded
	// when negative, exactly as algorithms.Settler.Settle on the clock of
	// whole µs (see the scripts). Cost, N, Refund and MaxDelay are
	// ignored; ParseReply reads the reply (a refund's). |Settle| is at
	// most algorithms.MaxSettle.
	Settle int64
	// Peek asks for the decision of one request of Cost without keeping
	// it (op 4): the reply is the one that decision would get, and nothing
	// is written. N and MaxDelay are ignored; not with Refund or Settle.
	Peek bool
	// MaxDelay > 0 shapes the decision (token_bucket and leaky_bucket):
	// a request that fits within MaxDelay, rounded down to whole µs, is
	// admitted into its slot with Decision.Delay the wait until it
	// (algorithms.Shaper.DecideDelay); the reply has the delay (ParseReply
	// reads it). Not with N > 1 or Refund; ignored for the other
	// algorithms and below a microsecond.
	MaxDelay time.Duration
}

// shapes reports whether r's call carries a max delay (ARGV[10]).
func (r *Request) shapes() bool {
	return r.MaxDelay >= time.Microsecond && r.Refund == nil && r.Settle == 0 && r.N <= 1 && !r.Peek &&
		(r.Kind == algorithms.TokenBucket || r.Kind == algorithms.LeakyBucket)
}

// AppendEvalSHA appends the EVALSHA command of r.
func (r *Request) AppendEvalSHA(dst []byte) []byte {
	s := ScriptFor(r.Kind)
	if s == nil {
		return dst
	}
	return r.appendCall(dst, "EVALSHA", s.SHA1, &s.evalSHAHead)
}

// AppendEval appends the EVAL command of r (the fallback after NOSCRIPT).
func (r *Request) AppendEval(dst []byte) []byte {
	s := ScriptFor(r.Kind)
	if s == nil {
		return dst
	}
	return r.appendCall(dst, "EVAL", s.Source, nil)
}

// appendCall appends the call of r's script; heads, when not nil, holds
// the call's start for 8, 9 and 10 arguments (Script.evalSHAHead).
func (r *Request) appendCall(dst []byte, cmd, script string, heads *[3]string) []byte {
	burst := r.Params.Burst
	if burst == 0 || (r.Kind != algorithms.TokenBucket && r.Kind != algorithms.LeakyBucket) {
		burst = r.Params.Limit
	}
	args := 8
	switch {
	case r.Settle != 0, r.Peek && r.Refund == nil:
	case r.shapes():
		args = 10
	case r.N > 1 && r.Refund == nil:
		args = 9
	}
	head := ""
	if heads != nil {
		head = heads[args-8]
	}
	if head != "" {
		dst = append(dst, head...)
	} else {
		dst = appendCallHead(dst, cmd, script, args)
	}
	if r.Settle != 0 {
		// op 2 charges |delta|, op 3 refunds it; no stamp, no ref.
		op, n := "$1\r\n2\r\n", r.Settle
		if n < 0 {
			op, n = "$1\r\n3\r\n", -n
		}
		dst = appendScriptArgs(dst, r.Key, r.Params, burst, n, r.Now)
		dst = append(dst, op...)
		return append(dst, "$1\r\n0\r\n$1\r\n0\r\n"...)
	}
	dst = appendScriptArgs(dst, r.Key, r.Params, burst, r.Cost, r.Now)
	if r.Refund == nil {
		// Three "0": not a refund, no stamp, no ref (a peek's op is "4").
		if r.Peek {
			dst = append(dst, "$1\r\n4\r\n$1\r\n0\r\n$1\r\n0\r\n"...)
		} else {
			dst = append(dst, "$1\r\n0\r\n$1\r\n0\r\n$1\r\n0\r\n"...)
		}
		switch args {
		case 9:
			dst = resp.AppendBulkInt(dst, r.N)
		case 10:
			dst = append(dst, "$1\r\n1\r\n"...) // n = 1
			dst = resp.AppendBulkInt(dst, int64(r.MaxDelay/time.Microsecond))
		}
		return dst
	}
	dst = append(dst, "$1\r\n1\r\n"...)
	dst = resp.AppendBulkInt(dst, r.Refund.Stamp)
	return resp.AppendBulkInt(dst, r.Refund.Ref)
}

// appendScriptHead appends the start of a script call with args arguments
// (EVALSHA sha / EVAL source, one key), its key and the five arguments every
// script begins with: limit, window in µs, burst, a count (the cost of a
// decision, the n of a lease call) and now.
func appendScriptHead(dst []byte, cmd, script string, args int, key []byte, p algorithms.Params, burst, count, now int64) []byte {
	dst = appendCallHead(dst, cmd, script, args)
	return appendScriptArgs(dst, key, p, burst, count, now)
}

// appendCallHead appends the start of a script call with args arguments,
// up to its key: the array header, cmd, script and the key count 1.
func appendCallHead(dst []byte, cmd, script string, args int) []byte {
	dst = resp.AppendArrayHeader(dst, 3+1+args)
	dst = resp.AppendBulkString(dst, cmd)
	dst = resp.AppendBulkString(dst, script)
	return append(dst, "$1\r\n1\r\n"...)
}

// appendScriptArgs appends a script call's key and the five arguments
// every script begins with (appendScriptHead).
func appendScriptArgs(dst []byte, key []byte, p algorithms.Params, burst, count, now int64) []byte {
	dst = resp.AppendBulk(dst, key)
	dst = resp.AppendBulkInt(dst, p.Limit)
	dst = resp.AppendBulkInt(dst, int64(p.Window/time.Microsecond))
	dst = resp.AppendBulkInt(dst, burst)
	dst = resp.AppendBulkInt(dst, count)
	return resp.AppendBulkInt(dst, now)
}

// Result is a script's reply.
type Result struct {
	algorithms.Decision
	// Stamp is the effective time of the decision (Unix µs, Redis clock).
	Stamp int64
	// Ref is the handle a refund of this admission needs.
	Ref int64
}

// ReplyLen is the number of integers in a script's reply; DelayReplyLen
// in the reply to a call with a max delay (Request.MaxDelay), whose
// eighth integer is the delay.
const (
	ReplyLen      = 7
	DelayReplyLen = 8
)

// ErrBadReply is wrapped by every error about a reply of the wrong shape.
var ErrBadReply = errors.New("redisrl: unexpected script reply")

func badReply(msg string) error { return &replyError{msg} }

type replyError struct{ msg string }

func (e *replyError) Error() string { return "redisrl: unexpected script reply: " + e.msg }
func (e *replyError) Unwrap() error { return ErrBadReply }

// replyInts checks that v is a script's reply, an array of ReplyLen
// integers (both scripts, decision and lease, answer with one), and returns
// them; an error reply is returned as v.Err().
func replyInts(v resp.Value) ([ReplyLen]int64, error) {
	var n [ReplyLen]int64
	all, err := replyIntsN(v, ReplyLen)
	copy(n[:], all[:ReplyLen])
	return n, err
}

// replyIntsN is replyInts for a reply of k integers (ReplyLen or
// DelayReplyLen).
func replyIntsN(v resp.Value, k int) ([DelayReplyLen]int64, error) {
	var n [DelayReplyLen]int64
	if v.Type == resp.Error {
		return n, v.Err()
	}
	if v.Type != resp.Array || v.Null {
		return n, badReply("a " + v.Type.String() + " instead of an array")
	}
	if len(v.Elems) != k {
		return n, badReply(strconv.Itoa(len(v.Elems)) + " elements instead of " + strconv.Itoa(k))
	}
	for i, e := range v.Elems {
		if e.Type != resp.Integer {
			return n, badReply("element " + strconv.Itoa(i) + " is a " + e.Type.String())
		}
		n[i] = e.Int
	}
	return n, nil
}

// ParseReply converts a script's reply into a Result. An error reply is
// returned as a *resp.ReplyError (check NOSCRIPT with IsNoScript); anything
// that is not an array of ReplyLen integers with values in range is an
// error wrapping ErrBadReply.
func ParseReply(v resp.Value) (Result, error) {
	n, err := replyIntsN(v, ReplyLen)
	if err != nil {
		return Result{}, err
	}
	return decision(n, -1)
}

// ParseReplyFor is ParseReply for the reply to r's call: with a max delay
// (r.MaxDelay), an array of DelayReplyLen integers whose delay (0 ..
// r.MaxDelay, and 0 for a denial) is the Decision's Delay; a reply without
// it, or with a delay out of that range, is an error wrapping ErrBadReply.
func ParseReplyFor(v resp.Value, r *Request) (Result, error) {
	k := r.replyLen()
	n, err := replyIntsN(v, k)
	if err != nil {
		return Result{}, err
	}
	return decision(n, r.maxDelayUS(k))
}

// replyLen is the number of integers in the reply to r's call.
func (r *Request) replyLen() int {
	if r.shapes() {
		return DelayReplyLen
	}
	return ReplyLen
}

// maxDelayUS is the longest delay a reply of k integers to r may carry
// (-1: none, the reply has no delay).
func (r *Request) maxDelayUS(k int) int64 {
	if k == ReplyLen {
		return -1
	}
	return int64(r.MaxDelay / time.Microsecond)
}

// ParseReplyBytes is d.Parse(b) then ParseReply: the same result and the
// same errors. The usual reply, an array of ReplyLen integers of 1 to 18
// digits without sign, is read straight from b (fastInts); any other
// goes through d.
func ParseReplyBytes(d *resp.Decoder, b []byte) (Result, error) {
	if n, ok := fastInts(b, ReplyLen); ok {
		return decision(n, -1)
	}
	v, err := d.Parse(b)
	if err != nil {
		return Result{}, err
	}
	return ParseReply(v)
}

// ParseReplyBytesFor is d.Parse(b) then ParseReplyFor(v, r), read as
// ParseReplyBytes does.
func ParseReplyBytesFor(d *resp.Decoder, b []byte, r *Request) (Result, error) {
	k := r.replyLen()
	if n, ok := fastInts(b, k); ok {
		return decision(n, r.maxDelayUS(k))
	}
	v, err := d.Parse(b)
	if err != nil {
		return Result{}, err
	}
	return ParseReplyFor(v, r)
}

// ParseBatchReplyBytes is d.Parse(b) then ParseBatchReply(v, n), read as
// ParseReplyBytes does.
func ParseBatchReplyBytes(d *resp.Decoder, b []byte, n int64) (Batch, error) {
	if ints, ok := fastInts(b, ReplyLen); ok {
		return batch(ints, n)
	}
	v, err := d.Parse(b)
	if err != nil {
		return Batch{}, err
	}
	return ParseBatchReply(v, n)
}

// fastInts reads b when it is exactly "*<k>\r\n" and k lines
// ":<digits>\r\n" of 1 to 18 digits (no sign: the values fit an int64 and
// resp's decoder reads them the same); ok is false for anything else.
func fastInts(b []byte, k int) (n [DelayReplyLen]int64, ok bool) {
	if len(b) < 4+4*k || b[0] != '*' || b[1] != '0'+byte(k) || b[2] != '\r' || b[3] != '\n' {
		return n, false
	}
	i := 4
	for e := 0; e < k; e++ {
		if i >= len(b) || b[i] != ':' {
			return n, false
		}
		i++
		start := i
		var v uint64
		for i < len(b) && b[i]-'0' < 10 {
			v = v*10 + uint64(b[i]-'0')
			i++
		}
		if d := i - start; d == 0 || d > 18 || i+1 >= len(b) || b[i] != '\r' || b[i+1] != '\n' {
			return n, false
		}
		n[e] = int64(v)
		i += 2
	}
	return n, i == len(b)
}

// decision checks a script's reply's integers and converts them; maxDelay
// is the longest delay (µs) the eighth may say, -1 when the reply has
// none.
func decision(n [DelayReplyLen]int64, maxDelay int64) (Result, error) {
	const maxDur = int64(1<<63-1) / int64(time.Microsecond)
	switch {
	case n[0] != 0 && n[0] != 1:
		return Result{}, badReply("allowed is " + strconv.FormatInt(n[0], 10))
	case n[1] < 1:
		return Result{}, badReply("limit is " + strconv.FormatInt(n[1], 10))
	case n[2] < 0 || n[2] > n[1]:
		return Result{}, badReply("remaining " + strconv.FormatInt(n[2], 10) + " outside 0.." + strconv.FormatInt(n[1], 10))
	case n[3] < 0 || n[3] > maxDur || n[4] < 0 || n[4] > maxDur:
		return Result{}, badReply("reset/retry after out of range")
	case n[0] == 1 && n[4] != 0:
		return Result{}, badReply("retry after on an admitted request")
	case n[0] == 0 && n[4] == 0:
		return Result{}, badReply("no retry after on a denied request")
	case n[5] < 0 || n[6] < 0:
		return Result{}, badReply("negative stamp or ref")
	case maxDelay >= 0 && (n[7] < 0 || n[7] > maxDelay):
		return Result{}, badReply("delay " + strconv.FormatInt(n[7], 10) + "µs outside 0.." + strconv.FormatInt(maxDelay, 10))
	case n[0] == 0 && n[7] != 0:
		return Result{}, badReply("delay on a denied request")
	}
	return Result{
		Decision: algorithms.Decision{
			Allowed:    n[0] == 1,
			Limit:      n[1],
			Remaining:  n[2],
			ResetAfter: time.Duration(n[3]) * time.Microsecond,
			RetryAfter: time.Duration(n[4]) * time.Microsecond,
			Delay:      time.Duration(n[7]) * time.Microsecond,
		},
		Stamp: n[5],
		Ref:   n[6],
	}, nil
}

// Batch is the reply of a call deciding N requests (Request.N).
type Batch struct {
	// Admitted is how many of the N requests were admitted: the first
	// Admitted, in order.
	Admitted int64
	// Last holds the reply's fields: Remaining and ResetAfter are those
	// after the admissions, RetryAfter the first denied request's (0 when
	// none was), Ref the first admission's.
	Last Result
}

// ParseBatchReply converts the reply of a call deciding n requests (n >= 1)
// into a Batch, checking it as ParseReply does.
func ParseBatchReply(v resp.Value, n int64) (Batch, error) {
	ints, err := replyIntsN(v, ReplyLen)
	if err != nil {
		return Batch{}, err
	}
	return batch(ints, n)
}

// batch checks the integers of the reply of a call deciding n requests and
// converts them.
func batch(ints [DelayReplyLen]int64, n int64) (Batch, error) {
	a := ints[0]
	if a < 0 || a > n {
		return Batch{}, badReply("admitted " + strconv.FormatInt(a, 10) + " of " + strconv.FormatInt(n, 10))
	}
	// The admitted count aside, the reply is one request's: admitted when
	// all were (no retry after), else denied (a retry after).
	if a == n {
		ints[0] = 1
	} else {
		ints[0] = 0
	}
	r, err := decision(ints, -1)
	if err != nil {
		return Batch{}, err
	}
	return Batch{Admitted: a, Last: r}, nil
}

// At is the decision of the i-th request (0-based) of the batch, each of
// cost c, as the algorithm decides it one after the other at the same
// instant: the first Admitted are admitted, with the remaining each one
// left (Remaining + (Admitted−1−i) × c) and the ref of its own admission;
// the rest are denied with the reply's remaining and retry after. Every
// request gets the reset after of the state after the batch (for the
// buckets at most (Admitted−1−i) × c / rate later than deciding it alone
// would say; the windows' is the same).
func (b *Batch) At(i, c int64) Result {
	r := b.Last
	if i >= b.Admitted {
		if r.RetryAfter == 0 { // cannot happen for a parsed reply
			r.RetryAfter = time.Microsecond
		}
		r.Allowed = false
		return r
	}
	r.Allowed, r.RetryAfter = true, 0
	r.Remaining = min(r.Remaining+(b.Admitted-1-i)*c, r.Limit)
	if r.Ref > 0 {
		r.Ref += i * c
	}
	return r
}

// IsNoScript reports whether err is Redis's NOSCRIPT error: the node does not
// have the script cached, and the caller must send AppendEval instead.
func IsNoScript(err error) bool {
	if err == nil {
		return false
	}
	if re, ok := err.(*resp.ReplyError); ok { // the usual case, without errors.As's allocation
		return re.Code == resp.CodeNoScript
	}
	var re *resp.ReplyError
	return errors.As(err, &re) && re.Code == resp.CodeNoScript
}
