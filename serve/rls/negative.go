package rls

import (
	"context"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
)

// Negative hits (RateLimitDescriptor.is_negative_hits): the descriptor's
// hits_addend goes back to its limit, and the descriptor answers OK with
// what remains after. Nothing goes below a fresh limit's state:
//
//   - token_bucket, leaky_bucket: the bucket gets the units back (redisrl's
//     refund), at most up to full (token_bucket) or empty (leaky_bucket);
//   - fixed_window: the current window's count goes down by at most what it
//     holds (an earlier window's hits are gone already), never below 0;
//   - a charged counter (Options.ChargeDenied) likewise, never below 0;
//   - sliding_log and sliding_window keep their hits per instant or per
//     window, not as one count: the call is INVALID_ARGUMENT.
//
// A negative descriptor is never over its limit and takes no part in the
// call's overall_code.

// canGiveBack reports whether units can be given back to a limit of kind k.
func canGiveBack(k algorithms.Kind) bool {
	return k == algorithms.TokenBucket || k == algorithms.LeakyBucket || k == algorithms.FixedWindow
}

// giveBack returns r.Cost units to r's limit (r.Cost >= 1, r.Params.Limit
// >= 1, canGiveBack(r.Kind)).
func (s *Server) giveBack(ctx context.Context, r redisrl.Request) (redisrl.Result, error) {
	b, ns := s.opts.Backend, s.Metrics.noscript
	if r.Kind == algorithms.FixedWindow {
		// A decision costing more than the limit changes nothing and says
		// what the window holds and when it is (the refund's stamp); the
		// refund then takes at most that. A window that ends in between
		// makes the refund a no-op: the old window's hits are gone.
		probe := r
		probe.Cost = r.Params.Limit + 1
		p, err := run(ctx, b, &probe, ns)
		if err != nil {
			return p, err
		}
		used := p.Limit - p.Remaining
		if used <= 0 {
			p.Allowed, p.RetryAfter = true, 0
			return p, nil
		}
		r.Cost = min(r.Cost, used)
		r.Refund = &redisrl.Result{Stamp: p.Stamp}
		return run(ctx, b, &r, ns)
	}
	r.Cost = min(r.Cost, max(r.Params.Limit, r.Params.Burst))
	r.Refund = &redisrl.Result{Stamp: r.Now}
	return run(ctx, b, &r, ns)
}

// fillCharged answers a charged counter's descriptor as envoyproxy/ratelimit
// does: OVER_LIMIT with 0 remaining when the count exceeds the limit, else
// OK with limit − count remaining; duration_until_reset is the time to the
// window's end in whole seconds (rounded up: the unit minus the current
// second's offset in it). Over the limit, shadow_mode answers OK (remaining
// 0, the reset kept) and quota_mode answers OK without a reset. A negative
// descriptor is OK with what remains.
func fillCharged(st *pb.RateLimitResponse_DescriptorStatus, it *item, l *Limit) string {
	st.DurationUntilReset = durationpb.New(wholeSeconds(it.cres.left))
	if !it.denied {
		st.LimitRemaining = clampU32(l.Params.Limit - it.cres.count)
		if it.neg {
			return outcomeNegative
		}
		return outcomeOK
	}
	if l.Shadow {
		return outcomeShadow
	}
	st.Code = pb.RateLimitResponse_OVER_LIMIT
	return outcomeOver
}
