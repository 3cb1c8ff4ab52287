package rls

import (
	"bytes"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const statsConfig = `
domain: st
descriptors:
  - {key: unspec, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - key: route
    value_to_metric: true
    descriptors:
      - {key: method, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: user, value: "al*", rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: shadow, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: ten, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: unl, rate_limit: {unlimited: true}}
`

// Per-limit statistics follow envoyproxy/ratelimit's stat keys and counts,
// in both modes: the unspecified-value form of detailed_metric (the peer's
// value-included-in-stats-key-when-unspecified scenario: 2 per minute, 3
// hits, one over), value_to_metric, a wildcard's pattern, shadow_mode, the
// near-limit band (past 80 %), and the bound on keys holding request values.
func TestLimitStats(t *testing.T) {
	for _, charge := range []bool{false, true} {
		name := "default"
		if charge {
			name = "charge-denied"
		}
		t.Run(name, func(t *testing.T) {
			srv, c := serve(t, Options{Config: parse(t, statsConfig), ChargeDenied: charge, MaxStatKeys: 2})
			k := uniq("s")
			for range 3 {
				call(t, c, "st", desc("unspec", k))
			}
			call(t, c, "st", desc("route", "api"+k, "method", "GET"))
			call(t, c, "st", desc("user", "alice"+k))
			call(t, c, "st", desc("shadow", k))
			call(t, c, "st", desc("shadow", k))
			for range 9 {
				call(t, c, "st", desc("ten", k))
			}
			call(t, c, "st", desc("unl", k))
			// A check counts nothing but the key.
			rlCall(t, c, &pb.RateLimitRequest{Domain: "st", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(desc("ten", k), 0, false)}})
			// A third key with a request value: over the bound of 2.
			call(t, c, "st", desc("unspec", "other-"+k))
			call(t, c, "st", desc("unspec", "other-"+k))

			for _, w := range []struct {
				key  string
				want [numLimitStats]uint64 // total, over, near, within, shadow
			}{
				{"st.unspec_" + k, [numLimitStats]uint64{3, 1, 1, 2, 0}},
				{"st.route_api" + k + ".method", [numLimitStats]uint64{1, 0, 0, 1, 0}},
				{"st.user_al*", [numLimitStats]uint64{1, 0, 0, 1, 0}},
				{"st.shadow", [numLimitStats]uint64{2, 1, 1, 1, 1}}, // 80 % of 1 is 0: every hit within is near
				// 80 % of 10 is 8: the 9th hit is near.
				{"st.ten", [numLimitStats]uint64{9, 0, 1, 9, 0}},
				{overflowStatKey, [numLimitStats]uint64{2, 0, 1, 2, 0}},
			} {
				for i, n := range limitStatNames {
					if got := srv.Metrics.LimitStat(w.key, n); got != w.want[i] {
						t.Errorf("%s %s = %d, want %d", w.key, n, got, w.want[i])
					}
				}
			}
			if got := srv.Metrics.LimitStat("st.unl", "total_hits"); got != 0 {
				t.Errorf("unlimited counted: %d", got)
			}
			var b bytes.Buffer
			if err := srv.Metrics.WritePrometheus(&b); err != nil {
				t.Fatal(err)
			}
			for _, line := range []string{
				`sluice_rls_limit_hits_total{key="st.unspec_` + k + `",stat="over_limit"} 1`,
				`sluice_rls_limit_hits_total{key="st.route_api` + k + `.method",stat="total_hits"} 1`,
				`sluice_rls_limit_hits_total{key="other",stat="total_hits"} 2`,
				`sluice_rls_limit_stats_overflow_total 2`,
			} {
				if !strings.Contains(b.String(), line+"\n") {
					t.Errorf("/metrics lacks %q", line)
				}
			}
		})
	}
}

func TestSanitizeStatKey(t *testing.T) {
	for in, want := range map[string]string{
		"d.remote_address_10.0.0.1": "d.remote_address_10_0_0_1",
		"d.k_a:b|c":                 "d.k_a_b_c",
		"d.k_v1.2":                  "d.k_v1.2",
	} {
		if got := sanitizeStatKey(in); got != want {
			t.Errorf("sanitizeStatKey(%q) = %q, want %q", in, got, want)
		}
	}
}
