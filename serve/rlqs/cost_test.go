package rlqs

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"
)

var evalshaStats = regexp.MustCompile(`cmdstat_evalsha:calls=(\d+),usec=(\d+)`)

// BenchmarkAllocateRedisCPU measures the allocation script's Redis CPU per
// report (usec from INFO commandstats of the node holding the bucket) with
// n participants in the bucket's pool:
//
//	go test -run '^$' -bench AllocateRedisCPU ./serve/rlqs/
func BenchmarkAllocateRedisCPU(b *testing.B) {
	for _, n := range []int{2, 16, 128} {
		for _, named := range []bool{false, true} {
			b.Run(fmt.Sprintf("participants=%d/named=%v", n, named), func(b *testing.B) {
				be := backend(b)
				a := &Allocator{Backend: be}
				key := Key("bench", fmt.Sprintf("api=%d-%v-%d", n, named, time.Now().UnixNano()))
				node, err := cluster.NodeOf(key)
				if err != nil {
					b.Fatal(err)
				}
				stats := func() (calls, usec int64) {
					s, err := cluster.Client(node).Info(context.Background(), "commandstats").Result()
					if err != nil {
						b.Fatal(err)
					}
					m := evalshaStats.FindStringSubmatch(s)
					if m == nil {
						return 0, 0
					}
					calls, _ = strconv.ParseInt(m[1], 10, 64)
					usec, _ = strconv.ParseInt(m[2], 10, 64)
					return calls, usec
				}
				q := func(i int) *Request {
					r := &Request{Key: key, Limit: 1_000_000, Window: time.Hour, Participant: fmt.Sprintf("p%d", i%n),
						Allowed: 40, Denied: 2, Elapsed: 5 * time.Second, CurrentWindow: -1, Interval: 5 * time.Second, Expiry: 17 * time.Second}
					if named {
						r.Owner, r.ClientField = fmt.Sprintf("s%d", i%n), fmt.Sprintf("envoy-%d.x", i%n)
					}
					return r
				}
				for i := 0; i < n; i++ {
					if _, err := a.Allocate(context.Background(), q(i)); err != nil {
						b.Fatal(err)
					}
				}
				c0, u0 := stats()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := a.Allocate(context.Background(), q(i)); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				c1, u1 := stats()
				if c1 > c0 {
					b.ReportMetric(float64(u1-u0)/float64(c1-c0), "redis-µs/report")
				}
			})
		}
	}
}
