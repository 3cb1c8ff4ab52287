package rlqs

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/internal/resp"
)

// Continuing a participant on another stream.
//
// An Envoy whose stream breaks (its replica died, or ended the stream)
// keeps its buckets and their assignments until their TTL and reports all
// of them on a new stream at its next report tick, usually to another
// replica. Without more, the new stream is a new participant: its first
// grant replaces the Envoy's bucket, and what the old participant was
// granted and did not report used stays taken until the window ends.
//
// A stream whose gRPC metadata names its Envoy (ClientHeader, unique per
// Envoy) lets the new stream continue the old participant instead, the
// Envoy's bucket and its tokens kept. It must be sure of two things: that
// no report of the Envoy was lost between the streams (a report built and
// sent on the dying stream reset the Envoy's counts: what it said is
// unknown), and that the old participant is that Envoy and not another
// Envoy configured with the same name, still reporting. Hence:
//
//  1. at a bucket's first report on the new stream, peek: the index names
//     the participant the client's last stream used and when it last
//     reported (l). The report's time_elapsed (whole seconds, since the
//     Envoy's previous report of the bucket) must match now − l: no report
//     was built in between. The Envoy's report period must be long enough
//     for a lost report to show (at least minContinueInterval). A bucket
//     that passes is held: no allocation, no action (the Envoy keeps its
//     assignment), its counts kept for the next report;
//  2. at its next report (one interval later), take: the old participant
//     must not have reported since l — a live Envoy of the same name would
//     have, within its interval — and still be unexpired. The new stream
//     then owns the participant (o:), restores the assignment the old one
//     sent (s:), and decides the two reports' counts as the old stream
//     would have: the same assignment is sent again while it may hold
//     enough, and the Envoy keeps its tokens;
//  3. anything else (no name, a new bucket, a lost report, a live
//     duplicate, an expired participant): the new stream is a participant
//     of its own, as without a name.
//
// A stream that lost its participant (another stream took it) learns it
// from the allocation script's refusal and goes on as a participant of its
// own (a live duplicate), or forgets the bucket (a window push).

// ClientHeader is the gRPC metadata that names an Envoy to the service
// (initial_metadata of the filter's grpc_service), unique per Envoy.
const ClientHeader = "x-sluice-client-id"

// minContinueInterval is the least report period at which a lost report
// shows in time_elapsed (whole seconds) against the service's clock.
const minContinueInterval = 2500 * time.Millisecond

// continueSlack bounds time_elapsed's truncation and the path's jitter:
// now − l − time_elapsed must be in [−continueEarly, continueSlack].
const (
	continueSlack = 1200 * time.Millisecond
	continueEarly = 500 * time.Millisecond
)

const peekBody = `
local now = tonumber(ARGV[1])
if not now or ARGV[2] == '' then return redis.error_reply('ERR sluice: bad rlqs arguments') end
` + luaNow + `
local p = redis.call('HGET', KEYS[1], 'c:' .. ARGV[2])
if not p then return {'', '', -1, now} end
local v = redis.call('HMGET', KEYS[1], 'l:' .. p, 'x:' .. p, 's:' .. p)
local l, x = tonumber(v[1]), tonumber(v[2])
if not l or not x or x < now or not v[3] then return {'', '', -1, now} end
return {p, v[3], l, now}
`

const takeBody = `
local now, seen = tonumber(ARGV[1]), tonumber(ARGV[4])
if not now or not seen or ARGV[2] == '' or ARGV[3] == '' or ARGV[5] == '' then
  return redis.error_reply('ERR sluice: bad rlqs arguments')
end
` + luaNow + `
local p = ARGV[3]
local v = redis.call('HMGET', KEYS[1], 'c:' .. ARGV[2], 'l:' .. p, 'x:' .. p, 's:' .. p)
local l, x = tonumber(v[2]), tonumber(v[3])
if v[1] ~= p or not l or l ~= seen or not x or x < now or not v[4] then return {0, '', now} end
redis.call('HSET', KEYS[1], 'o:' .. p, ARGV[5])
return {1, v[4], now}
`

var (
	peekSHA = func() string { s := sha1.Sum([]byte(peekBody)); return hex.EncodeToString(s[:]) }()
	takeSHA = func() string { s := sha1.Sum([]byte(takeBody)); return hex.EncodeToString(s[:]) }()
)

// errTaken: another stream continues the participant.
const takenMessage = "rlqs participant taken"

func isTaken(err error) bool { return err != nil && strings.Contains(err.Error(), takenMessage) }

// savedState is a participant's assignment as the allocation script keeps it.
type savedState struct {
	kind     byte // 'T' or 'D'
	ws       int64
	size     int64
	used     int64
	nanos    int32
	replaced int64
	sent     int64 // µs, the script's clock
	interval time.Duration
}

func parseState(s string) (savedState, error) {
	f := strings.Fields(s)
	if len(f) != 8 || (f[0] != "T" && f[0] != "D") {
		return savedState{}, fmt.Errorf("rlqs: bad saved state %q", s)
	}
	var n [7]int64
	for i := range n {
		v, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil || v < 0 || v > 1<<62 {
			return savedState{}, fmt.Errorf("rlqs: bad saved state %q", s)
		}
		n[i] = int64(v)
	}
	if n[3] > 999_999_999 {
		return savedState{}, fmt.Errorf("rlqs: bad saved state %q", s)
	}
	return savedState{kind: f[0][0], ws: n[0], size: n[1], used: n[2], nanos: int32(n[3]), replaced: n[4], sent: n[5],
		interval: time.Duration(n[6]) * time.Microsecond}, nil
}

// peeked is what a peek found: the participant, its state, its last call.
type peeked struct {
	participant string
	state       savedState
	last, now   int64 // µs, the script's clock
}

// script runs a continuation script on key with string arguments.
func (a *Allocator) script(ctx context.Context, sha, body string, key string, args ...string) (resp.Value, error) {
	return a.eval(ctx, func(cmd, script string) []byte {
		dst := resp.AppendArrayHeader(nil, 4+len(args))
		dst = resp.AppendBulkString(dst, cmd)
		dst = resp.AppendBulkString(dst, script)
		dst = resp.AppendBulkInt(dst, 1)
		dst = resp.AppendBulkString(dst, key)
		for _, s := range args {
			dst = resp.AppendBulkString(dst, s)
		}
		return dst
	}, sha, body)
}

func scriptNow(now time.Time) string {
	if now.IsZero() {
		return "0"
	}
	return strconv.FormatInt(now.UnixMicro(), 10)
}

// Peek finds the participant the client's last stream used for a bucket.
// ok false: none (or one that expired).
func (a *Allocator) Peek(ctx context.Context, key, clientField string, now time.Time) (p peeked, ok bool, err error) {
	v, err := a.script(ctx, peekSHA, peekBody, key, scriptNow(now), clientField)
	if err != nil {
		return peeked{}, false, err
	}
	if v.Type != resp.Array || len(v.Elems) != 4 || v.Elems[2].Type != resp.Integer || v.Elems[3].Type != resp.Integer {
		return peeked{}, false, errBadReply
	}
	p.participant, p.last, p.now = string(v.Elems[0].Str), v.Elems[2].Int, v.Elems[3].Int
	if p.participant == "" || p.last < 0 {
		return p, false, nil
	}
	if p.state, err = parseState(string(v.Elems[1].Str)); err != nil {
		return peeked{}, false, err
	}
	return p, true, nil
}

// Take makes owner the participant's owner if it has not called since
// last; it returns the participant's state and the script's clock.
func (a *Allocator) Take(ctx context.Context, key, clientField, participant string, last int64, owner string, now time.Time) (savedState, int64, bool, error) {
	v, err := a.script(ctx, takeSHA, takeBody, key, scriptNow(now), clientField, participant, strconv.FormatInt(last, 10), owner)
	if err != nil {
		return savedState{}, 0, false, err
	}
	if v.Type != resp.Array || len(v.Elems) != 3 || v.Elems[0].Type != resp.Integer || v.Elems[2].Type != resp.Integer {
		return savedState{}, 0, false, errBadReply
	}
	if v.Elems[0].Int != 1 {
		return savedState{}, v.Elems[2].Int, false, nil
	}
	st, err := parseState(string(v.Elems[1].Str))
	return st, v.Elems[2].Int, err == nil, err
}

// continuous says whether a bucket's first report on a new stream follows
// the peeked participant's last report with no report between: elapsed is
// the report's time_elapsed (whole seconds).
func continuous(p peeked, elapsed time.Duration) bool {
	if p.state.interval < minContinueInterval || elapsed < time.Second {
		return false
	}
	d := time.Duration(p.now-p.last)*time.Microsecond - elapsed
	return d >= -continueEarly && d <= continueSlack
}

// claim is a bucket held between a peek and a take.
type claim struct {
	participant     string
	last            int64 // the participant's last call (µs, the script's clock)
	at              time.Time
	elapsed         time.Duration // the first report's time_elapsed
	allowed, denied uint64
}

// validClient checks a client name from the metadata.
func validClient(s string) error {
	if len(s) > 256 {
		return fmt.Errorf("rlqs: %s of %d bytes (at most 256)", ClientHeader, len(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return fmt.Errorf("rlqs: %s holds a space or a byte outside printable ASCII", ClientHeader)
		}
	}
	return nil
}

// claimJob is a limited bucket's report on its way to an allocation job:
// prepare's input, and a peek or take first where the stream names its
// Envoy.
type claimJob struct {
	slot            int
	b               *bucket
	key             string
	limit           int64
	window          time.Duration
	allowed, denied uint64
	elapsed         time.Duration // since the previous report (the service's clock)

	peek     bool
	reported time.Duration // the report's time_elapsed (a peek)
	// continued: the job carries the claim's counts too; lastDenied are
	// this report's own denials.
	continued  bool
	lastDenied uint64

	found peeked
	ok    bool
	state savedState
	now   int64
	err   error
}

// claims runs the peeks and takes of a report (in parallel, as run does)
// and returns the allocation jobs of the buckets that are not held.
func (st *stream) claims(ctx context.Context, cs []*claimJob, now time.Time) []*job {
	s := st.s
	var clock time.Time
	if s.o.ScriptClock {
		clock = now
	}
	parallel(len(cs), func(i int) {
		c := cs[i]
		cctx, cancel := context.WithTimeout(ctx, s.o.RedisTimeout)
		defer cancel()
		field := st.clientField(c.b)
		if c.peek {
			c.found, c.ok, c.err = s.alloc.Peek(cctx, c.key, field, clock)
			return
		}
		cl := c.b.claim
		if cl.participant == "" || c.key != c.b.limitKey {
			return
		}
		c.state, c.now, c.ok, c.err = s.alloc.Take(cctx, c.key, field, cl.participant, cl.last, st.id, clock)
	})
	var jobs []*job
	for _, c := range cs {
		b := c.b
		if c.err != nil {
			s.o.Logger.Warn("rlqs: continuing a participant failed; the bucket is a participant of its own", "domain", st.domain, "err", c.err)
		}
		if c.peek {
			if c.err == nil && c.ok && continuous(c.found, c.reported) {
				// Held: no allocation, no action; the Envoy keeps its assignment.
				b.claim = &claim{participant: c.found.participant, last: c.found.last, at: now, elapsed: c.reported,
					allowed: c.allowed, denied: c.denied}
				b.limitKey, b.limit, b.window = c.key, c.limit, c.window
				continue
			}
			if c.err == nil && c.ok {
				s.Metrics.continued("own")
			}
			jobs = append(jobs, st.prepare(c, now))
			continue
		}
		cl := b.claim
		b.claim = nil
		c.continued, c.lastDenied = true, c.denied
		c.allowed, c.denied = satAdd(c.allowed, cl.allowed), satAdd(c.denied, cl.denied)
		c.elapsed = now.Sub(cl.at) + cl.elapsed
		if c.err == nil && c.ok && c.state.ws >= 0 {
			// The participant, and the assignment it sent, are this stream's.
			at := func(us int64) time.Time { return now.Add(-time.Duration(c.now-us) * time.Microsecond) }
			b.participant = cl.participant
			b.kind = kindDeny
			if c.state.kind == 'T' {
				b.kind = kindTokenBucket
			}
			b.ws, b.size, b.used, b.nanos, b.replaced = c.state.ws, c.state.size, c.state.used, c.state.nanos, c.state.replaced
			b.sentAt, b.refreshedAt = at(c.state.sent), at(cl.last)
			b.ttlSent = ttlFor(c.state.interval) // the TTL the old stream sent
			s.Metrics.continued("adopted")
		} else {
			s.Metrics.continued("own")
		}
		jobs = append(jobs, st.prepare(c, now))
	}
	return jobs
}
