package e2e

import (
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// A response reporting a usage no budget can hold: total_tokens 9223372036854775807, a
// valid integer (the filter clamps the cost to algorithms.MaxSettle). The documented
// contract: an excess is charged even below zero, over-use is never dropped. So the key
// must be in debt afterwards (a request reserving 1 refused) and the settlement must not
// be a store error.
func budgetHugeUsage(t *testing.T, bp *budgetProxy) {
	const key = "maxint"
	before := bp.metrics(t)
	r := bp.do(llmReq{key: key, reserve: "400", mode: "maxint", id: key})
	mustStatus(t, "maxint", r, 200)
	// Wait for the stream to end on the proxy: settled, or a store error.
	var now map[string]int64
	for i := 0; i < 500; i++ {
		now = bp.metrics(t)
		if now["llm.settled"] != before["llm.settled"] || now["llm.store_errors"] != before["llm.store_errors"] {
			break
		}
		sleepPoll()
	}
	t.Logf("metric moves: %v", deltas(before, now))
	if d := deltas(before, now); d["llm.store_errors"] != 0 || d["llm.settled"] != 1 || d["llm.excess"] <= 0 {
		t.Errorf("a huge usage: metric moves %v, want settled 1, excess > 0, no store error", d)
	}
	r = bp.do(llmReq{key: key, reserve: "1"})
	t.Logf("then reserving 1: %s", r)
	if r.status != 429 {
		t.Errorf("reserving 1 after a usage of 2^63-1: %s, want 429 (the key in debt)", r)
	}
}

func TestBudgetRunHugeUsage(t *testing.T) {
	up := startLLMUpstream(t)
	p := startBudgetRun(t, up, budgetConfig)
	bp := newBudgetProxy(p.url, up, runMetrics(p.admin))
	defer bp.close()
	budgetHugeUsage(t, bp)
	checkHostHealthy(t, p)
}

func TestBudgetEnvoyHugeUsage(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		up := startLLMUpstream(t)
		e := startBudgetEnvoy(t, tg, a, up, "budget-huge-usage", budgetConfig)
		bp := newBudgetProxy(envoyProxy(t, e).url, up, envoyMetricsAs(e, a))
		defer bp.close()
		budgetHugeUsage(t, bp)
		checkHealthyAs(t, e, a, 2)
	})
}

func sleepPoll() { time.Sleep(20 * time.Millisecond) }
