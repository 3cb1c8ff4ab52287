package integration

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/host/fakeclock"
)

// gatedUpstream counts the requests it holds and answers them when the test opens the
// gate.
type gatedUpstream struct {
	mu   sync.Mutex
	held int
	gate chan struct{}
}

func (u *gatedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.held++
	gate := u.gate
	u.mu.Unlock()
	select {
	case <-gate:
	case <-r.Context().Done():
	}
	u.mu.Lock()
	u.held--
	u.mu.Unlock()
}

func (u *gatedUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held
}

func (u *gatedUpstream) open() {
	u.mu.Lock()
	close(u.gate)
	u.gate = make(chan struct{})
	u.mu.Unlock()
}

// A VM that traps while its requests hold concurrency slots: the slots stay taken for
// the rest of the lease (the limit holds), and come back exactly one lease
// (filter.ConcurrencyLeaseTTL) after the dead holder's last renewal, counted in reclaimed.
// The clock is the test's: nothing waits for time to pass.
func TestConcurrencyTrappedVMSlotsReclaimed(t *testing.T) {
	c := fakeclock.New()
	cfg := `{"rules":[{"name":"c","match":{"path_prefix":"/slow"},"key":[{"header":"x-user"}],"algorithm":"concurrency","limit":3}]}`
	var logs bytes.Buffer
	var lmu sync.Mutex
	h, err := host.New(context.Background(), host.Options{
		Wasm: filtertest.Wasm(t, "sluice_debug"), PluginConfig: []byte(cfg), Workers: 2,
		FailurePolicy: host.FailReload, Clock: c,
		Logger: slog.New(slog.NewTextHandler(lockedWriter{&lmu, &logs}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	up := &gatedUpstream{gate: make(chan struct{})}
	srv := httptest.NewServer(h.Handler(up))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 16}}
	type result struct {
		status int
		failed bool
	}
	results := make(chan result, 16)
	send := func(path string, hdrs ...[2]string) {
		go func() {
			req, _ := http.NewRequest("GET", srv.URL+path, nil)
			req.Header.Set("x-user", "u")
			for _, kv := range hdrs {
				req.Header.Set(kv[0], kv[1])
			}
			r, err := client.Do(req)
			if err != nil {
				t.Error(err)
				results <- result{}
				return
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			results <- result{r.StatusCode, r.StatusCode == 503}
		}()
	}
	waitHeld := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); up.count() != n; {
			if time.Now().After(deadline) {
				select {
				case r := <-results:
					t.Logf("a result: %+v", r)
				default:
				}
				t.Fatalf("%d requests at the upstream, want %d\n%s", up.count(), n, logs.String())
			}
			time.Sleep(time.Millisecond)
		}
	}
	metric := func(name string) int64 {
		m, _ := h.Metric("sluice.c." + name)
		return m.Value
	}
	// Three in flight, spread over both workers (round robin), then worker 0's VM traps
	// (the fourth pick) holding one of them.
	for i := 0; i < 3; i++ {
		send("/slow")
	}
	waitHeld(3)
	send("/trap", [2]string{"x-sluice-debug-trap", "1"})
	if r := <-results; !r.failed {
		t.Fatalf("the trap request: %+v", r)
	}
	up.open()
	ok, failed := 0, 0
	for i := 0; i < 3; i++ {
		switch r := <-results; {
		case r.status == 200 && !r.failed:
			ok++
		case r.failed:
			failed++
		}
	}
	if ok != 2 || failed != 1 {
		t.Fatalf("after the trap: %d served, %d failed; want 2 and 1", ok, failed)
	}
	// The dead holder's slot is still taken: of three more, two are admitted. The trapped
	// worker's VM is reloaded by its first request after the backoff.
	c.Advance(1500 * time.Millisecond)
	for i := 0; i < 3; i++ {
		send("/slow")
	}
	if r := <-results; r.status != 429 {
		t.Fatalf("over the limit with the dead holder's slot: %+v", r)
	}
	waitHeld(2)
	// One nanosecond before the lease ends (every tick delivered): still taken.
	c.Advance(filter.ConcurrencyLeaseTTL - 1500*time.Millisecond - 1)
	if err := h.Tick(context.Background()); err != nil {
		t.Fatal(err)
	}
	send("/slow")
	if r := <-results; r.status != 429 {
		t.Fatalf("before the lease ended: %+v", r)
	}
	c.Advance(1)
	send("/slow")
	waitHeld(3)
	if n := metric("reclaimed"); n != 1 {
		t.Fatalf("reclaimed %d, want 1", n)
	}
	up.open()
	for i := 0; i < 3; i++ {
		if r := <-results; r.status != 200 {
			t.Fatalf("admitted request: %+v", r)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); metric("in_flight") != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("in_flight %d after every request ended", metric("in_flight"))
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("acquired %d, refused %d, reclaimed %d", metric("acquired"), metric("refused"), metric("reclaimed"))
}

// Heap allocations of the guest per request of a concurrency rule (sluice_debug build, as
// TestGuestAllocationsPerRequest): acquiring and releasing a slot allocate nothing once
// the pools have grown, for keys that come and go (each request its key's only one in
// flight) and for one key many hold at once.
func TestGuestAllocationsPerConcurrencyRequest(t *testing.T) {
	wasm := filtertest.Wasm(t, "sluice_debug")
	cfg := `{"rules":[{"name":"c","key":[{"header":"x-user"}],"algorithm":"concurrency","limit":1000}],"response":{"headers":"both"}}`
	h, err := host.New(context.Background(), host.Options{Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1,
		Logger: slog.New(slog.NewTextHandler(new(bytes.Buffer), nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	const clients = 32
	run := func(perClient int) {
		var wg sync.WaitGroup
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				user := "u" + string(rune('a'+c%4)) // 4 keys, 8 clients each
				req := &host.Request{Method: "GET", Path: "/", Authority: "example.test", RemoteAddr: "192.0.2.10:40000",
					Headers: [][2]string{{"x-user", user}}}
				for i := 0; i < perClient; i++ {
					resp, err := h.Exchange(context.Background(), req, upstream200)
					if err != nil || resp.Status != 200 {
						t.Errorf("request: %v %+v", err, resp)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	run(20) // grow the pools
	m0, _ := h.Metric(filter.DebugAllocsMetric)
	a0, _ := h.Metric("sluice.c.acquired")
	const perClient = 100
	run(perClient)
	m1, ok := h.Metric(filter.DebugAllocsMetric)
	if !ok {
		t.Fatal("no allocation metric")
	}
	a1, _ := h.Metric("sluice.c.acquired")
	n := clients * perClient
	if a1.Value-a0.Value != int64(n) {
		t.Fatalf("%d slots acquired for %d requests", a1.Value-a0.Value, n)
	}
	if f, _ := h.Metric("sluice.c.in_flight"); f.Value != 0 {
		t.Fatalf("in_flight %d after every request", f.Value)
	}
	per := float64(m1.Value-m0.Value) / float64(n)
	t.Logf("%.4f guest heap allocations per request (%d over %d requests, each acquiring and releasing a slot)", per, m1.Value-m0.Value, n)
	if per > 0.01 {
		t.Errorf("%.4f allocations per concurrency request in the guest", per)
	}
}
