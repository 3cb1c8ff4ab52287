package main

import (
	"fmt"
	"testing"
	"time"
)

// A burst: three `sluice run` proxies (2 workers each) on one
// 3-master cluster, 3,000 requests at 150 in flight on one key, limit 100
// per hour, timeout_ms 200 and failure_mode closed, for every algorithm.
// Asserted: never more than 100 admitted, every other request a 429 with
// Retry-After or (a call past timeout_ms, failing closed) a 503, nothing
// else. The goal is no 503 at all; none occurred in most runs here (with
// coalescing, 430–500 Redis calls per 3,000 requests), but on this shared
// 2-core machine a stall past 200 ms still happens in some runs — up to all
// 150 requests in flight timing out at once — so how many 503 there are is
// logged with the proxies' Redis calls, failures and timeouts, not bounded.
// What is asserted of them is that each is accounted for: every 503 is a
// decision Redis could not make that failure_mode closed rejected
// (sluice_redis_fail_closed, at most sluice_redis_failures).
func TestRunRedisBurstWithinTimeout(t *testing.T) {
	c := testCluster(t)
	withRedisClusters(t, redisClusterFlag{"redis": c.Addrs})
	for _, alg := range []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_window", "sliding_log"} {
		t.Run(alg, func(t *testing.T) {
			rule := fmt.Sprintf("burst-%s-%d", alg, time.Now().UnixNano())
			cfgPath := writeFile(t, "sluice.json", `{"rules":[{"name":"`+rule+`","key":[{"header":"x-api-key"}],
"algorithm":"`+alg+`","limit":100,"window":"1h","backend":"redis"}],
"failure_mode":"closed","redis":{"cluster":"redis","timeout_ms":200,"instances":3}}`)
			var addrs, admins []string
			for i := 0; i < 3; i++ {
				rs, _, _ := startTestRun(t, runConfig{wasm: buildRedisWasm(t), configPath: cfgPath, clusters: clusterFlag{}, workers: 2, admin: "127.0.0.1:0"})
				addrs, admins = append(addrs, rs.listenAddr), append(admins, rs.adminAddr)
			}
			const requests, inFlight = 3000, 150
			start := time.Now()
			r := fire(t, addrs, requests, inFlight, "k1")
			ok, denied, unavailable, other := r.ok, r.denied, r.unavailable, r.other-r.unavailable
			t.Logf("%s: %d requests (%d in flight) in %v: %d admitted, %d denied, %d 503, %d other", alg, requests, inFlight,
				time.Since(start).Round(time.Millisecond), ok, denied, unavailable, other)
			var calls, timeouts, failures, failClosed int64
			for _, a := range admins {
				calls += metricValue(t, a, "sluice_redis_calls")
				timeouts += metricValue(t, a, "sluice_redis_timeouts")
				failures += metricValue(t, a, "sluice_redis_failures")
				failClosed += metricValue(t, a, "sluice_redis_fail_closed")
			}
			t.Logf("%s: %d Redis calls; %d decisions failed, %d of them timeouts", alg, calls, failures, timeouts)
			if ok > 100 || other != 0 || ok+denied+unavailable != requests {
				t.Fatalf("admitted %d denied %d 503 %d other %d, want at most 100 admitted and only 429 or 503 otherwise", ok, denied, unavailable, other)
			}
			if unavailable != failClosed || failClosed > failures || timeouts > failures {
				t.Fatalf("%d 503, sluice_redis_fail_closed %d, failures %d, timeouts %d: want one fail_closed per 503, each a counted failure",
					unavailable, failClosed, failures, timeouts)
			}
		})
	}
}
