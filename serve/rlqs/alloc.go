package rlqs

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
	"github.com/sluice-proxy/sluice/serve/rls"
)

// The allocation script. One key per bucket (hash-tagged on the bucket, so
// one slot), a hash holding the current window's pool and one ledger per
// participant (a stream of one Envoy):
//
//	w        start of the window the pool belongs to (µs)
//	T        tokens taken from the pool in this window
//	t:<id>   tokens granted to the participant in this window (plus what
//	         its reports showed it admitted beyond them)
//	u:<id>   requests it reported allowed in this window
//	r:<id>   its demand: allowed + denied per second, smoothed
//	x:<id>   when its grants can no longer be spent (µs): the TTL of the
//	         last assignment it was sent, plus a grace
//	l:<id>   when it last reported (µs)
//
// and, for a stream that names its Envoy (continue.go), the fields that let
// another replica continue the participant when the Envoy's stream moves:
//
//	o:<id>   the stream that owns the participant
//	s:<id>   its assignment after the call: "kind ws size used nanos
//	         replaced sent interval" (kind T token bucket, D deny; times µs)
//	c:<client>.<bucket>  the participant the Envoy's stream last used
//
// Invariant: t:<id> ≥ what the participant admitted in the window plus what
// it can still admit, so T ≥ everything the window's tokens can admit, and
// the script never lets T exceed the limit by a grant. A grant is taken
// from the pool and never put back unless it is known unspent: t − u
// returns when the caller proves the participant's bucket empty (every
// admission it made is then reported), and the part of a replaced bucket
// that cannot have been spent returns after the replacement (credit). A participant whose grants
// expired (x passed: silent, killed, or reconnected as another stream)
// leaves the demand sum at once, but its t − u stays taken until the
// window ends: what it admitted after its last report is never reported,
// so none of it can be known unspent.
//
// Calling convention (one key, twenty-two arguments, decimal integers but
// ARGV[4], ARGV[13..15]):
//
//	ARGV[1]  limit: tokens per window (≥ 1)
//	ARGV[2]  window in µs
//	ARGV[3]  now in Unix µs; 0 = Redis TIME
//	ARGV[4]  participant id
//	ARGV[5]  allowed: requests the report says were allowed
//	ARGV[6]  denied
//	ARGV[7]  elapsed µs the report covers; 0 = no report (a window push)
//	ARGV[8]  window start of the participant's current assignment; -1 none
//	ARGV[9]  tokens the current assignment may still hold (an upper bound)
//	ARGV[10] tokens known unspent, to return to the pool (at most t − u);
//	         -1: the current assignment is proven empty (all of t − u)
//	ARGV[11] the participant's reporting interval in µs
//	ARGV[12] µs after now until the participant's grants are unspendable
//	ARGV[13] the owning stream ('' for a stream that names no Envoy: no
//	         ownership, no state, no index; ARGV[14..22] unused)
//	ARGV[14] the c: index field (client.bucket)
//	ARGV[15] the current assignment's kind: T, D or '' (none)
//	ARGV[16..20] its size, used, fill-interval nanos, replaced, µs since sent
//	ARGV[21] the nanos of a new grant
//	ARGV[22] what a new grant's replaced bucket holds at most (its Held)
//
// A call of an owning stream for a participant another stream took over
// (continue.go) is refused: ERR sluice: rlqs participant taken.
//
// Reply: {window_start, left_us, grant, taken, participants, demand_milli, now}
// grant > 0 is a new bucket of that many tokens the caller must send (it
// replaces the current one); 0: keep the current assignment (or, without
// one in this window, deny until the window's end); -1: revoke the current
// one (DENY_ALL): the pool holds more than the limit, which was lowered.
const allocBody = `
local L, W, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local id = ARGV[4]
local a, d, el = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local cws, held, credit = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local I, ex = tonumber(ARGV[11]), tonumber(ARGV[12])
if not (L and W and now and a and d and el and cws and held and credit and I and ex) or L < 1 or W < 1 or now < 0
  or a < 0 or d < 0 or el < 0 or I < 1 or ex < 1 or id == '' then
  return redis.error_reply('ERR sluice: bad rlqs arguments')
end
` + luaNow + `
local key = KEYS[1]
local ws = now - (now % W)
local left = ws + W - now
local flat = redis.call('HGETALL', key)
local f = {}
for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
local owner = ARGV[13] or ''
if owner ~= '' and f['o:' .. id] ~= nil and f['o:' .. id] ~= owner then
  return redis.error_reply('ERR sluice: rlqs participant taken')
end
local function num(x) return string.format('%.17g', x) end
local T = tonumber(f['T']) or 0
-- A new window when the pool's began before this one: a pool of a smaller
-- unit (the limit's unit grew) lies inside this window and keeps its count.
local fresh = (tonumber(f['w']) or -1) < ws
if fresh then T = 0 end
local del = {}
local function drop(k) if f[k] ~= nil then del[#del + 1] = k; f[k] = nil end end
local ids, cs = {}, {}
for k, _ in pairs(f) do
  local p2 = string.sub(k, 1, 2)
  if p2 == 'x:' then ids[#ids + 1] = string.sub(k, 3) elseif p2 == 'c:' then cs[#cs + 1] = k end
end
local n, sumr = 0, 0
for _, p in ipairs(ids) do
  if (tonumber(f['x:' .. p]) or 0) < now then
    drop('t:' .. p) drop('u:' .. p)
    if p ~= id then drop('r:' .. p) drop('x:' .. p) drop('l:' .. p) drop('s:' .. p) drop('o:' .. p) end
  else
    if fresh then drop('t:' .. p) drop('u:' .. p) end
    if p ~= id then n = n + 1; sumr = sumr + (tonumber(f['r:' .. p]) or 0) end
  end
end
for _, k in ipairs(cs) do
  if f['x:' .. f[k]] == nil then drop(k) end
end
if T < 0 then T = 0 end
local t = tonumber(f['t:' .. id]) or 0
local u = (tonumber(f['u:' .. id]) or 0) + a
if u > t then T = T + (u - t); t = u end
if credit < 0 or credit > t - u then credit = t - u end
T = T - credit
t = t - credit
local r = tonumber(f['r:' .. id])
if el > 0 then
  local rate = (a + d) * 1000000 / el
  if r == nil then r = rate else r = (r + rate) / 2 end
end
if r == nil then r = 0 end
n = n + 1
sumr = sumr + r
local h = held
if cws ~= ws then h = -1 end
local avail = L - T
if avail < 0 then avail = 0 end
local g = 0
if h < 0 or h < r * 1.5 * I / 1000000 then
  local floor = math.max(1, math.floor(L / (10 * n)))
  local want = math.max(math.ceil(r * 3 * I / 1000000), floor)
  local fair
  if sumr > 0 then fair = math.floor(avail * r / sumr) else fair = math.floor(avail / n) end
  if fair < floor then fair = floor end
  g = math.min(want, fair, avail)
  if h > 0 and g < 2 * h then g = 0 end
end
-- More taken than the limit allows (it was lowered): a bucket the
-- participant still holds is revoked (DENY_ALL); what it did not spend
-- returns when its next report proves it empty.
if g == 0 and T > L and cws == ws and held > 0 then g = -1 end
if g > 0 then t = t + g; T = T + g end
if #del > 0 then redis.call('HDEL', key, unpack(del)) end
local kv = {'w', num(ws), 'T', num(T), 't:' .. id, num(t), 'u:' .. id, num(u),
  'r:' .. id, num(r), 'x:' .. id, num(now + ex)}
local function set(k, v) kv[#kv + 1] = k; kv[#kv + 1] = v end
if el > 0 then set('l:' .. id, num(now)) end
if owner ~= '' then
  local ck, st = ARGV[15], ''
  if g > 0 then
    local rep = 0
    if cws == ws then rep = tonumber(ARGV[22]) or 0 end
    st = 'T ' .. num(ws) .. ' ' .. num(g) .. ' 0 ' .. ARGV[21] .. ' ' .. num(rep) .. ' ' .. num(now)
  elseif g == 0 and cws == ws and (ck == 'T' or ck == 'D') then
    st = ck .. ' ' .. num(ws) .. ' ' .. ARGV[16] .. ' ' .. ARGV[17] .. ' ' .. ARGV[18] .. ' ' .. ARGV[19] .. ' ' ..
      num(now - (tonumber(ARGV[20]) or 0))
  else
    st = 'D ' .. num(ws) .. ' 0 0 0 0 ' .. num(now)
  end
  set('o:' .. id, owner)
  set('s:' .. id, st .. ' ' .. num(I))
  if ARGV[14] ~= '' then set('c:' .. ARGV[14], id) end
end
redis.call('HSET', key, unpack(kv))
redis.call('PEXPIRE', key, math.floor(math.max(left, ex) / 1000) + 1000)
return {ws, left, g, T, n, math.floor(r * 1000), now}
`

// luaNow sets now to Redis TIME (µs) where the caller passed 0.
const luaNow = `if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end`

var allocSHA = func() string { s := sha1.Sum([]byte(allocBody)); return hex.EncodeToString(s[:]) }()

// Key is the Redis key of a bucket's pool: sluice:{rlqs/<domain>/<key part>}:q.
func Key(domain, keyPart string) string {
	return "sluice:{rlqs/" + domain + "/" + keyPart + "}:q"
}

// Request is one allocation call for one participant of one bucket.
type Request struct {
	Key         string
	Limit       int64
	Window      time.Duration
	Now         time.Time // zero: Redis TIME
	Participant string
	Allowed     uint64
	Denied      uint64
	Elapsed     time.Duration // 0: a push at a window's start, no report
	// CurrentWindow is the window start (Unix µs) of the participant's
	// current assignment, -1 for none (or one that may have expired).
	CurrentWindow int64
	// Held is an upper bound on what the current assignment still holds.
	Held int64
	// Empty: the current assignment is proven empty.
	Empty bool
	// Credit: tokens of replaced assignments known unspent (Empty aside).
	Credit int64
	// Interval is the participant's reporting interval.
	Interval time.Duration
	// Expiry is how long after now the participant's grants may be spent.
	Expiry time.Duration

	// Of a stream that names its Envoy (continue.go); Owner "" otherwise.
	Owner       string
	ClientField string
	// The current assignment: Kind 'T', 'D' or 0; SentAgo since it was sent.
	Kind                 byte
	Size, Used, Replaced int64
	Nanos, NextNanos     int32
	SentAgo              time.Duration
}

// Result is the script's answer.
type Result struct {
	WindowStart  int64 // Unix µs
	Left         time.Duration
	Grant        int64 // > 0: a new bucket of this size
	Revoke       bool  // send DENY_ALL: the limit is below what was taken
	Taken        int64 // the pool's tokens taken in the window, after the call
	Participants int64
	DemandMilli  int64 // the participant's smoothed demand, requests per 1,000 s
	Now          int64 // Unix µs the script decided at
}

// Allocator runs the allocation script on a Redis Cluster.
type Allocator struct {
	Backend  rls.Backend
	NoScript func() // counts EVAL fallbacks (may be nil)
}

func (q *Request) appendCall(dst []byte, cmd, script string) []byte {
	us := func(d time.Duration) int64 { return max(int64(d/time.Microsecond), 1) }
	now := int64(0)
	if !q.Now.IsZero() {
		now = q.Now.UnixMicro()
	}
	el := int64(0)
	if q.Elapsed > 0 {
		el = us(q.Elapsed)
	}
	credit := max(q.Credit, 0)
	if q.Empty {
		credit = -1
	}
	dst = resp.AppendArrayHeader(dst, 3+1+22)
	dst = resp.AppendBulkString(dst, cmd)
	dst = resp.AppendBulkString(dst, script)
	dst = resp.AppendBulkInt(dst, 1)
	dst = resp.AppendBulkString(dst, q.Key)
	for _, v := range []int64{q.Limit, us(q.Window), now} {
		dst = resp.AppendBulkInt(dst, v)
	}
	dst = resp.AppendBulkString(dst, q.Participant)
	for _, v := range []int64{int64(min(q.Allowed, 1<<50)), int64(min(q.Denied, 1<<50)), el, q.CurrentWindow, max(q.Held, 0)} {
		dst = resp.AppendBulkInt(dst, v)
	}
	dst = resp.AppendBulkInt(dst, credit)
	dst = resp.AppendBulkInt(dst, us(q.Interval))
	dst = resp.AppendBulkInt(dst, us(q.Expiry))
	dst = resp.AppendBulkString(dst, q.Owner)
	dst = resp.AppendBulkString(dst, q.ClientField)
	kind := ""
	if q.Kind == 'T' || q.Kind == 'D' {
		kind = string(q.Kind)
	}
	dst = resp.AppendBulkString(dst, kind)
	for _, v := range []int64{q.Size, q.Used, int64(q.Nanos), q.Replaced, max(int64(q.SentAgo/time.Microsecond), 0), int64(q.NextNanos), max(q.Held, 0)} {
		dst = resp.AppendBulkInt(dst, v)
	}
	return dst
}

var errBadReply = errors.New("rlqs: malformed script reply")

// eval runs a script, EVALSHA first and EVAL after NOSCRIPT; build makes
// the command of either ("EVALSHA" with the digest, "EVAL" with the body).
// An error reply is an error.
func (a *Allocator) eval(ctx context.Context, build func(cmd, script string) []byte, sha, body string) (resp.Value, error) {
	do := func(cmd []byte) (resp.Value, error) {
		reply, err := a.Backend.Do(ctx, cmd)
		if err != nil {
			return resp.Value{}, err
		}
		v, err := resp.Parse(reply)
		if err != nil {
			return resp.Value{}, err
		}
		if v.IsError() {
			return resp.Value{}, v.Err()
		}
		return v, nil
	}
	v, err := do(build("EVALSHA", sha))
	if err != nil && redisrl.IsNoScript(err) {
		if a.NoScript != nil {
			a.NoScript()
		}
		v, err = do(build("EVAL", body))
	}
	return v, err
}

// Allocate runs one allocation (EVALSHA, EVAL after NOSCRIPT). Any error
// means no decision was applied that the caller learns of: the caller
// sends no new assignment (the Envoy keeps its current one until its TTL).
func (a *Allocator) Allocate(ctx context.Context, q *Request) (Result, error) {
	if q.Limit < 1 || q.Window <= 0 || q.Participant == "" || strings.ContainsAny(q.Participant+q.Owner+q.ClientField, "\r\n ") {
		return Result{}, fmt.Errorf("rlqs: bad allocation request")
	}
	v, err := a.eval(ctx, func(cmd, script string) []byte { return q.appendCall(nil, cmd, script) }, allocSHA, allocBody)
	if err != nil {
		return Result{}, err
	}
	if v.Type != resp.Array || len(v.Elems) != 7 {
		return Result{}, errBadReply
	}
	var n [7]int64
	for i, e := range v.Elems {
		if e.Type != resp.Integer {
			return Result{}, errBadReply
		}
		n[i] = e.Int
	}
	if n[1] <= 0 || n[2] < -1 || n[3] < 0 {
		return Result{}, fmt.Errorf("%w: %s", errBadReply, strconv.FormatInt(n[2], 10))
	}
	revoke := n[2] == -1
	return Result{WindowStart: n[0], Left: time.Duration(n[1]) * time.Microsecond, Grant: max(n[2], 0), Revoke: revoke, Taken: n[3],
		Participants: n[4], DemandMilli: n[5], Now: n[6]}, nil
}
