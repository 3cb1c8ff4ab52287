package filter_test

import (
	"context"
	"testing"

	"github.com/sluice-proxy/sluice/host"
)

// BenchmarkFullCycle measures one full request cycle through the compiled
// module in the embedded host (wazero): context create → request headers →
// upstream → response headers → log → done → delete, one rule with both
// header styles on. allow: every request admitted and the five rate-limit
// headers added to the response; deny: every request rejected with a local
// 429 carrying Retry-After and the headers. baseline: the same module and
// host with a rule that never applies (one header lookup), so that
// allow − baseline is the cost of limiting itself.
func BenchmarkFullCycle(b *testing.B) {
	for _, c := range []struct {
		name  string
		limit string
		match string
	}{{"baseline-no-rule-applies", "1", `"match":{"headers":[{"name":"x-never","exact":"1"}]},`}, {"allow", "1000000000", ""}, {"deny", "1", ""}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := `{"rules":[{"name":"bench",` + c.match + `"key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":` + c.limit + `,"window":"1h"}],"response":{"headers":"both"}}`
			h, err := newHost(b, cfg, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			req := &host.Request{Method: "GET", Path: "/api/items?id=7", Authority: "example.test",
				Headers: [][2]string{{"user-agent", "bench"}, {"accept", "*/*"}}, RemoteAddr: "192.0.2.10:40000"}
			want := 200
			if c.name == "deny" {
				want = 429
				h.Exchange(ctx, req, upstream200) // spend the one token
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := h.Exchange(ctx, req, upstream200)
				if err != nil || resp.Status != want {
					b.Fatalf("status %v %v", resp, err)
				}
			}
			b.StopTimer()
			// CPU time of the whole process (host, guest, GC) per request:
			// less sensitive than ns/op to other processes on a busy machine.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
