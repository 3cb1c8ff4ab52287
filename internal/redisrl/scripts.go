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
//	ARGV[6]  op               0 = decide, 1 = refund an earlier admission;
//	                          token_bucket and leaky_bucket: 2 = settle a
//	                          charge of cost, 3 = settle a refund of cost;
//	                          4 = peek: decide as 0, write nothing (n = 1)
//	ARGV[7]  stamp            refund only: the stamp of the admission's reply
//	ARGV[8]  ref              refund only: the ref of the admission's reply
//	ARGV[9]  n                optional (default 1): decide n requests of cost
//	                          c each, in order, at the one instant (decide only)
//	ARGV[10] max_delay        optional (default 0), token_bucket and
//	                          leaky_bucket: shape (algorithms.Shaper.DecideDelay)
//	                          with a queue of at most this many µs; 0 = none.
//	                          Only with n = 1 and op 0 (ARGV[9] must be given).
//
// Reply: an array of seven integers
//
//	{allowed, limit, remaining, reset_after_us, retry_after_us, stamp_us, ref}
//
// and, when ARGV[10] is given, an eighth: delay_us, the wait from now until
// the admission's slot (0 for a denial, and for an admission that fits now
// when the key's latest slot is not ahead of now). A request that fits
// within max_delay is admitted into its slot: the state records the
// admission there (its time is the slot, later than now when the request
// waits), so every later decision queues behind it; stamp is the slot. One
// that would wait longer is denied, nothing written, with retry_after its
// wait minus max_delay. The arithmetic is algorithms.DecideDelay's on a
// clock of whole µs: with now in µs and the window in whole µs, DecideDelay
// fed the same numbers as nanoseconds gives these numbers exactly (the
// conformance tests hold the scripts to that). A refund (op 1) of a
// delayed admission gives its cost back at the key's latest slot, its own
// when nothing queued behind it: a key refunded that way decides, from the
// slot on, exactly as if the admission had never been made; requests that
// queued behind it keep their slots.
//
// A peek (op 4) is a decision that is not kept: the body runs as for op 0
// with a redis.call that passes the reads (GET, TIME, ZRANGE, ZCOUNT,
// ZRANGEBYSCORE) and drops every write, so the reply is the one a decision
// would get (remaining and reset_after as the admission would leave them)
// and the key is untouched. It builds one closure, for peeks only.
//
// Settlement (ops 2 and 3, token_bucket and leaky_bucket: a token
// budget's reservation settled once its response ended) applies delta =
// +cost (2: the excess, charged even below zero, the key going into debt)
// or −cost (3: the unused part, refunded up to a full bucket) exactly as
// algorithms.Settler.Settle on the clock of whole µs (the conformance test
// holds the scripts to it, states included): the key's level at now, in
// units where one cost unit is W (the bucket holds B × W; beyond it is
// debt, which a state read at a later eff already counts), charge adds
// cost × W, a refund subtracts it (floored at 0); a level within B × W is
// written at now, one beyond it at now + ⌈(level − B × W)/L⌉, the instant
// the debt is paid back (tokens, TAT and last time as Settle writes them),
// so every decision before that instant is refused with the exact wait.
// That needs L <= W (at most one unit per µs; config refuses a settling
// rule on a remote backend otherwise). A charge deeper than the script holds
// exactly (a level of 2^53 − 1 − L, or a debt of MaxDebtWait) leaves the key
// at that deepest debt, as algorithms.SettleCapped does locally: over-use is
// never dropped. A refund to a key never seen (or expired: fresh) writes
// nothing. The reply is a refund's: {1, B, remaining, reset_after_us, 0,
// eff, 0} with eff the state's new last instant.
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
// The per-request scripts keep each key's state in one plain string value
// of decimal integers separated by spaces (sliding_log: a sorted set), so a
// decision is TIME, one GET and, when it admits, one SET … PX: the write
// and the expiry in one call. A denial writes nothing. The bodies create no
// closures (a Lua function defined in a script is allocated again on every
// EVALSHA) and divide inline: q = ⌊a/b⌋ for 0 <= a < 2^53 is
// math.floor(a / b) corrected down once when q × b > a (the correctly
// rounded quotient is never below the true one's floor and at most one
// above it), ⌈a/b⌉ that plus one when q × b < a. lag is eff − now: a wait
// measured from eff (the state can be ahead of a clock that went back) is
// reported from now by adding it. Text is built with string.format('%d'),
// exact for every integer below 2^53 (Lua's own number-to-string keeps 14
// digits); numbers passed to redis.call are converted by Redis ("%.17g",
// also exact).
const prelude = `
local L, W, c, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4]), tonumber(ARGV[5])
local op, n, B, D = ARGV[6], 1, L, 0
if ARGV[9] then n = tonumber(ARGV[9]) end
if ARGV[10] then D = tonumber(ARGV[10]) end
if BURST then B = tonumber(ARGV[3]) end
local settles = false
if not (L and W and B and c and now and n and D) or L < 1 or W < 1 or B < 1 or c < 1 or now < 0 or n < 1
  or (op ~= '0' and op ~= '1' and op ~= '4' and not (settles and (op == '2' or op == '3'))) or (n > 1 and op ~= '0')
  or D < 0 or D >= 9007199254740992 or (D > 0 and (n > 1 or op ~= '0')) then
  return redis.error_reply('ERR sluice: bad arguments')
end
local redis = redis
if op == '4' then
  op = '0'
  local call, reads = redis.call, {GET = true, TIME = true, ZRANGE = true, ZCOUNT = true, ZRANGEBYSCORE = true}
  redis = {error_reply = redis.error_reply, call = function(cmd, ...)
    if reads[cmd] then return call(cmd, ...) end
    return 0
  end}
end
local px, t0 = 'PX', 0
if now == 0 then px = 'PXAT' end
` + clock + `local floor, eff = math.floor, now
if px == 'PXAT' then t0 = now end
`

// clock follows the argument checks of every script (the per-request
// prelude and the lease script): now from Redis TIME when the caller passed
// 0 (its two strings converted by arithmetic, one strtod each; tonumber
// converts twice), and the key.
const clock = `if now == 0 then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local key = KEYS[1]
`

// clockKeyDiv is clock followed by floor and ceiling integer division
// exact for integers below 2^53, as functions: the lease script's
// beginning (a lease call is one per many admissions, so its closures
// cost little).
const clockKeyDiv = clock + `local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function cdiv(a, b) return -idiv(-a, b) end
`

// settleLevel is the settlement shared by the bucket bodies (ops 2 and 3):
// lv, the level at now, gets cost × W added (2) or taken away (3, floored at
// 0), and w is the wait until a level beyond BW is back to BW (0 when it is
// not beyond). A charge deeper than a state holds exactly — a level of
// 2^53 − 1 − L, or a debt of maxDebtUS — leaves the level there: the key at
// its deepest debt, as algorithms.SettleCapped leaves a local key, rather
// than the charge dropped (a level already deeper is left as it is).
const settleLevel = `  if L > W then return redis.error_reply('ERR sluice: settlement needs a rate of at most one cost unit per microsecond') end
  if op == '2' then
    local top = 9007199254740991 - L
    if ` + maxDebtUS + ` * L < top - BW then top = BW + ` + maxDebtUS + ` * L end
    if lv < top then
      if cW > top - lv then lv = top else lv = lv + cW end
    end
  else
    lv = lv - cW
    if lv < 0 then lv = 0 end
  end
  local w = 0
  if lv > BW then
    local x = lv - BW
    w = floor(x / L)
    if w * L > x then w = w - 1 end
    if w * L < x then w = w + 1 end
    if op == '2' and w > ` + maxDebtUS + ` then return redis.error_reply('ERR sluice: settlement out of range') end
  end
`

// maxDebtUS is algorithms.MaxDebtWait in µs: the longest debt a charge may
// leave.
const maxDebtUS = "3162240000000000"

// token_bucket. State: "<s> <ts>": s = tokens × W (scaled, so refill is
// exact integer arithmetic: dt µs add dt × L), ts = time of s. A refund
// (op 1) is written like an admission of one; a = 1 stands for it.
const tokenBucketBody = `
local BW = B * W
local v = redis.call('GET', key)
local S, last
if v and #v == 16 then S, last = struct.unpack('<dd', v) end
local exists = S ~= nil
if not exists then S, last = BW, now end
if S > BW then S = BW end
if last > eff then eff = last end
local d = eff - last
if d * L >= BW - S then S = BW else S = S + d * L end
local lag, cW, a, retry, dl = eff - now, c * W, 1, 0, 0
if op == '1' then
  if not exists then return {1, B, B, 0, 0, eff, 0} end
  S = S + cW
  if S > BW then S = BW end
elseif op ~= '0' then
  -- Settlement (algorithms.Settle): the level at now, BW - S at eff plus
  -- the refill from now to eff, charged or refunded; in debt beyond BW.
  if op == '3' and not exists then return {1, B, B, 0, 0, eff, 0} end
  local lv = BW - S + lag * L
` + settleLevel + `  S = BW - (lv - w * L)
  eff, lag = now + w, w
elseif c > B then
  a, retry = 0, W
elseif D > 0 then
  -- Shaping: wait until S holds cW; admitted at that slot when the wait
  -- from now is at most D (DecideDelay).
  local x, w = cW - S, 0
  if x > 0 then
    w = floor(x / L)
    if w * L > x then w = w - 1 end
    if w * L < x then w = w + 1 end
  end
  if w + lag > D then
    a, retry = 0, w + lag - D
  else
    if w > 0 then
      if w * L >= BW - S then S = BW else S = S + w * L end
    end
    S = S - cW
    eff = eff + w
    lag = eff - now
    dl = lag
  end
else
  a = floor(S / cW)
  if a * cW > S then a = a - 1 end
  if a > n then a = n end
  if a > 0 then S = S - a * cW end
  if a < n then
    local x = cW - S
    retry = floor(x / L)
    if retry * L > x then retry = retry - 1 end
    if retry * L < x then retry = retry + 1 end
    retry = retry + lag
  end
end
local x = BW - S
local t = floor(x / L)
if t * L > x then t = t - 1 end
if t * L < x then t = t + 1 end
if t > 0 then t = t + lag end
if a > 0 then
  -- The key lives until it is equivalent to a fresh one: t, or, for an
  -- empty (full) bucket whose state is ahead of now (a shaped slot, a
  -- refund of one), until eff: before it, a fresh key would admit at now.
  local x = t0 + t
  if t == 0 then x = t0 + lag end
  local ms = floor(x / 1000)
  if ms * 1000 > x then ms = ms - 1 end
  if ms * 1000 < x then ms = ms + 1 end
  redis.call('SET', key, struct.pack('<dd', S, eff), px, ms + 1)
end
local r = floor(S / W)
if r * W > S then r = r - 1 end
if ARGV[10] then return {a, B, r, t, retry, eff, 0, dl} end
return {a, B, r, t, retry, eff, 0}
`

// leaky_bucket (GCRA, virtual scheduling). State: "<tat> <f> <ts>": the
// theoretical arrival time is tat + f/L µs (0 <= f < L) and ts the time of
// the last admission. The level, scaled like the token bucket's tokens, is
// (TAT − eff) × L; the bucket holds B × W.
const leakyBucketBody = `
local BW = B * W
local v = redis.call('GET', key)
local tat, f, last
if v and #v == 24 then tat, f, last = struct.unpack('<ddd', v) end
local exists = tat ~= nil
if not exists then tat, f, last = now, 0, now end
if last > eff then eff = last end
if tat < eff then tat, f = eff, 0 end
local lv = (tat - eff) * L + f
local lag, cW, a, retry, dl = eff - now, c * W, 1, 0, 0
if op == '1' then
  if not exists then return {1, B, B, 0, 0, eff, 0} end
  lv = lv - cW
  if lv < 0 then lv = 0 end
  local q = floor(lv / L)
  if q * L > lv then q = q - 1 end
  tat, f = eff + q, lv - q * L
elseif op ~= '0' then
  -- Settlement (algorithms.Settle): the level at now, charged or
  -- refunded; TAT = now + level / L, the last time when the debt (beyond
  -- BW) is paid back.
  if op == '3' and not exists then return {1, B, B, 0, 0, eff, 0} end
  lv = lv + lag * L
` + settleLevel + `  local q = floor(lv / L)
  if q * L > lv then q = q - 1 end
  tat, f = now + q, lv - q * L
  eff, lag = now + w, w
  lv = (tat - eff) * L + f
elseif c > B then
  a, retry = 0, W
elseif D > 0 then
  -- Shaping: wait until lv + cW fits; admitted at that slot when the wait
  -- from now is at most D (DecideDelay): the TAT moves to the slot if the
  -- bucket is empty by then, and takes cW / L.
  local x, w = lv + cW - BW, 0
  if x > 0 then
    w = floor(x / L)
    if w * L > x then w = w - 1 end
    if w * L < x then w = w + 1 end
  end
  if w + lag > D then
    a, retry = 0, w + lag - D
  else
    eff = eff + w
    if tat < eff then tat, f = eff, 0 end
    local q = floor(cW / L)
    if q * L > cW then q = q - 1 end
    f = f + (cW - q * L)
    if f >= L then f, q = f - L, q + 1 end
    tat = tat + q
    lv = (tat - eff) * L + f
    lag = eff - now
    dl = lag
  end
else
  a = 0
  if lv <= BW then
    local x = BW - lv
    a = floor(x / cW)
    if a * cW > x then a = a - 1 end
    if a > n then a = n end
  end
  if a > 0 then
    local tot = a * cW
    lv = lv + tot
    local q = floor(tot / L)
    if q * L > tot then q = q - 1 end
    f = f + (tot - q * L)
    if f >= L then f, q = f - L, q + 1 end
    tat = tat + q
  end
  if a < n then
    local x = lv + cW - BW
    retry = floor(x / L)
    if retry * L > x then retry = retry - 1 end
    if retry * L < x then retry = retry + 1 end
    retry = retry + lag
  end
end
local t = floor(lv / L)
if t * L > lv then t = t - 1 end
if t * L < lv then t = t + 1 end
if t > 0 then t = t + lag end
if a > 0 then
  -- The key lives until it is equivalent to a fresh one: t, or, for an
  -- empty (full) bucket whose state is ahead of now (a shaped slot, a
  -- refund of one), until eff: before it, a fresh key would admit at now.
  local x = t0 + t
  if t == 0 then x = t0 + lag end
  local ms = floor(x / 1000)
  if ms * 1000 > x then ms = ms - 1 end
  if ms * 1000 < x then ms = ms + 1 end
  redis.call('SET', key, struct.pack('<ddd', tat, f, eff), px, ms + 1)
end
local r = 0
if lv <= BW then
  r = floor((BW - lv) / W)
  if r * W > BW - lv then r = r - 1 end
end
if ARGV[10] then return {a, B, r, t, retry, eff, 0, dl} end
return {a, B, r, t, retry, eff, 0}
`

// fixed_window. State: "<w> <n>": w = window start (µs since the epoch, a
// multiple of W), n = admitted in that window. left is the wait until the
// window ends, from now.
const fixedWindowBody = `
local v = redis.call('GET', key)
local start, count = -1, 0
if v and #v == 16 then start, count = struct.unpack('<dd', v) end
if start > eff then eff = start end
local ws = floor(eff / W)
if ws * W > eff then ws = ws - 1 end
ws = ws * W
if ws ~= start then count = 0 end
local left = ws + W - now
local x = t0 + left
local ms = floor(x / 1000)
if ms * 1000 > x then ms = ms - 1 end
if ms * 1000 < x then ms = ms + 1 end
if op == '1' then
  local stamp = tonumber(ARGV[7]) or 0
  local sw = floor(stamp / W)
  if sw * W > stamp then sw = sw - 1 end
  if sw * W ~= ws or count < c then return {1, L, L - count, 0, 0, eff, 0} end
  count = count - c
  if count == 0 then redis.call('DEL', key) return {1, L, L, 0, 0, eff, 0} end
  redis.call('SET', key, struct.pack('<dd', ws, count), px, ms + 1)
  return {1, L, L - count, left, 0, eff, 0}
end
local reset = left
if count == 0 then reset = 0 end
if c > L then return {0, L, math.max(L - count, 0), reset, W, eff, 0} end
local a = 0
if count < L then
  a = floor((L - count) / c)
  if a * c > L - count then a = a - 1 end
  if a > n then a = n end
end
if a < 1 then return {0, L, math.max(L - count, 0), reset, left, eff, 0} end
-- With the Redis clock, a window's keys all expire at its end: a key of the
-- same window keeps its TTL.
if px == 'PXAT' and ws == start then
  redis.call('SET', key, struct.pack('<dd', ws, count + a * c), 'KEEPTTL')
else
  redis.call('SET', key, struct.pack('<dd', ws, count + a * c), px, ms + 1)
end
count = count + a * c
local retry = 0
if a < n then retry = left end
return {a, L, L - count, left, retry, eff, 0}
`

// sliding_window. State: "<w> <p> <n>": w = current window start, p =
// previous window's count, n = current window's count. Estimate at elapsed
// e: p × (W − e)/W + n, compared with L after multiplying through by W.
// A refund that finds its admission's window sets save.
const slidingWindowBody = `
local v = redis.call('GET', key)
local start, prev, cur = 0, 0, 0
if v and #v == 24 then start, prev, cur = struct.unpack('<ddd', v) end
if start > eff then eff = start end
local ws = floor(eff / W)
if ws * W > eff then ws = ws - 1 end
ws = ws * W
-- keep: the key expires at the end of the window after the current one's
-- (start + 2W) both before and after this call, so its TTL stays.
local keep = px == 'PXAT' and ws == start and cur > 0
if ws == start + W then prev, cur = cur, 0 elseif ws ~= start then prev, cur = 0, 0 end
start = ws
local e, LW, lag = eff - start, L * W, eff - now
local a, wait, save = 1, 0, false
if op == '1' then
  local stamp = tonumber(ARGV[7]) or 0
  local sw = floor(stamp / W)
  if sw * W > stamp then sw = sw - 1 end
  sw = sw * W
  if sw == start and cur >= c then cur, save = cur - c, true
  elseif sw == start - W and prev >= c then prev, save = prev - c, true end
elseif c > L then
  a, wait = 0, W
else
  a = 0
  local room = LW - (prev * (W - e) + cur * W)
  if room >= 0 then
    local cW = c * W
    a = floor(room / cW)
    if a * cW > room then a = a - 1 end
    if a > n then a = n end
  end
  if a > 0 then cur, save = cur + a * c, true end
  if a < n then
    -- The first elapsed time from which the previous window's weighted
    -- count p × (W − x)/W leaves room for another request: W − ⌊k × W / p⌋
    -- for k = what the current window leaves (0 when p <= k).
    if cur + c <= L then
      local k, at = L - cur - c, 0
      if prev > k then
        local q = floor(k * W / prev)
        if q * prev > k * W then q = q - 1 end
        at = W - q
      end
      if at < W then wait = at - e end
    end
    if wait == 0 then
      local k, at = L - c, 0
      if cur > k then
        local q = floor(k * W / cur)
        if q * cur > k * W then q = q - 1 end
        at = W - q
      end
      wait = start + W + at - eff
    end
    if wait > 0 then wait = wait + lag end
  end
end
local reset = 0
if cur > 0 then reset = start + 2 * W - eff elseif prev > 0 then reset = start + W - eff end
if reset > 0 then reset = reset + lag end
if save then
  if prev == 0 and cur == 0 then
    redis.call('DEL', key)
  elseif keep and cur > 0 and op == '0' then
    redis.call('SET', key, struct.pack('<ddd', start, prev, cur), 'KEEPTTL')
  else
    local x = t0 + reset
    local ms = floor(x / 1000)
    if ms * 1000 > x then ms = ms - 1 end
    if ms * 1000 < x then ms = ms + 1 end
    redis.call('SET', key, struct.pack('<ddd', start, prev, cur), px, ms + 1)
  end
end
local est, r = prev * (W - e) + cur * W, 0
if est <= LW then
  r = floor((LW - est) / W)
  if r * W > LW - est then r = r - 1 end
end
return {a, L, r, reset, wait, eff, 0}
`

// sliding_log. State: a sorted set with one member per admitted unit of
// cost, scored by its time in µs and named "<time>:<index>" (indexes at one
// time are consecutive from 1, so names never collide). Entries at or before
// eff − W have expired; they are ignored, and pruned by the next admission.
// The newest entry, read first for eff, also gives a denial's reset, tells
// whether entries at eff exist (only then are their indexes read), and
// whether an admission prunes (only the first in a window after the
// newest entry's: the set holds at most two windows of entries).
const slidingLogBody = `
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
local top = tonumber(newest[2])
if top and top > eff then eff = top end
local cutoff, lag = eff - W, eff - now
local live = '(' .. string.format('%d', cutoff)
if op == '1' then
  local ref, s = tonumber(ARGV[8]) or 0, string.format('%d', tonumber(ARGV[7]) or 0)
  local names, m = {}, 0
  for i = ref, ref + c - 1 do
    m = m + 1
    names[m] = s .. ':' .. string.format('%d', i)
    if m >= 256 then redis.call('ZREM', key, unpack(names, 1, m)) m = 0 end
  end
  if m > 0 then redis.call('ZREM', key, unpack(names, 1, m)) end
  local used = redis.call('ZCOUNT', key, live, '+inf')
  return {1, L, math.max(L - used, 0), 0, 0, eff, 0}
end
local used = 0
if top and top > cutoff then used = redis.call('ZCOUNT', key, live, '+inf') end
local a = 0
if c <= L and used + c <= L then
  a = floor((L - used) / c)
  if a * c > L - used then a = a - 1 end
  if a > n then a = n end
end
if a < 1 then
  -- A denial writes nothing (not even the pruning): the state stays exactly
  -- as it was, so a clock that later goes backwards sees it unchanged.
  local reset, retry = 0, W
  if used > 0 then reset = top - cutoff + lag end
  if c <= L then
    local o = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', used + c - L - 1, 1)
    retry = tonumber(o[2]) - cutoff + lag
  end
  return {0, L, math.max(L - used, 0), reset, retry, eff, 0}
end
-- Pruning waits for the first admission in a window after the newest
-- entry's: the set then holds entries of at most the last two windows, and
-- dead ones are never counted (every read bounds the score).
local wi = floor(eff / W)
if wi * W > eff then wi = wi - 1 end
local ti = -1
if top then
  ti = floor(top / W)
  if ti * W > top then ti = ti - 1 end
end
if top and ti ~= wi then redis.call('ZREMRANGEBYSCORE', key, '-inf', cutoff) end
local base = 1
if top == eff then
  local same = redis.call('ZRANGEBYSCORE', key, eff, eff)
  for _, m in ipairs(same) do
    local i = tonumber(string.match(m, ':(%d+)$'))
    if i and i >= base then base = i + 1 end
  end
end
local s = string.format('%d', eff) .. ':'
local add, m = {}, 0
for i = base, base + a * c - 1 do
  add[m + 1], add[m + 2], m = eff, s .. string.format('%d', i), m + 2
  if m >= 512 then redis.call('ZADD', key, unpack(add, 1, m)) m = 0 end
end
if m > 0 then redis.call('ZADD', key, unpack(add, 1, m)) end
local x = t0 + W + lag
local ms = floor(x / 1000)
if ms * 1000 > x then ms = ms - 1 end
if ms * 1000 < x then ms = ms + 1 end
if px == 'PXAT' then redis.call('PEXPIREAT', key, ms + 1) else redis.call('PEXPIRE', key, ms + 1) end
used = used + a * c
local retry = 0
if a < n then
  local o = redis.call('ZRANGEBYSCORE', key, live, '+inf', 'WITHSCORES', 'LIMIT', used + c - L - 1, 1)
  retry = tonumber(o[2]) - cutoff + lag
end
return {a, L, L - used, W + lag, retry, eff, base}
`
