package rls

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// checkThenCharge is Envoy's pattern for a quota charged on the response
// path: the request path asks with hits_addend 0 (a check) and, when the
// check is OK, the response path charges 1 (apply_on_stream_done). It
// returns how many requests the check admitted, up to tries, and the last
// check's answer.
func checkThenCharge(t *testing.T, c pb.RateLimitServiceClient, domain string, d func() *ratelimitv3.RateLimitDescriptor, tries int) (int, *pb.RateLimitResponse) {
	t.Helper()
	admitted := 0
	var last *pb.RateLimitResponse
	for range tries {
		last = rlCall(t, c, &pb.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(d(), 0, false)}})
		if last.OverallCode != pb.RateLimitResponse_OK {
			continue
		}
		admitted++
		rlCall(t, c, &pb.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d()}, HitsAddend: 1})
	}
	return admitted, last
}

// A check (a descriptor's hits_addend 0) reads the
// limit without charging it, in both modes, and answers OVER_LIMIT when
// the descriptor is over: without --charge-denied when one more request
// would be refused (so a limit of N admits N checked-then-charged requests,
// for every algorithm), with it as envoyproxy/ratelimit does, when the
// count already exceeds the limit (N + 1 of them: the check at N is OK).
func TestCheckWithoutCharge(t *testing.T) {
	cases := []struct {
		key    string
		limit  int
		charge bool
	}{
		{"a", 3, false}, {"tb", 10, false}, {"lb", 10, false}, {"sl", 10, false}, {"sw", 10, false},
		{"a", 3, true}, {"b", 10, true},
	}
	servers := map[bool]pb.RateLimitServiceClient{}
	for _, charge := range []bool{false, true} {
		_, servers[charge] = serve(t, Options{Config: parse(t, chargedConfig), ChargeDenied: charge, Now: func() int64 { return testNow }})
	}
	for _, tc := range cases {
		name := tc.key
		if tc.charge {
			name += "/charge-denied"
		}
		t.Run(name, func(t *testing.T) {
			c := servers[tc.charge]
			k := uniq("chk")
			d := func() *ratelimitv3.RateLimitDescriptor { return desc(tc.key, k) }
			// Checks alone charge nothing.
			for range 2 * tc.limit {
				r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(d(), 0, false)}})
				if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != uint32(tc.limit) {
					t.Fatalf("check of a fresh limit: %v, remaining %d; want OK, %d", r.OverallCode, r.Statuses[0].LimitRemaining, tc.limit)
				}
			}
			want := tc.limit
			if tc.charge {
				want++ // the peer's rule: over when count > limit
			}
			got, last := checkThenCharge(t, c, "cd", d, 3*tc.limit)
			if got != want {
				t.Errorf("check-then-charge admitted %d, want %d", got, want)
			}
			if st := last.Statuses[0]; last.OverallCode != pb.RateLimitResponse_OVER_LIMIT || st.Code != pb.RateLimitResponse_OVER_LIMIT ||
				st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration() <= 0 {
				t.Errorf("last check: %v", last)
			}
			// A check is a descriptor's hits_addend 0: the request's 0 is 1, as
			// the peer reads it (proto3 tells no 0 from unset), so it charges.
			fresh := desc(tc.key, uniq("req0"))
			r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{fresh}, HitsAddend: 0})
			if r.OverallCode != pb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != uint32(tc.limit-1) {
				t.Errorf("request hits_addend 0 on a fresh limit: %v, remaining %d; want OK, %d (charged 1)", r.OverallCode, r.Statuses[0].LimitRemaining, tc.limit-1)
			}
		})
	}
	// In a call with a charged descriptor, a check that is over denies the
	// call, and the charge is undone (default mode: a denied call is
	// charged to nothing).
	t.Run("mixed", func(t *testing.T) {
		c := servers[false]
		k := uniq("mix")
		for range 3 {
			call(t, c, "cd", desc("a", k))
		}
		r := rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			withHits(desc("a", k), 0, false), desc("b", k)}, HitsAddend: 1})
		if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || r.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("check over beside a charge: %v", r)
		}
		r = rlCall(t, c, &pb.RateLimitRequest{Domain: "cd", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("b", k), 0, false)}})
		if r.Statuses[0].LimitRemaining != 10 {
			t.Errorf("b after the denied call: remaining %d, want 10 (refunded)", r.Statuses[0].LimitRemaining)
		}
	})
}
