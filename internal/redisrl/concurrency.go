package redisrl

import (
	"encoding/hex"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/internal/digest"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// The concurrency script: an in-flight limit shared by every proxy of a
// fleet ("algorithm": "concurrency" on backend redis). A key's state is a
// hash: one field per holder (a worker's root context in some proxy, a
// random id), its value "slots expiry_us". An entry past its expiry belongs
// to a holder that stopped renewing — its proxy died, its VM trapped — and
// the next call on the key drops it (reclaimed). The key expires one lease
// after its last write, so a key whose every holder died goes away with them.
//
//	KEYS[1]  the key (AppendConcurrencyKey)
//	ARGV[1]  op      a = acquire n slots (if the live holders hold at most
//	                 limit − n), r = release n, w = renew: this holder holds n
//	                 (0 drops its entry) with a fresh lease
//	ARGV[2]  holder  the holder's id (text)
//	ARGV[3]  limit
//	ARGV[4]  n
//	ARGV[5]  ttl     the lease, µs
//	ARGV[6]  now     Unix µs; 0 = Redis TIME (always, in production)
//
// Reply: {allowed, in_flight, reclaimed, held}: whether the acquire was
// granted (1 for release and renew), the slots every live holder holds
// after the call, the slots of lapsed holders it dropped, and what this
// holder holds after it.
const concurrencyScript = `-- sluice concurrency v1
local key, op, holder = KEYS[1], ARGV[1], ARGV[2]
local L, n, ttl, now = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if not (L and n and ttl and now) or L < 1 or n < 0 or ttl < 1000 or now < 0 or (op ~= 'a' and op ~= 'r' and op ~= 'w') then
  return redis.error_reply('ERR sluice: bad concurrency arguments')
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local all = redis.call('HGETALL', key)
local others, mine, lapsed = 0, 0, 0
for i = 1, #all, 2 do
  local h, v = all[i], all[i + 1]
  local sp = string.find(v, ' ', 1, true)
  local c, e = nil, nil
  if sp then c, e = tonumber(string.sub(v, 1, sp - 1)), tonumber(string.sub(v, sp + 1)) end
  if not (c and e) then
    redis.call('HDEL', key, h)
  elseif h == holder then
    mine = c
  elseif e > now then
    others = others + c
  else
    lapsed = lapsed + c
    redis.call('HDEL', key, h)
  end
end
local allowed = 1
if op == 'a' then
  if others + mine + n > L then allowed = 0 else mine = mine + n end
elseif op == 'r' then
  mine = math.max(mine - n, 0)
else
  mine = n
end
if allowed == 1 then
  if mine > 0 then
    redis.call('HSET', key, holder, string.format('%d %d', mine, now + ttl))
  else
    redis.call('HDEL', key, holder)
  end
end
if others + mine > 0 then
  redis.call('PEXPIRE', key, math.floor(ttl / 1000))
end
return {allowed, others + mine, lapsed, mine}
`

// ConcurrencyScript is the concurrency script's source and SHA-1.
var ConcurrencyScript = func() Script {
	sum := digest.SHA1([]byte(concurrencyScript))
	return Script{Source: concurrencyScript, SHA1: hex.EncodeToString(sum[:])}
}()

// ConcurrencyOp is what a concurrency call does.
type ConcurrencyOp byte

const (
	ConcurrencyAcquire ConcurrencyOp = 'a'
	ConcurrencyRelease ConcurrencyOp = 'r'
	ConcurrencyRenew   ConcurrencyOp = 'w'
)

// ConcurrencyRequest is one call of the concurrency script.
type ConcurrencyRequest struct {
	Key    []byte
	Op     ConcurrencyOp
	Holder uint64
	Limit  int64
	N      int64
	TTL    time.Duration // whole milliseconds, at least 1 ms
	Now    int64         // Unix µs; 0: Redis TIME
}

// AppendConcurrencyKey appends the key of rule's in-flight state for key:
// "sluice:{<rule>|<key>}:cc" (the parts as AppendKey writes them).
func AppendConcurrencyKey(dst []byte, rule, key string) []byte {
	return append(appendKeyHead(dst, rule, key), "cc"...)
}

// AppendEvalSHA appends the EVALSHA command of r.
func (r *ConcurrencyRequest) AppendEvalSHA(dst []byte) []byte {
	return r.appendCall(dst, "EVALSHA", ConcurrencyScript.SHA1)
}

// AppendEval appends the EVAL command of r (the fallback after NOSCRIPT).
func (r *ConcurrencyRequest) AppendEval(dst []byte) []byte {
	return r.appendCall(dst, "EVAL", ConcurrencyScript.Source)
}

func (r *ConcurrencyRequest) appendCall(dst []byte, cmd, script string) []byte {
	dst = appendCallHead(dst, cmd, script, 6) // the key and six arguments
	dst = resp.AppendBulk(dst, r.Key)
	dst = append(dst, "$1\r\n"...)
	dst = append(dst, byte(r.Op), '\r', '\n')
	dst = resp.AppendBulk(dst, strconv.AppendUint(make([]byte, 0, 20), r.Holder, 16))
	dst = resp.AppendBulkInt(dst, r.Limit)
	dst = resp.AppendBulkInt(dst, r.N)
	dst = resp.AppendBulkInt(dst, int64(r.TTL/time.Microsecond))
	return resp.AppendBulkInt(dst, r.Now)
}

// ConcurrencyResult is the concurrency script's reply.
type ConcurrencyResult struct {
	Allowed   bool
	InFlight  int64 // every live holder's slots after the call
	Reclaimed int64 // lapsed holders' slots dropped by the call
	Held      int64 // this holder's slots after the call
}

// ParseConcurrencyReply reads the concurrency script's reply. An error
// reply is returned as v.Err() (check NOSCRIPT with IsNoScript); any other
// shape or a value out of range is an error wrapping ErrBadReply.
func ParseConcurrencyReply(v resp.Value) (ConcurrencyResult, error) {
	if v.Type == resp.Error {
		return ConcurrencyResult{}, v.Err()
	}
	if v.Type != resp.Array || v.Null || len(v.Elems) != 4 {
		return ConcurrencyResult{}, badReply("not an array of 4 integers")
	}
	var n [4]int64
	for i, e := range v.Elems {
		if e.Type != resp.Integer || e.Int < 0 {
			return ConcurrencyResult{}, badReply("element " + strconv.Itoa(i) + " is not a non-negative integer")
		}
		n[i] = e.Int
	}
	if n[0] > 1 || n[3] > n[1] {
		return ConcurrencyResult{}, badReply("inconsistent concurrency reply")
	}
	return ConcurrencyResult{Allowed: n[0] == 1, InFlight: n[1], Reclaimed: n[2], Held: n[3]}, nil
}
