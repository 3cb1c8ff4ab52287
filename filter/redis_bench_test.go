package filter_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/host"
)

// BenchmarkRedisBackend measures one request through sluice-redis.wasm in the embedded
// host, on loopback against the 3-master cluster, one request at a time (latency), for the
// local backend and the Redis backend. It reports Redis round trips per request
// (redis-calls/op, counted by the filter) and the latency added by the Redis backend is the
// difference of the two ns/op.
//
//	go test ./filter -run '^$' -bench BenchmarkRedisBackend -benchtime 2000x
func BenchmarkRedisBackend(b *testing.B) {
	testCluster(b)
	for _, backend := range []string{"local", "redis"} {
		for _, alg := range []string{"token_bucket", "sliding_log"} {
			b.Run(backend+"/"+alg, func(b *testing.B) {
				limit := 1_000_000
				if alg == "sliding_log" {
					limit = 10_000 // its maximum: keep -benchtime below it
				}
				cfg := fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-user"}],"algorithm":%q,"limit":%d,"window":"1h","backend":%q}],
"failure_mode":"closed","redis":{"cluster":%q,"timeout_ms":1000}}`, unique("bench"), alg, limit, backend, redisService)
				p := startRedisProxy(b, cfg, 1)
				req := &host.Request{Path: "/api", Headers: [][2]string{{"x-user", "bench"}}}
				// Warm up: the script cached on its node, connections open.
				for i := 0; i < 10; i++ {
					if r, err := p.h.Exchange(context.Background(), req, nil); err != nil || r.Status != 200 {
						b.Fatalf("warm-up: %v %+v", err, r)
					}
				}
				calls0 := p.metric(filter.MetricRedisCalls)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					r, err := p.h.Exchange(context.Background(), req, nil)
					if err != nil || r.Status != 200 {
						b.Fatalf("%v %+v", err, r)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64(p.metric(filter.MetricRedisCalls)-calls0)/float64(b.N), "redis-calls/op")
			})
		}
	}
}
