package rls

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
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
// configured fixed_window limit then keeps one counter per key: the count of
// hits its current window has seen, denied or not, which this script adds
// to (or, for is_negative_hits, takes from, never below 0) and returns. The
// decision is made by the caller: over the limit when count >
// requests_per_unit.
//
// Calling convention: KEYS[1] the counter's key (AppendKey's layout with
// the suffix "fwc"); ARGV[1] the window in µs, ARGV[2] the hits (>= 0, at
// most maxChargedCount), ARGV[3] now in Unix µs (0: Redis TIME), ARGV[4] "1"
// to take the hits away instead of adding them. Reply: {count, left_us}, the
// count after the call and the time until the window ends. The state is
// "<window start> <count>" in decimal; a count of 0 leaves no key. Every
// quantity stays below 2^53 (the window within algorithms.MaxWindow, the
// count within maxChargedCount), so Lua's doubles are exact.
const chargedScript = `-- sluice fixed_window charged v1
local W, c, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not (W and c and now) or W < 1 or c < 0 or c > 4503599627370496 or now < 0 then
  return redis.error_reply('ERR sluice: bad arguments')
end
local px = 'PX'
if now == 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  px = 'PXAT'
end
local key = KEYS[1]
local q = math.floor(now / W)
if q * W > now then q = q - 1 elseif (q + 1) * W <= now then q = q + 1 end
local ws = q * W
local count = 0
local v = redis.call('GET', key)
if v then
  local s, n = string.match(v, '^(%d+) (%d+)$')
  if s and tonumber(s) == ws then count = tonumber(n) end
end
local left = ws + W - now
if c == 0 then return {count, left} end
if ARGV[4] == '1' then
  count = count - c
  if count < 0 then count = 0 end
else
  count = count + c
  if count > 4503599627370496 then count = 4503599627370496 end
end
if count == 0 then
  redis.call('DEL', key)
  return {0, left}
end
local x = ws + W
if px == 'PX' then x = left end
local ms = math.floor(x / 1000)
if ms * 1000 < x then ms = ms + 1 end
redis.call('SET', key, string.format('%d %d', ws, count), px, ms + 1)
return {count, left}
`

// maxChargedCount bounds a charged counter and the hits of one call (2^52):
// a counter saturates there instead of overflowing, and every sum the
// script computes stays exact.
const maxChargedCount = 1 << 52

var chargedSHA = func() string { s := sha1.Sum([]byte(chargedScript)); return hex.EncodeToString(s[:]) }()

// chargedKeySuffix replaces redisrl's "fw2" in a charged counter's key: the
// layouts differ, so a replica with --charge-denied and one without count on
// different keys.
const chargedKeySuffix = "fwc"

// chargedKey is the key of a configured fixed_window limit's charged
// counter: redisrl.AppendKey's, with chargedKeySuffix.
func chargedKey(domain, key string) []byte {
	k := redisrl.AppendKey(nil, algorithms.FixedWindow, domain+"/", key)
	return append(k[:len(k)-3], chargedKeySuffix...)
}

// chargedCall is one call of chargedScript.
type chargedCall struct {
	key    []byte
	window time.Duration
	hits   int64 // clamped to maxChargedCount
	now    int64
	take   bool // is_negative_hits
}

// chargedResult is chargedScript's reply.
type chargedResult struct {
	count int64
	left  time.Duration
}

func (c *chargedCall) appendCall(dst []byte, cmd, script string) []byte {
	dst = resp.AppendArrayHeader(dst, 8)
	dst = resp.AppendBulkString(dst, cmd)
	dst = resp.AppendBulkString(dst, script)
	dst = resp.AppendBulkString(dst, "1")
	dst = resp.AppendBulk(dst, c.key)
	dst = resp.AppendBulkInt(dst, int64(c.window/time.Microsecond))
	dst = resp.AppendBulkInt(dst, c.hits)
	dst = resp.AppendBulkInt(dst, c.now)
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

// runCharged runs c (EVALSHA; EVAL after NOSCRIPT).
func runCharged(ctx context.Context, b Backend, c *chargedCall, noscript func()) (chargedResult, error) {
	return runScript(ctx, b, c, noscript, parseChargedReply)
}

func parseChargedReply(v resp.Value) (chargedResult, error) {
	if v.Type == resp.Error {
		return chargedResult{}, v.Err()
	}
	if v.Type != resp.Array || v.Null || len(v.Elems) != 2 || v.Elems[0].Type != resp.Integer || v.Elems[1].Type != resp.Integer {
		return chargedResult{}, fmt.Errorf("%w: charged counter: %s", redisrl.ErrBadReply, v.Type)
	}
	n, left := v.Elems[0].Int, v.Elems[1].Int
	if n < 0 || n > maxChargedCount || left < 1 || left > int64(algorithms.MaxWindow/time.Microsecond) {
		return chargedResult{}, fmt.Errorf("%w: charged counter: count %d, left %d µs", redisrl.ErrBadReply, n, left)
	}
	return chargedResult{count: n, left: time.Duration(left) * time.Microsecond}, nil
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
