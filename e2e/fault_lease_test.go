package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// leaseFaults: leases while the service is cut off (TestEnvoyNetworkFaults). Two Envoys
// (one worker each) share a rule with "lease": 10 (fixed window of 30 per 10 s, timeout_ms
// 100, instances 2) under mode. Each Envoy spends 3 of one key (one acquire each: 10
// leased, 7 left in its pool); the link to the service is refused and each Envoy gets 20
// more requests at once; the link heals and each gets 20 more in the same window.
//
// docs/leases.md: while cut off a proxy spends what its pools hold (at most lease per key,
// granted and so counted by the service), then failure_mode decides. Under "closed" each
// Envoy admits exactly its pool's 7 during the cut (the rest 503) and the window at most
// the limit. Under "local" the fallback goes on from what the last grant said the fleet
// had taken: the first Envoy's grant saw 10 of 30 taken, the second's 20, so while cut off
// the first admits its 7 and 15 − ⌈15 × 10/30⌉ = 10, the second its 7 and 5 — the limit
// plus the stated slack Σ(U − Uᵢ)/instances = (20 − 10)/2 = 5 — and once healed the
// service admits the 10 it had not granted: 2 × limit − U + slack = 45 in the window.
func leaseFaults(t *testing.T, tg envoyproc.Target, link *faultLink, mode string) {
	rule := rlsName(tg, "fault-lease-"+mode)
	cfg := fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":30,"window":"10s","backend":"rls","lease":10}],
 "failure_mode":%q,"rls":{"cluster":"rls","domain":%q,"timeout_ms":100,"instances":2}}`, rule, mode, rlsDomain)
	es, urls := startEnvoys(t, tg, 2, 1, renderRLSEnvoy(rlsBootstrap{Name: rule, RLSPort: link.port, Config: cfg}))
	const window = 10 * time.Second
	faultPoll(t, window, "the first 6 s of a window", func() bool { return time.Now().UnixNano()%int64(window) < int64(6*time.Second) })
	start := time.Now().Truncate(window)
	key := "lease-" + rlsStamp
	var spent, cut, after [2]map[int]int
	for i := range es {
		spent[i] = statuses(timedGets(t, urls[i:i+1], 3, key))
	}
	leased := rlsFleet(t, es)["leased"]
	link.refuse()
	for i := range es {
		cut[i] = statuses(timedGets(t, urls[i:i+1], 20, key))
	}
	link.heal()
	recovered := recoverTime(t, es, urls, key+"-r")
	for i := range es {
		after[i] = statuses(timedGets(t, urls[i:i+1], 20, key))
	}
	if time.Now().Truncate(window) != start {
		t.Fatalf("the window ended before the requests did: the machine is too slow for this check")
	}
	total := 0
	for i := range es {
		total += spent[i][200] + cut[i][200] + after[i][200]
	}
	t.Logf("lease %s: spent %v, leased %d; cut off: %v; healed (remote again after %v): %v; the window admitted %d of 30",
		mode, spent, leased, cut, recovered.Round(time.Millisecond), after, total)
	for i := range es {
		if spent[i][200] != 3 {
			t.Errorf("Envoy %d before the cut: %v, want 3 × 200", i, spent[i])
		}
		if mode == "closed" && (cut[i][200] != 10-3 || cut[i][503] != 20-7) {
			t.Errorf("Envoy %d cut off: %v, want its pool's 7 admitted and 13 × 503", i, cut[i])
		}
	}
	if leased != 20 {
		t.Errorf("leased %d before the cut, want 20 (10 per Envoy)", leased)
	}
	bound, cutBound := 30, 30 // closed: the limit
	if mode == "local" {
		bound, cutBound = 2*30-20+5, 30+5
	}
	if whileCut := spent[0][200] + spent[1][200] + cut[0][200] + cut[1][200]; whileCut > cutBound {
		t.Errorf("the window admitted %d until the heal, more than %d", whileCut, cutBound)
	}
	if total > bound {
		t.Errorf("the window admitted %d across the cut, more than %d", total, bound)
	}
	if recovered > 2*time.Second {
		t.Errorf("remote decisions again only %v after healing", recovered)
	}
}
