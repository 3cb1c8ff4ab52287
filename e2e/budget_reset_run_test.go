package e2e

import "testing"

// TestBudgetRunUpstreamReset: budgetResets through `sluice run` (two workers): an upstream
// that cuts a streamed response mid-body resets the stream as Envoy does (the host's
// handler recovers httputil.ReverseProxy's abort and ends the stream: proxy_on_log, done,
// delete), so the request settles — by no_usage before the usage chunk, by the usage after.
func TestBudgetRunUpstreamReset(t *testing.T) {
	up := startLLMUpstream(t)
	p := startBudgetRun(t, up, budgetConfig)
	bp := newBudgetProxy(p.url, up, runMetrics(p.admin))
	defer bp.close()
	budgetResets(t, bp)
	checkHostHealthy(t, p)
}
