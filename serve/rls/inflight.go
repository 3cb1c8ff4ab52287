package rls

import (
	"context"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// In-flight calls (rlswire.InFlight): a sluice rule with "algorithm": "concurrency" on
// backend "rls". Such a call has one inline descriptor and runs the concurrency script
// (redisrl) on the key "sluice:{<domain>/<rule>|<key>}:cc": every proxy of the fleet
// counts against one limit, each worker a holder whose slots are leased.

// isInFlight reports whether the call of ds is an in-flight call: one inline descriptor
// of algorithm "concurrency".
func isInFlight(ds []*ratelimitv3.RateLimitDescriptor) bool {
	if len(ds) != 1 || !IsInline(ds[0]) {
		return false
	}
	es := ds[0].GetEntries()
	return len(es) > 1 && es[1].GetValue() == rlswire.ConcurrencyAlgorithm
}

// inFlight answers an in-flight call (isInFlight): INVALID_ARGUMENT for a malformed
// descriptor, PERMISSION_DENIED for a domain without inline descriptors, UNAVAILABLE
// when Redis cannot decide.
func (s *Server) inFlight(ctx context.Context, domain string, d *ratelimitv3.RateLimitDescriptor) (*pb.RateLimitResponse, error) {
	if d.GetHitsAddend() != nil || d.GetLimit() != nil {
		return nil, status.Error(codes.InvalidArgument, "descriptor 0: an in-flight descriptor takes no hits_addend or limit override")
	}
	if !s.inlineAllowed(domain) {
		return nil, status.Errorf(codes.PermissionDenied, "descriptor 0: inline descriptors are not enabled for domain %q (sluice serve --inline-domains)", domain)
	}
	q, retry, err := parseInFlight(d, domain)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "descriptor 0: "+err.Error())
	}
	var now int64
	if s.opts.Now != nil {
		now = s.opts.Now()
	}
	q.Now = now
	res, err := runScript(ctx, s.opts.Backend, q, nil, redisrl.ParseConcurrencyReply)
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	st := &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK,
		LimitRemaining: uint32(min(max(q.Limit-res.InFlight, 0), int64(^uint32(0))))}
	out := &pb.RateLimitResponse{OverallCode: pb.RateLimitResponse_OK, Statuses: []*pb.RateLimitResponse_DescriptorStatus{st}}
	if !res.Allowed {
		st.Code, out.OverallCode, st.LimitRemaining = pb.RateLimitResponse_OVER_LIMIT, pb.RateLimitResponse_OVER_LIMIT, 0
	}
	if st.LimitRemaining == 0 {
		st.DurationUntilReset = durationpb.New(retry)
	}
	if res.Reclaimed > 0 {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: rlswire.ReclaimedHeader, Value: strconv.FormatInt(res.Reclaimed, 10)})
	}
	return out, nil
}

// inFlightError is a malformed in-flight descriptor.
type inFlightError string

func (e inFlightError) Error() string { return string(e) }

// parseInFlight reads an in-flight descriptor: the fixed entries (Algorithm
// "concurrency", Limit 1..MaxLimit, WindowUS the Retry-After hint, Burst 0) and InFlight.
func parseInFlight(d *ratelimitv3.RateLimitDescriptor, domain string) (*redisrl.ConcurrencyRequest, time.Duration, error) {
	es := d.GetEntries()
	if len(es) != rlswire.FixedEntries+1 {
		return nil, 0, inFlightError("an in-flight descriptor has 7 entries, not " + strconv.Itoa(len(es)))
	}
	for j, e := range es[:rlswire.FixedEntries] {
		if e.GetKey() != rlswire.Fixed[j] {
			return nil, 0, inFlightError("entry " + strconv.Itoa(j) + ": expected " + rlswire.Fixed[j])
		}
	}
	if es[6].GetKey() != rlswire.InFlight {
		return nil, 0, inFlightError("entry 6: expected " + rlswire.InFlight)
	}
	rule := es[0].GetValue()
	if msg := config.CheckRuleID(rule); msg != "" {
		return nil, 0, inFlightError("rule name " + msg)
	}
	limit, err1 := strconv.ParseInt(es[2].GetValue(), 10, 64)
	retryUS, err2 := strconv.ParseInt(es[3].GetValue(), 10, 64)
	if err1 != nil || err2 != nil || limit < 1 || limit > algorithms.MaxLimit || retryUS < 1 ||
		retryUS > int64(algorithms.MaxWindow/time.Microsecond) || es[4].GetValue() != "0" {
		return nil, 0, inFlightError("limit 1..1000000000, window_us (the Retry-After hint) 1µs..366d and burst 0")
	}
	op, holder, n, ttlMS, ok := rlswire.ParseInFlight(es[6].GetValue())
	if !ok {
		return nil, 0, inFlightError(rlswire.InFlight + " must be <a|r|w>:<holder hex>:<n>:<ttl_ms>, not " + strconv.Quote(es[6].GetValue()))
	}
	q := &redisrl.ConcurrencyRequest{Key: redisrl.AppendConcurrencyKey(nil, domain+"/"+rule, es[5].GetValue()),
		Op: redisrl.ConcurrencyOp(op), Holder: holder, Limit: limit, N: n, TTL: time.Duration(ttlMS) * time.Millisecond}
	return q, time.Duration(retryUS) * time.Microsecond, nil
}
