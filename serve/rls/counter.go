package rls

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// Window counters: how the default (exact) mode decides a fixed_window
// request, configured or inline. Each window has its own counter of
// admitted units, a plain integer at the key counterKey(…) + ":" + the
// window's start in Unix µs (the window found from the replica's clock, as
// --charge-denied's counters, with the same expiry: the window's end plus
// chargedSlack). A decision of n requests of cost c is INCRBY n × c and
// PEXPIREAT sent together; with v the count INCRBY answers, the counter
// held v − n × c before, and the first a = ⌊(L − (v − n × c)) / c⌋
// (between 0 and n) are admitted. The units of the n − a denied ones go
// back at once (DECRBY), before the call answers: a denied request is
// charged nothing. An undo that fails leaves the decision standing and
// the units charged until the window ends (extra denials, never an extra
// admission), as a failed refund does.
//
// Exactness: the counter is the window's admitted units plus the units of
// denials whose DECRBY has not landed yet, never less. A request is
// admitted only when its increment leaves the counter at most L, so the
// admitted units never exceed L, whatever the replicas and their
// concurrency. A denial's units in flight can only make a concurrent
// request more likely to be denied, as a refund in flight does; with one
// cost per key (hits_addend 1) not even that: the first denial of a window
// finds the counter at its admitted units, so every later request of the
// window is denied by the algorithm too, and a limit of N admits exactly N.
//
// Refunds (a denied call's admissions, sluice.wasm's refund, is_negative_hits)
// take from the counter of the stamp's window, never below 0
// (chargedScript's take), and nothing when that window has ended. A peek
// (hits_addend 0) and a cost above the limit read the counter (GET).
//
// A Redis Cluster decision costs about what envoyproxy/ratelimit's INCRBY
// and EXPIRE do, where the fixed_window script (TIME, GET, SET) costs Redis
// several times that (RATIONALE.md).

// counterKeySuffix replaces redisrl's "fw2" in a window counter's key, so
// that replicas deciding with the script (fw2) and with counters count
// apart, as do --charge-denied's counters (chargedKeySuffix).
const counterKeySuffix = "fwx"

// counterKey is the key of r's window counters, without the window: r.Key
// (redisrl.AppendKey's for fixed_window) with counterKeySuffix.
func counterKey(r *redisrl.Request) []byte {
	k := make([]byte, 0, len(r.Key))
	k = append(k, r.Key...)
	if len(k) >= 3 {
		k = k[:len(k)-3]
	}
	return append(k, counterKeySuffix...)
}

// counterCall is the chargedCall of r's window at now (Unix µs): the same
// window, key layout and expiry, on the counter's key.
func counterCall(r *redisrl.Request, now, hits int64) *chargedCall {
	return &chargedCall{key: counterKey(r), window: r.Params.Window, hits: hits, now: now}
}

// counterNow is r's instant: r.Now when pinned (tests), else the
// replica's clock.
func counterNow(r *redisrl.Request) int64 {
	if r.Now != 0 {
		return r.Now
	}
	return time.Now().UnixMicro()
}

// runCounter decides r (r.Kind is FixedWindow) on its window counter: a
// decision of max(r.N, 1) requests, a refund or a peek. The reply is the
// script's (ParseBatchReply's Batch for a decision; Last for the others).
// undoFailed, when not nil, learns of a denial's DECRBY that failed.
func runCounter(ctx context.Context, b Backend, r *redisrl.Request, noscript, expireFailed func(), undoFailed func(error)) (redisrl.Batch, error) {
	now := counterNow(r)
	L, W := r.Params.Limit, int64(r.Params.Window/time.Microsecond)
	cc := counterCall(r, now, 0)
	_, left := cc.windowStart()
	switch {
	case r.Refund != nil:
		return refundCounter(ctx, b, r, cc, noscript)
	case r.Peek || r.Cost > L:
		count, err := getCounter(ctx, b, cc)
		if err != nil {
			return redisrl.Batch{}, err
		}
		res := redisrl.Result{Decision: algorithms.Decision{Limit: L, Remaining: max(L-count, 0), RetryAfter: left}, Stamp: now}
		if count > 0 {
			res.ResetAfter = left
		}
		switch {
		case r.Cost > L:
			res.RetryAfter = time.Duration(W) * time.Microsecond
		case count+r.Cost <= L:
			res.Allowed, res.RetryAfter, res.ResetAfter = true, 0, left
			res.Remaining = L - count - r.Cost
		}
		a := int64(0)
		if res.Allowed {
			a = 1
		}
		return redisrl.Batch{Admitted: a, Last: res}, nil
	}
	n, c := max(r.N, 1), r.Cost
	cc.hits = n * c
	v, err := incrCounter(ctx, b, cc, r.Now != 0, expireFailed)
	if err != nil {
		return redisrl.Batch{}, err
	}
	before := max(v-n*c, 0)
	a := int64(0)
	if before < L {
		a = min(n, (L-before)/c)
	}
	if a < n {
		if err := undoCounter(ctx, b, cc, (n-a)*c, r.Now != 0, expireFailed); err != nil && undoFailed != nil {
			undoFailed(err)
		}
	}
	count := before + a*c
	res := redisrl.Result{Decision: algorithms.Decision{Allowed: a == n, Limit: L, Remaining: max(L-count, 0)}, Stamp: now}
	if count > 0 {
		res.ResetAfter = left
	}
	if a < n {
		res.RetryAfter = left
	}
	return redisrl.Batch{Admitted: a, Last: res}, nil
}

// undoFailed is runCounter's undoFailed for r's decisions: the failure is
// counted as a failed refund and logged.
func (s *Server) undoFailed(r *redisrl.Request) func(error) {
	return func(err error) {
		s.Metrics.refund(false)
		s.opts.Logger.Warn("giving back a denial's units failed: they stay charged until the window ends",
			"key", string(r.Key), "err", err)
	}
}

// counterCmd is the RESP command name key arg.
func counterCmd(name, key string, arg int64) []byte {
	dst := resp.AppendArrayHeader(make([]byte, 0, 32+len(key)), 3)
	return resp.AppendBulkInt(resp.AppendBulkString(resp.AppendBulkString(dst, name), key), arg)
}

// intReply reads an integer reply.
func intReply(reply []byte, err error, what string) (int64, error) {
	if err != nil {
		return 0, err
	}
	v, err := resp.Parse(reply)
	if err != nil {
		return 0, fmt.Errorf("redis reply: %w", err)
	}
	if v.Type == resp.Error {
		return 0, v.Err()
	}
	if v.Type != resp.Integer {
		return 0, fmt.Errorf("%w: window counter: %s answered a %s", redisrl.ErrBadReply, what, v.Type)
	}
	return v.Int, nil
}

// incrCounter sends INCRBY key hits and PEXPIREAT key at together and
// returns the count INCRBY answered (runChargedPlain's pair). With a pinned
// time (tests: pinned), the expiry is relative, PEXPIRE of the wait until
// then, as the scripts' PX: a pinned instant is not Redis's.
func incrCounter(ctx context.Context, b Backend, cc *chargedCall, pinned bool, expireFailed func()) (int64, error) {
	key, at := cc.windowKey()
	expire := counterCmd("PEXPIREAT", key, at)
	if pinned {
		expire = counterCmd("PEXPIRE", key, at-(cc.now+999)/1000)
	}
	cmds := [2][]byte{counterCmd("INCRBY", key, cc.hits), expire}
	replies, errs := doPipeline(ctx, b, cmds[:])
	v, err := intReply(replies[0], errs[0], "INCRBY")
	if err != nil {
		return 0, &errRedis{err}
	}
	if set := expireSet(replies[1], errs[1]); set == 0 {
		// As runChargedPlain: the PEXPIREAT ran first, or the key went;
		// once more, now that the INCRBY has counted.
		r, err := b.Do(ctx, cmds[1])
		if expireSet(r, err) < 0 && expireFailed != nil {
			expireFailed()
		}
	} else if set < 0 && expireFailed != nil {
		expireFailed()
	}
	return v, nil
}

// undoCounter takes back units a denial added (DECRBY). The counter holds
// them unless is_negative_hits took them meanwhile (it floors at 0, not
// knowing they are in flight): a count below 0 is then put back to 0
// (INCRBY) with the window's expiry, the key being new.
func undoCounter(ctx context.Context, b Backend, cc *chargedCall, units int64, pinned bool, expireFailed func()) error {
	key, _ := cc.windowKey()
	reply, err := b.Do(ctx, counterCmd("DECRBY", key, units))
	v, err := intReply(reply, err, "DECRBY")
	if err != nil {
		return &errRedis{err}
	}
	if v >= 0 {
		return nil
	}
	fix := *cc
	fix.hits = -v
	if _, err := incrCounter(ctx, b, &fix, pinned, expireFailed); err != nil {
		return err
	}
	return nil
}

// getCounter reads the count of cc's window.
func getCounter(ctx context.Context, b Backend, cc *chargedCall) (int64, error) {
	key, _ := cc.windowKey()
	cmd := resp.AppendArrayHeader(make([]byte, 0, 16+len(key)), 2)
	cmd = resp.AppendBulkString(resp.AppendBulkString(cmd, "GET"), key)
	reply, err := b.Do(ctx, cmd)
	if err != nil {
		return 0, &errRedis{err}
	}
	v, err := resp.Parse(reply)
	if err != nil {
		return 0, &errRedis{fmt.Errorf("redis reply: %w", err)}
	}
	switch {
	case v.Type == resp.Error:
		return 0, &errRedis{v.Err()}
	case v.Type == resp.BulkString && v.Null:
		return 0, nil
	case v.Type != resp.BulkString:
		return 0, &errRedis{fmt.Errorf("%w: window counter: GET answered a %s", redisrl.ErrBadReply, v.Type)}
	}
	var n int64
	for _, d := range v.Str {
		if d < '0' || d > '9' || n > (1<<62)/10 {
			return 0, nil // below 0 (see undoCounter) or out of range: as empty
		}
		n = n*10 + int64(d-'0')
	}
	return n, nil
}

// refundCounter takes r.Cost units from the counter of the window of
// r.Refund's stamp (chargedScript's take: never below 0), nothing when that
// window is not the current one; the reply says what the current window
// holds after.
func refundCounter(ctx context.Context, b Backend, r *redisrl.Request, cc *chargedCall, noscript func()) (redisrl.Batch, error) {
	L := r.Params.Limit
	ws, left := cc.windowStart()
	stamp := *cc
	stamp.now = r.Refund.Stamp
	sw, _ := stamp.windowStart()
	var count int64
	var err error
	if sw != ws || r.Cost < 1 {
		count, err = getCounter(ctx, b, cc)
	} else {
		t := *cc
		t.hits, t.take = min(r.Cost, maxChargedCount), true
		count, err = runScript(ctx, b, &t, noscript, parseChargedReply)
	}
	if err != nil {
		return redisrl.Batch{}, err
	}
	res := redisrl.Result{Decision: algorithms.Decision{Allowed: true, Limit: L, Remaining: max(L-count, 0)}, Stamp: cc.now}
	if count > 0 {
		res.ResetAfter = left
	}
	return redisrl.Batch{Admitted: 1, Last: res}, nil
}
