package integration

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
)

// hostTarget runs the compiled module in sluice's own embedded host (host/),
// which has Envoy's shared-data semantics, calls proxy_on_delete and runs
// several workers.
var req = filtertest.NewRequest

const perIPConfig = `{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],
  "algorithm":"fixed_window","limit":3,"window":"1h"}]}`

type hostTarget struct {
	t *testing.T
	h *host.Host
}

func newHost(t testing.TB, cfg string, workers int, logs *bytes.Buffer) (*host.Host, error) {
	t.Helper()
	wasm := filtertest.Wasm(t, "")
	if logs == nil {
		logs = new(bytes.Buffer)
	}
	var mu sync.Mutex
	h, err := host.New(context.Background(), host.Options{
		Wasm:         wasm,
		PluginConfig: []byte(cfg),
		Workers:      workers,
		VMID:         "sluice-test",
		Logger:       slog.New(slog.NewTextHandler(lockedWriter{&mu, logs}, nil)),
	})
	if err == nil {
		t.Cleanup(func() { h.Close(context.Background()) })
	}
	return h, err
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func startHost(t *testing.T, cfg string, workers int) *hostTarget {
	t.Helper()
	var logs bytes.Buffer
	h, err := newHost(t, cfg, workers, &logs)
	if err != nil {
		t.Fatalf("host.New: %v\n%s", err, logs.String())
	}
	return &hostTarget{t: t, h: h}
}

func upstream200(*host.Request) *host.Response {
	return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "text/plain"}}}
}

func (ht *hostTarget) exchange(r filtertest.Request) (*host.Response, error) {
	return ht.h.Exchange(context.Background(), &host.Request{
		Method: r.Method, Path: r.Path, Authority: "example.test", Headers: r.Headers, RemoteAddr: r.Source,
	}, upstream200)
}

func (ht *hostTarget) do(r filtertest.Request) filtertest.Response {
	resp, err := ht.exchange(r)
	if err != nil {
		ht.t.Fatal(err)
	}
	if resp.Failed {
		ht.t.Fatalf("guest trapped: %+v", resp)
	}
	out := filtertest.Response{Status: resp.Status, Local: resp.Local, Body: string(resp.Body)}
	if resp.Local {
		out.GRPCStatus = resp.GRPCStatus
	}
	for _, kv := range resp.Headers {
		if !resp.Local && (kv[0] == "content-type" || strings.HasPrefix(kv[0], ":")) {
			continue
		}
		out.Headers = append(out.Headers, kv)
	}
	return out
}

func (ht *hostTarget) metric(name string) int64 {
	m, ok := ht.h.Metric(name)
	if !ok {
		return 0
	}
	return m.Value
}

func TestBadConfigurationRefusedByHost(t *testing.T) {
	var logs bytes.Buffer
	_, err := newHost(t, `{"rules":[{"name":"x","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"10x"}]}`, 1, &logs)
	if err == nil {
		t.Fatal("bad configuration accepted")
	}
	if want := `rules[0].window: \"10x\" is not a duration`; !strings.Contains(logs.String(), want) {
		t.Errorf("logs %s\nwant %s", logs.String(), want)
	}
}

// Through the embedded host (Envoy's shared-data semantics, 8 workers, one
// VM each): 2,000 concurrent requests on one new key, limit 100 per hour,
// admit exactly 100 — including the race of the first requests creating
// the key on every worker.
func TestHostConcurrentExactAdmissions(t *testing.T) {
	const workers, requests, limit, clients = 8, 2000, 100, 64
	for _, alg := range []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_log", "sliding_window"} {
		t.Run(alg, func(t *testing.T) {
			cfg := `{"rules":[{"name":"hot","key":[{"header":"x-api-key"}],"algorithm":"` + alg + `","limit":100,"window":"1h"}],"failure_mode":"closed"}`
			ht := startHost(t, cfg, workers)
			var mu sync.Mutex
			statuses := map[int]int{}
			var wg sync.WaitGroup
			next := make(chan struct{}, requests)
			for i := 0; i < requests; i++ {
				next <- struct{}{}
			}
			close(next)
			for c := 0; c < clients; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range next {
						resp, err := ht.exchange(req("10.0.0.1:1", "x-api-key", "the-key"))
						mu.Lock()
						if err != nil || resp.Failed {
							statuses[-1]++
						} else {
							statuses[resp.Status]++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if statuses[200] != limit || statuses[429] != requests-limit {
				t.Errorf("statuses %v, want exactly %d × 200", statuses, limit)
			}
			if got := ht.metric("sluice.hot.store_errors"); got != 0 {
				t.Errorf("store_errors %d", got)
			}
			if got := ht.metric("sluice.hot.allowed"); got != limit {
				t.Errorf("allowed metric %d", got)
			}
			st := ht.h.Stats()
			busy := 0
			for _, w := range st.Workers {
				if w.Requests > 0 {
					busy++
				}
			}
			if busy < 2 {
				t.Errorf("only %d workers served requests: no concurrency tested", busy)
			}
		})
	}
}

// Through the embedded host: many distinct keys keep the rule's shared-data
// entries within max_keys (a smaller run than the native 1,000,000), and
// every new key is admitted: a full table evicts the least-used key.
func TestHostDistinctKeysBounded(t *testing.T) {
	const maxKeys, n = 500, 100_000
	cfg := `{"rules":[{"name":"b","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1,"window":"1h","max_keys":500}]}`
	ht := startHost(t, cfg, 2)
	admitted := 0
	for i := 0; i < n; i++ {
		resp, err := ht.exchange(req("10.0.0.1:1", "x-api-key", "k"+strconv.Itoa(i)))
		if err != nil || resp.Failed {
			t.Fatalf("request %d: %v %+v", i, err, resp)
		}
		if resp.Status == 200 {
			admitted++
		}
	}
	keys := 0
	for _, k := range ht.h.SharedData().Keys() {
		if strings.HasPrefix(k, "sluice:sluice:b:") {
			keys++
		} else if k != filter.SeedKey {
			t.Errorf("unexpected shared-data key %q", k)
		}
	}
	t.Logf("%d distinct keys: %d shared-data entries (max_keys %d), %d admitted", n, keys, maxKeys, admitted)
	if keys > maxKeys {
		t.Errorf("%d shared-data entries > max_keys %d", keys, maxKeys)
	}
	if keys < maxKeys*9/10 {
		t.Errorf("only %d of %d slots used", keys, maxKeys)
	}
	if admitted != n {
		t.Errorf("%d of %d new keys admitted: a key was denied because of other keys", admitted, n)
	}
	if m, _ := ht.h.Metric("sluice.b.evicted"); m.Value != int64(n-keys) {
		t.Errorf("evicted %d, want %d (every request after the table filled)", m.Value, n-keys)
	}
}

// The soak: 1,000,000 requests with 2 KiB header values (the key is one of
// them, different for every request) through the compiled module; each
// VM's linear memory must end under 32 MiB. A standard-Go guest that never
// yields can stop finishing GC cycles and grow without bound.
func TestHostSoakMemoryFlat(t *testing.T) {
	const n, workers, limitBytes = 1_000_000, 2, 32 << 20
	cfg := `{"rules":[{"name":"soak","key":[{"header":"x-api-key"}],"algorithm":"sliding_window","limit":1000,"window":"1m"},
	  {"name":"ip","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}]}`
	ht := startHost(t, cfg, workers)
	pad := strings.Repeat("p", 2048)
	var wg sync.WaitGroup
	var failed sync.Map
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			key := []byte(strings.Repeat("k", 2048))
			for i := w; i < n; i += workers {
				copy(key, strconv.Itoa(i))
				resp, err := ht.exchange(req("10.0.0.1:1", "x-api-key", string(key), "x-pad", pad))
				if err != nil || resp.Failed || resp.Status != 200 {
					failed.Store(i, resp)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	failed.Range(func(k, v any) bool {
		t.Errorf("request %v failed: %+v", k, v)
		return false
	})
	st := ht.h.Stats()
	for _, w := range st.Workers {
		t.Logf("worker %d: %d requests, linear memory %.1f MiB, restarts %d", w.ID, w.Requests, float64(w.MemoryBytes)/(1<<20), w.VMRestarts)
		if w.MemoryBytes >= limitBytes {
			t.Errorf("worker %d: linear memory %d bytes ≥ 32 MiB", w.ID, w.MemoryBytes)
		}
		if w.VMRestarts != 0 {
			t.Errorf("worker %d restarted %d times", w.ID, w.VMRestarts)
		}
	}
	if st.Requests < n {
		t.Errorf("%d requests served, want %d", st.Requests, n)
	}
}

// Heap allocations of the guest per request, measured inside the compiled
// module (sluice_debug build: the guest reports runtime/metrics
// /gc/heap/allocs:objects as a counter) over full request cycles in the
// embedded host, on the allow and the deny path with both header styles.
func TestGuestAllocationsPerRequest(t *testing.T) {
	wasm := filtertest.Wasm(t, "sluice_debug")
	// The -xff cases also normalize a path (//api/./x/../items) for a
	// path_prefix rule and the path key, and take the client from two
	// X-Forwarded-For headers through proxy_get_header_map_pairs.
	const xff = `,"client_ip":{"xff_trusted_hops":1,"proxy_appends_xff":true}`
	for _, c := range []struct{ name, limit, rules, path string }{
		{"allow", "1000000000", "", "/api/items?id=7"},
		{"deny", "1", "", "/api/items?id=7"},
		{"allow-xff", "1000000000", xff, "//api/./x/../items?id=7"},
		{"deny-xff", "1", xff, "//api/./x/../items?id=7"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := `{"rules":[{"name":"bench","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":` + c.limit + `,"window":"1h"}`
			if c.rules != "" {
				cfg += `,{"name":"path","match":{"path_prefix":"/api/items"},"key":[{"path":true},{"remote_ip":true}],"algorithm":"token_bucket","limit":` + c.limit + `,"window":"1h"}`
			}
			cfg += `],"response":{"headers":"both"}` + c.rules + `}`
			h, err := host.New(context.Background(), host.Options{Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1,
				Logger: slog.New(slog.NewTextHandler(new(bytes.Buffer), nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close(context.Background())
			req := &host.Request{Method: "GET", Path: c.path, Authority: "example.test", RemoteAddr: "192.0.2.10:40000",
				Headers: [][2]string{{"x-forwarded-for", "203.0.113.5"}, {"x-forwarded-for", "198.51.100.7, 192.0.2.10"}}}
			for i := 0; i < 1000; i++ {
				h.Exchange(context.Background(), req, upstream200)
			}
			m0, _ := h.Metric(filter.DebugAllocsMetric)
			const n = 20000
			for i := 0; i < n; i++ {
				if _, err := h.Exchange(context.Background(), req, upstream200); err != nil {
					t.Fatal(err)
				}
			}
			m1, ok := h.Metric(filter.DebugAllocsMetric)
			if !ok {
				t.Fatal("no allocation metric")
			}
			per := float64(m1.Value-m0.Value) / n
			t.Logf("%s: %.4f guest heap allocations per request (%d over %d requests)", c.name, per, m1.Value-m0.Value, n)
			if per > 0.01 {
				t.Errorf("%.4f allocations per request in the guest", per)
			}
			if c.name == "allow-xff" {
				if m, _ := h.Metric("sluice.path.allowed"); m.Value < n {
					t.Errorf("the path rule admitted %d requests, want every one (the normalized path is not matched)", m.Value)
				}
			}
		})
	}
}

// Odd and huge header values through the compiled module: no trap, and the
// key still works (a 100 KiB value exceeds the 64 KiB arena: the overflow
// buffer path).
func TestHostOddHeaderValues(t *testing.T) {
	cfg := `{"rules":[{"name":"k","key":[{"header":"x-api-key"},{"cookie":"s"},{"query":"q"}],"algorithm":"fixed_window","limit":1,"window":"1h"}],
	  "client_ip":{"xff_trusted_hops":3}}`
	ht := startHost(t, cfg, 1)
	huge := strings.Repeat("\xff\x00z", 100<<10/3)
	for _, v := range []string{huge, "\x00", "\xc3\x28 invalid utf-8", strings.Repeat(";", 5000)} {
		r := filtertest.Request{Source: "[::1]:1", Path: "/p?q=" + strings.Repeat("%", 300) + "&q=1",
			Headers: [][2]string{{"x-api-key", v}, {"cookie", "x=" + v + "; s=2"}, {"x-forwarded-for", v + ", ,"}}}
		first, err := ht.exchange(r)
		if err != nil || first.Failed {
			t.Fatalf("value %.20q: %v %+v", v, err, first)
		}
		second, err := ht.exchange(r)
		if err != nil || second.Failed {
			t.Fatalf("value %.20q: %v %+v", v, err, second)
		}
		if first.Status != 200 || second.Status != 429 {
			t.Errorf("value %.20q: statuses %d %d, want 200 429", v, first.Status, second.Status)
		}
	}
	if st := ht.h.Stats(); st.VMRestarts != 0 || st.Failed != 0 {
		t.Errorf("restarts %d failed %d", st.VMRestarts, st.Failed)
	}
}
