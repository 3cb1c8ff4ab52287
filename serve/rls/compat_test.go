package rls

import (
	"context"
	"math"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// compatConfig exercises envoyproxy/ratelimit's semantics through the
// service; every test uses its own descriptor values (uniq).
const compatConfig = `
domain: web
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: general
    rate_limit: {unit: minute, requests_per_unit: 1, name: general}
  - key: special
    rate_limit:
      unit: minute
      requests_per_unit: 5
      name: special
      replaces: [{name: general}]
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 60, algorithm: token_bucket, burst: 2}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`

func compatServer(t *testing.T, opts Options) pb.RateLimitServiceClient {
	opts.Config = parse(t, compatConfig)
	_, c := serve(t, opts)
	return c
}

func codesOf(r *pb.RateLimitResponse) []pb.RateLimitResponse_Code {
	var cs []pb.RateLimitResponse_Code
	for _, s := range r.Statuses {
		cs = append(cs, s.Code)
	}
	return append(cs, r.OverallCode)
}

func TestCompatFixedWindow(t *testing.T) {
	c := compatServer(t, Options{})
	d := desc("user", uniq("u"))
	for i := uint32(0); i < 3; i++ {
		r := call(t, c, "web", d)
		st := r.Statuses[0]
		if r.OverallCode != pb.RateLimitResponse_OK || st.LimitRemaining != 2-i || st.CurrentLimit.GetRequestsPerUnit() != 3 ||
			st.CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("call %d: %v", i, r)
		}
		// The window is aligned to the unit, as envoyproxy/ratelimit's cache
		// keys (now / 60 * 60): testNow is 30 s into its minute.
		if st.DurationUntilReset.AsDuration() != 30*time.Second {
			t.Fatalf("duration_until_reset %v", st.DurationUntilReset.AsDuration())
		}
	}
	r := call(t, c, "web", d)
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 || r.Statuses[0].DurationUntilReset.AsDuration() != 30*time.Second {
		t.Fatalf("4th: %v", r)
	}
	// No refund tokens for configured descriptors.
	if h := header(call(t, c, "web", desc("user", uniq("u"))), rlswire.RefundHeader); len(h) != 0 {
		t.Fatalf("refund header for a configured descriptor: %q", h)
	}
}

func TestCompatUnlimitedNoMatchUnknownDomain(t *testing.T) {
	c := compatServer(t, Options{})
	r := call(t, c, "web", desc("free", "x"), desc("nomatch", "x"))
	if r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatal(r)
	}
	if st := r.Statuses[0]; st.Code != pb.RateLimitResponse_OK || st.LimitRemaining != math.MaxUint32 || st.CurrentLimit != nil {
		t.Fatalf("unlimited: %v", st)
	}
	if st := r.Statuses[1]; st.Code != pb.RateLimitResponse_OK || st.LimitRemaining != 0 || st.CurrentLimit != nil {
		t.Fatalf("no match: %v", st)
	}
	if r := call(t, c, "unknown-domain", desc("user", "x")); r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v", r)
	}
}

func TestCompatShadowMode(t *testing.T) {
	s, c := serve(t, Options{Config: parse(t, compatConfig)})
	d := desc("shadow", uniq("s"))
	for i := 0; i < 3; i++ {
		r := call(t, c, "web", d)
		if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OK {
			t.Fatalf("shadow call %d: %v", i, r)
		}
	}
	if n := s.Metrics.Descriptors("web", outcomeShadow); n != 2 {
		t.Fatalf("shadow_over_limit = %d, want 2", n)
	}
	if n := s.Metrics.Descriptors("web", outcomeOK); n != 1 {
		t.Fatalf("ok = %d, want 1", n)
	}
}

func TestCompatZeroLimitDeniesAll(t *testing.T) {
	c := compatServer(t, Options{})
	r := call(t, c, "web", desc("blocked", "x"))
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].DurationUntilReset.AsDuration() != 30*time.Second {
		t.Fatal(r)
	}
}

func TestCompatReplaces(t *testing.T) {
	c := compatServer(t, Options{})
	g, sp := desc("general", uniq("g")), desc("special", uniq("s"))
	// general alone: 1 per minute.
	if cs := codesOf(call(t, c, "web", g)); cs[1] != pb.RateLimitResponse_OK {
		t.Fatal(cs)
	}
	if cs := codesOf(call(t, c, "web", g)); cs[1] != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatal(cs)
	}
	// With special in the same call, general is replaced: no limit applies to it.
	for i := 0; i < 5; i++ {
		r := call(t, c, "web", g, sp)
		if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil || r.Statuses[1].LimitRemaining != uint32(4-i) {
			t.Fatalf("call %d: %v", i, r)
		}
	}
	if r := call(t, c, "web", g, sp); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != pb.RateLimitResponse_OK {
		t.Fatal(r)
	}
}

func TestCompatLimitOverride(t *testing.T) {
	c := compatServer(t, Options{})
	d := desc("user", uniq("o"))
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	r := call(t, c, "web", d)
	if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 ||
		r.Statuses[0].CurrentLimit.GetUnit() != pb.RateLimitResponse_RateLimit_HOUR || r.Statuses[0].DurationUntilReset.AsDuration() != 29*time.Minute+30*time.Second {
		t.Fatal(r)
	}
	if r := call(t, c, "web", d); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("override 1/hour admitted twice: %v", r)
	}
	d.Limit.Unit = typev3.RateLimitUnit_UNKNOWN
	if _, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "web", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}); err == nil {
		t.Fatal("override with unit UNKNOWN accepted")
	}
}

func TestCompatHitsAddend(t *testing.T) {
	c := compatServer(t, Options{})
	d := desc("user", uniq("h"))
	req := func(hits uint32, per *uint64) *pb.RateLimitResponse {
		dd := &ratelimitv3.RateLimitDescriptor{Entries: d.Entries}
		if per != nil {
			dd.HitsAddend = wrapperspb.UInt64(*per)
		}
		r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "web", HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{dd}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := req(2, nil); r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("hits 2 of 3: %v", r)
	}
	// 2 more do not fit: denied, and not charged.
	if r := req(2, nil); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("hits 2 more: %v", r)
	}
	zero := uint64(0)
	if r := req(5, &zero); r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("per-descriptor hits_addend 0: %v", r)
	}
	one := uint64(1)
	if r := req(7, &one); r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("per-descriptor hits_addend 1 over the request's 7: %v", r)
	}
	// hits_addend 0 on the request means 1.
	if r := req(0, nil); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("hits_addend 0 = 1: %v", r)
	}
}

func TestCompatAlgorithmAndShareThreshold(t *testing.T) {
	c := compatServer(t, Options{})
	b := desc("bucket", uniq("b"))
	// token_bucket, burst 2, time pinned: exactly 2.
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		if r := call(t, c, "web", b); r.OverallCode != want {
			t.Fatalf("bucket call %d: %v", i, r)
		}
	}
	// 1 token per second: the retry is exact.
	if r := call(t, c, "web", b); r.Statuses[0].DurationUntilReset.AsDuration() != time.Second {
		t.Fatalf("token_bucket retry: %v", r)
	}
	// Every value matching a share_threshold wildcard shares one counter
	// (of 2): the third distinct value is denied. The pattern is unique to
	// the run, since the shared counter has no per-value part.
	p := uniq("shared")
	_, c2 := serve(t, Options{Config: parse(t, "domain: web\ndescriptors:\n  - key: files\n    value: \""+p+"*\"\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")})
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		if r := call(t, c2, "web", desc("files", p+string(rune('a'+i)))); r.OverallCode != want {
			t.Fatalf("share_threshold value %d: %v", i, r)
		}
	}
}

func TestCompatQuotaMode(t *testing.T) {
	c := compatServer(t, Options{})
	a, b := desc("quota_a", uniq("q")), desc("quota_b", uniq("q"))
	if r := call(t, c, "web", a, b); r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatal(r)
	}
	// a is over (quota), b is not: OK overall while one quota descriptor has room.
	r := call(t, c, "web", a, b)
	if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[1].Code != pb.RateLimitResponse_OK {
		t.Fatal(r)
	}
	// Both over: OVER_LIMIT.
	if r := call(t, c, "web", a, b); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT {
		t.Fatal(r)
	}
}

func TestCompatResponseHeaders(t *testing.T) {
	c := compatServer(t, Options{Headers: &DefaultHeaderNames})
	u, s := desc("user", uniq("u")), desc("special", uniq("s"))
	r := call(t, c, "web", s, u)
	// The descriptor closest to its limit: user, 2 of 3 left (special has 4 of 5).
	if got := [3][]string{header(r, "RateLimit-Limit"), header(r, "RateLimit-Remaining"), header(r, "RateLimit-Reset")}; len(got[0]) != 1 ||
		got[0][0] != "3" || got[1][0] != "2" || got[2][0] != "30" {
		t.Fatalf("headers %v", got)
	}
	call(t, c, "web", u)
	call(t, c, "web", u)
	r = call(t, c, "web", s, u)
	if got := header(r, "RateLimit-Remaining"); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || len(got) != 1 || got[0] != "0" {
		t.Fatalf("over limit: %v", r)
	}
	// Off by default.
	c2 := compatServer(t, Options{})
	if r := call(t, c2, "web", desc("user", uniq("u"))); len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers without Options.Headers: %v", r.ResponseHeadersToAdd)
	}
}

// Inline and configured descriptors in one call: a denial by either refunds the other.
func TestMixedCallRefundsBoth(t *testing.T) {
	c := compatServer(t, Options{InlineDomains: []string{"web"}})
	u := desc("user", uniq("m"))
	in := inlineDesc("r", "leaky_bucket", 1, time.Minute, 0, uniq("m"))
	if r := call(t, c, "web", u, in); r.OverallCode != pb.RateLimitResponse_OK || len(header(r, rlswire.RefundHeader)) != 1 || header(r, rlswire.RefundHeader)[0][:2] != "1:" {
		t.Fatal(r)
	}
	for i := 0; i < 3; i++ {
		if r := call(t, c, "web", u, in); r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != pb.RateLimitResponse_OK {
			t.Fatal(r)
		}
	}
	// user was charged once in 4 calls: 1 left after the next one.
	if r := call(t, c, "web", u); r.Statuses[0].LimitRemaining != 1 {
		t.Fatal(r)
	}
}

// Global shadow mode (envoyproxy/ratelimit's SHADOW_MODE): the call is
// answered OK, the status still says OVER_LIMIT, and the counters are what
// enforcement would leave (the other descriptor is refunded).
func TestCompatGlobalShadow(t *testing.T) {
	s, c := serve(t, Options{Config: parse(t, compatConfig), GlobalShadow: true})
	u, sp := desc("user", uniq("g")), desc("special", uniq("g"))
	for i := 0; i < 3; i++ {
		call(t, c, "web", u)
	}
	r := call(t, c, "web", sp, u)
	if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[1].Code != pb.RateLimitResponse_OVER_LIMIT || s.Metrics.GlobalShadow() != 1 {
		t.Fatalf("global shadow: %v (%d)", r, s.Metrics.GlobalShadow())
	}
	if r := call(t, c, "web", sp); r.Statuses[0].LimitRemaining != 4 {
		t.Fatalf("special was charged by the call over the limit: %v", r)
	}
}
