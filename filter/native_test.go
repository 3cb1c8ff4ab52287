package filter_test

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Tests that move the clock or inject host failures run natively only (the
// proxytest emulator's clock is fake and not controllable).

func TestTokenBucketRetryAfterAndRecovery(t *testing.T) {
	cfg := `{"rules":[{"name":"tb","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":10,"window":"10s","burst":2}]}`
	n := startNative(t, cfg, t0)
	for i := 0; i < 2; i++ {
		if r := n.do(req("10.9.0.1:1")); r.Status != 200 {
			t.Fatalf("burst request %d: %d", i+1, r.Status)
		}
	}
	r := n.do(req("10.9.0.1:1"))
	if r.Status != 429 || r.Header("retry-after") != "1" {
		t.Fatalf("empty bucket: %d retry-after %q, want 429 and 1 (one token per second)", r.Status, r.Header("retry-after"))
	}
	n.advance(999 * time.Millisecond)
	if r := n.do(req("10.9.0.1:1")); r.Status != 429 {
		t.Fatalf("after 999ms: %d", r.Status)
	}
	n.advance(time.Millisecond)
	r = n.do(req("10.9.0.1:1"))
	if r.Status != 200 {
		t.Fatalf("after 1s: %d", r.Status)
	}
	// Bucket empty again; full after 2s: t=2, legacy reset 2.
	if got := r.Header("ratelimit"); got != `"tb";r=0;t=2` {
		t.Errorf("RateLimit %q", got)
	}
	if got := r.Header("ratelimit-policy"); got != `"tb";q=10;w=10` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := r.Header("x-ratelimit-limit"); got != "2" {
		t.Errorf("X-RateLimit-Limit %q (bucket capacity)", got)
	}
}

func TestFixedWindowExactReset(t *testing.T) {
	cfg := `{"rules":[{"name":"fw","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	n := startNative(t, cfg, t0) // 12:10 → window ends 13:00
	r := n.do(req("10.9.0.2:1"))
	if got := r.Header("ratelimit"); got != `"fw";r=0;t=3000` {
		t.Errorf("RateLimit %q", got)
	}
	r = n.do(req("10.9.0.2:1"))
	if r.Status != 429 || r.Header("retry-after") != "3000" || r.Header("x-ratelimit-reset") != "3000" {
		t.Errorf("denied: %d %v", r.Status, r.Headers)
	}
	n.advance(50 * time.Minute)
	if r := n.do(req("10.9.0.2:1")); r.Status != 200 {
		t.Errorf("next window: %d", r.Status)
	}
}

func TestStoreFailureModes(t *testing.T) {
	for _, c := range []struct {
		mode   string
		status int
	}{{"open", 200}, {"closed", 503}} {
		t.Run(c.mode, func(t *testing.T) {
			cfg := `{"rules":[{"name":"f","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],"failure_mode":"` + c.mode + `"}`
			n := startNative(t, cfg, t0)
			n.w.Host.FailShared = abi.StatusInternalFailure
			for i := 0; i < 3; i++ {
				r := n.do(req("10.9.1.1:1"))
				if r.Status != c.status {
					t.Fatalf("request %d: %d, want %d", i+1, r.Status, c.status)
				}
				if r.Has("ratelimit") {
					t.Errorf("headers from a failed store: %v", r.Headers)
				}
				if c.status == 503 && r.Body != "rate limiter unavailable\n" {
					t.Errorf("body %q", r.Body)
				}
			}
			if got := n.metric("sluice.f.store_errors"); got != 3 {
				t.Errorf("store_errors %d", got)
			}
			n.w.Host.FailShared = 0
			if r := n.do(req("10.9.1.1:1")); r.Status != 200 {
				t.Errorf("store back: %d", r.Status)
			}
			if r := n.do(req("10.9.1.1:1")); r.Status != 429 {
				t.Errorf("store back, limit: %d", r.Status)
			}
		})
	}
}

// twoWorkers returns two workers (VMs) sharing shared data and metrics.
func twoWorkers(t *testing.T, cfg string) (*filtertest.Worker, *filtertest.Worker) {
	t.Helper()
	a := filtertest.NewHost()
	b := filtertest.NewHost()
	b.Shared, b.Metrics = a.Shared, a.Metrics
	a.Now_, b.Now_ = t0, t0
	wa := filtertest.NewWorker(a, filter.NewVM(a))
	wb := filtertest.NewWorker(b, filter.NewVM(b))
	if !wa.Start(cfg) || !wb.Start(cfg) {
		t.Fatal("start failed")
	}
	return wa, wb
}

// A worker that loses the compare-and-swap decides again on the new state:
// no admission is lost or doubled, whichever worker wins.
func TestLostCASRaceDecidesAgain(t *testing.T) {
	for _, existing := range []bool{false, true} {
		t.Run("slot-exists="+strconv.FormatBool(existing), func(t *testing.T) {
			cfg := `{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":2,"window":"1h"}]}`
			wa, wb := twoWorkers(t, cfg)
			if existing {
				if r := wb.Do(req("10.9.2.1:1")); r.Status != 200 {
					t.Fatal(r.Status)
				}
			}
			// Worker A reads, then — before its set — worker B admits a
			// request for the same key. A's set must fail and A decide
			// again.
			fired := 0
			wa.Host.SetHook = func(string) {
				if fired == 0 {
					fired++
					if r := wb.Do(req("10.9.2.1:1")); r.Status != 200 {
						t.Errorf("B: %d", r.Status)
					}
				}
			}
			ra := wa.Do(req("10.9.2.1:1"))
			wa.Host.SetHook = nil
			if fired != 1 {
				t.Fatal("hook did not fire")
			}
			admitted := 1 + map[bool]int{false: 0, true: 1}[existing]
			if ra.Status == 200 {
				admitted++
			}
			if admitted != 2 {
				t.Errorf("admitted %d, want exactly the limit 2 (A: %d)", admitted, ra.Status)
			}
			if existing && ra.Status != 429 {
				t.Errorf("A must be denied after re-deciding: %d", ra.Status)
			}
			if !existing && ra.Header("ratelimit") != "" && !strings.HasPrefix(ra.Header("ratelimit"), `"r";r=0;`) {
				t.Errorf("A re-decided on the new state: RateLimit %q", ra.Header("ratelimit"))
			}
			if r := wb.Do(req("10.9.2.1:1")); r.Status != 429 {
				t.Errorf("after the race the key is spent: %d", r.Status)
			}
		})
	}
}

// Many workers hammering one key admit exactly the limit, for every
// algorithm, including the race to create the key.
func TestHammerExactAdmissions(t *testing.T) {
	const workers, perWorker, limit = 8, 250, 100
	for _, alg := range []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_log", "sliding_window"} {
		t.Run(alg, func(t *testing.T) {
			cfg := `{"rules":[{"name":"h","key":[{"header":"x-k"}],"algorithm":"` + alg + `","limit":` + strconv.Itoa(limit) + `,"window":"1h"}],"failure_mode":"closed"}`
			shared, metrics := filtertest.NewSharedData(), filtertest.NewMetrics()
			ws := make([]*filtertest.Worker, workers)
			for i := range ws {
				h := filtertest.NewHost()
				h.Shared, h.Metrics, h.Now_ = shared, metrics, t0
				ws[i] = filtertest.NewWorker(h, filter.NewVM(h))
				if !ws[i].Start(cfg) {
					t.Fatal("start")
				}
			}
			var mu sync.Mutex
			counts := map[int]int{}
			var wg sync.WaitGroup
			for _, w := range ws {
				wg.Add(1)
				go func(w *filtertest.Worker) {
					defer wg.Done()
					local := map[int]int{}
					for i := 0; i < perWorker; i++ {
						local[w.Do(req("10.0.0.1:1", "x-k", "hot")).Status]++
					}
					mu.Lock()
					for k, v := range local {
						counts[k] += v
					}
					mu.Unlock()
				}(w)
			}
			wg.Wait()
			if counts[200] != limit || counts[429] != workers*perWorker-limit {
				t.Errorf("statuses %v, want exactly %d admitted", counts, limit)
			}
			if v, _ := metrics.Get("sluice.h.store_errors"); v != 0 {
				t.Errorf("store errors %d", v)
			}
			if v, _ := metrics.Get("sluice.h.allowed"); v != limit {
				t.Errorf("allowed metric %d", v)
			}
		})
	}
}

// 1,000,000 distinct keys: the rule's shared-data entries stay within
// max_keys, and every new key is admitted (its own limit, 1): once the table
// is full each new key evicts a least-used one.
func TestMillionDistinctKeysBounded(t *testing.T) {
	const maxKeys, n = 1000, 1_000_000
	cfg := `{"rules":[{"name":"b","key":[{"header":"x-k"}],"algorithm":"fixed_window","limit":1,"window":"1h","max_keys":` + strconv.Itoa(maxKeys) + `}]}`
	nt := startNative(t, cfg, t0)
	allowed := 0
	for i := 0; i < n; i++ {
		if nt.do(req("10.0.0.1:1", "x-k", "key-"+strconv.Itoa(i))).Status == 200 {
			allowed++
		}
		if i%100_000 == 0 {
			nt.advance(time.Millisecond)
		}
	}
	entries := len(nt.w.Host.Shared.Keys("sluice::b:"))
	if total := nt.w.Host.Shared.Len(); total != entries+1 {
		t.Errorf("%d shared-data keys, want the rule's %d and the seed", total, entries)
	}
	evicted := nt.metric("sluice.b.evicted")
	t.Logf("%d distinct keys: %d shared-data entries (max_keys %d), %d admitted, %d evicted", n, entries, maxKeys, allowed, evicted)
	if entries > maxKeys || entries < maxKeys*9/10 {
		t.Errorf("%d entries, want at most max_keys %d and most of them used", entries, maxKeys)
	}
	if allowed != n {
		t.Errorf("%d of %d new keys admitted: a key was denied because of other keys", allowed, n)
	}
	// Each request either created a slot or evicted a key that had used 1.
	if evicted != int64(n-entries) || nt.metric("sluice.b.evicted_used") != evicted {
		t.Errorf("evicted %d (used %d), want %d", evicted, nt.metric("sluice.b.evicted_used"), n-entries)
	}
	if nt.vm.Streams() != 0 {
		t.Errorf("%d stream contexts leaked", nt.vm.Streams())
	}
}

// A full table evicts the least-used candidate; the newcomer starts fresh
// and the evicted key, if it returns, starts fresh too (it regains what it
// had used: evicted_used). An idle slot is reclaimed without an eviction.
func TestSlotEvictionAndReclaim(t *testing.T) {
	cfg := `{"rules":[{"name":"s","key":[{"header":"x-k"}],"algorithm":"fixed_window","limit":2,"window":"1m","max_keys":1}]}`
	n := startNative(t, cfg, t0)
	step := func(key string, status int, remaining string, evicted, used int64) {
		t.Helper()
		if r := n.do(req("10.0.0.1:1", "x-k", key)); r.Status != status || r.Header("x-ratelimit-remaining") != remaining {
			t.Fatalf("%s: %d remaining %q, want %d %q", key, r.Status, r.Header("x-ratelimit-remaining"), status, remaining)
		}
		if e, u := n.metric("sluice.s.evicted"), n.metric("sluice.s.evicted_used"); e != evicted || u != used {
			t.Fatalf("after %s: evicted %d used %d, want %d %d", key, e, u, evicted, used)
		}
	}
	step("a", 200, "1", 0, 0)
	step("b", 200, "1", 1, 1) // a (used 1) evicted; b is not charged for a
	step("a", 200, "1", 2, 2) // a back, fresh: it regained its 1
	step("a", 200, "0", 2, 2)
	step("a", 429, "0", 2, 2) // a is held by its own state
	step("c", 200, "1", 3, 4) // a evicted with 2 used
	// The window passes: c's slot is idle, d claims it without evicting.
	n.advance(time.Minute)
	step("d", 200, "1", 3, 4)
	step("d", 200, "0", 3, 4)
	if got := len(n.w.Host.Shared.Keys("sluice::s:")); got != 1 {
		t.Errorf("%d entries, want 1", got)
	}
}

// panicHost panics in the data path.
type panicHost struct {
	*filtertest.Host
	armed *bool
}

func (p panicHost) GetProperty(path string) ([]byte, abi.Status) {
	if *p.armed {
		panic("boom")
	}
	return p.Host.GetProperty(path)
}

func TestPanicInDataPathRecovered(t *testing.T) {
	for _, c := range []struct {
		mode   string
		status int
	}{{"open", 200}, {"closed", 503}} {
		t.Run(c.mode, func(t *testing.T) {
			h := filtertest.NewHost()
			h.Now_ = t0
			armed := false
			vm := filter.NewVM(panicHost{h, &armed})
			w := filtertest.NewWorker(h, vm)
			if !w.Start(`{"rules":[{"name":"p","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}],"failure_mode":"` + c.mode + `"}`) {
				t.Fatal(h.Logs)
			}
			armed = true
			if r := w.Do(req("10.0.0.1:1")); r.Status != c.status {
				t.Errorf("status %d, want %d", r.Status, c.status)
			}
			if v, _ := h.Metrics.Get(filter.ErrorsMetric); v != 1 {
				t.Errorf("errors metric %d", v)
			}
			if len(h.Logs) == 0 || !strings.Contains(h.Logs[len(h.Logs)-1].Msg, "boom") {
				t.Errorf("logs %v", h.Logs)
			}
		})
	}
}

// Some hosts return OK and an empty value for a missing header.
func TestMissingHeaderAsEmptyValue(t *testing.T) {
	n := startNative(t, `{"rules":[{"name":"k","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`, t0)
	n.w.Host.MissingHeaderOK = true
	for i := 0; i < 3; i++ {
		if r := n.do(req("10.0.0.1:1")); r.Status != 200 || r.Has("ratelimit") {
			t.Fatalf("%d %v", r.Status, r.Headers)
		}
	}
}

func TestNoSourceAddressRuleDoesNotApply(t *testing.T) {
	n := startNative(t, perIPConfig, t0)
	for i := 0; i < 5; i++ {
		if r := n.do(filtertest.Request{}); r.Status != 200 || r.Has("ratelimit") {
			t.Fatalf("%d %v", r.Status, r.Headers)
		}
	}
}

// Stream contexts are released by proxy_on_done, proxy_on_log or
// proxy_on_delete, whichever comes first (sluice.wasm does not export
// proxy_on_log; the proxytest emulator sends no stream's proxy_on_done), and
// deleting a root context drops its plugin.
func TestContextsReleased(t *testing.T) {
	h := filtertest.NewHost()
	h.Now_ = t0
	vm := filter.NewVM(h)
	w := filtertest.NewWorker(h, vm)
	if !w.Start(perIPConfig) {
		t.Fatal(h.Logs)
	}
	h.Properties = map[string]string{"source\x00address": "10.0.0.1:1"}
	for id := uint32(100); id < 115; id++ {
		vm.OnContextCreate(id, 1)
		vm.OnRequestHeaders(id, 0, true)
	}
	if vm.Streams() != 15 {
		t.Fatalf("%d streams", vm.Streams())
	}
	for id := uint32(100); id < 105; id++ {
		vm.OnDelete(id) // no access log
	}
	for id := uint32(105); id < 110; id++ {
		vm.OnLog(id) // the proxytest emulator's build
		vm.OnDone(id)
		vm.OnDelete(id)
	}
	for id := uint32(110); id < 115; id++ {
		if !vm.OnDone(id) { // sluice.wasm in Envoy: no proxy_on_log
			t.Errorf("stream %d: proxy_on_done answered false", id)
		}
		if n := vm.Streams(); n != 114-int(id) {
			t.Errorf("after proxy_on_done of %d: %d streams, want %d", id, n, 114-id)
		}
		vm.OnDelete(id)
	}
	if vm.Streams() != 0 {
		t.Errorf("%d streams left", vm.Streams())
	}
	// Callbacks for unknown or released contexts are harmless.
	if vm.OnRequestHeaders(999, 0, true) != abi.ActionContinue || vm.OnResponseHeaders(100, 0, true) != abi.ActionContinue {
		t.Error("unknown context not continued")
	}
	vm.OnContextCreate(200, 77) // unknown root
	vm.OnDelete(1)              // the root context
	vm.OnContextCreate(201, 1)  // its streams are not created any more
	if vm.OnRequestHeaders(201, 0, true) != abi.ActionContinue || vm.Streams() != 0 {
		t.Error("stream of a deleted root context")
	}
}

// Workers sharing shared data agree on one secret hash seed; separate
// processes (separate shared data) get different ones.
func TestSharedSeed(t *testing.T) {
	wa, wb := twoWorkers(t, perIPConfig)
	v, _, ok := wa.Host.Shared.Get(filter.SeedKey)
	if !ok || len(v) != 8 {
		t.Fatalf("seed %x %v", v, ok)
	}
	wc, _ := twoWorkers(t, perIPConfig)
	w, _, _ := wc.Host.Shared.Get(filter.SeedKey)
	if string(v) == string(w) {
		t.Errorf("two processes got the same seed %x", v)
	}
	// The two workers of one process limit one client together.
	for i, w := range []*filtertest.Worker{wa, wb, wa} {
		if r := w.Do(req("10.0.0.1:1")); r.Status != 200 {
			t.Fatalf("request %d: %d", i+1, r.Status)
		}
	}
	if r := wb.Do(req("10.0.0.1:1")); r.Status != 429 {
		t.Errorf("4th request across workers: %d", r.Status)
	}
}

// A host refusing the local response must not leave the request paused.
type refusingHost struct{ *filtertest.Host }

func (refusingHost) SendLocalResponse(int, string, []byte, []abi.Header, int32) abi.Status {
	return abi.StatusInternalFailure
}

func TestLocalResponseRefusedContinues(t *testing.T) {
	h := filtertest.NewHost()
	h.Now_ = t0
	vm := filter.NewVM(refusingHost{h})
	w := filtertest.NewWorker(h, vm)
	if !w.Start(`{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`) {
		t.Fatal(h.Logs)
	}
	w.Do(req("10.0.0.1:1"))
	r := w.Do(req("10.0.0.1:1"))
	if r.Action != abi.ActionContinue {
		t.Errorf("action %v after a refused local response", r.Action)
	}
	if v, _ := h.Metrics.Get(filter.ErrorsMetric); v != 1 {
		t.Errorf("errors metric %d", v)
	}
}

// metricCallHost records every IncrementMetric call.
type metricCallHost struct {
	*filtertest.Host
	calls *[][2]int64 // id, delta
}

func (m metricCallHost) DefineMetric(t abi.MetricType, name string) (uint32, abi.Status) {
	id, st := m.Host.DefineMetric(t, name)
	if name == filter.GCCyclesMetric {
		*m.calls = append(*m.calls, [2]int64{-1, int64(id)}) // remember the counter's id
	}
	return id, st
}

func (m metricCallHost) IncrementMetric(id uint32, delta int64) abi.Status {
	*m.calls = append(*m.calls, [2]int64{int64(id), delta})
	return m.Host.IncrementMetric(id, delta)
}

// Envoy refuses a counter increment ≤ 0 (BadArgument): the guest never asks for one, though
// it reports its heap every 64 requests whether or not a collection ran.
func TestGCCyclesNeverIncrementedByZero(t *testing.T) {
	h := filtertest.NewHost()
	h.Now_ = t0
	var calls [][2]int64
	w := filtertest.NewWorker(h, filter.NewVM(metricCallHost{h, &calls}))
	if !w.Start(`{"rules":[{"name":"p","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1000000,"window":"1h"}]}`) {
		t.Fatal(h.Logs)
	}
	for i := 0; i < 64*5; i++ {
		w.Do(req("10.0.0.1:1"))
	}
	gcID := int64(-2)
	reports := 0
	for _, c := range calls {
		switch {
		case c[0] == -1:
			gcID = c[1]
		case c[0] == gcID:
			reports++
			if c[1] <= 0 {
				t.Errorf("%s incremented by %d", filter.GCCyclesMetric, c[1])
			}
		}
	}
	if gcID == -2 {
		t.Fatalf("%s never defined; calls %v", filter.GCCyclesMetric, calls)
	}
	t.Logf("%d increments of %s in %d requests", reports, filter.GCCyclesMetric, 64*5)
}
