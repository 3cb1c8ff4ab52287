package redisrl

// The Lua scripts. Each is the shared prelude followed by one algorithm's
// body, so that the five stay consistent in their arguments, their time
// source, their arithmetic and their reply.
//
// Calling convention (one key, eight or nine arguments, all decimal integers):
//
//	KEYS[1]  the limiter's key (see AppendKey)
//	ARGV[1]  limit            requests per window
//	ARGV[2]  window           in microseconds
//	ARGV[3]  burst            bucket capacity (token/leaky bucket; = limit otherwise)
//	ARGV[4]  cost             units this request takes (>= 1)
//	ARGV[5]  now              Unix microseconds; 0 = Redis TIME (always 0 in production)
//	ARGV[6]  op               0 = decide, 1 = refund an earlier admission
//	ARGV[7]  stamp            refund only: the stamp of the admission's reply
//	ARGV[8]  ref              refund only: the ref of the admission's reply
//	ARGV[9]  n                optional (default 1): decide n requests of cost
//	                          c each, in order, at the one instant (decide only)
//
// Reply: an array of seven integers
//
//	{allowed, limit, remaining, reset_after_us, retry_after_us, stamp_us, ref}
//
// allowed is the number of the n requests admitted (0/1 for one): as n
// requests decided one after the other at the same time, the first allowed
// are admitted and the rest denied, since a denial changes nothing and an
// admission only takes. remaining and reset_after are those of the state
// after the admissions; retry_after that of the first denied request (0 when
// all were admitted); ref that of the first admission (sliding_log: the i-th
// admission's is ref + i × c).
//
// stamp is the effective time of the decision and ref an algorithm-specific
// handle (sliding_log: the index of its first log entry); a refund passes both
// back. Arithmetic is exact: every quantity is an integer below 2^53 (Lua
// numbers are doubles), which config.RedisParams guarantees for the parameters, and
// divisions go through idiv/cdiv, which correct the rounding of a/b.
//
// Numbers go to redis.call as Lua numbers: Redis converts them with "%.17g"
// (fpconv_dtoa since 7.2, also exact), every integer below 2^53 written
// exactly, and read back with tonumber. num (string.format, about 0.5 µs a
// call in Redis's Lua) is only for text built in Lua (sliding_log's member
// names and score bounds). fixed_window rewrites only the count while the
// window is the same.
const prelude = `
local L = tonumber(ARGV[1])
local W = tonumber(ARGV[2])
local B = tonumber(ARGV[3])
local c = tonumber(ARGV[4])
local now = tonumber(ARGV[5])
local op = ARGV[6]
local n = tonumber(ARGV[9] or '1')
if not (L and W and B and c and now and n) or L < 1 or W < 1 or B < 1 or c < 1 or now < 0 or n < 1 or (op ~= '0' and op ~= '1') or (n > 1 and op ~= '0') then
  return redis.error_reply('ERR sluice: bad arguments')
end
local stamp = tonumber(ARGV[7]) or 0
local ref = tonumber(ARGV[8]) or 0
` + clockKeyDiv + `local eff = now
-- late converts a wait measured from eff to one measured from now (they
-- differ when the clock went backwards and the state is ahead of it).
local function late(w) if w > 0 then return w + (eff - now) end return w end
-- expire sets the key to vanish w microseconds after eff (rounded up to
-- milliseconds, plus one for the expiry clock's coarser start).
local function expire(w) redis.call('PEXPIRE', key, cdiv(late(w), 1000) + 1) end
`

// clockKeyDiv follows the argument checks of every script (the
// per-request prelude and the lease script): now from Redis TIME when the
// caller passed 0, the key, and floor and ceiling integer division exact
// for integers below 2^53.
const clockKeyDiv = `if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local key = KEYS[1]
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return -idiv(-a, b) end
`

// token_bucket. State: hash {s = tokens × W (scaled, so refill is exact
// integer arithmetic: dt µs add dt × L), ts = time of s}.
const tokenBucketBody = `
local BW = B * W
local h = redis.call('HMGET', key, 's', 'ts')
local S, last = tonumber(h[1]), tonumber(h[2])
local exists = S ~= nil and last ~= nil
if not exists then S, last = BW, now end
S = math.min(math.max(S, 0), BW)
if last > eff then eff = last end
if eff - last >= cdiv(BW - S, L) then S = BW else S = S + (eff - last) * L end
local cW = c * W
if op == '1' then
  if not exists then return {1, B, B, 0, 0, eff, 0} end
  S = S + cW
  if S > BW then S = BW end
  redis.call('HSET', key, 's', S, 'ts', eff)
  expire(cdiv(BW - S, L))
  return {1, B, idiv(S, W), late(cdiv(BW - S, L)), 0, eff, 0}
end
if c > B then return {0, B, idiv(S, W), late(cdiv(BW - S, L)), W, eff, 0} end
local a = math.min(n, idiv(S, cW))
if a < 1 then
  return {0, B, idiv(S, W), late(cdiv(BW - S, L)), late(cdiv(cW - S, L)), eff, 0}
end
S = S - a * cW
redis.call('HSET', key, 's', S, 'ts', eff)
expire(cdiv(BW - S, L))
local retry = 0
if a < n then retry = late(cdiv(cW - S, L)) end
return {a, B, idiv(S, W), late(cdiv(BW - S, L)), retry, eff, 0}
`

// leaky_bucket (GCRA, virtual scheduling). State: hash {tat, f, ts}: the
// theoretical arrival time is tat + f/L µs (0 <= f < L) and ts the time of the
// last admission. The level, scaled like the token bucket's tokens, is
// (TAT − eff) × L; the bucket holds B × W.
const leakyBucketBody = `
local BW = B * W
local h = redis.call('HMGET', key, 'tat', 'f', 'ts')
local tat, f, last = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
local exists = tat ~= nil and f ~= nil and last ~= nil
if not exists then tat, f, last = now, 0, now end
if last > eff then eff = last end
if tat < eff then tat, f = eff, 0 end
local lv = (tat - eff) * L + f
local function remaining(x) if x > BW then return 0 end return idiv(BW - x, W) end
local cW = c * W
if op == '1' then
  if not exists then return {1, B, B, 0, 0, eff, 0} end
  lv = lv - cW
  if lv < 0 then lv = 0 end
  local q = idiv(lv, L)
  redis.call('HSET', key, 'tat', eff + q, 'f', lv - q * L, 'ts', eff)
  expire(cdiv(lv, L))
  return {1, B, remaining(lv), late(cdiv(lv, L)), 0, eff, 0}
end
if c > B then return {0, B, remaining(lv), late(cdiv(lv, L)), W, eff, 0} end
local a = 0
if lv <= BW then a = math.min(n, idiv(BW - lv, cW)) end
if a < 1 then
  return {0, B, remaining(lv), late(cdiv(lv, L)), late(cdiv(lv + cW - BW, L)), eff, 0}
end
local tot = a * cW
local after = lv + tot
local q = idiv(tot, L)
f = f + (tot - q * L)
if f >= L then f, q = f - L, q + 1 end
tat = tat + q
redis.call('HSET', key, 'tat', tat, 'f', f, 'ts', eff)
expire(cdiv(after, L))
local retry = 0
if a < n then retry = late(cdiv(after + cW - BW, L)) end
return {a, B, remaining(after), late(cdiv(after, L)), retry, eff, 0}
`

// fixed_window. State: hash {w = window start (µs since the epoch, a multiple
// of W), n = admitted in that window}.
const fixedWindowBody = `
local h = redis.call('HMGET', key, 'w', 'n')
local start, count = tonumber(h[1]), tonumber(h[2])
if start == nil or count == nil then start, count = -1, 0 end
if start > eff then eff = start end
local ws = idiv(eff, W) * W
if ws ~= start then count = 0 end
local untilNext = ws + W - eff
if op == '1' then
  if idiv(stamp, W) * W ~= ws or count < c then return {1, L, L - count, 0, 0, eff, 0} end
  count = count - c
  if count == 0 then redis.call('DEL', key) return {1, L, L, 0, 0, eff, 0} end
  redis.call('HSET', key, 'n', count)
  expire(untilNext)
  return {1, L, L - count, late(untilNext), 0, eff, 0}
end
local reset = late(untilNext)
if count == 0 then reset = 0 end
if c > L then return {0, L, math.max(L - count, 0), reset, W, eff, 0} end
local a = math.min(n, idiv(L - count, c))
if a < 1 then return {0, L, math.max(L - count, 0), reset, late(untilNext), eff, 0} end
count = count + a * c
if ws == start then redis.call('HSET', key, 'n', count) else redis.call('HSET', key, 'w', ws, 'n', count) end
expire(untilNext)
local retry = 0
if a < n then retry = late(untilNext) end
return {a, L, L - count, late(untilNext), retry, eff, 0}
`

// sliding_window. State: hash {w = current window start, p = previous
// window's count, n = current window's count}. Estimate at elapsed e:
// p × (W − e)/W + n, compared with L after multiplying through by W.
const slidingWindowBody = `
local h = redis.call('HMGET', key, 'w', 'p', 'n')
local start, prev, cur = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
if start == nil or prev == nil or cur == nil then start, prev, cur = idiv(eff, W) * W, 0, 0 end
if start > eff then eff = start end
local ws = idiv(eff, W) * W
if ws == start + W then prev, cur = cur, 0 elseif ws ~= start then prev, cur = 0, 0 end
start = ws
local e = eff - start
local LW = L * W
local function weighted(p, n) return p * (W - e) + n * W end
local function remaining(p, n)
  local est = weighted(p, n)
  if est > LW then return 0 end
  return idiv(LW - est, W)
end
local function resetAfter(p, n)
  if n > 0 then return start + 2 * W - eff elseif p > 0 then return start + W - eff end
  return 0
end
-- admitFrom: the elapsed time from which p × (W − x)/W <= a.
local function admitFrom(p, a) if p <= a then return 0 end return W - idiv(a * W, p) end
local function save()
  if prev == 0 and cur == 0 then redis.call('DEL', key) return end
  redis.call('HSET', key, 'w', start, 'p', prev, 'n', cur)
  expire(resetAfter(prev, cur))
end
if op == '1' then
  local sw = idiv(stamp, W) * W
  if sw == start and cur >= c then cur = cur - c save()
  elseif sw == start - W and prev >= c then prev = prev - c save() end
  return {1, L, remaining(prev, cur), late(resetAfter(prev, cur)), 0, eff, 0}
end
if c > L then return {0, L, remaining(prev, cur), late(resetAfter(prev, cur)), W, eff, 0} end
local a, room = 0, LW - weighted(prev, cur)
if room >= 0 then a = math.min(n, idiv(room, c * W)) end
if a > 0 then
  cur = cur + a * c
  save()
end
local wait = 0
if a < n then
  if cur + c <= L then
    local at = admitFrom(prev, L - cur - c)
    if at < W then wait = at - e end
  end
  if wait == 0 then wait = start + W + admitFrom(cur, L - c) - eff end
  wait = late(wait)
end
return {a, L, remaining(prev, cur), late(resetAfter(prev, cur)), wait, eff, 0}
`

// sliding_log. State: a sorted set with one member per admitted unit of
// cost, scored by its time in µs and named "<time>:<index>" (indexes at one
// time are consecutive from 1, so names never collide). Entries at or before
// eff − W have expired; they are ignored, and pruned by the next admission.
const slidingLogBody = `
local function num(x) return string.format('%.17g', x) end
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[2] then
  local t = tonumber(newest[2])
  if t > eff then eff = t end
end
local cutoff = eff - W
local live = '(' .. num(cutoff)
if op == '1' then
  for i = ref, ref + c - 1 do redis.call('ZREM', key, num(stamp) .. ':' .. num(i)) end
  local used = redis.call('ZCOUNT', key, live, '+inf')
  return {1, L, math.max(L - used, 0), 0, 0, eff, 0}
end
local used = redis.call('ZCOUNT', key, live, '+inf')
local a = 0
if c <= L and used + c <= L then a = math.min(n, idiv(L - used, c)) end
if a < 1 then
  -- A denial writes nothing (not even the pruning): the state stays exactly
  -- as it was, so a clock that later goes backwards sees it unchanged.
  local reset, retry = 0, W
  if used > 0 then
    local n = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    reset = late(tonumber(n[2]) - cutoff)
  end
  if c <= L then
    local o = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', used + c - L - 1, 1)
    retry = late(tonumber(o[2]) - cutoff)
  end
  return {0, L, math.max(L - used, 0), reset, retry, eff, 0}
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff)
local base = 1
local same = redis.call('ZRANGEBYSCORE', key, eff, eff)
for _, m in ipairs(same) do
  local i = tonumber(string.match(m, ':(%d+)$'))
  if i and i >= base then base = i + 1 end
end
local s = num(eff)
local add, m = {}, 0
for i = base, base + a * c - 1 do
  add[m + 1], add[m + 2], m = s, s .. ':' .. num(i), m + 2
  if m >= 512 then redis.call('ZADD', key, unpack(add, 1, m)) m = 0 end
end
if m > 0 then redis.call('ZADD', key, unpack(add, 1, m)) end
expire(W)
used = used + a * c
local retry = 0
if a < n then
  local o = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', used + c - L - 1, 1)
  retry = late(tonumber(o[2]) - cutoff)
end
return {a, L, L - used, late(W), retry, eff, base}
`
