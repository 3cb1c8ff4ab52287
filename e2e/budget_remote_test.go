package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// TestEnvoyBudgetRemote: a token budget across a fleet. Two Envoys (one worker each), A
// and B, with sluice.wasm's backend "rls" share one `sluice serve` on the suite's Redis
// Cluster, both in front of the fake LLM upstream (budget_upstream_test.go), and one key
// of rule llm: a token bucket of 1000 an hour (burst 1000) reserving x-max-tokens and
// settling by the response's OpenAI usage. A remote rule reserves on the service (the
// descriptor's hits_addend) and settles there when the stream ends: a call of its own, an
// inline descriptor with sluice.settle = "<actual − reserved>", fire and forget, counted
// in the Envoy's sluice.rls.settlements (when sent) and in the service's
// sluice_rls_descriptors_total{outcome="settle"} (when applied on Redis). Each step waits
// for both before the next, so the scenario is sequential and exact; 1000 an hour refills
// 0.28 tokens a second, at most a few tokens over the test, which only the Retry-After
// check allows for. The key starts full at 1000:
//
//  1. A reserves 600 (400 left) and its response reports 100: A settles −500 → 900 left.
//  2. B reserves 800 → 100 left: admitted only because A's 500 came back fleet-wide —
//     without A's settlement (not sent, not applied, or applied to A's Envoy alone) 400
//     are left and B is refused 429, which fails the test here (tried: with A's usage
//     600, nothing to settle, B gets 429 with Retry-After 1440 = ⌈400 × 3.6⌉ s). B's
//     response reports exactly 800: nothing to settle, B sends no settlement. (B
//     reserving and using 900 would leave 1000 − 100 − 900 = 0, and step 3's
//     reservation of 100 would wait 6 minutes for the refill.)
//  3. A reserves 100 → 1000 − 100 − 800 − 100 = 0 left, and its response reports 2900:
//     A settles +2800 → −2800, the key in debt for all. B's request reserving 1 then
//     needs 2801 tokens: refused 429 with Retry-After ⌈2801 × 3.6 s⌉ = 10084 s (less the
//     seconds since the test began), and it never reaches the upstream. Without A's
//     excess charged fleet-wide, B finds 0 left (plus the refill) and waits at most
//     ⌈1 × 3.6⌉ = 4 s, if refused at all: the Retry-After check fails.
func TestEnvoyBudgetRemote(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		srv := startServe(t, c, "--inline-domains", rlsDomain)
		up := startLLMUpstream(t)
		cfg := fmt.Sprintf(`{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
 "backend":"rls","cost":{"request":{"header":"x-max-tokens","default":500},"response":{"usage":"openai"}}}],
 "failure_mode":"closed","rls":{"cluster":"rls","domain":%q,"timeout_ms":5000,"instances":2}}`, rlsDomain)
		render := renderRLSEnvoy(rlsBootstrap{Name: rlsName(tg, "budget"), RLSPort: srv.port, Config: cfg})
		es, urls := startEnvoys(t, tg, 2, 1, func(site EnvoySite) ([]byte, error) {
			site.UpstreamPort = up.port
			return render(site)
		})
		a := newBudgetProxy(urls[0], up, envoyMetrics(es[0]))
		b := newBudgetProxy(urls[1], up, envoyMetrics(es[1]))
		defer a.close()
		defer b.close()
		// The rule is "llm" on every run; the key is unique to the run and the Envoy
		// version (the cluster's state outlives a subtest).
		key := rlsName(tg, "budget")
		start := time.Now()
		beforeA, beforeB := a.metrics(t), b.metrics(t)
		settles := serveSettles(t, srv)

		// 1. A: reserve 600, usage 100 → settles −500.
		mustStatus(t, "A reserving 600 of 1000", a.do(llmReq{key: key, reserve: "600", usage: 100}), 200)
		a.waitMetrics(t, "A's settlement of −500", beforeA, map[string]int64{
			"llm.reserved": 600, "llm.settled": 1, "llm.refunded": 500, "llm.allowed": 1,
			"rls.settlements": 1, "rls.settlement_failures": 0,
		})
		waitServeSettles(t, srv, settles+1)
		t.Logf("1. A: reserved 600, used 100; A's moves %v; the service applied its settlement", deltas(beforeA, a.metrics(t)))

		// 2. B: reserve 800 (100 left after it only because A's 500 came back), usage 800.
		r := b.do(llmReq{key: key, reserve: "800", usage: 800})
		mustStatus(t, "B reserving 800 with 900 left (400 had A's refund of 500 not reached the service)", r, 200)
		b.waitMetrics(t, "B's exact usage", beforeB, map[string]int64{
			"llm.reserved": 800, "llm.settled": 1, "llm.allowed": 1,
			"rls.settlements": 0, "rls.settlement_failures": 0,
		})
		if n := serveSettles(t, srv); n != settles+1 {
			t.Errorf("the service applied %d settlements, want %d (B's exact usage settles nothing)", n-settles, 1)
		}
		t.Logf("2. B: reserved 800, used 800; B's moves %v", deltas(beforeB, b.metrics(t)))

		// 3. A: reserve 100 (100 left), usage 2900 → settles +2800: −2800 left.
		mustStatus(t, "A reserving 100 with 100 left", a.do(llmReq{key: key, reserve: "100", usage: 2900}), 200)
		a.waitMetrics(t, "A's settlement of +2800", beforeA, map[string]int64{
			"llm.reserved": 700, "llm.settled": 2, "llm.refunded": 500, "llm.excess": 2800, "llm.allowed": 2,
			"rls.settlements": 2, "rls.settlement_failures": 0,
		})
		waitServeSettles(t, srv, settles+2)
		seen := up.requests(key)
		r = b.do(llmReq{key: key, reserve: "1"})
		mustStatus(t, "B reserving 1 with the key 2800 in debt", r, 429)
		retry, err := strconv.ParseInt(r.header.Get("Retry-After"), 10, 64)
		if err != nil || retry <= 0 {
			t.Errorf("Retry-After %q, want > 0", r.header.Get("Retry-After"))
		}
		checkRetryAfter(t, r, 2801, start)
		if n := up.requests(key); n != seen {
			t.Errorf("the upstream saw %d requests of the key after the refusal, %d before it", n, seen)
		}
		if n := up.requests(key); n != 3 {
			t.Errorf("the upstream saw %d requests of the key, want 3", n)
		}
		b.waitMetrics(t, "B's refusal", beforeB, map[string]int64{
			"llm.reserved": 800, "llm.settled": 1, "llm.allowed": 1, "llm.denied": 1,
			"rls.settlements": 0, "rls.settlement_failures": 0,
		})
		t.Logf("3. A: reserved 100, used 2900; then B reserving 1: %d, Retry-After %d s (exact 10084 less %.1f s of refill)",
			r.status, retry, time.Since(start).Seconds())

		// 4. Every settlement answered OK, and both VMs healthy.
		for i, p := range []*budgetProxy{a, b} {
			m := p.metrics(t)
			if f := m["rls.settlement_failures"]; f != 0 {
				t.Errorf("Envoy %c: %d settlement failures", 'A'+i, f)
			}
			t.Logf("Envoy %c: all moves %v", 'A'+i, deltas(map[string]int64{}, m))
		}
		t.Logf("the service: %d settlements applied", serveSettles(t, srv)-settles)
		for _, e := range es {
			checkEnvoyHealthy(t, e, 1)
		}
	})
}

// serveSettles is the service's count of settlements applied on Redis (descriptors of
// outcome settle) in the domain rlsDomain.
func serveSettles(t *testing.T, srv *serveProc) int64 {
	t.Helper()
	resp, err := http.Get("http://" + srv.admin + "/metrics")
	if err != nil {
		t.Fatalf("sluice serve /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	prefix := fmt.Sprintf("sluice_rls_descriptors_total{domain=%q,outcome=\"settle\"} ", rlsDomain)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatalf("sluice serve /metrics: %q: %v", l, err)
			}
			return n
		}
	}
	return 0
}

// waitServeSettles polls until the service has applied want settlements (deadline 10 s;
// more fails at once).
func waitServeSettles(t *testing.T, srv *serveProc, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := serveSettles(t, srv)
		if n == want {
			return
		}
		if n > want || time.Now().After(deadline) {
			t.Fatalf("the service applied %d settlements, want %d", n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
