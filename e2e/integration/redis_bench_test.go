package integration

import (
	"context"
	"fmt"
	"strconv"
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
				limit, perKey := 1_000_000, 1<<62
				if alg == "sliding_log" {
					// Its maximum limit is 10,000: a new key every 9,000 requests keeps a
					// long run admitted.
					limit, perKey = 10_000, 9_000
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
					if i > 0 && i%perKey == 0 {
						req.Headers[0][1] = "bench-" + strconv.Itoa(i/perKey)
					}
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
