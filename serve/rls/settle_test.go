package rls

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// reserveDesc is a decision descriptor of cost hits (its own hits_addend,
// as sluice.wasm sends a rule with "cost").
func reserveDesc(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: d.Entries, HitsAddend: wrapperspb.UInt64(hits)}
}

// settleDesc is d with sluice.settle = delta.
func settleDesc(d *ratelimitv3.RateLimitDescriptor, delta string) *ratelimitv3.RateLimitDescriptor {
	es := append(append([]*ratelimitv3.RateLimitDescriptor_Entry(nil), d.Entries...), &ratelimitv3.RateLimitDescriptor_Entry{Key: rlswire.Settle, Value: delta})
	return &ratelimitv3.RateLimitDescriptor{Entries: es}
}

// A token budget across two replicas on a pinned clock: reservations of
// their hits_addend, a settlement's refund on one replica reopening the key
// on the other, an excess charged into debt that every replica refuses
// for exactly the debt's refill, a refund of a costly admission giving its
// whole cost back.
func TestSettleAcrossReplicas(t *testing.T) {
	var now atomic.Int64
	now.Store(testNow)
	pin := func() int64 { return now.Load() }
	_, r1 := serve(t, Options{InlineDomains: []string{"mesh"}, Now: pin})
	_, r2 := serve(t, Options{InlineDomains: []string{"mesh"}, Now: pin})
	for _, alg := range []string{"token_bucket", "leaky_bucket"} {
		t.Run(alg, func(t *testing.T) {
			now.Store(testNow)
			d := inlineDesc("budget", alg, 100, time.Minute, 100, uniq("k"))
			expect := func(r *pb.RateLimitResponse, code pb.RateLimitResponse_Code, remaining uint32, wait time.Duration) {
				t.Helper()
				st := r.Statuses[0]
				if r.OverallCode != code || st.Code != code || st.LimitRemaining != remaining || (wait > 0 && st.DurationUntilReset.AsDuration() != wait) {
					t.Fatalf("got %v, want %v remaining %d (wait %v)", r, code, remaining, wait)
				}
			}
			expect(call(t, r1, "mesh", reserveDesc(d, 80)), pb.RateLimitResponse_OK, 20, 0)
			expect(call(t, r2, "mesh", reserveDesc(d, 30)), pb.RateLimitResponse_OVER_LIMIT, 20, 6*time.Second)
			// The 80 cost 20: 60 back, on the other replica.
			expect(call(t, r2, "mesh", settleDesc(d, "-60")), pb.RateLimitResponse_OK, 80, 0)
			r := call(t, r1, "mesh", reserveDesc(d, 30))
			expect(r, pb.RateLimitResponse_OK, 50, 0)
			// The 30 cost 230: 200 charged, 150 beyond the bucket: 90 s
			// of debt, 90.6 s until one unit fits.
			expect(call(t, r2, "mesh", settleDesc(d, "200")), pb.RateLimitResponse_OK, 0, 0)
			for _, c := range []pb.RateLimitServiceClient{r1, r2} {
				expect(call(t, c, "mesh", d), pb.RateLimitResponse_OVER_LIMIT, 0, 90600*time.Millisecond)
			}
			now.Add(90600*1000 - 1)
			expect(call(t, r1, "mesh", d), pb.RateLimitResponse_OVER_LIMIT, 0, time.Microsecond)
			now.Add(1)
			expect(call(t, r2, "mesh", d), pb.RateLimitResponse_OK, 0, 0)
			// A refund of an admission of cost 40 gives the 40 back.
			now.Add(60_000_000) // full again
			r = call(t, r1, "mesh", reserveDesc(d, 40))
			expect(r, pb.RateLimitResponse_OK, 60, 0)
			tok := header(r, rlswire.RefundHeader)
			if len(tok) != 1 {
				t.Fatalf("refund token: %v", r)
			}
			_, stamp, ref, _ := rlswire.ParseToken([]byte(tok[0]))
			rf := &ratelimitv3.RateLimitDescriptor{HitsAddend: wrapperspb.UInt64(40),
				Entries: append(append([]*ratelimitv3.RateLimitDescriptor_Entry(nil), d.Entries...),
					&ratelimitv3.RateLimitDescriptor_Entry{Key: rlswire.Refund, Value: string(rlswire.AppendPair(nil, stamp, ref))})}
			call(t, r2, "mesh", rf)
			expect(call(t, r2, "mesh", reserveDesc(d, 100)), pb.RateLimitResponse_OK, 0, 0)
		})
	}
}

// A settlement is no decision: in a call another descriptor denies, it is
// applied all the same (not undone by the all-or-nothing refund) and
// answered OK, without a refund token.
func TestSettleIsNoDecision(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	d := inlineDesc("budget", "token_bucket", 10, time.Minute, 10, uniq("k"))
	call(t, c, "mesh", reserveDesc(d, 10))
	deny := inlineDesc("deny", "fixed_window", 1, time.Minute, 0, uniq("k"))
	call(t, c, "mesh", deny)
	r := call(t, c, "mesh", settleDesc(d, "-4"), deny)
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4 ||
		len(header(r, rlswire.RefundHeader)) != 0 {
		t.Fatalf("settle with a denial: %v", r)
	}
	if r := call(t, c, "mesh", reserveDesc(d, 4)); r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("after the settlement: %v", r)
	}
}

func TestSettleErrors(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	tb := inlineDesc("budget", "token_bucket", 10, time.Second, 0, "k")
	for _, tc := range []struct {
		name string
		d    *ratelimitv3.RateLimitDescriptor
		code codes.Code
		msg  string
	}{
		{"window algorithm", settleDesc(inlineDesc("b", "fixed_window", 10, time.Second, 0, "k"), "1"), codes.InvalidArgument, "entry 6 (sluice.settle): fixed_window holds at most limit per window"},
		{"zero", settleDesc(tb, "0"), codes.InvalidArgument, "entry 6 (sluice.settle): must be a non-zero decimal integer"},
		{"plus", settleDesc(tb, "+3"), codes.InvalidArgument, "must be a non-zero decimal integer"},
		{"too large", settleDesc(tb, "-1000000000001"), codes.InvalidArgument, "must be a non-zero decimal integer of at most 1000000000000"},
		{"too fast", settleDesc(inlineDesc("b", "leaky_bucket", 2_000_000, time.Second, 0, "k"), "5"), codes.InvalidArgument, "at most one cost unit per microsecond"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "mesh", Descriptors: []*ratelimitv3.RateLimitDescriptor{tc.d}})
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("got %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
}

// A charge deeper than the script holds exactly leaves the key at its deepest debt (as a
// local rule's), answered OK: the over-use is kept, and the key refuses for a long time.
func TestSettleDeepestDebt(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	d := inlineDesc("b", "token_bucket", 10, 100*time.Hour, 0, uniq("k"))
	if r := call(t, c, "mesh", settleDesc(d, "1000000000000")); r.OverallCode != pb.RateLimitResponse_OK {
		t.Fatalf("a charge of 10^12: %v", r)
	}
	r := call(t, c, "mesh", d)
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].DurationUntilReset.AsDuration() < 24*time.Hour*365 {
		t.Fatalf("after the deepest debt: %v, want OVER_LIMIT for years", r)
	}
}
