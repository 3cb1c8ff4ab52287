package rls

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// Charging denied requests (Options.ChargeDenied, sluice serve
// --charge-denied): envoyproxy/ratelimit's Redis fixed-window cache adds
// every descriptor's hits_addend to its window's counter (INCRBY) and then
// decides each descriptor from the count after the addition, so a denied
// request is charged too, and so is every other descriptor of its call. A
// configured fixed_window limit then keeps one counter per key and window,
// as the peer does: a plain integer at the key chargedKey(…) + ":" + the
// window's start in Unix µs, the window found from the replica's clock (the
// peer's clock too; Redis's TIME is not asked). Adding hits is INCRBY and
// PEXPIREAT sent together (runChargedPlain); the rest (is_negative_hits:
// taking hits away, never below 0; hits 0: a read; more hits than
// maxPlainHits) is chargedScript. Either returns the count; the decision
// is made by the caller: over the limit when count > requests_per_unit.
//
// chargedScript's calling convention: KEYS[1] the window's counter; ARGV[1] the hits (>= 0,
// at most maxChargedCount), ARGV[2] the instant the counter expires, in
// Unix ms (the window's end plus chargedSlack), ARGV[3] "1" to take the
// hits away instead of adding them. Reply: the count after the call. A
// count of 0 leaves no key; hits 0 only read. A count saturates at
// maxChargedCount, so INCRBY never overflows and Lua's doubles stay exact;
// plain INCRBYs (runChargedPlain) may carry it past, and every reply is
// then maxChargedCount.
const chargedScript = `-- sluice fixed_window charged v3
local c, at = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (c and at) or c < 0 or c > 4503599627370496 or at < 1 then
  return redis.error_reply('ERR sluice: bad arguments')
end
local key = KEYS[1]
if c == 0 then
  local n = tonumber(redis.call('GET', key) or '0') or 0
  if n > 4503599627370496 then n = 4503599627370496 end
  return n
end
if ARGV[3] == '1' then
  local n = redis.call('DECRBY', key, c)
  if n <= 0 then redis.call('DEL', key) return 0 end
  if n > 4503599627370496 then n = 4503599627370496 end
  return n
end
local n = redis.call('INCRBY', key, c)
if n > 4503599627370496 then
  n = 4503599627370496
  redis.call('SET', key, '4503599627370496')
end
redis.call('PEXPIREAT', key, at)
return n
`

// chargedSlack keeps a window's counter this long past the window's end,
// so that a replica whose clock is behind Redis's by up to that much
// still finds the count (a clock ahead of Redis's needs no slack: the
// replica moves to the next window's key first).
const chargedSlack = time.Second

// maxChargedCount bounds a charged counter and the hits of one call (2^52):
// a counter saturates there instead of overflowing, and every sum the
// script computes stays exact.
const maxChargedCount = 1 << 52

var chargedSHA = func() string { s := sha1.Sum([]byte(chargedScript)); return hex.EncodeToString(s[:]) }()

// chargedKeySuffix replaces redisrl's "fw2" in a charged counter's key: the
// layouts differ, so a replica with --charge-denied and one without count on
// different keys ("fwc" was the layout of one key per descriptor, holding
// its window's start and count: replicas of the two versions count apart).
const chargedKeySuffix = "fwn"

// chargedKey is the key of a configured fixed_window limit's charged
// counter: redisrl.AppendKey's, with chargedKeySuffix.
func chargedKey(domain, key string) []byte {
	k := redisrl.AppendKey(nil, algorithms.FixedWindow, domain+"/", key)
	return append(k[:len(k)-3], chargedKeySuffix...)
}

// chargedCall is one call of chargedScript.
type chargedCall struct {
	key    []byte // chargedKey's; the window's start is appended per call
	window time.Duration
	hits   int64 // clamped to maxChargedCount
	now    int64 // Unix µs
	take   bool  // is_negative_hits
}

// chargedResult is chargedScript's reply, and the wait until the window's
// end.
type chargedResult struct {
	count int64
	left  time.Duration
}

// windowStart is the start, in Unix µs, of the window holding c.now, and
// the wait from now until its end.
func (c *chargedCall) windowStart() (ws int64, left time.Duration) {
	w := int64(c.window / time.Microsecond)
	ws = c.now - c.now%w
	if c.now < 0 {
		ws = c.now - (c.now%w+w)%w
	}
	return ws, time.Duration(ws+w-c.now) * time.Microsecond
}

func (c *chargedCall) appendCall(dst []byte, cmd, script string) []byte {
	key, at := c.windowKey()
	dst = resp.AppendArrayHeader(dst, 7)
	dst = resp.AppendBulkString(dst, cmd)
	dst = resp.AppendBulkString(dst, script)
	dst = resp.AppendBulkString(dst, "1")
	dst = resp.AppendBulkString(dst, key)
	dst = resp.AppendBulkInt(dst, c.hits)
	dst = resp.AppendBulkInt(dst, at)
	take := "0"
	if c.take {
		take = "1"
	}
	return resp.AppendBulkString(dst, take)
}

// AppendEvalSHA and AppendEval make chargedCall a scriptCall.
func (c *chargedCall) AppendEvalSHA(dst []byte) []byte {
	return c.appendCall(dst, "EVALSHA", chargedSHA)
}
func (c *chargedCall) AppendEval(dst []byte) []byte { return c.appendCall(dst, "EVAL", chargedScript) }

// runCharged runs c: when it adds hits (1 to maxPlainHits), as the plain
// commands INCRBY and PEXPIREAT sent together (envoyproxy/ratelimit's
// pipeline, and as cheap for Redis: a script call costs Redis several
// times the two commands); otherwise chargedScript (EVALSHA; EVAL after
// NOSCRIPT). expireFailed counts a PEXPIREAT that failed after its INCRBY
// counted: the decision stands (the hits were added), the key may outlive
// its window.
func runCharged(ctx context.Context, b Backend, c *chargedCall, noscript, expireFailed func()) (chargedResult, error) {
	_, left := c.windowStart()
	if !c.take && c.hits > 0 && c.hits <= maxPlainHits {
		n, err := runChargedPlain(ctx, b, c, expireFailed)
		if err != nil {
			return chargedResult{}, &errRedis{err}
		}
		return chargedResult{count: n, left: left}, nil
	}
	n, err := runScript(ctx, b, c, noscript, parseChargedReply)
	if err != nil {
		return chargedResult{}, err
	}
	return chargedResult{count: n, left: left}, nil
}

// maxPlainHits bounds the hits runCharged adds with a plain INCRBY. The
// script saturates a counter at maxChargedCount; a plain INCRBY may pass it
// (the count read is then taken as maxChargedCount), by at most
// maxPlainHits a call, which leaves INCRBY's 2^63 out of reach (2^31 calls
// past the saturation, all in one window).
const maxPlainHits = 1 << 32

// runChargedPlain sends INCRBY key hits and PEXPIREAT key at, and returns
// the count INCRBY answered.
func runChargedPlain(ctx context.Context, b Backend, c *chargedCall, expireFailed func()) (int64, error) {
	key, at := c.windowKey()
	cmd := func(name string, arg int64) []byte {
		dst := resp.AppendArrayHeader(make([]byte, 0, 32+len(key)), 3)
		return resp.AppendBulkInt(resp.AppendBulkString(resp.AppendBulkString(dst, name), key), arg)
	}
	cmds := [2][]byte{cmd("INCRBY", c.hits), cmd("PEXPIREAT", at)}
	replies, errs := doPipeline(ctx, b, cmds[:])
	if errs[0] != nil {
		return 0, errs[0]
	}
	v, err := resp.Parse(replies[0])
	if err != nil {
		return 0, fmt.Errorf("redis reply: %w", err)
	}
	if v.Type == resp.Integer {
		v.Int = min(v.Int, maxChargedCount) // past the script's saturation: see maxPlainHits
	}
	n, err := parseChargedReply(v)
	if err == nil && n < 1 {
		err = fmt.Errorf("%w: charged counter: INCRBY of %d answered %d", redisrl.ErrBadReply, c.hits, n)
	}
	if err != nil {
		return 0, err
	}
	set := expireSet(replies[1], errs[1])
	if set == 0 {
		// PEXPIREAT found no key: it ran before the INCRBY (two
		// resends after CLUSTERDOWN may swap), or the key was taken
		// away meanwhile. Once more, now that the INCRBY has counted:
		// a key without an expiry would stay for ever.
		r, err := b.Do(ctx, cmds[1])
		set = expireSet(r, err)
	}
	if set < 0 && expireFailed != nil {
		expireFailed()
	}
	return n, nil
}

// expireSet reads PEXPIREAT's answer: 1 the expiry is set, 0 no such key,
// -1 a failure (no reply, an error reply, or anything else).
func expireSet(reply []byte, err error) int {
	if err != nil {
		return -1
	}
	v, perr := resp.Parse(reply)
	switch {
	case perr != nil || v.Type != resp.Integer:
		return -1
	case v.Int == 0:
		return 0
	}
	return 1
}

// windowKey is the key of the counter of c's window (chargedKey's, ":",
// the window's start in Unix µs) and the instant it expires, in Unix ms
// (the window's end plus chargedSlack, rounded up).
func (c *chargedCall) windowKey() (key string, at int64) {
	ws, left := c.windowStart()
	end := time.Duration(c.now)*time.Microsecond + left + chargedSlack
	return string(c.key) + ":" + strconv.FormatInt(ws, 10), int64((end + time.Millisecond - 1) / time.Millisecond)
}

func parseChargedReply(v resp.Value) (int64, error) {
	if v.Type == resp.Error {
		return 0, v.Err()
	}
	if v.Type != resp.Integer {
		return 0, fmt.Errorf("%w: charged counter: %s", redisrl.ErrBadReply, v.Type)
	}
	if v.Int < 0 || v.Int > maxChargedCount {
		return 0, fmt.Errorf("%w: charged counter: count %d", redisrl.ErrBadReply, v.Int)
	}
	return v.Int, nil
}

// wholeSeconds is envoyproxy/ratelimit's duration_until_reset for a window
// ending left from now: unit − (now in whole seconds mod unit), i.e. left
// rounded up to the second.
func wholeSeconds(left time.Duration) time.Duration {
	return (left + time.Second - 1) / time.Second * time.Second
}

// CheckChargeDenied reports an error naming the first configured limit that
// --charge-denied cannot apply to: every limit with a counter must be a
// fixed_window (the counter envoyproxy/ratelimit keeps); the others keep no
// count of hits that a denied request could be added to.
func (c *Config) CheckChargeDenied() error {
	if c == nil {
		return nil
	}
	var bad []string
	c.eachLimit(func(key string, l *Limit) {
		if !l.Unlimited && l.Kind != algorithms.FixedWindow {
			bad = append(bad, key+" ("+l.Kind.String()+")")
		}
	})
	if len(bad) > 0 {
		return fmt.Errorf("--charge-denied applies to fixed_window limits only (envoyproxy/ratelimit's counters); not to %s", strings.Join(bad, ", "))
	}
	return nil
}

// clampHits bounds a charged call's hits (see maxChargedCount).
func clampHits(h int64) int64 { return min(max(h, 0), maxChargedCount) }
