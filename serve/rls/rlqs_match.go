package rls

import (
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Entry is one key/value pair of a descriptor.
type Entry struct{ Key, Value string }

// Matched is what a configured descriptor matches, for callers outside this
// package (the RLQS service matches a BucketId as a descriptor).
type Matched struct {
	Limit *Limit
	// KeyPart identifies the limit's counter: the descriptor's entries as
	// the Redis keys of configured descriptors write them (share_threshold
	// applied), so two descriptors share a counter exactly when RLS would
	// count them together.
	KeyPart string
	// FullKey is envoyproxy/ratelimit's full key (domain.k_v…), the metric
	// name of the limit.
	FullKey string
}

// Match looks the descriptor of entries up in domain exactly as
// ShouldRateLimit does for a configured descriptor without a limit
// override. It returns nil when the descriptor has no limit (an unknown
// domain, no matching node, or a node without rate_limit).
func (c *Config) Match(domain string, entries []Entry) *Matched {
	es := make([]*ratelimitv3.RateLimitDescriptor_Entry, len(entries))
	for i, e := range entries {
		es[i] = &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
	}
	d := &ratelimitv3.RateLimitDescriptor{Entries: es}
	m, err := c.lookup(domain, d)
	if err != nil || m == nil || m.limit == nil {
		return nil
	}
	return &Matched{Limit: m.limit, KeyPart: redisKeyPart(es, m.shared), FullKey: m.limit.key}
}
