// Package rls is `sluice serve`: a rate-limit service speaking Envoy's
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit that decides
// on a Redis Cluster with the Redis backend's scripts (internal/redisrl:
// one round trip per descriptor, Redis TIME, hash tags, EVALSHA with EVAL
// after NOSCRIPT). It keeps no state of its own, so any number of replicas
// share one cluster and stay exact.
//
// A request's descriptors are of two kinds. An inline descriptor (first
// entry sluice.rule) carries a sluice rule's algorithm, limit, window,
// burst and key, as sluice.wasm's backend "rls" sends it; the service
// accepts them only for the domains it is told to (Options.InlineDomains).
// Any other descriptor is looked up in an envoyproxy/ratelimit
// configuration (Config), so the service is a drop-in for that one.
//
// All descriptors of a call are decided in parallel. If any of them (not in
// shadow mode) is over its limit, every descriptor that admitted the
// request is refunded (redisrl's refund) before the answer: a denied
// request is charged to no descriptor. The filter can also refund an
// admission later with the token the service returns for each admitted
// inline descriptor (response header x-sluice-refund "<i>:<stamp>:<ref>").
//
// Shaping (a sluice rule's "delay"): an inline descriptor whose seventh
// entry is sluice.max_delay_us is decided by its script with that queue
// (redisrl Request.MaxDelay; never coalesced), and an admission into a
// later slot is answered with x-sluice-delay "<i>:<delay_us>" (rlswire).
//
// Token budgets (a sluice rule's "cost"): a decision's cost is its
// descriptor's hits_addend, as for any descriptor; an inline descriptor
// whose seventh entry is sluice.settle = "<delta>" settles the reservation
// once the response has ended (redisrl Request.Settle: a charge, the key
// going into debt, or a refund up to a full bucket), answered OK; like a
// refund it is no decision (rlswire).
//
// Leases (a sluice rule's "lease"): an inline descriptor whose seventh
// entry is sluice.lease = "<n>:<instances>" runs redisrl's lease script,
// reserving up to n admissions for the caller (OK with quota.requests =
// the grant and x-sluice-lease "<i>:<stamp>:<valid_us>"; OVER_LIMIT when
// nothing is left, duration_until_reset the wait); sluice.return =
// "<n>:<stamp>" gives unspent ones back (OK). Lease descriptors are no
// decisions: they take no part in overall_code or in the all-or-nothing
// refund (a grant is the caller's until it returns it), except that a call
// answered with an error returns the grants it made, since the caller never
// learns of them.
package rls

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// MaxDescriptors bounds the descriptors of one call (each is a Redis round
// trip in parallel): a larger call is INVALID_ARGUMENT.
const MaxDescriptors = 1024

// HeaderNames are the response headers envoyproxy/ratelimit adds when
// LIMIT_RESPONSE_HEADERS_ENABLED is set (its defaults: RateLimit-Limit,
// RateLimit-Remaining, RateLimit-Reset), describing the descriptor closest
// to its limit.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// DefaultHeaderNames are envoyproxy/ratelimit's default header names.
var DefaultHeaderNames = HeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}

// Options configure a Server.
type Options struct {
	// Backend runs the scripts (a ClusterBackend in production).
	Backend Backend
	// InlineDomains are the domains whose inline descriptors are accepted;
	// "*" accepts any domain. Inline descriptors of other domains are
	// PERMISSION_DENIED.
	InlineDomains []string
	// Config is the envoyproxy/ratelimit configuration (nil: none, every
	// configured-style descriptor is OK without a limit).
	Config *Config
	// GlobalShadow answers OK when a descriptor is over its limit (its
	// status still says OVER_LIMIT), as envoyproxy/ratelimit's SHADOW_MODE.
	// Such a call is still charged to no descriptor: the counters are what
	// enforcement would leave.
	GlobalShadow bool
	// GlobalQuota puts every configured descriptor (not the unlimited
	// ones, nor inline ones) in quota mode, as envoyproxy/ratelimit's
	// QUOTA_MODE: a descriptor with no limit counts as a quota descriptor
	// within its limit there, so a call with one is never over by quota.
	GlobalQuota bool
	// Headers, when set, adds the limit/remaining/reset headers of the
	// descriptor closest to its limit to every response.
	Headers *HeaderNames
	// RefundTimeout bounds the refunds the service sends after a denial
	// (they outlive the caller's deadline). 0 means one second.
	RefundTimeout time.Duration
	// ChargeDenied counts every hit of a configured fixed_window limit,
	// denied or not, as envoyproxy/ratelimit's Redis cache does (charged.go):
	// each descriptor's counter gets its hits_addend, and is over its limit
	// when the count after the addition exceeds requests_per_unit; there is
	// no refund. The configuration must hold fixed_window limits only
	// (Config.CheckChargeDenied). Inline descriptors keep sluice's
	// semantics.
	ChargeDenied bool
	// DynamicMetadata adds the response's dynamic metadata, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA (metadata.go).
	DynamicMetadata bool
	// MaxStatKeys bounds the per-limit statistics keys that hold request
	// values (detailed_metric, value_to_metric, limit overrides); a key
	// past the bound is counted as "other". 0 means DefaultMaxStatKeys.
	MaxStatKeys int
	// Now, when set, pins the scripts' time (Unix µs) instead of Redis
	// TIME: tests only.
	Now func() int64
	// Logger receives refund failures and reloads (nil: discarded).
	Logger *slog.Logger
}

// Server implements RateLimitServiceServer. It is safe for concurrent use.
type Server struct {
	pb.UnimplementedRateLimitServiceServer
	opts    Options
	inline  map[string]bool
	anyDom  bool
	cfg     atomic.Pointer[Config]
	Metrics *Metrics
	batch   batcher // coalescing (batch.go)
}

// New returns a Server.
func New(opts Options) *Server {
	s := &Server{opts: opts, inline: map[string]bool{}}
	for _, d := range opts.InlineDomains {
		if d == "*" {
			s.anyDom = true
		}
		s.inline[d] = true
	}
	if s.opts.RefundTimeout <= 0 {
		s.opts.RefundTimeout = time.Second
	}
	if s.opts.Logger == nil {
		s.opts.Logger = slog.New(slog.DiscardHandler)
	}
	s.cfg.Store(opts.Config)
	if s.opts.MaxStatKeys <= 0 {
		s.opts.MaxStatKeys = DefaultMaxStatKeys
	}
	s.Metrics = newMetrics(s.knownDomain, s.opts.MaxStatKeys)
	return s
}

// SetConfig replaces the configuration (a reload); calls in flight finish
// with the one they started with.
func (s *Server) SetConfig(c *Config) { s.cfg.Store(c) }

// Config returns the current configuration (nil if none).
func (s *Server) Config() *Config { return s.cfg.Load() }

func (s *Server) inlineAllowed(domain string) bool { return s.anyDom || s.inline[domain] }

// knownDomain reports whether a domain may be a metric label value: one
// configured or listed for inline descriptors (others are "other", so
// callers cannot grow the metrics without bound).
func (s *Server) knownDomain(d string) bool {
	if s.inline[d] && d != "*" {
		return true
	}
	c := s.cfg.Load()
	return c != nil && c.domains[d] != nil
}

// item is one descriptor's part of a call.
type item struct {
	in        *inline // inline descriptor
	m         *match  // configured limit (nil: none)
	unlimited bool
	cost      int64
	call      bool // a script runs for it
	req       redisrl.Request
	res       redisrl.Result
	err       error
	denied    bool // the limit denied the request (before shadow mode)
	neg       bool // is_negative_hits: cost units go back to the limit
	// A configured fixed_window limit under Options.ChargeDenied: the
	// counter's call and reply.
	charged *chargedCall
	cres    chargedResult
	// next is the call's next charged descriptor on the same counter, run
	// after this one (envoyproxy/ratelimit's pipeline runs a call's INCRBYs
	// in order); queued marks every one but the first.
	next   *item
	queued bool
	// A lease descriptor (in.leaseCall()): the lease script's call and reply.
	lq   *redisrl.LeaseRequest
	lres redisrl.LeaseResult
}

func (it *item) limit() *Limit {
	if it.m == nil {
		return nil
	}
	return it.m.limit
}

// ShouldRateLimit implements the RateLimitService.
func (s *Server) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	start := time.Now()
	resp, err := s.shouldRateLimit(ctx, req)
	s.Metrics.call(req.GetDomain(), resp, err, time.Since(start))
	return resp, err
}

func (s *Server) shouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	domain := req.GetDomain()
	if ds := req.GetDescriptors(); domain != "" && isInFlight(ds) {
		return s.inFlight(ctx, domain, ds[0]) // inflight.go
	}
	items, err := s.items(domain, req)
	if err != nil {
		return nil, err
	}
	var now int64
	if s.opts.Now != nil {
		now = s.opts.Now()
	}
	for i := range items {
		items[i].plan(now)
	}
	// The calls run detached from the caller's cancellation, bounded by the
	// backend's timeout: the service must learn what it charged to be able
	// to undo it.
	dctx := context.WithoutCancel(ctx)
	s.run(dctx, items)
	failed, over := s.verdict(items)
	if failed == nil {
		s.countLimits(items)
	}
	if failed != nil || over || ctx.Err() != nil {
		s.refundAdmitted(dctx, domain, items, failed != nil || ctx.Err() != nil)
	}
	if failed != nil || ctx.Err() != nil {
		s.countReturns(items)
	}
	if failed != nil {
		return nil, status.Errorf(codes.Unavailable, "redis: %v", failed)
	}
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	out := s.response(domain, items, over)
	if s.opts.DynamicMetadata {
		out.DynamicMetadata = dynamicMetadata(req, items, out.Statuses)
	}
	return out, nil
}

// items checks the call and makes one item per descriptor: an inline
// descriptor's request, or the configured limit it matched, with the
// limits another one replaces dropped.
func (s *Server) items(domain string, req *pb.RateLimitRequest) ([]item, error) {
	if domain == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if len(ds) > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors in one call; at most %d", len(ds), MaxDescriptors)
	}
	cfg := s.cfg.Load()
	items := make([]item, len(ds))
	replacing := map[string]bool{}
	for i, d := range ds {
		it := &items[i]
		it.neg = d.GetIsNegativeHits()
		it.cost = hitsAddend(req, d)
		if IsInline(d) {
			if err := s.inlineItem(it, i, domain, d); err != nil {
				return nil, err
			}
			continue
		}
		m, err := cfg.lookup(domain, d)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: %v", i, err)
		}
		if m == nil {
			continue
		}
		for _, r := range m.limit.Replaces {
			replacing[r] = true
		}
		s.configuredItem(it, domain, d, m)
	}
	for i := range items {
		if l := items[i].limit(); l != nil && l.Name != "" && replacing[l.Name] {
			items[i].m, items[i].charged = nil, nil
		}
	}
	for i := range items {
		if it := &items[i]; it.neg && it.charged == nil && it.m != nil && !canGiveBack(it.m.limit.Kind) {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d: is_negative_hits: %s keeps no count that hits can be given back to (token_bucket, leaky_bucket and fixed_window do)", i, it.m.limit.Kind)
		}
	}
	return items, nil
}

// inlineItem fills it from inline descriptor i (sluice.wasm's rules).
func (s *Server) inlineItem(it *item, i int, domain string, d *ratelimitv3.RateLimitDescriptor) error {
	if it.neg {
		return status.Errorf(codes.InvalidArgument, "descriptor %d: is_negative_hits on an inline descriptor (sluice.wasm gives admissions back with %s)", i, rlswire.Refund)
	}
	if !s.inlineAllowed(domain) {
		return status.Errorf(codes.PermissionDenied, "descriptor %d: inline descriptors are not enabled for domain %q (sluice serve --inline-domains)", i, domain)
	}
	in, err := parseInline(i, d)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	it.in = in
	if in.leaseCall() {
		it.lq = in.leaseRequest(domain)
		return nil
	}
	it.req = redisrl.Request{Kind: in.kind, Params: in.params,
		Key: redisrl.AppendKey(nil, in.kind, domain+"/"+in.rule, in.key), MaxDelay: in.maxDelay}
	if in.refund {
		it.req.Refund = &redisrl.Result{Stamp: in.stamp, Ref: in.ref}
	}
	it.req.Settle = in.settle
	return nil
}

// configuredItem fills it from descriptor d, which matched the configured
// limit m: unlimited, the peer's charged counter (--charge-denied), or a
// script request.
func (s *Server) configuredItem(it *item, domain string, d *ratelimitv3.RateLimitDescriptor, m *match) {
	if m.limit.Unlimited {
		it.unlimited = true
		return
	}
	it.m = m
	l := m.limit
	if s.opts.ChargeDenied && l.Kind == algorithms.FixedWindow {
		it.charged = &chargedCall{key: chargedKey(domain, redisKeyPart(d.GetEntries(), m.shared)),
			window: l.Params.Window, take: it.neg}
		return
	}
	it.req = redisrl.Request{Kind: l.Kind, Params: l.Params,
		Key: redisrl.AppendKey(nil, l.Kind, domain+"/", redisKeyPart(d.GetEntries(), m.shared))}
}

// plan says whether the item calls Redis at time now, and with what cost,
// or is decided here (denied, or nothing to do).
func (it *item) plan(now int64) {
	switch {
	case it.lq != nil:
		// A lease call ignores hits_addend: it reserves or returns n.
		it.call = true
		it.lq.Now = now
	case it.in != nil && it.in.settle != 0:
		// A settlement ignores hits_addend: it applies its delta.
		it.call = true
		it.req.Now = now
	case it.charged != nil:
		// Every call, hits_addend 0 and requests_per_unit 0 included,
		// reads the counter (envoyproxy/ratelimit's INCRBY).
		it.call = true
		it.charged.now = now
		if now == 0 {
			// The peer's clock: the replica's (chargedScript).
			it.charged.now = time.Now().UnixMicro()
		}
		it.charged.hits = clampHits(it.cost)
	case it.in == nil && it.m == nil:
	case it.neg && (it.cost == 0 || it.m.limit.Params.Limit == 0):
		// Nothing to give back, or to a limit that admits nothing.
	case it.in == nil && it.m.limit.Params.Limit == 0:
		it.denied = true // requests_per_unit 0, hits_addend 0 too
	case it.cost == 0 && it.in != nil && it.in.refund:
		// A refund of nothing.
	case it.cost == 0:
		// hits_addend 0 checks without charging: the decision of one
		// unit, peeked (written nowhere), is the answer — OVER_LIMIT
		// when one more request would be refused.
		it.call = true
		it.req.Now = now
		it.req.Peek, it.req.Cost = true, 1
	default:
		it.call = true
		it.req.Now = now
		it.req.Cost = clampCost(it.cost, it.req.Params)
	}
}

// run makes the items' Redis calls, in parallel, except that charged
// descriptors on one counter run in order (envoyproxy/ratelimit's
// pipeline).
func (s *Server) run(dctx context.Context, items []item) {
	last := map[string]*item{}
	for i := range items {
		if it := &items[i]; it.call && it.charged != nil {
			if prev := last[string(it.charged.key)]; prev != nil {
				prev.next, it.queued = it, true
			}
			last[string(it.charged.key)] = it
		}
	}
	var wg sync.WaitGroup
	for i := range items {
		if it := &items[i]; it.call && !it.queued {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.call(dctx, it)
			}()
		}
	}
	wg.Wait()
}

// call makes item it's Redis call (and those of the charged items queued
// behind it) and records the result.
func (s *Server) call(dctx context.Context, it *item) {
	if it.lq != nil {
		it.lres, it.err = runLease(dctx, s.opts.Backend, it.lq, s.Metrics.noscript)
		return
	}
	if it.charged != nil {
		for c := it; c != nil; c = c.next {
			c.cres, c.err = runCharged(dctx, s.opts.Backend, c.charged, s.Metrics.noscript, s.Metrics.expireFailed)
			c.denied = c.err == nil && !c.neg && c.cres.count > c.m.limit.Params.Limit
		}
		return
	}
	if it.neg {
		it.res, it.err = s.giveBack(dctx, it.req)
		return
	}
	it.res, it.err = s.decide(dctx, &it.req)
	if it.err == nil && it.req.Refund == nil && it.req.Settle == 0 {
		it.denied = !it.res.Allowed
	}
	if it.err == nil && it.req.Peek && it.res.Allowed {
		// The reply counts the unit it would have taken.
		it.res.Remaining += it.req.Cost
	}
}

// verdict is the call's first Redis error, and whether it is over.
// envoyproxy/ratelimit since 05c08d0 (#1059): the call is over when a
// descriptor not in quota_mode is over its limit, or when every
// quota_mode one is; a shadow_mode limit over its limit counts as within
// it.
func (s *Server) verdict(items []item) (failed error, over bool) {
	quotaTotal, quotaOver := 0, 0
	for i := range items {
		it := &items[i]
		if it.err != nil {
			s.Metrics.redisError()
			if failed == nil {
				failed = it.err
			}
		}
		l := it.limit()
		switch {
		case s.quota(it):
			quotaTotal++
			if it.denied && (l == nil || !l.Shadow) {
				quotaOver++
			}
		case it.denied && (l == nil || !l.Shadow):
			over = true
		}
	}
	if quotaTotal > 0 && quotaOver == quotaTotal {
		over = true
	}
	return failed, over
}

// hitsAddend is the cost of descriptor d: its own hits_addend when set
// (0 allowed), else the request's, at least 1 (envoyproxy/ratelimit's
// GetHitsAddends).
func hitsAddend(req *pb.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) int64 {
	h := uint64(max(1, req.GetHitsAddend()))
	if w := d.GetHitsAddend(); w != nil {
		h = w.GetValue()
	}
	return int64(min(h, math.MaxInt64))
}

// clampCost bounds a cost to the capacity + 1: every cost above the
// capacity is denied alike (RetryAfter = the window), and the scripts'
// arithmetic stays exact.
func clampCost(c int64, p algorithms.Params) int64 {
	capacity := max(p.Limit, p.Burst)
	return min(c, capacity+1)
}

// countReturns counts the admissions the call's lease returns gave back when
// the call answers an error (another descriptor failed, or the caller went
// away): the return ran on the detached context and landed all the same, so
// sluice_rls_returned_total says so, as the answer would have. A stopping
// Envoy sends its returns and deletes its VM, cancelling them, right away.
func (s *Server) countReturns(items []item) {
	for i := range items {
		if it := &items[i]; it.call && it.lq != nil && it.lq.Return && it.err == nil && it.lres.Granted > 0 {
			s.Metrics.leased(0, it.lres.Granted)
		}
	}
}

// refundAdmitted undoes every admission of the call, in parallel, and
// waits. Lease grants are the caller's, except when the call fails
// (returnGrants): then they are returned too.
func (s *Server) refundAdmitted(ctx context.Context, domain string, items []item, returnGrants bool) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.RefundTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i := range items {
		it := &items[i]
		if it.lq != nil {
			if returnGrants && it.err == nil && !it.lq.Return && it.lres.Granted > 0 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.returnGrant(ctx, domain, it)
				}()
			}
			continue
		}
		if !it.call || it.err != nil || it.req.Refund != nil || it.req.Settle != 0 || it.req.Peek || !it.res.Allowed || it.neg || it.charged != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := it.req
			res := it.res
			r.Refund = &res
			after, err := run(ctx, s.opts.Backend, &r, s.Metrics.noscript)
			if err != nil {
				s.Metrics.refund(false)
				s.opts.Logger.Warn("refund failed: the admission stays charged until its window passes",
					"domain", domain, "key", string(r.Key), "err", err)
				return
			}
			s.Metrics.refund(true)
			// The status reports the state after the refund.
			it.res.Remaining, it.res.ResetAfter = after.Remaining, after.ResetAfter
		}()
	}
	wg.Wait()
}

// returnGrant gives back what a lease acquire of a failed call granted
// (the caller never learns of it).
func (s *Server) returnGrant(ctx context.Context, domain string, it *item) {
	q := *it.lq
	q.N, q.Return, q.Stamp = it.lres.Granted, true, it.lres.Stamp
	if _, err := runLease(ctx, s.opts.Backend, &q, s.Metrics.noscript); err != nil {
		s.Metrics.refund(false)
		s.opts.Logger.Warn("lease return failed: the grant stays charged until its window passes or the bucket refills",
			"domain", domain, "key", string(q.Key), "err", err)
		return
	}
	s.Metrics.refund(true)
}

func (s *Server) response(domain string, items []item, over bool) *pb.RateLimitResponse {
	out := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(items))}
	if over {
		out.OverallCode = pb.RateLimitResponse_OVER_LIMIT
	}
	for i := range items {
		it := &items[i]
		st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}
		out.Statuses[i] = st
		outcome := outcomeNoLimit
		switch {
		case it.unlimited:
			st.LimitRemaining = math.MaxUint32
			outcome = outcomeUnlimited
		case it.in != nil:
			st.CurrentLimit = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: clampU32(it.in.params.Limit),
				Unit: unitOf(it.in.params.Window), Name: it.in.rule}
			if it.in.refund {
				outcome = outcomeRefund
				break
			}
			if it.in.settle != 0 {
				outcome = outcomeSettle
				st.LimitRemaining = clampU32(it.res.Remaining)
				st.DurationUntilReset = durationpb.New(it.res.ResetAfter)
				break
			}
			if it.lq != nil {
				outcome = s.fillLease(out, st, i, it)
				break
			}
			outcome = s.fill(st, it, false)
			if !over && it.call && it.res.Allowed && !it.req.Peek {
				out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: rlswire.RefundHeader,
					Value: string(rlswire.AppendToken(nil, i, it.res.Stamp, it.res.Ref))})
				if it.res.Delay > 0 {
					out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: rlswire.DelayHeader,
						Value: string(rlswire.AppendIndexed(nil, i, int64(it.res.Delay/time.Microsecond)))})
				}
			}
		case it.m != nil:
			l := it.m.limit
			st.CurrentLimit = &pb.RateLimitResponse_RateLimit{RequestsPerUnit: l.RequestsPerUnit, Unit: l.Unit, Name: l.Name}
			switch {
			case it.charged != nil:
				outcome = fillCharged(st, it, l)
			case it.neg:
				outcome = outcomeNegative
				if it.call {
					st.LimitRemaining = clampU32(it.res.Remaining)
					st.DurationUntilReset = durationpb.New(it.res.ResetAfter)
				}
			default:
				outcome = s.fill(st, it, l.Shadow)
			}
		}
		s.Metrics.descriptor(domain, outcome)
	}
	if over && s.opts.GlobalShadow {
		out.OverallCode = pb.RateLimitResponse_OK
		s.Metrics.add(&s.Metrics.globalShadow)
	}
	if h := s.opts.Headers; h != nil {
		if st := closest(out.Statuses, items, s.quota); st != nil {
			reset := st.GetDurationUntilReset().AsDuration()
			secs := int64((reset + time.Second - 1) / time.Second)
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd,
				&corev3.HeaderValue{Key: h.Limit, Value: strconv.FormatUint(uint64(st.CurrentLimit.GetRequestsPerUnit()), 10)},
				&corev3.HeaderValue{Key: h.Remaining, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
				&corev3.HeaderValue{Key: h.Reset, Value: strconv.FormatInt(secs, 10)})
		}
	}
	return out
}

// fillLease answers a lease descriptor: an acquire's grant in
// quota.requests (OK) with its stamp and validity in an x-sluice-lease
// header, or OVER_LIMIT with the wait when nothing was granted; a return is
// OK (quota.requests = what it gave back, when anything).
func (s *Server) fillLease(out *pb.RateLimitResponse, st *pb.RateLimitResponse_DescriptorStatus, i int, it *item) string {
	r := &it.lres
	st.LimitRemaining = clampU32(r.Remaining)
	if it.lq.Return {
		st.DurationUntilReset = durationpb.New(r.ResetAfter)
		if r.Granted > 0 {
			st.Quota = &pb.RateLimitResponse_Quota{Requests: clampU32(r.Granted)}
		}
		s.Metrics.leased(0, r.Granted)
		return outcomeReturn
	}
	s.Metrics.leased(r.Granted, 0)
	if r.Granted == 0 {
		st.Code = pb.RateLimitResponse_OVER_LIMIT
		st.DurationUntilReset = durationpb.New(r.RetryAfter)
		return outcomeLeaseOver
	}
	st.DurationUntilReset = durationpb.New(r.ResetAfter)
	st.Quota = &pb.RateLimitResponse_Quota{Requests: clampU32(r.Granted)}
	out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: rlswire.LeaseHeader,
		Value: string(rlswire.AppendToken(nil, i, r.Stamp, int64(r.Valid/time.Microsecond)))})
	return outcomeLease
}

// fill sets a decided descriptor's code, remaining and reset.
func (s *Server) fill(st *pb.RateLimitResponse_DescriptorStatus, it *item, shadow bool) string {
	switch {
	case !it.call && !it.denied: // nothing to decide
		return outcomeOK
	case !it.call: // requests_per_unit 0: the window's end, on this clock
		w := it.req.Params.Window
		now := time.Now().UnixMicro()
		if s.opts.Now != nil && s.opts.Now() > 0 {
			now = s.opts.Now()
		}
		wus := int64(w / time.Microsecond)
		st.DurationUntilReset = durationpb.New(time.Duration(wus-now%wus) * time.Microsecond)
	case it.res.Allowed:
		st.LimitRemaining = clampU32(it.res.Remaining)
		st.DurationUntilReset = durationpb.New(it.res.ResetAfter)
		return outcomeOK
	default:
		st.LimitRemaining = clampU32(it.res.Remaining)
		st.DurationUntilReset = durationpb.New(it.res.RetryAfter)
	}
	if shadow {
		return outcomeShadow
	}
	st.Code = pb.RateLimitResponse_OVER_LIMIT
	return outcomeOver
}

// quota reports whether it is a quota_mode descriptor: its limit says so,
// or Options.GlobalQuota and it is a configured descriptor that is not
// unlimited.
func (s *Server) quota(it *item) bool {
	if l := it.limit(); l != nil && l.Quota {
		return true
	}
	return s.opts.GlobalQuota && it.in == nil && !it.unlimited
}

// closest picks the status the rate-limit headers describe, as
// envoyproxy/ratelimit does: the one with a limit and the fewest remaining
// (the first of equals), unless a descriptor is over its limit (not in
// quota mode), then the last such. Only descriptors that were decided count.
func closest(sts []*pb.RateLimitResponse_DescriptorStatus, items []item, quota func(*item) bool) *pb.RateLimitResponse_DescriptorStatus {
	var best *pb.RateLimitResponse_DescriptorStatus
	minRem := uint32(math.MaxUint32)
	for i, st := range sts {
		if it := &items[i]; !it.call && !it.denied || it.in != nil && (it.in.refund || it.in.leaseCall() || it.in.settle != 0) {
			continue // no limit, unlimited, a refund, a lease call or a settlement
		}
		if st.CurrentLimit != nil && st.LimitRemaining < minRem {
			best, minRem = st, st.LimitRemaining
		}
		if st.Code == pb.RateLimitResponse_OVER_LIMIT && !quota(&items[i]) {
			best, minRem = st, 0
		}
	}
	return best
}

func clampU32(n int64) uint32 {
	if n > math.MaxUint32 {
		return math.MaxUint32
	}
	if n < 0 {
		return 0
	}
	return uint32(n)
}

// IsUnavailable reports whether err is the service's answer to a Redis
// failure.
func IsUnavailable(err error) bool { return status.Code(err) == codes.Unavailable }
