package rls

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/internal/resp"
)

const chargedConfig = `
domain: cd
descriptors:
  - {key: a, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: b, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: shadow, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: quota, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: zero, rate_limit: {unit: minute, requests_per_unit: 0}}
  - {key: unl, rate_limit: {unlimited: true}}
  - {key: tb, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}}
  - {key: lb, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: leaky_bucket}}
  - {key: sl, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_log}}
  - {key: sw, rate_limit: {unit: hour, requests_per_unit: 10, algorithm: sliding_window}}
`

// want is one descriptor status, as envoyproxy/ratelimit answers it.
type want struct {
	code      pb.RateLimitResponse_Code
	remaining uint32
	reset     time.Duration // -1: none
}

func check(t *testing.T, step string, r *pb.RateLimitResponse, overall pb.RateLimitResponse_Code, ws ...want) {
	t.Helper()
	if r.OverallCode != overall {
		t.Errorf("%s: overall %v, want %v", step, r.OverallCode, overall)
	}
	if len(r.Statuses) != len(ws) {
		t.Fatalf("%s: %d statuses, want %d", step, len(r.Statuses), len(ws))
	}
	for i, w := range ws {
		st := r.Statuses[i]
		reset := time.Duration(-1)
		if st.DurationUntilReset != nil {
			reset = st.DurationUntilReset.AsDuration()
		}
		if st.Code != w.code || st.LimitRemaining != w.remaining || reset != w.reset {
			t.Errorf("%s: descriptor %d: %v remaining %d reset %v; want %v %d %v", step, i, st.Code, st.LimitRemaining, reset, w.code, w.remaining, w.reset)
		}
	}
}

func rlCall(t *testing.T, c pb.RateLimitServiceClient, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	r, err := c.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return r
}

func withHits(d *ratelimitv3.RateLimitDescriptor, n uint64, negative bool) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	d.IsNegativeHits = negative
	return d
}

// --charge-denied answers as envoyproxy/ratelimit's Redis cache: every
// descriptor of every call is charged, a denied one too; over when the
// count after the call exceeds the limit (remaining 0); hits_addend 0
// reads the count (OVER_LIMIT on a counter already over); requests_per_unit
// 0 is over at the first hit; shadow_mode answers OK with remaining 0;
// quota_mode OVER_LIMIT with its reset, the call over when every quota_mode
// descriptor of it is (TestQuotaMode has the rule); resets are
// whole seconds to the window's end; a new window starts from 0.
func TestChargeDenied(t *testing.T) {
	var now atomic.Int64
	now.Store(testNow) // 30 s into a minute, 30 min 30 s into an hour
	_, c := serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: true, Now: func() int64 { return now.Load() }})
	k := uniq("k")
	a, b := desc("a", k), desc("b", k)
	const min30, hour = 30 * time.Second, 1770 * time.Second
	for i, w := range []struct {
		overall pb.RateLimitResponse_Code
		a, b    want
	}{
		{pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 2, min30}, want{pb.RateLimitResponse_OK, 9, hour}},
		{pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 1, min30}, want{pb.RateLimitResponse_OK, 8, hour}},
		{pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 0, min30}, want{pb.RateLimitResponse_OK, 7, hour}},
		// a is over; b is charged all the same.
		{pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OVER_LIMIT, 0, min30}, want{pb.RateLimitResponse_OK, 6, hour}},
		{pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OVER_LIMIT, 0, min30}, want{pb.RateLimitResponse_OK, 5, hour}},
	} {
		r := call(t, c, "cd", a, b)
		check(t, "call "+string(rune('1'+i)), r, w.overall, w.a, w.b)
	}
	// hits_addend 0 reads: a (5 > 3) is still over, b unchanged.
	r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		withHits(desc("a", k), 0, false), withHits(desc("b", k), 0, false)}})
	check(t, "hits 0", r, pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OVER_LIMIT, 0, min30}, want{pb.RateLimitResponse_OK, 5, hour})
	// Negative hits give back, never below 0: a 5 → 3 (OK, 0 left) → 0.
	r = rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("a", k), 2, true)}})
	check(t, "negative 2", r, pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 0, min30})
	r = rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("a", k), 100, true)}})
	check(t, "negative 100", r, pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 3, min30})
	r = call(t, c, "cd", a)
	check(t, "after the returns", r, pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 2, min30})

	// Shadow, quota, zero, unlimited and no limit in one call.
	sh, q, z, u, none := desc("shadow", k), desc("quota", k), desc("zero", k), desc("unl", k), desc("nothing", k)
	r = call(t, c, "cd", sh, q, z, u, none)
	check(t, "first", r, pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OK, 0, min30}, want{pb.RateLimitResponse_OK, 0, min30},
		want{pb.RateLimitResponse_OVER_LIMIT, 0, min30}, want{pb.RateLimitResponse_OK, math.MaxUint32, -1}, want{pb.RateLimitResponse_OK, 0, -1})
	// quota is over, and is the call's only quota_mode descriptor: the
	// call is over (envoyproxy/ratelimit since #1059, TestQuotaMode).
	r = call(t, c, "cd", sh, q, u)
	check(t, "second", r, pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OK, 0, min30}, want{pb.RateLimitResponse_OVER_LIMIT, 0, min30},
		want{pb.RateLimitResponse_OK, math.MaxUint32, -1})
	if st := r.Statuses[1]; st.CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Errorf("quota_mode status lost its limit: %v", st)
	}
	r = rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("zero", k), 0, false)}})
	check(t, "zero, hits 0", r, pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OVER_LIMIT, 0, min30})

	// The next minute: a starts again (b's hour goes on); the reset is the
	// whole seconds to the window's end, rounded up.
	now.Store(testNow + int64(30*time.Second/time.Microsecond) + 250_000)
	r = call(t, c, "cd", a, b)
	check(t, "next minute", r, pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 2, 60 * time.Second}, want{pb.RateLimitResponse_OK, 4, 1740 * time.Second})
}

// One counter named twice or more in a call is charged in descriptor
// order, each status reading the count after its own hits, as the peer's
// pipeline of INCRBYs does.
func TestChargeDeniedSameKeyInOrder(t *testing.T) {
	_, c := serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: true})
	k := uniq("k")
	for round := 0; round < 20; round++ {
		k := k + "-" + string(rune('a'+round))
		r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("a", k), desc("b", k), withHits(desc("a", k), 0, false), desc("a", k), withHits(desc("a", k), 2, false), desc("a", k)}})
		const m, h = 30 * time.Second, 1770 * time.Second
		check(t, "same key", r, pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OK, 2, m}, want{pb.RateLimitResponse_OK, 9, h},
			want{pb.RateLimitResponse_OK, 2, m}, want{pb.RateLimitResponse_OK, 1, m}, want{pb.RateLimitResponse_OVER_LIMIT, 0, m},
			want{pb.RateLimitResponse_OVER_LIMIT, 0, m})
	}
}

// Without --charge-denied a denied request is charged to no descriptor.
func TestDeniedNotChargedByDefault(t *testing.T) {
	_, c := serve(t, Options{Config: parse(t, chargedConfig)})
	k := uniq("k")
	a, b := desc("a", k), desc("b", k)
	for i := 0; i < 3; i++ {
		call(t, c, "cd", a, b)
	}
	r := call(t, c, "cd", a, b)
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[1].LimitRemaining != 7 {
		t.Fatalf("denied call: %v, b remaining %d; want OVER_LIMIT, 7 (not charged)", r.OverallCode, r.Statuses[1].LimitRemaining)
	}
}

// is_negative_hits without --charge-denied: units go back to token_bucket,
// leaky_bucket and fixed_window limits, never past a fresh limit;
// sliding_log and sliding_window refuse; hits_addend 0 and
// requests_per_unit 0 give nothing back; inline descriptors refuse.
func TestNegativeHits(t *testing.T) {
	_, c := serve(t, Options{Config: parse(t, chargedConfig), InlineDomains: []string{"cd"}})
	for _, key := range []string{"tb", "lb", "b"} {
		t.Run(key, func(t *testing.T) {
			k := uniq("k")
			for i := 0; i < 6; i++ {
				call(t, c, "cd", desc(key, k))
			}
			neg := func(n uint64) uint32 {
				t.Helper()
				r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc(key, k), n, true)}})
				if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OK {
					t.Fatalf("negative %d: %v", n, r)
				}
				return r.Statuses[0].LimitRemaining
			}
			if got := neg(0); got != 0 {
				t.Errorf("hits_addend 0: remaining %d, want 0 (nothing known, nothing given back)", got)
			}
			if got := neg(3); got != 7 {
				t.Errorf("6 taken, 3 given back: remaining %d, want 7", got)
			}
			if got := neg(math.MaxUint64); got != 10 {
				t.Errorf("a huge return: remaining %d, want 10 (a fresh limit)", got)
			}
			r := call(t, c, "cd", desc(key, k))
			if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 9 {
				t.Errorf("after the returns: %v remaining %d, want OK 9", r.OverallCode, r.Statuses[0].LimitRemaining)
			}
		})
	}
	for _, key := range []string{"sl", "sw"} {
		_, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "cd",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc(key, "x"), 1, true)}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is_negative_hits") {
			t.Errorf("%s: %v, want INVALID_ARGUMENT about is_negative_hits", key, err)
		}
	}
	r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("zero", "x"), 5, true)}})
	if r.OverallCode != pb.RateLimitResponse_OK {
		t.Errorf("requests_per_unit 0: %v", r)
	}
	d := inlineDesc("api", "fixed_window", 3, time.Minute, 0, "x")
	d.IsNegativeHits = true
	if _, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "cd",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("inline: %v, want INVALID_ARGUMENT", err)
	}
}

// Huge hits_addend under --charge-denied: the counter saturates at 2^52
// (no Redis overflow error, no wrap), a huge return brings it back to 0.
func TestChargeDeniedHugeHits(t *testing.T) {
	_, c := serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: true, Now: func() int64 { return testNow }})
	k := uniq("k")
	for i := 0; i < 3; i++ {
		r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", HitsAddend: math.MaxUint32,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("b", k), math.MaxUint64, false), desc("a", k)}})
		check(t, "huge", r, pb.RateLimitResponse_OVER_LIMIT, want{pb.RateLimitResponse_OVER_LIMIT, 0, 1770 * time.Second},
			want{pb.RateLimitResponse_OVER_LIMIT, 0, 30 * time.Second})
	}
	b := backend(t)
	cmd := resp.AppendBulkString(resp.AppendArrayHeader(nil, 2), "GET")
	hour := int64(time.Hour / time.Microsecond)
	key := fmt.Appendf(chargedKey("cd", "b="+k), ":%d", testNow-testNow%hour)
	got, err := b.Do(context.Background(), resp.AppendBulk(cmd, key))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "$16\r\n4503599627370496\r\n" {
		t.Errorf("saturated counter: %q", got)
	}
	r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("b", k), math.MaxUint64, true)}})
	check(t, "huge return", r, pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 10, 1770 * time.Second})
}

// A counter past maxChargedCount (plain INCRBYs may carry it there) reads
// as maxChargedCount on every path: the plain INCRBY, the script's read
// (hits 0) and its give-back (is_negative_hits); none is a bad reply.
func TestChargeDeniedPastSaturation(t *testing.T) {
	b := backend(t)
	_, c := serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: true, Backend: b, Now: func() int64 { return testNow }})
	k := uniq("past")
	hour := int64(time.Hour / time.Microsecond)
	key := fmt.Appendf(chargedKey("cd", "b="+k), ":%d", testNow-testNow%hour)
	set := resp.AppendBulk(resp.AppendBulkString(resp.AppendArrayHeader(nil, 3), "SET"), key)
	if got, err := b.Do(context.Background(), resp.AppendBulkString(set, "4503599627370501")); err != nil || !strings.Contains(string(got), "OK") {
		t.Fatalf("SET: %q %v", got, err)
	}
	over := want{pb.RateLimitResponse_OVER_LIMIT, 0, 1770 * time.Second}
	for _, step := range []struct {
		name string
		d    *ratelimitv3.RateLimitDescriptor
		w    want
	}{
		{"read", withHits(desc("b", k), 0, false), over},
		{"plain", desc("b", k), over},
		{"give back", withHits(desc("b", k), 1, true), want{pb.RateLimitResponse_OK, 0, 1770 * time.Second}},
	} {
		r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{step.d}})
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		check(t, step.name, r, step.w.code, step.w)
	}
}

func TestCheckChargeDenied(t *testing.T) {
	err := parse(t, chargedConfig).CheckChargeDenied()
	if err == nil || !strings.Contains(err.Error(), "cd.tb (token_bucket)") || !strings.Contains(err.Error(), "cd.sw (sliding_window)") ||
		strings.Contains(err.Error(), "cd.a ") || strings.Contains(err.Error(), "unl") {
		t.Errorf("CheckChargeDenied: %v", err)
	}
	if err := parse(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: u, rate_limit: {unlimited: true}}\n").CheckChargeDenied(); err != nil {
		t.Errorf("fixed windows only: %v", err)
	}
	if err := (*Config)(nil).CheckChargeDenied(); err != nil {
		t.Errorf("no config: %v", err)
	}
}

func TestParseChargedReply(t *testing.T) {
	if n, err := parseChargedReply(resp.Value{Type: resp.Integer, Int: 7}); err != nil || n != 7 {
		t.Errorf("good reply: %d %v", n, err)
	}
	for _, bad := range []resp.Value{{Type: resp.Integer, Int: -1}, {Type: resp.Integer, Int: 1<<52 + 1},
		{Type: resp.Array, Elems: []resp.Value{{Type: resp.Integer, Int: 1}}}, {Type: resp.Error, Str: []byte("ERR x")},
		{Type: resp.BulkString, Str: []byte("1")}} {
		if _, err := parseChargedReply(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	// The window holding now, and the wait to its end, from the replica's
	// clock; the counter expires chargedSlack after the end (ms, rounded up).
	c := chargedCall{key: []byte("k"), window: time.Minute, hits: 3, now: 90_000_500}
	if ws, left := c.windowStart(); ws != 60_000_000 || left != 29_999_500*time.Microsecond {
		t.Errorf("windowStart: %d %v", ws, left)
	}
	v, err := resp.Parse(c.AppendEvalSHA(nil))
	if err != nil || len(v.Elems) != 7 || string(v.Elems[3].Str) != "k:60000000" || string(v.Elems[4].Str) != "3" ||
		string(v.Elems[5].Str) != "121000" || string(v.Elems[6].Str) != "0" {
		t.Errorf("call: %v %v", v, err)
	}
	for _, c := range []struct{ left, want time.Duration }{{time.Microsecond, time.Second}, {time.Second, time.Second},
		{time.Second + 1, 2 * time.Second}, {59*time.Second + 999*time.Millisecond, 60 * time.Second}} {
		if got := wholeSeconds(c.left); got != c.want {
			t.Errorf("wholeSeconds(%v) = %v, want %v", c.left, got, c.want)
		}
	}
}

// pexpireFails wraps a Backend: every PEXPIREAT answers an error reply,
// and the commands it saw are recorded (a Backend without DoPipeline:
// the plain commands come one Do after another).
type pexpireFails struct {
	Backend
	mu   sync.Mutex
	seen []string
	// swapped: the first PEXPIREAT answers 0 (no key) without reaching
	// Redis, as one sent before its INCRBY; the rest pass.
	swapped bool
}

func (b *pexpireFails) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	v, err := resp.Parse(cmd)
	if err != nil || len(v.Elems) == 0 {
		return b.Backend.Do(ctx, cmd)
	}
	name := string(v.Elems[0].Str)
	b.mu.Lock()
	b.seen = append(b.seen, name)
	first := len(b.seen) >= 2 && b.seen[len(b.seen)-2] == "INCRBY"
	b.mu.Unlock()
	switch {
	case name != "PEXPIREAT":
	case !b.swapped:
		return []byte("-ERR refused by the test\r\n"), nil
	case first:
		return []byte(":0\r\n"), nil
	}
	return b.Backend.Do(ctx, cmd)
}

// A charged call adding hits is INCRBY and PEXPIREAT on the window's key,
// the key expiring chargedSlack after the window's end; a failed
// PEXPIREAT leaves the decision standing and is counted.
func TestChargeDeniedPlainCommands(t *testing.T) {
	b := backend(t)
	s, c := serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: true, Backend: b})
	k := uniq("plain")
	for i, code := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", HitsAddend: uint32(1 + i), Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", k)}})
		check(t, fmt.Sprint("call ", i), r, code, want{code, []uint32{2, 0, 0}[i], 30 * time.Second})
	}
	minute := int64(time.Minute / time.Microsecond)
	ws := testNow - testNow%minute
	key := fmt.Appendf(chargedKey("cd", "a="+k), ":%d", ws)
	get := func(name string) string {
		t.Helper()
		got, err := b.Do(context.Background(), resp.AppendBulk(resp.AppendBulkString(resp.AppendArrayHeader(nil, 2), name), key))
		if err != nil {
			t.Fatal(err)
		}
		return string(got)
	}
	if got := get("GET"); got != "$1\r\n6\r\n" {
		t.Errorf("counter: %q", got)
	}
	if got, want := get("PEXPIRETIME"), fmt.Sprintf(":%d\r\n", (ws+minute)/1000+1000); got != want {
		t.Errorf("expiry: %q, want %q", got, want)
	}
	if s.Metrics.expireFails != 0 {
		t.Errorf("%d expire errors", s.Metrics.expireFails)
	}

	fb := &pexpireFails{Backend: b}
	s2, c2 := serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: true, Backend: fb})
	k2 := uniq("plain")
	r := rlCall(t, c2, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", k2)}})
	check(t, "PEXPIREAT refused", r, pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 2, 30 * time.Second})
	if got := strings.Join(fb.seen, " "); got != "INCRBY PEXPIREAT" {
		t.Errorf("commands: %s", got)
	}
	if s2.Metrics.expireFails != 1 || s2.Metrics.RedisErrors() != 0 {
		t.Errorf("expire errors %d, redis errors %d; want 1, 0", s2.Metrics.expireFails, s2.Metrics.RedisErrors())
	}
	// A PEXPIREAT that found no key (it ran first) is sent once more.
	sb := &pexpireFails{Backend: b, swapped: true}
	s3, c3 := serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: true, Backend: sb})
	k3 := uniq("plain")
	r = rlCall(t, c3, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", k3)}})
	check(t, "PEXPIREAT first", r, pb.RateLimitResponse_OK, want{pb.RateLimitResponse_OK, 2, 30 * time.Second})
	if got := strings.Join(sb.seen, " "); got != "INCRBY PEXPIREAT PEXPIREAT" {
		t.Errorf("commands: %s", got)
	}
	key = fmt.Appendf(chargedKey("cd", "a="+k3), ":%d", ws)
	if got, want := get("PEXPIRETIME"), fmt.Sprintf(":%d\r\n", (ws+minute)/1000+1000); got != want {
		t.Errorf("expiry after the second PEXPIREAT: %q, want %q", got, want)
	}
	if s3.Metrics.expireFails != 0 {
		t.Errorf("%d expire errors, want 0", s3.Metrics.expireFails)
	}

	var out strings.Builder
	s2.Metrics.WritePrometheus(&out)
	if !strings.Contains(out.String(), "sluice_rls_redis_expire_errors_total 1\n") {
		t.Errorf("metrics:\n%s", out.String())
	}
}
