package redisrl

import (
	"encoding/hex"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/digest"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// Leases (rules[].lease): one call reserves up to N admissions of a
// (rule, key) pair, which the proxy then spends on its own; a second call
// gives back what it did not spend. The admissions are taken from the
// global state when they are reserved, so the admissions of all proxies
// together never exceed what the algorithm allows; what a proxy holds
// unspent is under-admission, returned when its lease ends.
//
// The lease script has its own arguments (it does not share the prelude of
// the per-request scripts, only their clock, and division as functions:
// clockKeyDiv) and keeps its own state under its own key (AppendLeaseKey),
// with the fields of the per-request state of its algorithm in a hash:
// token_bucket {s = tokens × W, ts}, fixed_window {w = window start, n =
// admitted in it} (the per-request scripts pack the same fields into a
// string since v2; a lease call is one per many admissions, so its extra
// PEXPIRE costs little). A rule that gains or loses "lease" therefore
// starts afresh, as after a change of algorithm.
//
// Calling convention (one key, nine arguments, decimal integers but ARGV[9]):
//
//	KEYS[1]  the lease key (AppendLeaseKey)
//	ARGV[1]  limit
//	ARGV[2]  window in µs
//	ARGV[3]  burst (token_bucket; = limit for fixed_window)
//	ARGV[4]  n: acquire: the most admissions wanted; return: how many to give back
//	ARGV[5]  now in Unix µs; 0 = Redis TIME
//	ARGV[6]  op: 0 = acquire, 1 = return
//	ARGV[7]  stamp: return only: the stamp of the acquire's reply
//	ARGV[8]  instances: the proxies sharing the key (redis.instances)
//	ARGV[9]  "tb" or "fw"
//
// Reply: an array of seven integers
//
//	{granted, limit, remaining, reset_after_us, retry_after_us, stamp_us, valid_us}
//
// granted is what was reserved (acquire: 0..n; 0 is a denial, and
// retry_after the wait until an admission is available) or given back
// (return: 0..n). remaining is what the global state still holds after the
// call (not counting any lease), stamp identifies the fixed window the
// admissions belong to, and valid_us is how long the reserved admissions may
// be spent: until the end of the fixed window; 0 (no bound from the
// algorithm) for token_bucket.
//
// Adaptive size: an acquire is granted min(n, ⌈available / instances⌉), so
// near exhaustion every proxy gets a share of what is left instead of the
// first one taking it all, and never more than the key holds.
const leaseBody = `
local L, W, B = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n, now, op = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local stamp, inst, alg = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
if not (L and W and B and n and now and stamp and inst) or L < 1 or W < 1 or B < 1 or n < 1 or now < 0 or inst < 1
  or (op ~= '0' and op ~= '1') or (alg ~= 'tb' and alg ~= 'fw') then
  return redis.error_reply('ERR sluice: bad lease arguments')
end
` + clockKeyDiv + `local function num(x) return string.format('%.17g', x) end
local function grant(avail)
  if avail <= 0 then return 0 end
  local g = cdiv(avail, inst)
  if g > n then g = n end
  return g
end
if alg == 'fw' then
  local h = redis.call('HMGET', key, 'w', 'n')
  local start, count = tonumber(h[1]), tonumber(h[2])
  if start == nil or count == nil then start, count = -1, 0 end
  local eff = now
  if start > eff then eff = start end
  local ws = idiv(eff, W) * W
  if ws ~= start then count = 0 end
  local left = ws + W - now
  if op == '1' then
    if stamp ~= ws or count == 0 then return {0, L, L - count, 0, 0, ws, 0} end
    local k = math.min(n, count)
    count = count - k
    if count == 0 then redis.call('DEL', key) return {k, L, L, 0, 0, ws, 0} end
    redis.call('HSET', key, 'n', num(count))
    return {k, L, L - count, left, 0, ws, 0}
  end
  local g = grant(L - count)
  if g == 0 then return {0, L, 0, left, left, ws, 0} end
  count = count + g
  redis.call('HSET', key, 'w', num(ws), 'n', num(count))
  redis.call('PEXPIRE', key, cdiv(left, 1000) + 1)
  return {g, L, L - count, left, 0, ws, left}
end
local BW = B * W
local h = redis.call('HMGET', key, 's', 'ts')
local S, last = tonumber(h[1]), tonumber(h[2])
local exists = S ~= nil and last ~= nil
if not exists then S, last = BW, now end
S = math.min(math.max(S, 0), BW)
local eff = now
if last > eff then eff = last end
if eff - last >= cdiv(BW - S, L) then S = BW else S = S + (eff - last) * L end
local function save()
  redis.call('HSET', key, 's', num(S), 'ts', num(eff))
  redis.call('PEXPIRE', key, cdiv(cdiv(BW - S, L) + (eff - now), 1000) + 1)
end
if op == '1' then
  if not exists or S >= BW then return {0, B, idiv(S, W), 0, 0, eff, 0} end
  local k = math.min(n, idiv(BW - S, W))
  S = S + k * W
  save()
  return {k, B, idiv(S, W), cdiv(BW - S, L), 0, eff, 0}
end
local g = grant(idiv(S, W))
if g == 0 then return {0, B, 0, cdiv(BW - S, L) + (eff - now), cdiv(W - S, L) + (eff - now), eff, 0} end
S = S - g * W
save()
return {g, B, idiv(S, W), cdiv(BW - S, L) + (eff - now), 0, eff, 0}
`

// LeaseScript is the lease script (both algorithms).
var LeaseScript = func() Script {
	src := "-- sluice lease v1\n" + leaseBody
	sum := digest.SHA1([]byte(src))
	return Script{Source: src, SHA1: hex.EncodeToString(sum[:])}
}()

// LeaseSupported reports whether algorithm k has leases.
func LeaseSupported(k algorithms.Kind) bool {
	return k == algorithms.TokenBucket || k == algorithms.FixedWindow
}

// MaxLeaseKeyLen bounds the length of every key AppendLeaseKey builds.
const MaxLeaseKeyLen = MaxKeyLen + 1

// AppendLeaseKey appends the lease key of a (rule, key) pair for algorithm
// k: "sluice:{<rule>|<key>}:<alg>l" (the same cluster hash tag as the
// per-request key), <alg> the v1 suffix (fw, tb): the lease state is still
// a hash, written by the lease script alone.
func AppendLeaseKey(dst []byte, k algorithms.Kind, rule, key string) []byte {
	dst = appendKeyHead(dst, rule, key)
	if s := ScriptFor(k); s != nil {
		return append(dst, s.lease...)
	}
	return append(dst, "xxl"...)
}

// LeaseRequest is one call of the lease script.
type LeaseRequest struct {
	Kind      algorithms.Kind // TokenBucket or FixedWindow
	Params    algorithms.Params
	Key       []byte // AppendLeaseKey
	N         int64  // acquire: most wanted; return: how many
	Instances int64  // >= 1
	Now       int64  // Unix µs; 0 = Redis TIME (production)
	Return    bool
	Stamp     int64 // return: the acquire's Stamp
}

// AppendEvalSHA appends the EVALSHA command of r.
func (r *LeaseRequest) AppendEvalSHA(dst []byte) []byte {
	return r.appendCall(dst, "EVALSHA", LeaseScript.SHA1)
}

// AppendEval appends the EVAL command of r.
func (r *LeaseRequest) AppendEval(dst []byte) []byte {
	return r.appendCall(dst, "EVAL", LeaseScript.Source)
}

func (r *LeaseRequest) appendCall(dst []byte, cmd, script string) []byte {
	burst, alg := r.Params.Limit, "fw"
	if r.Kind == algorithms.TokenBucket {
		alg = "tb"
		if r.Params.Burst > 0 {
			burst = r.Params.Burst
		}
	}
	dst = appendScriptHead(dst, cmd, script, 9, r.Key, r.Params, burst, r.N, r.Now)
	if r.Return {
		dst = resp.AppendBulkString(dst, "1")
	} else {
		dst = resp.AppendBulkString(dst, "0")
	}
	dst = resp.AppendBulkInt(dst, r.Stamp)
	dst = resp.AppendBulkInt(dst, max(r.Instances, 1))
	return resp.AppendBulkString(dst, alg)
}

// LeaseResult is the lease script's reply.
type LeaseResult struct {
	// Granted is what an acquire reserved or a return gave back.
	Granted int64
	// Decision is the global state after the call: Allowed is Granted > 0,
	// Remaining what the key holds beyond every lease, RetryAfter (when
	// nothing was granted) the wait until the key has an admission.
	algorithms.Decision
	// Stamp is passed back by a return (the fixed window of the admissions).
	Stamp int64
	// Valid is how long reserved admissions may be spent (the end of the
	// fixed window); 0 when the algorithm sets no bound.
	Valid time.Duration
}

// ParseLeaseReply converts the lease script's reply; errors as ParseReply.
func ParseLeaseReply(v resp.Value, n int64) (LeaseResult, error) {
	x, err := replyInts(v)
	if err != nil {
		return LeaseResult{}, err
	}
	const maxDur = int64(1<<63-1) / int64(time.Microsecond)
	switch {
	case x[0] < 0 || x[0] > n:
		return LeaseResult{}, badReply("granted " + strconv.FormatInt(x[0], 10) + " outside 0.." + strconv.FormatInt(n, 10))
	case x[1] < 1:
		return LeaseResult{}, badReply("limit is " + strconv.FormatInt(x[1], 10))
	case x[2] < 0 || x[2] > x[1]:
		return LeaseResult{}, badReply("remaining " + strconv.FormatInt(x[2], 10) + " outside 0.." + strconv.FormatInt(x[1], 10))
	case x[3] < 0 || x[3] > maxDur || x[4] < 0 || x[4] > maxDur || x[6] < 0 || x[6] > maxDur:
		return LeaseResult{}, badReply("durations out of range")
	case x[5] < 0:
		return LeaseResult{}, badReply("negative stamp")
	}
	return LeaseResult{
		Granted: x[0],
		Decision: algorithms.Decision{
			Allowed:    x[0] > 0,
			Limit:      x[1],
			Remaining:  x[2],
			ResetAfter: time.Duration(x[3]) * time.Microsecond,
			RetryAfter: time.Duration(x[4]) * time.Microsecond,
		},
		Stamp: x[5],
		Valid: time.Duration(x[6]) * time.Microsecond,
	}, nil
}
