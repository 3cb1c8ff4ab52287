package main

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricValue reads one counter from a sluice run admin /metrics page
// ("name value" lines; -1 when absent).
func metricValue(t *testing.T, admin, name string) int64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return int64(v)
		}
	}
	return -1
}

// The check through `sluice run --redis-cluster` with
// sluice-redis.wasm: three instances, lease 10, limit 100/h, 3,000
// concurrent requests on one key → between 70 and 100 admitted, never
// more, counted from the responses; Redis calls counted from /metrics.
func TestRunThreeInstancesLeases(t *testing.T) {
	c := testCluster(t)
	withRedisClusters(t, redisClusterFlag{"redis": c.Addrs})
	rule := fmt.Sprintf("lease-%d", time.Now().UnixNano())
	cfgPath := writeFile(t, "sluice.json", `{"rules":[{"name":"`+rule+`","key":[{"header":"x-api-key"}],
"algorithm":"fixed_window","limit":100,"window":"1h","backend":"redis","lease":10}],
"failure_mode":"closed","redis":{"cluster":"redis","timeout_ms":5000,"instances":3}}`)
	var addrs, admins []string
	for i := 0; i < 3; i++ {
		rs, _, _ := startTestRun(t, runConfig{wasm: buildRedisWasm(t), configPath: cfgPath, clusters: clusterFlag{}, workers: 2, admin: "127.0.0.1:0"})
		addrs = append(addrs, rs.listenAddr)
		admins = append(admins, rs.adminAddr)
	}
	const requests = 3000
	start := time.Now()
	r := fire(t, addrs, requests, 0, "k1")
	var calls, leased int64
	for _, a := range admins {
		calls += metricValue(t, a, "sluice_redis_calls")
		leased += metricValue(t, a, "sluice_redis_leased")
	}
	t.Logf("%d HTTP requests through 3 sluice run instances with lease 10 in %v: %d admitted, %d denied, %d other; %d Redis calls, %d leased",
		requests, time.Since(start).Round(time.Millisecond), r.ok, r.denied, r.other, calls, leased)
	if r.ok < 70 || r.ok > 100 || r.ok+r.denied != requests {
		t.Fatalf("admitted %d denied %d other %d, want 70..100 admitted", r.ok, r.denied, r.other)
	}
	if calls <= 0 || calls > requests/10 || leased > 100 {
		t.Fatalf("%d Redis calls, %d leased for %d requests", calls, leased, requests)
	}
}
