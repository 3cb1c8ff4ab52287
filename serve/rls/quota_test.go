package rls

import (
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const quotaConfig = `
domain: qm
descriptors:
  - {key: regular, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: regular2, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: quota, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: quota2, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: shadowquota, quota_mode: true, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: unl, rate_limit: {unlimited: true}}
`

// quotaLimits are quotaConfig's requests_per_unit.
var quotaLimits = map[string]uint32{"regular": 2, "regular2": 3, "quota": 2, "quota2": 3, "shadowquota": 1, "unl": 0}

// TestQuotaMode is envoyproxy/ratelimit's quota mode since 05c08d0 (#1059),
// as sluice's own table, in both modes of sluice serve. The facts come from
// the peer's src/service/ratelimit.go (shouldRateLimitWorker) and its tests
// TestServiceGlobalQuotaMode, TestServicePerDescriptorQuotaMode,
// TestServiceMixedPerDescriptorModes(UnderLimit),
// TestServiceQuotaModeOnlyAllOverTheLimit, ...OnlySomeOverTheLimit,
// TestServiceQuotaModeWithShadowMode and TestServiceMixedModeWithShadowMode:
//
//   - a quota_mode descriptor over its limit keeps its OVER_LIMIT status,
//     with remaining 0 and its reset;
//   - the call is OVER_LIMIT when a descriptor outside quota mode is over, or
//     when every quota_mode descriptor of the call is (and there is one);
//   - QUOTA_MODE (--quota-mode) puts every descriptor but the unlimited ones
//     in quota mode, a descriptor without a limit included (it never is over,
//     so it keeps the call OK);
//   - SHADOW_MODE (--shadow-mode) answers OK whatever the statuses say;
//   - a descriptor in both shadow_mode and quota_mode that is over answers OK
//     (the cache's shadow rule comes first), so it counts as within its
//     limit (the peer's code, no test of its own).
//
// bench/rls pins the peer at 3fb7025, the newest pseudo-version the Go
// module proxy serves, which predates #1059: its fidelity test checks the
// counting (TestFidelityChargeDenied), this table the quota rule.
//
// Each row first uses up the limits of the descriptors it names "over",
// one call of that descriptor alone per request of its limit, then sends
// the call. Without --charge-denied a descriptor is over when nothing
// remains (a denied call is charged to nothing, and its admissions are
// refunded); with it, when the call's hit takes the counter past the
// limit.
func TestQuotaMode(t *testing.T) {
	type row struct {
		name        string
		global      bool // --quota-mode
		shadow      bool // --shadow-mode
		descs       []string
		over        []bool // used up before the call
		overall     pb.RateLimitResponse_Code
		statusCodes []pb.RateLimitResponse_Code
	}
	OK, OVER := pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT
	rows := []row{
		// TestServicePerDescriptorQuotaMode
		{name: "regular over, quota within", descs: []string{"regular", "quota"}, over: []bool{true, false},
			overall: OVER, statusCodes: []pb.RateLimitResponse_Code{OVER, OK}},
		// TestServiceMixedPerDescriptorModes: the only quota descriptor is over
		{name: "regular within, quota over", descs: []string{"regular", "quota"}, over: []bool{false, true},
			overall: OVER, statusCodes: []pb.RateLimitResponse_Code{OK, OVER}},
		// ...UnderLimit
		{name: "both within", descs: []string{"regular", "quota"}, over: []bool{false, false},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OK, OK}},
		// TestServiceQuotaModeOnlyAllOverTheLimit
		{name: "all quotas over", descs: []string{"quota", "quota2"}, over: []bool{true, true},
			overall: OVER, statusCodes: []pb.RateLimitResponse_Code{OVER, OVER}},
		// TestServiceQuotaModeOnlySomeOverTheLimit
		{name: "some quotas over", descs: []string{"quota", "quota2"}, over: []bool{true, false},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OVER, OK}},
		{name: "some quotas over, other order", descs: []string{"quota", "quota2"}, over: []bool{false, true},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OK, OVER}},
		// An unlimited descriptor is no quota descriptor.
		{name: "quota over beside unlimited", descs: []string{"quota", "unl"}, over: []bool{true, false},
			overall: OVER, statusCodes: []pb.RateLimitResponse_Code{OVER, OK}},
		// shadow_mode and quota_mode: the shadow rule first.
		{name: "shadow quota over beside quota over", descs: []string{"shadowquota", "quota"}, over: []bool{true, true},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OK, OVER}},
		// TestServiceGlobalQuotaMode
		{name: "global: all over", global: true, descs: []string{"regular", "regular2"}, over: []bool{true, true},
			overall: OVER, statusCodes: []pb.RateLimitResponse_Code{OVER, OVER}},
		{name: "global: some over", global: true, descs: []string{"regular", "regular2"}, over: []bool{true, false},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OVER, OK}},
		{name: "global: a descriptor without a limit", global: true, descs: []string{"regular", "nolimit"}, over: []bool{true, false},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OVER, OK}},
		{name: "global: unlimited is no quota", global: true, descs: []string{"regular", "unl"}, over: []bool{true, false},
			overall: OVER, statusCodes: []pb.RateLimitResponse_Code{OVER, OK}},
		// TestServiceQuotaModeWithShadowMode, TestServiceMixedModeWithShadowMode
		{name: "global shadow: all quotas over", shadow: true, descs: []string{"quota", "quota2"}, over: []bool{true, true},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OVER, OVER}},
		{name: "global shadow: regular and quota over", shadow: true, descs: []string{"regular", "quota"}, over: []bool{true, true},
			overall: OK, statusCodes: []pb.RateLimitResponse_Code{OVER, OVER}},
	}
	for _, charge := range []bool{false, true} {
		mode := "default"
		if charge {
			mode = "charge-denied"
		}
		servers := map[[2]bool]pb.RateLimitServiceClient{}
		client := func(global, shadow bool) pb.RateLimitServiceClient {
			if c := servers[[2]bool{global, shadow}]; c != nil {
				return c
			}
			_, c := serve(t, Options{Config: parse(t, quotaConfig), ChargeDenied: charge, GlobalQuota: global, GlobalShadow: shadow,
				Now: func() int64 { return testNow }})
			servers[[2]bool{global, shadow}] = c
			return c
		}
		for ri, r := range rows {
			t.Run(mode+"/"+r.name, func(t *testing.T) {
				c := client(r.global, r.shadow)
				k := uniq(fmt.Sprint("q", ri))
				ds := make([]*ratelimitv3.RateLimitDescriptor, len(r.descs))
				for i, name := range r.descs {
					ds[i] = desc(name, k)
					if r.over[i] {
						for range quotaLimits[name] {
							call(t, c, "qm", desc(name, k))
						}
					}
				}
				got := call(t, c, "qm", ds...)
				if got.OverallCode != r.overall {
					t.Errorf("overall %v, want %v", got.OverallCode, r.overall)
				}
				for i, st := range got.Statuses {
					name, lim := r.descs[i], quotaLimits[r.descs[i]]
					if st.Code != r.statusCodes[i] {
						t.Errorf("%s: %v, want %v", name, st.Code, r.statusCodes[i])
					}
					if name == "unl" || name == "nolimit" {
						continue
					}
					if st.CurrentLimit.GetRequestsPerUnit() != lim {
						t.Errorf("%s: limit %v, want %d", name, st.CurrentLimit, lim)
					}
					// An over descriptor: nothing left, and its window's
					// reset (30 s: testNow is 30 s into its minute).
					reset := st.GetDurationUntilReset().AsDuration()
					if r.over[i] {
						if st.LimitRemaining != 0 || reset != 30*time.Second {
							t.Errorf("%s (over): remaining %d, reset %v; want 0, 30s", name, st.LimitRemaining, reset)
						}
						continue
					}
					// Within: the call's hit, unless the call was denied
					// without --charge-denied (refunded: all of it remains).
					want := lim - 1
					if !charge && r.overall == OVER && !r.shadow {
						want = lim
					}
					if st.LimitRemaining != want {
						t.Errorf("%s (within): remaining %d, want %d", name, st.LimitRemaining, want)
					}
				}
			})
		}
	}
}
