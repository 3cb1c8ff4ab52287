package integration

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/host"
)

// BenchmarkFullCycleKeyFlood is BenchmarkFullCycle's allow case where every
// request carries a new key and the rule's table (max_keys 1000) is full:
// each request reads all its candidate slots and evicts one — the most
// shared-data reads a request makes. Compare with BenchmarkFullCycle/allow
// (one known key, found in its first candidate).
func BenchmarkFullCycleKeyFlood(b *testing.B) {
	cfg := `{"rules":[{"name":"bench","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":10,"window":"1h","max_keys":1000}],"response":{"headers":"both"}}`
	h, err := newHost(b, cfg, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	// One new key per request, whatever b.N: a key that came back could find its slot
	// still held (the least-used candidate is evicted, not the oldest) and, after 10
	// returns, be denied. The keys are made before the timer starts.
	keys := make([]string, b.N)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(i)
	}
	req := &host.Request{Method: "GET", Path: "/api/items?id=7", Authority: "example.test",
		Headers: [][2]string{{"user-agent", "bench"}, {"x-user", ""}}, RemoteAddr: "192.0.2.10:40000"}
	for i := 0; i < 3000; i++ { // fill the table
		req.Headers[1][1] = "fill-" + strconv.Itoa(i)
		h.Exchange(ctx, req, upstream200)
	}
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.Headers[1][1] = keys[i]
		resp, err := h.Exchange(ctx, req, upstream200)
		if err != nil || resp.Status != 200 {
			b.Fatalf("status %v %v", resp, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	if m, _ := h.Metric("sluice.bench.evicted"); m.Value < int64(b.N) {
		b.Fatalf("evicted %d of %d requests: the table was not full", m.Value, b.N)
	}
}
