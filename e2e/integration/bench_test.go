package integration

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

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

// BenchmarkFullCycleHTTP is BenchmarkFullCycle through the host's net/http
// Handler (the path `sluice run` serves), with a recorder instead of a
// socket: the request and response header conversions, the response body
// callback and two hand-offs to the worker are included; the network is
// not.
func BenchmarkFullCycleHTTP(b *testing.B) {
	for _, c := range []struct {
		name  string
		limit string
		match string
		want  int
	}{{"baseline-no-rule-applies", "1", `"match":{"headers":[{"name":"x-never","exact":"1"}]},`, 200}, {"allow", "1000000000", "", 200}, {"deny", "1", "", 429}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := `{"rules":[{"name":"bench",` + c.match + `"key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":` + c.limit + `,"window":"1h"}],"response":{"headers":"both"}}`
			h, err := newHost(b, cfg, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				io.WriteString(w, "ok\n")
			})
			hd := h.Handler(up)
			req := httptest.NewRequest("GET", "/api/items?id=7", nil)
			req.RemoteAddr = "192.0.2.10:40000"
			req.Header.Set("User-Agent", "bench")
			req.Header.Set("Accept", "*/*")
			if c.want == 429 {
				hd.ServeHTTP(httptest.NewRecorder(), req) // spend the one token
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				rec := httptest.NewRecorder()
				hd.ServeHTTP(rec, req)
				if rec.Code != c.want {
					b.Fatalf("status %d, want %d", rec.Code, c.want)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// BenchmarkFullCycleSlidingLog is BenchmarkFullCycle (headers "both") for
// sliding_log with a full log, beside token_bucket with the same rule
// shape. deny-full-1000: limit 1000 per hour, the key's 1000 requests made
// first, then every request denied against its 1000 entries. allow-1000:
// limit 10,000 per hour, each key given 1000 requests first (timer
// stopped), then at most 1000 measured admissions, so every admission
// copies a log of 1000 to 2000 entries; then the next key.
func BenchmarkFullCycleSlidingLog(b *testing.B) {
	for _, c := range []struct {
		name, alg, limit string
		want             int
		fill, per        int // requests per key before timing, timed per key
	}{
		{"token_bucket/allow", "token_bucket", "1000000000", 200, 0, 0},
		{"sliding_log/allow-1000", "sliding_log", "10000", 200, 1000, 1000},
		{"token_bucket/deny", "token_bucket", "1", 429, 1, 0},
		{"sliding_log/deny-full-1000", "sliding_log", "1000", 429, 1000, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := `{"rules":[{"name":"bench","key":[{"header":"x-user"}],"algorithm":"` + c.alg + `","limit":` + c.limit + `,"window":"1h"}],"response":{"headers":"both"}}`
			h, err := newHost(b, cfg, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			req := &host.Request{Method: "GET", Path: "/api/items?id=7", Authority: "example.test",
				Headers: [][2]string{{"user-agent", "bench"}, {"x-user", ""}}, RemoteAddr: "192.0.2.10:40000"}
			key := 0
			next := func() { // a new key, given its first requests
				key++
				req.Headers[1][1] = "user-" + strconv.Itoa(key)
				for range c.fill {
					if resp, err := h.Exchange(ctx, req, upstream200); err != nil || resp.Status != 200 {
						b.Fatalf("fill: %v %v", resp, err)
					}
				}
			}
			next()
			b.ReportAllocs()
			var cpu time.Duration
			cpu0 := processCPU()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if c.per > 0 && i > 0 && i%c.per == 0 {
					b.StopTimer()
					cpu += processCPU() - cpu0
					next()
					cpu0 = processCPU()
					b.StartTimer()
				}
				resp, err := h.Exchange(ctx, req, upstream200)
				if err != nil || resp.Status != c.want {
					b.Fatalf("request %d: status %v %v, want %d", i, resp, err, c.want)
				}
			}
			b.StopTimer()
			cpu += processCPU() - cpu0
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
