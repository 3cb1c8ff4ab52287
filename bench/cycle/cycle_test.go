package cycle

import (
	"context"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

// BenchmarkCycle attributes the cost of one request cycle in the embedded host (in process,
// host.Exchange, one worker, no HTTP), to explain the load test's figures: a no-op module
// (the host's own cost), sluice with no rule applying, then sluice limiting (every request
// admitted) with the response-header styles, each algorithm, a hot key vs 1,000 keys, and
// denial. cpu-ns/op is the process CPU time per request (host, guest and GC).
//
//	go test ./bench/cycle -run '^$' -bench Cycle
func BenchmarkCycle(b *testing.B) {
	wasm := sluiceModule(b)
	sluice, err := os.ReadFile(wasm)
	if err != nil {
		b.Fatal(err)
	}
	rule := func(alg, key, match, limit, headers string) string {
		window := "1h"
		if alg == "sliding_log" {
			// Its limit is at most 10,000 and it keeps one entry per admitted request:
			// 1,000 per millisecond never denies here and keeps the log below 1,000 entries.
			limit, window = "1000", "1ms"
		}
		return `{"rules":[{"name":"bench",` + match + `"key":[` + key + `],"algorithm":"` + alg + `","limit":` + limit +
			`,"window":"` + window + `"}],"response":{"headers":"` + headers + `"}}`
	}
	const ip, hdr, huge = `{"remote_ip":true}`, `{"header":"x-key"}`, "1000000000"
	type bench struct {
		name   string
		wasm   []byte
		config string
		keys   int
		status int
	}
	benches := []bench{
		{"noop-module", nil, "", 0, 200},
		{"sluice/no-rule-applies", sluice, rule("token_bucket", ip, `"match":{"headers":[{"name":"x-never","exact":"1"}]},`, huge, "both"), 0, 200},
		{"sluice/allow/headers-none", sluice, rule("token_bucket", ip, "", huge, "none"), 0, 200},
		{"sluice/allow/headers-draft", sluice, rule("token_bucket", ip, "", huge, "draft"), 0, 200},
		{"sluice/allow/headers-both", sluice, rule("token_bucket", ip, "", huge, "both"), 0, 200},
		{"sluice/allow/headers-both/1000-keys", sluice, rule("token_bucket", hdr, "", huge, "both"), 1000, 200},
		{"sluice/deny/headers-both", sluice, rule("token_bucket", ip, "", "1", "both"), 0, 429},
	}
	for _, alg := range algorithms {
		benches = append(benches, bench{"sluice/allow/headers-none/" + alg, sluice, rule(alg, ip, "", huge, "none"), 0, 200})
	}
	for _, bc := range benches {
		b.Run(bc.name, func(b *testing.B) {
			mod := bc.wasm
			if mod == nil {
				mod = noopModule(b)
			}
			ctx := context.Background()
			h, err := host.New(ctx, host.Options{Wasm: mod, PluginConfig: []byte(bc.config), Workers: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close(ctx)
			reqs := make([]*host.Request, max(bc.keys, 1))
			for i := range reqs {
				reqs[i] = &host.Request{Method: "GET", Path: "/api/items?id=7", Authority: "example.test",
					Headers:    [][2]string{{"user-agent", "bench"}, {"accept", "*/*"}, {"x-key", "k" + strconv.Itoa(i)}},
					RemoteAddr: "192.0.2.10:40000"}
			}
			up := func(*host.Request) *host.Response {
				return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "text/plain"}}}
			}
			if bc.status == 429 {
				h.Exchange(ctx, reqs[0], up) // spend the one request
			}
			cpu0 := processCPU()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := h.Exchange(ctx, reqs[i%len(reqs)], up)
				if err != nil || resp.Status != bc.status {
					b.Fatalf("response %+v, %v; want status %d", resp, err, bc.status)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU returns the user+system CPU time of this process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
