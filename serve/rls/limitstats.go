package rls

import (
	"bufio"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
)

// Per-limit statistics, as envoyproxy/ratelimit keeps them
// (src/limiter/base_limiter.go, src/stats/manager_impl.go): for each
// configured limit, by its stat key, the hits of the descriptors that
// reached it (total_hits), and of those the ones over the limit
// (over_limit), near it (near_limit: past 80 % of it, over or not), within
// it (within_limit) and over it in shadow mode (shadow_mode). The stat key
// is the limit's full key, "<domain>.<key>[_<value>]…" as the
// configuration names it; with detailed_metric the request's entries
// instead; with value_to_metric the request's value at the levels that ask
// for it (statKey in config.go's lookup). Written to /metrics as
// sluice_rls_limit_hits_total{key,stat}.
//
// Cardinality: a key named by the configuration alone is always counted
// (there are as many as limits); a key holding request values is counted
// under its own name for the first Options.MaxStatKeys such keys, and
// every later one under key "other" (no stat key is "other": each has a
// '.'), each such hit also counted in sluice_rls_limit_stats_overflow_total.

// DefaultMaxStatKeys is Options.MaxStatKeys's default.
const DefaultMaxStatKeys = 1000

// The statistics of one limit, in the order of limitStatNames.
const (
	statTotal = iota
	statOver
	statNear
	statWithin
	statShadow
	numLimitStats
)

var limitStatNames = [numLimitStats]string{"total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"}

// nearLimitRatio is envoyproxy/ratelimit's NEAR_LIMIT_RATIO default.
const nearLimitRatio = float32(0.8)

// overflowStatKey is the key of the hits of keys past Options.MaxStatKeys.
const overflowStatKey = "other"

// ipv4RE finds IPv4 addresses in a stat key, whose dots become '_' (the
// peer's utils.SanitizeStatName, with ':' and '|').
var ipv4RE = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

var statKeyReplacer = strings.NewReplacer(":", "_", "|", "_")

// sanitizeStatKey is a stat key as the peer names its counters.
func sanitizeStatKey(k string) string {
	return ipv4RE.ReplaceAllStringFunc(statKeyReplacer.Replace(k), func(ip string) string {
		return strings.ReplaceAll(ip, ".", "_")
	})
}

// limitCounts is what one descriptor adds to its limit's statistics.
type limitCounts [numLimitStats]uint64

// peerCounts are the statistics of hits taking a counter from before to
// after against limit L, as the peer's GetResponseDescriptorStatus counts
// them (after > L is over).
func peerCounts(hits, before, after, limit uint64, shadow bool) limitCounts {
	var c limitCounts
	c[statTotal] = hits
	near := uint64(math.Floor(float64(float32(limit) * nearLimitRatio)))
	if after > limit {
		if before >= limit {
			c[statOver] = hits
		} else {
			c[statOver] = after - limit
			c[statNear] = limit - max(near, before)
		}
		if shadow {
			c[statShadow] = c[statOver]
		}
		return c
	}
	c[statWithin] = hits
	if after > near {
		if before >= near {
			c[statNear] = hits
		} else {
			c[statNear] = after - near
		}
	}
	return c
}

// countLimits adds the call's decided configured descriptors to their
// limits' statistics. With --charge-denied the counts are the peer's, from
// the counter before and after the hits. Without it, a descriptor the limit
// denied adds all its hits to over_limit (and shadow_mode, in shadow mode):
// it was charged nothing; one it admitted counts as the peer's would with
// the limit's capacity and what the admission left (an admission refunded
// afterwards because another descriptor denied the call counts as within).
// A check (hits_addend 0) adds nothing but the key. is_negative_hits and
// unlimited descriptors are not counted.
func (s *Server) countLimits(items []item) {
	for i := range items {
		it := &items[i]
		if it.m == nil || it.neg || it.err != nil {
			continue
		}
		l := it.m.limit
		var c limitCounts
		switch {
		case it.charged != nil:
			hits := uint64(it.charged.hits)
			after := uint64(it.cres.count)
			c = peerCounts(hits, after-min(hits, after), after, uint64(l.Params.Limit), l.Shadow)
		case it.denied:
			c[statTotal], c[statOver] = uint64(it.cost), uint64(it.cost)
			if l.Shadow {
				c[statShadow] = c[statOver]
			}
		case it.call:
			hits := uint64(it.cost)
			capacity := uint64(max(l.Params.Limit, l.Params.Burst))
			// A check's remaining is the current one (hits 0: before = after).
			after := capacity - min(capacity, uint64(max(it.res.Remaining, 0)))
			c = peerCounts(hits, after-min(hits, after), after, capacity, l.Shadow)
		default:
			continue
		}
		s.Metrics.limitHits(it.m.stat, it.m.fromRequest, c)
	}
}

// limitHits adds c to the statistics of stat key k.
func (m *Metrics) limitHits(k string, fromRequest bool, c limitCounts) {
	k = sanitizeStatKey(k)
	m.mu.Lock()
	defer m.mu.Unlock()
	if fromRequest && !m.fromRequest[k] {
		if _, configured := m.limits[k]; !configured {
			if len(m.fromRequest) >= m.maxFromRequest {
				k = overflowStatKey
				m.limitOverflow += c[statTotal]
			} else {
				m.fromRequest[k] = true
			}
		}
	}
	p := m.limits[k]
	if p == nil {
		p = new([numLimitStats]uint64)
		m.limits[k] = p
	}
	for i, v := range c {
		p[i] += v
	}
}

// LimitStat returns statistic stat (total_hits, over_limit, near_limit,
// within_limit, shadow_mode) of stat key k.
func (m *Metrics) LimitStat(k, stat string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.limits[k]
	for i, n := range limitStatNames {
		if n == stat && p != nil {
			return p[i]
		}
	}
	return 0
}

func (m *Metrics) writeLimits(bw *bufio.Writer, family func(name, kind, help string)) {
	family("sluice_rls_limit_hits_total", "counter", "Hits of configured limits by stat key (envoyproxy/ratelimit's naming; \"other\" past the bound on keys holding request values) and statistic (total_hits, over_limit, near_limit, within_limit, shadow_mode).")
	keys := make([]string, 0, len(m.limits))
	for k := range m.limits {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for i, n := range limitStatNames {
			fmt.Fprintf(bw, "sluice_rls_limit_hits_total{key=%s,stat=%s} %d\n", quoteLabel(k), quoteLabel(n), m.limits[k][i])
		}
	}
	family("sluice_rls_limit_stats_overflow_total", "counter", "Hits counted under key \"other\" because their stat key held request values past the bound (--max-stat-keys).")
	fmt.Fprintf(bw, "sluice_rls_limit_stats_overflow_total %d\n", m.limitOverflow)
}
