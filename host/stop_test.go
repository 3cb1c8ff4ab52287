package host

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// stopperMetric reads a counter of the stopper guest (0 when it was never defined).
func stopperMetric(h *Host, name string) int64 {
	m, _ := h.Metric("stopper." + name)
	return m.Value
}

// heldBackend answers GET /done/<root> once release is closed; it counts the calls that
// arrived and the ones whose request context ended before release (abandoned by the host).
type heldBackend struct {
	srv       *httptest.Server
	release   chan struct{}
	arrived   atomic.Int64
	abandoned atomic.Int64
	paths     sync.Map
}

func newHeldBackend(t *testing.T) *heldBackend {
	b := &heldBackend{release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.paths.Store(r.URL.Path, true)
		b.arrived.Add(1)
		select {
		case <-b.release:
			w.Write([]byte("ok"))
		case <-r.Context().Done():
			b.abandoned.Add(1)
		}
	}))
	t.Cleanup(func() {
		select {
		case <-b.release:
		default:
			close(b.release)
		}
		b.srv.Close()
	})
	return b
}

// Close with roots that answer false from proxy_on_done and make an HTTP call: Close waits
// until the replies have reached them and they called proxy_done; only then proxy_on_delete.
// Meanwhile new requests are refused and the snapshot says closed.
func TestCloseWaitsForProxyDoneAfterHTTPCall(t *testing.T) {
	b := newHeldBackend(t)
	h, logs := newHost(t, "stopper", Options{Workers: 2, PluginConfig: []byte("http"),
		Clusters: map[string]string{"backend": b.srv.URL}})
	closed := make(chan error, 1)
	go func() { closed <- h.Close(testCtx(t)) }()
	waitFor(t, func() bool { return b.arrived.Load() == 2 })
	if _, err := h.Exchange(testCtx(t), &Request{Path: "/"}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Exchange while closing: %v, want ErrClosed", err)
	}
	if !h.Snapshot().Closed {
		t.Error("snapshot while closing: not closed")
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) before the roots' replies arrived", err)
	case <-time.After(100 * time.Millisecond):
	}
	if d, del := stopperMetric(h, "done"), stopperMetric(h, "deleted"); d != 2 || del != 0 {
		t.Fatalf("before the replies: %d proxy_on_done, %d proxy_on_delete; want 2, 0", d, del)
	}
	close(b.release)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after the replies")
	}
	for _, m := range []string{"done", "replies", "done_ok", "deleted", "deleted_after_reply"} {
		if v := stopperMetric(h, m); v != 2 {
			t.Errorf("stopper.%s = %d, want 2 (one per worker)\n%s", m, v, logs)
		}
	}
	if b.abandoned.Load() != 0 {
		t.Errorf("%d calls abandoned", b.abandoned.Load())
	}
	for _, p := range []string{"/done/1"} { // each worker's plugin root is context 1
		if _, ok := b.paths.Load(p); !ok {
			t.Errorf("backend never got %s", p)
		}
	}
}

// asyncDoneExtension is proxy_test_async for the stopper guest: the reply comes back
// through Guest.Start's deliver after wait, as proxy_on_test_reply(root, token). sent
// counts calls whose work finished (before delivery), delivered the callbacks that ran.
type asyncDone struct {
	wait      chan struct{}
	sent      atomic.Int64
	delivered atomic.Int64
}

func (a *asyncDone) extension() Extension {
	return Extension{Name: "test-async", Funcs: []HostFunc{{
		Name:    "proxy_test_async",
		Params:  []api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32},
		Results: []api.ValueType{api.ValueTypeI32},
		Func: func(g *Guest, stack []uint64) {
			root := g.RootContextID()
			const token = 7
			g.WriteUint32(uint32(stack[2]), token)
			deliver := g.Start()
			go func() {
				<-a.wait
				a.sent.Add(1)
				deliver(func(g *Guest) {
					if !g.ContextExists(root) {
						return
					}
					if _, err := g.Callback("proxy_on_test_reply", root, nil, uint64(root), token); err == nil {
						a.delivered.Add(1)
					}
				})
			}()
			stack[0] = uint64(StatusOK)
		},
	}}}
}

// Extension calls made from proxy_on_done: with false, the reply reaches the root, which
// calls proxy_done; with true (what the sluice filter does with its leases), the root is
// deleted at once and its reply dropped, but Close still waits until the call completed —
// so what was sent reaches its server before the VM and the extension's connections go.
func TestCloseWaitsForExtensionCalls(t *testing.T) {
	for _, mode := range []string{"ext", "ext-true"} {
		t.Run(mode, func(t *testing.T) {
			a := &asyncDone{wait: make(chan struct{})}
			h, logs := newHost(t, "stopper", Options{Workers: 2, PluginConfig: []byte(mode),
				Extensions: []Extension{a.extension()}})
			closed := make(chan error, 1)
			go func() { closed <- h.Close(testCtx(t)) }()
			waitFor(t, func() bool { return stopperMetric(h, "done") == 2 })
			select {
			case err := <-closed:
				t.Fatalf("Close returned (%v) with extension calls in flight", err)
			case <-time.After(100 * time.Millisecond):
			}
			close(a.wait)
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
			if a.sent.Load() != 2 {
				t.Fatalf("Close returned with %d of 2 calls completed", a.sent.Load())
			}
			want := map[string]int64{"done": 2, "replies": 2, "done_ok": 2, "deleted": 2, "deleted_after_reply": 2}
			if mode == "ext-true" {
				want = map[string]int64{"done": 2, "replies": 0, "done_ok": 0, "deleted": 2, "deleted_after_reply": 0}
			}
			for m, w := range want {
				if v := stopperMetric(h, m); v != w {
					t.Errorf("stopper.%s = %d, want %d\n%s", m, v, w, logs)
				}
			}
			if got, w := a.delivered.Load(), want["replies"]; got != w {
				t.Errorf("%d callbacks delivered, want %d", got, w)
			}
		})
	}
}

// Close's deadline bounds the wait: a root whose call never returns, or that never calls
// proxy_done, is deleted when the deadline passes, and its call is abandoned.
func TestCloseDeadline(t *testing.T) {
	for _, mode := range []string{"http", "never"} {
		t.Run(mode, func(t *testing.T) {
			b := newHeldBackend(t)
			h, logs := newHost(t, "stopper", Options{Workers: 2, PluginConfig: []byte(mode),
				Clusters: map[string]string{"backend": b.srv.URL}})
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			if err := h.Close(ctx); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			// Close returned, so the deadline ended the wait (without it Close waits for
			// the held roots forever, and the test times out); not before the deadline.
			// The metrics and the warning below say how it ended.
			if took < 300*time.Millisecond {
				t.Errorf("Close took %v with a 300 ms deadline", took)
			}
			if d, r, del := stopperMetric(h, "done"), stopperMetric(h, "replies"), stopperMetric(h, "deleted"); d != 2 || r != 0 || del != 2 {
				t.Errorf("done %d, replies %d, deleted %d; want 2, 0, 2\n%s", d, r, del, logs)
			}
			if !strings.Contains(logs.String(), "did not call proxy_done before the deadline") {
				t.Errorf("no warning about the late roots:\n%s", logs)
			}
			if mode == "http" {
				waitFor(t, func() bool { return b.abandoned.Load() == 2 })
			}
		})
	}
}

// proxy_done from a root that is not waiting for it (here, from a stream of a live root)
// is NOT_FOUND, as in cpp-host's WasmBase::done.
func TestProxyDoneNotPending(t *testing.T) {
	h, _ := newHost(t, "stopper", Options{Workers: 1, PluginConfig: []byte("http")})
	resp := mustExchange(t, h, &Request{Path: "/"}, nil)
	if string(resp.Body) != strconv.Itoa(int(StatusNotFound)) {
		t.Fatalf("proxy_done from a live root's stream = %q, want NOT_FOUND (%d)", resp.Body, StatusNotFound)
	}
}

// A configuration change retires the old root the same way: proxy_on_done false keeps it
// (with its call in flight) until it calls proxy_done after the reply; the new root serves
// meanwhile.
func TestReconfigureRetireWaitsForProxyDone(t *testing.T) {
	b := newHeldBackend(t)
	h, logs := newHost(t, "stopper", Options{Workers: 2, PluginConfig: []byte("http"),
		Clusters: map[string]string{"backend": b.srv.URL}})
	if err := h.Reconfigure(testCtx(t), 0, []byte("plain")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return b.arrived.Load() == 2 })
	if d, del := stopperMetric(h, "done"), stopperMetric(h, "deleted"); d != 2 || del != 0 {
		t.Fatalf("before the replies: done %d, deleted %d; want 2, 0", d, del)
	}
	resp := mustExchange(t, h, &Request{Path: "/"}, nil)
	if resp.Status != 200 {
		t.Fatalf("request on the new root: %d", resp.Status)
	}
	close(b.release)
	waitFor(t, func() bool { return stopperMetric(h, "deleted_after_reply") == 2 })
	if r, ok := stopperMetric(h, "replies"), stopperMetric(h, "done_ok"); r != 2 || ok != 2 {
		t.Errorf("replies %d, proxy_done OK %d; want 2, 2\n%s", r, ok, logs)
	}
	if err := h.Close(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if d, del := stopperMetric(h, "done"), stopperMetric(h, "deleted"); d != 4 || del != 4 {
		t.Errorf("after Close: done %d, deleted %d; want 4, 4 (the new roots answer true)", d, del)
	}
}

// Kill models a crash: no proxy_on_done, no call made, requests refused afterwards.
func TestKillRunsNoProxyOnDone(t *testing.T) {
	b := newHeldBackend(t)
	h, _ := newHost(t, "stopper", Options{Workers: 2, PluginConfig: []byte("http"),
		Clusters: map[string]string{"backend": b.srv.URL}})
	if err := h.Kill(); err != nil {
		t.Fatal(err)
	}
	if d, del := stopperMetric(h, "done"), stopperMetric(h, "deleted"); d != 0 || del != 0 {
		t.Errorf("after Kill: done %d, deleted %d; want 0, 0", d, del)
	}
	if _, err := h.Exchange(testCtx(t), &Request{Path: "/"}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Exchange after Kill: %v, want ErrClosed", err)
	}
	if err := h.Close(testCtx(t)); err != nil {
		t.Errorf("Close after Kill: %v", err)
	}
	if b.arrived.Load() != 0 {
		t.Errorf("%d calls reached the backend", b.arrived.Load())
	}
}
