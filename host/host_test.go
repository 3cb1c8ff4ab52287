package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func header(kv [][2]string, name string) (string, bool) {
	m := headerMap{kv: kv}
	return m.get(name)
}

func mustExchange(t *testing.T, h *Host, req *Request, up Upstream) *Response {
	t.Helper()
	resp, err := h.Exchange(testCtx(t), req, up)
	if err != nil {
		t.Fatalf("Exchange %s: %v", req.Path, err)
	}
	return resp
}

func TestRefusesModuleWithoutABIVersion(t *testing.T) {
	_, err := New(context.Background(), Options{Wasm: guest(t, "noabi"), Workers: 1})
	if err == nil || !strings.Contains(err.Error(), "proxy_abi_version_0_2_1") {
		t.Fatalf("New = %v, want an error naming proxy_abi_version_0_2_1", err)
	}
}

func TestRefusesWhenConfigureReturnsFalse(t *testing.T) {
	logs := &logBuffer{}
	opts := Options{Wasm: guest(t, "badconfig"), Workers: 2, PluginConfig: []byte("10x")}
	opts.Logger = newTestLogger(logs)
	_, err := New(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "proxy_on_configure returned false") {
		t.Fatalf("New = %v, want a proxy_on_configure error", err)
	}
	if !strings.Contains(logs.String(), `rules[0].window: \"10x\" is not a duration`) {
		t.Errorf("the guest's reason is not in the log:\n%s", logs)
	}
	// The same module with a configuration it accepts starts.
	h, _ := newHost(t, "badconfig", Options{PluginConfig: []byte("ok")})
	if h.ABIVersion() != "0.2.1" {
		t.Errorf("ABIVersion = %q", h.ABIVersion())
	}
}

func TestRefusesGarbage(t *testing.T) {
	if _, err := New(context.Background(), Options{Wasm: []byte("not wasm")}); err == nil {
		t.Fatal("New accepted bytes that are not wasm")
	}
	if _, err := New(context.Background(), Options{}); err == nil {
		t.Fatal("New accepted an empty module")
	}
}

func TestRequestHeaderMutations(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{})
	var seen *Request
	resp := mustExchange(t, h, &Request{
		Path: "/echo-headers?q=1", Authority: "example.test",
		Headers: [][2]string{{"X-Replace", "a"}, {"x-replace", "b"}, {"x-remove", "1"}, {"X-Remove", "2"}, {"X-Mixed-Case", "mc"}},
	}, func(r *Request) *Response {
		seen = r
		return &Response{Status: 200, Headers: [][2]string{{"Content-Type", "text/plain"}}, Body: []byte("hi")}
	})
	if seen == nil {
		t.Fatal("upstream not called")
	}
	want := map[string]string{
		"x-replace":         "replaced",
		"x-added":           "1",
		"x-mixed-seen":      "mc/0", // lookup is case-insensitive
		"x-absent-status":   "1",    // NOT_FOUND
		"x-resp-map-status": "2",    // BAD_ARGUMENT: no response headers in the request phase
	}
	for k, v := range want {
		if got, _ := header(seen.Headers, k); got != v {
			t.Errorf("upstream header %s = %q, want %q (all: %v)", k, got, v, seen.Headers)
		}
	}
	n := 0
	for _, p := range seen.Headers {
		if p[0] == "x-replace" {
			n++
		}
		if p[0] == "x-remove" {
			t.Errorf("x-remove still present: %v", seen.Headers)
		}
	}
	if n != 1 {
		t.Errorf("replace left %d x-replace headers", n)
	}
	if seen.Path != "/echo-headers?q=1" || seen.Authority != "example.test" || seen.Method != "GET" {
		t.Errorf("upstream request = %+v", seen)
	}
	if resp.Status != 200 || string(resp.Body) != "hi" || resp.Local {
		t.Errorf("response = %+v", resp)
	}
	if resp.Header("x-kitchen-response") == "" || resp.Header("x-response-code") != "200" || resp.Header("content-type") != "text/plain" {
		t.Errorf("response headers = %v", resp.Headers)
	}
}

func TestSetHeaderMapPairs(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{})
	var seen *Request
	mustExchange(t, h, &Request{Path: "/set-pairs", Headers: [][2]string{{"x-keep", "k"}, {"x-drop", "d"}}}, func(r *Request) *Response {
		seen = r
		return nil
	})
	if v, _ := header(seen.Headers, "x-keep"); v != "k" {
		t.Errorf("x-keep = %q", v)
	}
	if _, ok := header(seen.Headers, "x-drop"); ok {
		t.Errorf("x-drop survived set_pairs: %v", seen.Headers)
	}
	// 4 pseudo-headers + 2 regular ones were serialized to the guest.
	if v, _ := header(seen.Headers, "x-set-pairs"); v != "6" {
		t.Errorf("guest saw %s pairs, want 6", v)
	}
}

func TestLocalResponse(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{})
	called := false
	resp := mustExchange(t, h, &Request{Path: "/local"}, func(r *Request) *Response { called = true; return nil })
	if called {
		t.Error("upstream called after a local response")
	}
	if resp.Status != 403 || string(resp.Body) != "nope\n" || !resp.Local || resp.Details != "denied_by_kitchen" {
		t.Errorf("response = %+v", resp)
	}
	if resp.Header("x-local") != "yes" || resp.Header("content-type") != "text/plain" {
		t.Errorf("headers = %v", resp.Headers)
	}
	// As in Envoy, the local reply passes the filter's response phase.
	if resp.Header("x-kitchen-response") == "" || resp.Header("x-response-code") != "403" {
		t.Errorf("proxy_on_response_headers did not see the local reply: %v", resp.Headers)
	}
}

func TestLocalResponseInResponsePhase(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{})
	resp := mustExchange(t, h, &Request{Path: "/resp-local"}, func(r *Request) *Response {
		return &Response{Status: 200, Body: []byte("upstream body")}
	})
	if resp.Status != 418 || string(resp.Body) != "teapot\n" || !resp.Local {
		t.Errorf("response = %+v", resp)
	}
}

func TestResponseStatusRewrite(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{})
	resp := mustExchange(t, h, &Request{Path: "/resp-status"}, nil)
	if resp.Status != 201 {
		t.Errorf("status = %d, want 201", resp.Status)
	}
}

func TestProperties(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{VMID: "vm1", RootID: "root1", PluginName: "plug"})
	resp := mustExchange(t, h, &Request{
		Method: "POST", Path: "/props?x=y", Authority: "api.example", Scheme: "https",
		Headers:    [][2]string{{"a", "1"}, {"b", "2"}},
		RemoteAddr: "10.1.2.3:4567", LocalAddr: "127.0.0.1:8080",
	}, nil)
	want := []string{
		"source.address=10.1.2.3:4567;0",
		"destination.address=127.0.0.1:8080;0",
		"request.path=/props?x=y;0",
		"request.url_path=/props;0",
		"request.method=POST;0",
		"request.host=api.example;0",
		"request.scheme=https;0",
		"plugin_name=plug;0",
		"plugin_root_id=root1;0",
		"plugin_vm_id=vm1;0",
		"no.such=;1",
		"response.code=;1",
		"source.port=4567",
		"request.headers=6",
	}
	got := string(resp.Body)
	for _, w := range want {
		if !strings.Contains(got, w+"\n") {
			t.Errorf("missing %q in\n%s", w, got)
		}
	}
}

func TestTimeAndLogLevel(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{})
	before := time.Now().UnixNano()
	resp := mustExchange(t, h, &Request{Path: "/time"}, nil)
	after := time.Now().UnixNano()
	f := strings.Fields(string(resp.Body))
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || ns < before || ns > after {
		t.Errorf("time %q not in [%d, %d]", resp.Body, before, after)
	}
	if f[1] != "2" {
		t.Errorf("log level = %s, want 2 (info)", f[1])
	}
	h2, _ := newHost(t, "kitchen", Options{LogLevel: -4})
	resp = mustExchange(t, h2, &Request{Path: "/time"}, nil)
	if f := strings.Fields(string(resp.Body)); f[1] != "1" {
		t.Errorf("log level = %s, want 1 (debug)", f[1])
	}
}

func TestGuestLogLevels(t *testing.T) {
	h, logs := newHost(t, "kitchen", Options{LogLevel: 4}) // warn
	mustExchange(t, h, &Request{Path: "/log-levels"}, nil)
	for l := 0; l <= 5; l++ {
		n := logs.count(fmt.Sprintf("msg=\"level %d\"", l))
		if want := b2i(l >= 3); n != want {
			t.Errorf("level %d logged %d times, want %d", l, n, want)
		}
	}
	if !strings.Contains(logs.String(), `level=ERROR+4 msg="level 5"`) {
		t.Errorf("critical not mapped to ERROR+4:\n%s", logs)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestUnimplementedHostCall(t *testing.T) {
	h, logs := newHost(t, "kitchen", Options{Workers: 2})
	for i := 0; i < 3; i++ {
		resp := mustExchange(t, h, &Request{Path: "/unimpl"}, nil)
		if string(resp.Body) != "status=12" {
			t.Fatalf("body = %q, want status=12", resp.Body)
		}
	}
	if n := logs.count("proxy_register_shared_queue"); n != 1 {
		t.Errorf("unimplemented call logged %d times, want once:\n%s", n, logs)
	}
}

func TestBodies(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{})
	var seen string
	resp := mustExchange(t, h, &Request{Method: "POST", Path: "/body", Body: []byte("hello")}, func(r *Request) *Response {
		seen = string(r.Body)
		return &Response{Status: 200, Body: []byte("abc")}
	})
	if seen != "HELLO" {
		t.Errorf("upstream body = %q, want HELLO", seen)
	}
	if string(resp.Body) != "[abc]" {
		t.Errorf("response body = %q, want [abc]", resp.Body)
	}
	// Other paths leave bodies alone.
	resp = mustExchange(t, h, &Request{Method: "POST", Path: "/other", Body: []byte("x")}, func(r *Request) *Response {
		seen = string(r.Body)
		return &Response{Body: []byte("y")}
	})
	if seen != "x" || string(resp.Body) != "y" {
		t.Errorf("bodies changed: %q %q", seen, resp.Body)
	}
}

func TestMetrics(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 2})
	resp := mustExchange(t, h, &Request{Path: "/metrics"}, nil)
	if string(resp.Body) != "gauge=3;negcounter=2;histget=2" {
		t.Errorf("body = %q", resp.Body)
	}
	for i := 0; i < 9; i++ {
		mustExchange(t, h, &Request{Path: "/x"}, nil)
	}
	m, ok := h.Metric("kitchen_requests_total")
	if !ok || m.Value != 10 || m.Type != MetricCounter {
		t.Errorf("kitchen_requests_total = %+v, %v", m, ok)
	}
	// Every stream got on_log and on_delete before Exchange returned.
	for _, name := range []string{"kitchen_logs_total", "kitchen_deletes_total"} {
		if m, _ := h.Metric(name); m.Value != 10 {
			t.Errorf("%s = %d, want 10", name, m.Value)
		}
	}
	var b strings.Builder
	h.Snapshot().WritePrometheus(&b)
	out := b.String()
	for _, want := range []string{
		"# TYPE kitchen_requests_total counter\nkitchen_requests_total 10\n",
		"# TYPE kitchen_gauge gauge\nkitchen_gauge 3\n",
		"# TYPE kitchen_latency_ms histogram\n",
		`kitchen_latency_ms_bucket{le="5"} 0`,
		`kitchen_latency_ms_bucket{le="10"} 1`,
		`kitchen_latency_ms_bucket{le="1000"} 2`,
		`kitchen_latency_ms_bucket{le="+Inf"} 2`,
		"kitchen_latency_ms_sum 707\n",
		"kitchen_latency_ms_count 2\n",
		`kitchen_labelled_total{rule="a b"} 2`,
		"sluice_host_requests_total 10\n",
		"sluice_host_vm_restarts_total 0\n",
		`sluice_host_worker_memory_bytes{worker="1"} `,
		"sluice_host_workers 2\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics lack %q:\n%s", want, out)
		}
	}
}

func TestTickResumesPausedRequest(t *testing.T) {
	// A long period: only h.Tick fires it.
	h, _ := newHost(t, "kitchen", Options{Workers: 1, PluginConfig: []byte("tick=3600000")})
	ctx := testCtx(t)
	type result struct {
		resp *Response
		req  *Request
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var seen *Request
		resp, err := h.Exchange(ctx, &Request{Path: "/pause-tick"}, func(r *Request) *Response { seen = r; return nil })
		done <- result{resp, seen, err}
	}()
	var r result
	for got := false; !got; {
		if err := h.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r = <-done:
			got = true
		case <-time.After(10 * time.Millisecond):
		}
	}
	if r.err != nil || r.req == nil {
		t.Fatalf("paused request: %+v", r)
	}
	if v, _ := header(r.req.Headers, "x-resumed-by"); v != "tick" {
		t.Errorf("x-resumed-by = %q", v)
	}
	if m, _ := h.Metric("kitchen_ticks_total"); m.Value < 1 {
		t.Errorf("ticks = %d", m.Value)
	}
}

func TestTickTimer(t *testing.T) {
	c := newFakeClock()
	h, _ := newHost(t, "kitchen", Options{Workers: 2, PluginConfig: []byte("tick=5"), Clock: c})
	// The timer resumes the request once the test steps the host's clock past the tick
	// period, after the request has paused; the test waits for that event, bounded by its
	// context.
	go func() {
		if poll(func() bool { m, _ := h.Metric("kitchen_requests_total"); return m.Value == 1 }) {
			c.Advance(5 * time.Millisecond)
		}
	}()
	resp, err := h.Exchange(testCtx(t), &Request{Path: "/pause-tick"}, func(r *Request) *Response {
		v, _ := header(r.Headers, "x-resumed-by")
		return &Response{Status: 200, Body: []byte(v)}
	})
	if err != nil || string(resp.Body) != "tick" {
		t.Fatalf("resp = %+v, %v", resp, err)
	}
}

func TestPausedRequestCancelled(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1, PluginConfig: []byte("tick=3600000")})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := h.Exchange(ctx, &Request{Path: "/pause-tick"}, nil)
		errc <- err
	}()
	// Wait until the request is paused on the worker: its on_request_headers has run.
	waitFor(t, func() bool { m, _ := h.Metric("kitchen_requests_total"); return m.Value == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Exchange = %v, want context.Canceled", err)
	}
	// The aborted stream still gets log/done/delete (FIFO on the single worker).
	mustExchange(t, h, &Request{Path: "/x"}, nil)
	if m, _ := h.Metric("kitchen_deletes_total"); m.Value != 2 {
		t.Errorf("deletes = %d, want 2", m.Value)
	}
}

// waitFor polls cond (an event that is bound to happen) for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	if !pollFor(10*time.Second, cond) {
		t.Fatal("condition not reached in 10s")
	}
}

// pollFor reports whether cond holds within d, polling it every millisecond: the one
// polling loop of the host's tests, for events that are bound to happen (never to let time
// pass: the host's time is a clock the tests step).
func pollFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

func TestHTTPCall(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls = append(calls, r.Method+" "+r.URL.String()+" "+r.Header.Get("x-from")+" "+r.Host)
		mu.Unlock()
		w.Header().Set("X-Backend", "1")
		w.WriteHeader(202)
		w.Write([]byte("pong"))
	}))
	defer backend.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	h, _ := newHost(t, "kitchen", Options{Workers: 2, Clusters: map[string]string{"backend": backend.URL, "dead": dead.URL}})

	var seen *Request
	resp := mustExchange(t, h, &Request{Path: "/pause-call"}, func(r *Request) *Response { seen = r; return nil })
	if resp.Status != 200 || seen == nil {
		t.Fatalf("resp = %+v", resp)
	}
	if v, _ := header(seen.Headers, "x-callout-status"); v != "202" {
		t.Errorf("x-callout-status = %q", v)
	}
	if v, _ := header(seen.Headers, "x-callout-body"); v != "pong" {
		t.Errorf("x-callout-body = %q", v)
	}
	mu.Lock()
	if len(calls) != 1 || !strings.HasPrefix(calls[0], "GET /callout?from=") || !strings.HasSuffix(calls[0], " kitchen backend") {
		t.Errorf("backend saw %q", calls)
	}
	mu.Unlock()

	resp = mustExchange(t, h, &Request{Path: "/pause-call-local"}, nil)
	if resp.Status != 429 || string(resp.Body) != "callout said 202: pong" || resp.Details != "from_callout" {
		t.Errorf("local from callout = %+v", resp)
	}
	resp = mustExchange(t, h, &Request{Path: "/pause-call?cluster=nope"}, nil)
	if resp.Status != 502 || string(resp.Body) != "http call refused: 2" {
		t.Errorf("unknown cluster = %d %q", resp.Status, resp.Body)
	}
	resp = mustExchange(t, h, &Request{Path: "/pause-call?cluster=dead"}, nil)
	if resp.Status != 503 || string(resp.Body) != "callout failed" {
		t.Errorf("dead cluster = %d %q", resp.Status, resp.Body)
	}
}

func TestVMConfig(t *testing.T) {
	_, logs := newHost(t, "kitchen", Options{Workers: 1, VMConfig: []byte("vmc")})
	if !strings.Contains(logs.String(), "vm start, vm config: vmc") {
		t.Errorf("VM configuration not seen by the guest:\n%s", logs)
	}
}

func TestConcurrentExchanges(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 4})
	const n = 400
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			want := strconv.Itoa(i)
			resp, err := h.Exchange(context.Background(), &Request{Path: "/echo-headers", Headers: [][2]string{{"x-i", want}}}, func(r *Request) *Response {
				v, _ := header(r.Headers, "x-i")
				return &Response{Body: []byte(v)}
			})
			if err != nil {
				errs <- err
				return
			}
			if string(resp.Body) != want {
				errs <- fmt.Errorf("request %d got body %q", i, resp.Body)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := h.Stats()
	if st.Requests != n {
		t.Errorf("Stats.Requests = %d, want %d", st.Requests, n)
	}
	busy := 0
	for _, w := range st.Workers {
		if w.Requests > 0 {
			busy++
		}
		if w.MemoryBytes == 0 || !w.Healthy {
			t.Errorf("worker %+v", w)
		}
	}
	if busy < 2 {
		t.Errorf("only %d of 4 workers served requests: %+v", busy, st.Workers)
	}
	if m, _ := h.Metric("kitchen_deletes_total"); m.Value != n {
		t.Errorf("deletes = %d", m.Value)
	}
}

func TestClose(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Exchange(context.Background(), &Request{}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Exchange after Close = %v", err)
	}
}

func TestAcceptsABI020(t *testing.T) {
	wasm := guest(t, "minimal")
	old, repl := []byte("proxy_abi_version_0_2_1"), []byte("proxy_abi_version_0_2_0")
	if !bytes.Contains(wasm, old) {
		t.Fatal("minimal guest has no 0_2_1 export name")
	}
	h, err := New(testCtx(t), Options{Wasm: bytes.ReplaceAll(wasm, old, repl), Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(testCtx(t))
	if h.ABIVersion() != "0.2.0" {
		t.Fatalf("ABIVersion = %q", h.ABIVersion())
	}
	if resp := mustExchange(t, h, &Request{}, nil); resp.Status != 200 {
		t.Fatalf("resp = %+v", resp)
	}
}
