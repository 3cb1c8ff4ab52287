package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// BenchmarkRunRedisVsLocalThroughput: requests per second through one
// `sluice run` (2 workers) with the same token_bucket rule on the local
// backend and on the Redis backend (3-master cluster), all admitted, 32
// requests in flight; first over 1,000 keys (a worker rarely has two requests
// of one key in flight, so Redis decides each in its own call), then on one
// hot key (a worker's requests for it that arrive while its call is in flight
// go together in the next). One iteration is one round: 1 s on each backend,
// the two alternating. It fails if a request is not admitted, and reports
// each backend's median req/s and the median of the per-round ratios
// redis/local (a figure, not a test's bound,
// because a shared machine makes such a bound flaky). Because req/s follow
// whatever else the machine runs, it also reports the CPU per request of this
// process (the proxies and the load generator: getrusage) and of the Redis
// masters (INFO cpu), and the ratio they imply when CPU-bound: local CPU /
// (Redis backend's CPU + Redis's CPU). Three rounds:
//
//	go test ./cmd/sluice -run '^$' -bench '^BenchmarkRunRedisVsLocalThroughput$' -benchtime 3x -v
func BenchmarkRunRedisVsLocalThroughput(b *testing.B) {
	c := testCluster(b)
	withRedisClusters(b, redisClusterFlag{"redis": c.Addrs})
	wasm := buildRedisWasm(b)
	rule := fmt.Sprintf("tput-%d", time.Now().UnixNano())
	start := func(backend string) string {
		cfg := writeFile(b, "sluice-"+backend+".json", `{"rules":[{"name":"`+rule+`-`+backend+`","key":[{"header":"x-api-key"}],
"algorithm":"token_bucket","limit":1000000,"window":"1h","backend":"`+backend+`"}],
"failure_mode":"closed","redis":{"cluster":"redis","timeout_ms":1000,"instances":1}}`)
		rs, _, _ := startTestRun(b, runConfig{wasm: wasm, configPath: cfg, clusters: clusterFlag{}, workers: 2})
		return rs.listenAddr
	}
	addrs := map[string]string{"local": start("local"), "redis": start("redis")}
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 32, MaxIdleConnsPerHost: 32}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	type result struct {
		rps, cpu, redisCPU float64 // req/s; µs of CPU per request here and in Redis
	}
	run := func(b *testing.B, addr string, keys int, d time.Duration) result {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		cpu0, rcpu0 := processCPU(), redisCPU(b, c)
		var n, bad atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
					req.Header.Set("x-api-key", "k"+strconv.Itoa((w*7919+i)%keys))
					resp, err := client.Do(req)
					if err != nil {
						bad.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						n.Add(1)
					} else {
						bad.Add(1)
					}
				}
			}(w)
		}
		wg.Wait()
		if bad.Load() != 0 {
			b.Fatalf("%d requests not admitted", bad.Load())
		}
		reqs := float64(max(n.Load(), 1))
		return result{float64(n.Load()) / d.Seconds(), (processCPU() - cpu0) * 1e6 / reqs, (redisCPU(b, c) - rcpu0) * 1e6 / reqs}
	}
	med := func(v []float64) float64 { v = slices.Clone(v); sort.Float64s(v); return v[len(v)/2] }
	for _, keys := range []int{1000, 1} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			run(b, addrs["local"], keys, 500*time.Millisecond) // warm-up
			run(b, addrs["redis"], keys, 500*time.Millisecond)
			var local, redis, ratio, cpuRatio, localCPU, redisBackendCPU, redisServerCPU []float64
			for b.Loop() {
				l := run(b, addrs["local"], keys, time.Second)
				x := run(b, addrs["redis"], keys, time.Second)
				cr := (l.cpu + l.redisCPU) / (x.cpu + x.redisCPU)
				local, redis, ratio, cpuRatio = append(local, l.rps), append(redis, x.rps), append(ratio, x.rps/l.rps), append(cpuRatio, cr)
				localCPU, redisBackendCPU, redisServerCPU = append(localCPU, l.cpu), append(redisBackendCPU, x.cpu), append(redisServerCPU, x.redisCPU)
				b.Logf("%d keys, round %d: local %.0f req/s, redis %.0f req/s, redis/local %.2f; CPU per request local %.0f µs, redis %.0f µs + Redis %.0f µs, CPU-bound redis/local %.2f",
					keys, len(local), l.rps, x.rps, x.rps/l.rps, l.cpu, x.cpu, x.redisCPU, cr)
			}
			b.ReportMetric(med(local), "local-req/s")
			b.ReportMetric(med(redis), "redis-req/s")
			b.ReportMetric(med(ratio), "redis/local")
			b.ReportMetric(med(cpuRatio), "cpu-bound-redis/local")
			b.ReportMetric(med(localCPU), "local-cpu-µs/req")
			b.ReportMetric(med(redisBackendCPU), "redis-cpu-µs/req")
			b.ReportMetric(med(redisServerCPU), "redis-server-cpu-µs/req")
		})
	}
}

// processCPU is this process's user + system CPU time in seconds.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// redisCPU is the CPU time in seconds the cluster's masters have used
// (used_cpu_sys + used_cpu_user of INFO cpu).
func redisCPU(t testing.TB, c *redistest.Cluster) float64 {
	var sum float64
	for i := range c.Addrs {
		info, err := c.Client(i).Info(context.Background(), "cpu").Result()
		if err != nil {
			t.Fatalf("INFO cpu of %s: %v", c.Addrs[i], err)
		}
		for _, l := range strings.Split(info, "\r\n") {
			for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
				if v, ok := strings.CutPrefix(l, k); ok {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil {
						t.Fatalf("INFO cpu of %s: %q", c.Addrs[i], l)
					}
					sum += f
				}
			}
		}
	}
	return sum
}
