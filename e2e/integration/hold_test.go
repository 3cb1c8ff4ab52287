package integration

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
)

// Held requests (rules[].delay) through the compiled module in the embedded
// host: heap allocations of the guest per held request, and per tick, once
// the pool of hold records has grown (sluice_debug build, as
// TestGuestAllocationsPerRequest).
func TestGuestAllocationsPerHeldRequest(t *testing.T) {
	wasm := filtertest.Wasm(t, "sluice_debug")
	// 2,000/s, burst 1: 64 clients keep about 64 requests held, one released every
	// 0.5 ms (a tick each).
	cfg := `{"rules":[{"name":"shape","key":[{"header":"x-user"}],"algorithm":"leaky_bucket",
	  "limit":2000,"window":"1s","burst":1,"delay":{"max":"5s"}}],"response":{"headers":"both"}}`
	h, err := host.New(context.Background(), host.Options{Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1,
		Logger: slog.New(slog.NewTextHandler(new(bytes.Buffer), nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	const clients = 64
	run := func(perClient int) {
		var wg sync.WaitGroup
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := &host.Request{Method: "GET", Path: "/", Authority: "example.test", RemoteAddr: "192.0.2.10:40000",
					Headers: [][2]string{{"x-user", "one"}}}
				for i := 0; i < perClient; i++ {
					resp, err := h.Exchange(context.Background(), req, upstream200)
					if err != nil || resp.Status != 200 {
						t.Errorf("held request: %v %+v", err, resp)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	run(10) // grow the pools
	m0, _ := h.Metric(filter.DebugAllocsMetric)
	d0, _ := h.Metric("sluice.shape.delayed")
	const perClient = 60
	run(perClient)
	m1, ok := h.Metric(filter.DebugAllocsMetric)
	if !ok {
		t.Fatal("no allocation metric")
	}
	d1, _ := h.Metric("sluice.shape.delayed")
	n := clients * perClient
	held := d1.Value - d0.Value
	if held < int64(n)*9/10 {
		t.Fatalf("%d of %d requests were held: the test measures held requests", held, n)
	}
	per := float64(m1.Value-m0.Value) / float64(n)
	t.Logf("%.4f guest heap allocations per request (%d over %d requests, %d of them held, released by ticks)",
		per, m1.Value-m0.Value, n, held)
	if per > 0.01 {
		t.Errorf("%.4f allocations per held request in the guest", per)
	}
}
