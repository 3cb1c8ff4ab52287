package dynmod

import (
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/proxywasm"
)

// fakeEnvoy is Envoy as the shell sees it, in Go: streams with request headers, the
// responses and headers the shell gives them, metrics, and schedulers whose events the
// test delivers.
type fakeEnvoy struct {
	mu      sync.Mutex
	workers int
	logs    []string
	streams map[filterPtr]*fakeStream
	metrics map[string]int64
	names   []string // by envoy metric id
	kinds   []metricKind
	scheds  map[schedPtr]filterPtr
	events  []schedPtr // committed, undelivered
}

type fakeStream struct {
	worker    int
	req       [][2]string
	resp      [][2]string
	body      []byte
	local     *fakeLocal
	continued int
	metadata  map[string]string // NAMESPACE.FIELD → value
}

type fakeLocal struct {
	status  int
	headers [][2]string
	body    string
	details string
}

func newFakeEnvoy(workers int) *fakeEnvoy {
	return &fakeEnvoy{workers: workers, streams: map[filterPtr]*fakeStream{}, metrics: map[string]int64{}, scheds: map[schedPtr]filterPtr{}}
}

func (e *fakeEnvoy) stream(worker int, hdrs ...string) filterPtr {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := &fakeStream{worker: worker}
	for i := 0; i+1 < len(hdrs); i += 2 {
		s.req = append(s.req, [2]string{hdrs[i], hdrs[i+1]})
	}
	f := filterPtr(unsafe.Pointer(s))
	e.streams[f] = s
	return f
}

func (e *fakeEnvoy) log(level abi.LogLevel, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.logs = append(e.logs, msg)
}

func (e *fakeEnvoy) get(f filterPtr, k headerKind) [][2]string {
	s := e.streams[f]
	if k == requestHeaders {
		return s.req
	}
	return s.resp
}

func (e *fakeEnvoy) header(f filterPtr, k headerKind, name string, dst []byte) ([]byte, bool) {
	for _, kv := range e.get(f, k) {
		if kv[0] == name {
			return append(dst, kv[1]...), true
		}
	}
	return dst, false
}

func (e *fakeEnvoy) headerPairs(f filterPtr, k headerKind, dst []byte) ([]byte, bool) {
	return proxywasm.AppendPairs(dst, e.get(f, k)), true
}

func (e *fakeEnvoy) setMetadata(f filterPtr, packed []byte, n int) {
	s := e.streams[f]
	if s.metadata == nil {
		s.metadata = map[string]string{}
	}
	unpackHeaders(packed, n, func(name, value []byte) { s.metadata[string(name)] = string(value) })
}

func (e *fakeEnvoy) addHeader(f filterPtr, k headerKind, name string, value []byte) bool {
	s := e.streams[f]
	s.resp = append(s.resp, [2]string{name, string(value)})
	return true
}

func (e *fakeEnvoy) sendResponse(f filterPtr, status int, packed []byte, n int, body []byte, details string) {
	l := &fakeLocal{status: status, body: string(body), details: details}
	unpackHeaders(packed, n, func(name, value []byte) {
		l.headers = append(l.headers, [2]string{string(name), string(value)})
	})
	e.streams[f].local = l
}

// fakePrepared is the C stream record's prepared headers.
type fakePrepared [][2]string

func (p *fakePrepared) set(packed []byte, n int) {
	unpackHeaders(packed, n, func(name, value []byte) {
		*p = append(*p, [2]string{string(name), string(value)})
	})
}

func (e *fakeEnvoy) continueDecoding(f filterPtr) { e.streams[f].continued++ }

func (e *fakeEnvoy) attribute(f filterPtr, id attribute, dst []byte) ([]byte, bool) {
	if id == attrSourceAddress {
		return append(dst, "10.0.0.1:5555"...), true
	}
	return dst, false
}

func (e *fakeEnvoy) body(f filterPtr, response bool, dst []byte) ([]byte, bool) {
	return append(dst, e.streams[f].body...), true
}

func (e *fakeEnvoy) workerIndex(f filterPtr) int { return e.streams[f].worker }
func (e *fakeEnvoy) concurrency() int            { return e.workers }

func (e *fakeEnvoy) defineMetric(c configPtr, k metricKind, name string) (uint64, bool) {
	e.names = append(e.names, name)
	e.kinds = append(e.kinds, k)
	return uint64(len(e.names) - 1), true
}

func (e *fakeEnvoy) addMetric(c configPtr, f filterPtr, k metricKind, id uint64, delta int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if id >= uint64(len(e.names)) || e.kinds[id] != k {
		return false
	}
	e.metrics[e.names[id]] += delta
	return true
}

func (e *fakeEnvoy) newScheduler(f filterPtr) schedPtr {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := schedPtr(unsafe.Pointer(new(int)))
	e.scheds[p] = f
	return p
}

func (e *fakeEnvoy) commit(s schedPtr, event uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, s)
}

func (e *fakeEnvoy) deleteScheduler(s schedPtr) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.scheds, s)
}

// req runs one request through the shell as the C side does: request headers, then, unless
// Go ended the stream, the response headers and the stream's end.
type result struct {
	status  int // 200 when forwarded
	headers map[string]string
	paused  bool
	w       *worker
	id      uint32
	f       filterPtr
}

func req(t *testing.T, e *fakeEnvoy, c *filterConfig, worker int, hdrs ...string) result {
	t.Helper()
	f := e.stream(worker, hdrs...)
	var prepared fakePrepared
	w, id, act, ended := c.requestHeaders(f, true, &prepared)
	r := result{w: w, id: id, f: f, headers: map[string]string{}}
	s := e.streams[f]
	if act == abi.ActionPause && s.local == nil {
		r.paused = true
		return r
	}
	if s.local != nil {
		r.status = s.local.status
		for _, h := range s.local.headers {
			r.headers[h[0]] = h[1]
		}
	} else {
		r.status = 200
	}
	if ended {
		for _, h := range prepared {
			r.headers[h[0]] = h[1]
		}
		return r
	}
	w.responseHeaders(id, f, true)
	for _, h := range s.resp {
		r.headers[h[0]] = h[1]
	}
	w.destroy(id, f)
	return r
}

func newTestConfig(t *testing.T, e *fakeEnvoy, json string) (*module, *filterConfig) {
	t.Helper()
	m := newModule(e)
	idx, err := m.newConfig(nil, "sluice", []byte(json))
	if err != nil {
		t.Fatalf("newConfig: %v\nlogs: %s", err, strings.Join(e.logs, "\n"))
	}
	return m, m.config(idx)
}

func TestSharedAcrossWorkers(t *testing.T) {
	e := newFakeEnvoy(4)
	_, c := newTestConfig(t, e, `{"rules":[{"name":"per-key","key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":5,"window":"1m"}]}`)
	ok, denied := 0, 0
	for i := 0; i < 40; i++ {
		r := req(t, e, c, i%4, "x-key", "a")
		switch r.status {
		case 200:
			ok++
			if r.headers["x-ratelimit-limit"] == "" && r.headers["ratelimit-limit"] == "" && len(r.headers) == 0 {
				t.Fatalf("admitted request %d got no rate-limit headers", i)
			}
		case 429:
			denied++
			if r.headers["retry-after"] == "" {
				t.Fatalf("denial without retry-after: %v", r.headers)
			}
		default:
			t.Fatalf("status %d", r.status)
		}
	}
	if ok != 5 || denied != 35 {
		t.Fatalf("admitted %d, denied %d; want 5 and 35 across 4 workers", ok, denied)
	}
	if r := req(t, e, c, 1, "x-key", "b"); r.status != 200 {
		t.Fatalf("another key: %d", r.status)
	}
	if e.metrics["sluice.per-key.denied"] != 35 {
		t.Fatalf("metrics: %v", e.metrics)
	}
	for _, w := range c.workers {
		if n := w.vm.Streams(); n != 0 || len(w.live) != 0 {
			t.Fatalf("streams left: vm %d, shell %d", n, len(w.live))
		}
	}
}

func TestBadConfigurationRefused(t *testing.T) {
	for _, tc := range []struct{ json, want string }{
		{`{"rules":[{"name":"x","key":[{"header":"k"}],"algorithm":"token_bucket","limit":-1,"window":"1m"}]}`, "rules[0].limit"},
		{`{"rules":[{"name":"x","key":[{"header":"k"}],"algorithm":"token_bucket","limit":1,"window":"1m","backend":"rls"}],"rls":{"grpc_service":"rls"}}`, `"rls" needs sluice.wasm`},
		{`{"rules":[{"name":"x","key":[{"header":"k"}],"algorithm":"token_bucket","limit":1,"window":"1m","backend":"redis"}]}`, `"redis" needs sluice-redis.wasm`},
		{`true`, "not an object"},
	} {
		e := newFakeEnvoy(2)
		m := newModule(e)
		if _, err := m.newConfig(nil, "sluice", []byte(tc.json)); err == nil {
			t.Fatalf("%s: accepted", tc.json)
		}
		if logs := strings.Join(e.logs, "\n"); !strings.Contains(logs, tc.want) {
			t.Fatalf("%s: logs %q lack %q", tc.json, logs, tc.want)
		}
	}
}

// A held request (delay.max) pauses; the tick reaches the VM through the paused stream's
// scheduler, and the request goes on once its slot comes.
func TestHeldRequestResumedByTick(t *testing.T) {
	e := newFakeEnvoy(1)
	m, c := newTestConfig(t, e, `{"rules":[{"name":"shape","key":[{"header":"x-key"}],"algorithm":"leaky_bucket","limit":1,"window":"1s","delay":{"max":"5s"}}]}`)
	now := time.Unix(1_700_000_000, 0).UnixNano()
	m.now = func() int64 { return now }
	if r := req(t, e, c, 0, "x-key", "a"); r.status != 200 {
		t.Fatalf("first: %d", r.status)
	}
	r := req(t, e, c, 0, "x-key", "a")
	if !r.paused {
		t.Fatalf("second request not held: %d %v", r.status, r.headers)
	}
	w := r.w
	w.mu.Lock()
	tick := w.tickMS
	w.mu.Unlock()
	if tick == 0 || len(w.paused) != 1 {
		t.Fatalf("tick %d ms, paused %d", tick, len(w.paused))
	}
	// The timer fires (called here instead of waiting): the tick is committed on the held
	// stream's scheduler; delivered before the slot, it releases nothing.
	w.fire()
	if len(e.events) != 1 {
		t.Fatalf("events %d", len(e.events))
	}
	deliver := func() {
		s := e.events[0]
		e.events = e.events[1:]
		w.scheduled(r.id, e.scheds[s], tickEvent)
	}
	deliver()
	if e.streams[r.f].continued != 0 {
		t.Fatal("released before its slot")
	}
	now += int64(time.Second)
	w.fire()
	deliver()
	if e.streams[r.f].continued != 1 {
		t.Fatalf("not released after its slot: continued %d, local %+v", e.streams[r.f].continued, e.streams[r.f].local)
	}
	w.responseHeaders(r.id, r.f, true)
	w.destroy(r.id, r.f)
	if len(e.scheds) != 0 || len(w.live) != 0 || w.vm.Streams() != 0 {
		t.Fatalf("left: schedulers %d, live %d, vm %d", len(e.scheds), len(w.live), w.vm.Streams())
	}
	found := false
	for _, kv := range e.streams[r.f].resp {
		found = found || kv[0] == "sluice-delay-ms"
	}
	if !found {
		t.Fatalf("held response without its delay header: %v", e.streams[r.f].resp)
	}
}

// A held stream that ends (client reset) before its tick arrives takes its tick with it; the
// next paused stream carries the next one.
func TestHeldStreamDestroyed(t *testing.T) {
	e := newFakeEnvoy(1)
	m, c := newTestConfig(t, e, `{"rules":[{"name":"shape","key":[{"header":"x-key"}],"algorithm":"leaky_bucket","limit":1,"window":"1s","delay":{"max":"5s"}}]}`)
	now := time.Unix(1_700_000_000, 0).UnixNano()
	m.now = func() int64 { return now }
	req(t, e, c, 0, "x-key", "a")
	r1 := req(t, e, c, 0, "x-key", "a")
	r2 := req(t, e, c, 0, "x-key", "b")
	r3 := req(t, e, c, 0, "x-key", "a")
	if !r1.paused || r2.paused || !r3.paused {
		t.Fatalf("paused: %v %v %v", r1.paused, r2.paused, r3.paused)
	}
	w := r1.w
	w.fire()
	if w.pending == 0 {
		t.Fatal("no tick committed")
	}
	victim := r1
	if w.pending == r3.id {
		victim = r3
	}
	w.destroy(victim.id, victim.f)
	if w.pending != 0 {
		t.Fatal("the destroyed stream's tick is still pending")
	}
	w.fire()
	if w.pending == 0 || w.pending == victim.id {
		t.Fatalf("pending %d after the destroy", w.pending)
	}
}

func TestProcsAndConfigSlots(t *testing.T) {
	e := newFakeEnvoy(3)
	const one = `{"rules":[{"name":"r","key":[{"header":"k"}],"algorithm":"fixed_window","limit":1,"window":"1s"}]}`
	m, c := newTestConfig(t, e, one)
	if m.procs != 5 || len(c.workers) != 3 {
		t.Fatalf("procs %d, workers %d", m.procs, len(c.workers))
	}
	idx, err := m.newConfig(nil, "other", []byte(one))
	if err != nil || idx != 2 {
		t.Fatalf("second config: %d %v", idx, err)
	}
	m.destroyConfig(1)
	if m.config(1) != nil || m.config(2) == nil {
		t.Fatal("destroy")
	}
	if idx, _ := m.newConfig(nil, "third", []byte(one)); idx != 1 {
		t.Fatalf("slot not reused: %d", idx)
	}
}

// Four workers on four goroutines, as Envoy's worker threads call the module, race on one
// key: exactly the limit is admitted (the shared map's compare-and-swap), and the race
// detector (make test runs this package with -race) sees no unguarded state.
func TestConcurrentWorkers(t *testing.T) {
	e := newFakeEnvoy(4)
	_, c := newTestConfig(t, e, `{"rules":[{"name":"one","key":[{"header":"x-key"}],"algorithm":"sliding_log","limit":100,"window":"1h"}]}`)
	var streams [4][]filterPtr
	for w := range streams {
		for i := 0; i < 500; i++ {
			streams[w] = append(streams[w], e.stream(w, "x-key", "k"))
		}
	}
	var admitted, denied [4]int
	var wg sync.WaitGroup
	for w := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, f := range streams[w] {
				var p fakePrepared
				wk, id, act, ended := c.requestHeaders(f, true, &p)
				if !ended {
					wk.destroy(id, f)
				}
				if act == abi.ActionContinue {
					admitted[w]++
				} else {
					denied[w]++
				}
			}
		}()
	}
	wg.Wait()
	sum := 0
	for w := range admitted {
		sum += admitted[w]
	}
	if sum != 100 {
		t.Fatalf("admitted %d of 2,000 (per worker %v), want exactly 100", sum, admitted)
	}
}

// An admitted request and a denied one allocate nothing in the shell or the filter (the
// fake Envoy's own bookkeeping aside: its streams are made before the count).
func TestNoAllocsPerRequest(t *testing.T) {
	e := newFakeEnvoy(2)
	_, c := newTestConfig(t, e, `{"rules":[{"name":"tb","key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":1000000,"window":"1s"}],"response":{"headers":"both"}}`)
	keys := []string{"a", "b", "c", "d"}
	var fs []filterPtr
	for i := 0; i < 400; i++ {
		fs = append(fs, e.stream(i%2, "x-key", keys[i%4]))
	}
	var p fakePrepared
	n := 0
	allocs := testing.AllocsPerRun(300, func() {
		p = p[:0]
		c.requestHeaders(fs[n%len(fs)], true, nopPrepared{})
		n++
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per admitted request", allocs)
	}
}

type nopPrepared struct{}

func (nopPrepared) set([]byte, int) {}

// The log line of a recovered panic names the function that panicked, not the deferred
// recover that caught it (recoverHook in the exports).
func TestPanicSite(t *testing.T) {
	var site string
	func() {
		defer func() {
			if r := recover(); r != nil {
				site = panicSite(debug.Stack())
			}
		}()
		panicsHere()
	}()
	if !strings.Contains(site, "dynmod.panicsHere ") || !strings.Contains(site, "module_test.go:") {
		t.Fatalf("panicSite = %q, want dynmod.panicsHere and its file", site)
	}
	if got := panicSite([]byte("goroutine 1 [running]:\nmain.f()\n\t/x.go:1 +0x1\n")); got != "unknown" {
		t.Fatalf("a stack without a panic: %q", got)
	}
}

func panicsHere() { panic("here") }
