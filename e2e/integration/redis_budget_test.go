package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/host"
)

// A token budget with backend "redis" across three proxies on the real cluster: the
// reservation is the script's cost, the settlement a call of the script's settle op when
// the stream ends, and every proxy sees the result. Proxy 0 reserves 600 and uses 100: the
// 500 back lets proxy 1 reserve 900; that one uses 2,900: the 2,000 charged put the key
// 2 minutes (at 1,000 a minute) into debt, and proxy 2 is refused with that wait.
func TestRedisBudgetAcrossProxies(t *testing.T) {
	testCluster(t)
	rule := unique("budget")
	cfg := fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":1000,"window":"1m","burst":1000,
"backend":"redis","cost":{"request":{"header":"x-max-tokens","default":100},"response":{"header":"x-cost"}}}],
"failure_mode":"closed","redis":{"cluster":%q,"timeout_ms":5000,"instances":3}}`, rule, redisService)
	var ps []*redisProxy
	for i := 0; i < 3; i++ {
		ps = append(ps, startRedisProxy(t, cfg, 1))
	}
	exchange := func(p *redisProxy, reserve, cost string) *host.Response {
		t.Helper()
		up := func(*host.Request) *host.Response {
			return &host.Response{Status: 200, Headers: [][2]string{{"x-cost", cost}}}
		}
		resp, err := p.h.Exchange(context.Background(), &host.Request{Path: "/v1", Method: "POST",
			Headers: [][2]string{{"x-user", "alice"}, {"x-max-tokens", reserve}}, RemoteAddr: "10.0.0.1:1234"}, up)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// eventually retries f (a settlement is fire and forget: it lands a round trip after
	// the stream ended) until it holds.
	eventually := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !f(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5s; logs: %s %s %s", what, ps[0].Logs(), ps[1].Logs(), ps[2].Logs())
			}
		}
	}
	if r := exchange(ps[0], "600", "100"); r.Status != 200 {
		t.Fatalf("proxy 0: %d", r.Status)
	}
	eventually("proxy 1 admitted 900 after proxy 0's refund of 500", func() bool { return exchange(ps[1], "900", "2900").Status == 200 })
	var retry int
	// Until proxy 1's settlement lands the key is merely empty (a refusal with a wait of
	// about a second): wait for the debt's wait.
	eventually("proxy 2 refused by the debt", func() bool {
		r := exchange(ps[2], "1", "1")
		retry, _ = strconv.Atoi(r.Header("retry-after"))
		return r.Status == 429 && retry > 60
	})
	// 2,000 beyond the bucket at 1,000 a minute, and one more unit for the request.
	if retry < 110 || retry > 121 {
		t.Errorf("retry-after %ds, want about 120s", retry)
	}
	settled := func(p *redisProxy, m string) int64 { return p.metric(filter.RuleMetric(rule, m)) }
	if settled(ps[0], "refunded") != 500 || settled(ps[1], "excess") != 2000 || settled(ps[0], "reserved") != 600 {
		t.Errorf("refunded %d excess %d reserved %d", settled(ps[0], "refunded"), settled(ps[1], "excess"), settled(ps[0], "reserved"))
	}
	for i, p := range ps {
		if f := p.metric(filter.MetricRedisSettleFailures); f != 0 {
			t.Errorf("proxy %d: %d settlement failures", i, f)
		}
	}
	if ps[0].metric(filter.MetricRedisSettlements) != 1 || ps[1].metric(filter.MetricRedisSettlements) < 1 {
		t.Errorf("settlements %d, %d", ps[0].metric(filter.MetricRedisSettlements), ps[1].metric(filter.MetricRedisSettlements))
	}
}
