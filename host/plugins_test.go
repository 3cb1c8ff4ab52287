package host

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// whoami asks the kitchen guest which root the stream of plugin p got as parent and what
// configuration the guest stored for that root.
func whoami(t *testing.T, h *Host, p int) string {
	t.Helper()
	resp := mustExchange(t, h, &Request{Path: "/whoami", Plugin: p}, nil)
	if resp.Status != 200 {
		t.Fatalf("/whoami on plugin %d: %d %q", p, resp.Status, resp.Body)
	}
	return string(resp.Body)
}

func metricValue(h *Host, name string) int64 {
	m, _ := h.Metric(name)
	return m.Value
}

func TestTwoPluginsOneVM(t *testing.T) {
	h, logs := newHost(t, "kitchen", Options{Workers: 2, PluginConfig: []byte("alpha"), MorePlugins: [][]byte{[]byte("beta")}})
	// Round-robin: several requests reach both workers; ids are per VM, so the same on both.
	for i := 0; i < 6; i++ {
		if got := whoami(t, h, 0); got != "root=1;config=alpha" {
			t.Errorf("plugin 0: %q", got)
		}
		if got := whoami(t, h, 1); got != "root=2;config=beta" {
			t.Errorf("plugin 1: %q", got)
		}
	}
	for _, want := range []string{"configured root 1: alpha", "configured root 2: beta", "vm start, vm config: , root 1", "vm start, vm config: , root 2"} {
		if n := logs.count(want); n != 2 {
			t.Errorf("%q logged %d times, want once per worker:\n%s", want, n, logs)
		}
	}
	// Either plugin's stream may make any live root effective, not an unknown id.
	for _, c := range []struct {
		plugin int
		path   string
		want   string
	}{{0, "/set-effective?id=2", "status=0"}, {1, "/set-effective?id=1", "status=0"}, {0, "/set-effective?id=999", "status=2"}} {
		if r := mustExchange(t, h, &Request{Path: c.path, Plugin: c.plugin}, nil); string(r.Body) != c.want {
			t.Errorf("plugin %d %s: %q, want %q", c.plugin, c.path, r.Body, c.want)
		}
	}
	for _, p := range []int{2, -1} {
		_, err := h.Exchange(testCtx(t), &Request{Path: "/whoami", Plugin: p}, nil)
		if err == nil || !strings.Contains(err.Error(), "does not exist") || !strings.Contains(err.Error(), "2 plugin(s)") {
			t.Errorf("Exchange with Plugin %d: %v", p, err)
		}
	}

	// The net/http path: one handler per plugin, like two listeners.
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up") })
	for _, c := range []struct {
		plugin int
		status int
		body   string
	}{{0, 200, "root=1;config=alpha"}, {1, 200, "root=2;config=beta"}, {5, 500, "plugin 5 does not exist"}} {
		rec := httptest.NewRecorder()
		h.PluginHandler(c.plugin, up).ServeHTTP(rec, httptest.NewRequest("GET", "/whoami", nil))
		if rec.Code != c.status || !strings.Contains(rec.Body.String(), c.body) {
			t.Errorf("PluginHandler(%d): %d %q", c.plugin, rec.Code, rec.Body)
		}
	}
}

func TestReconfigureDrainsOldRoot(t *testing.T) {
	h, logs := newHost(t, "kitchen", Options{Workers: 1, PluginConfig: []byte("v1&tick=3600000")})
	ctx := testCtx(t)
	type result struct {
		seen *Request
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var seen *Request
		_, err := h.Exchange(ctx, &Request{Path: "/pause-tick"}, func(r *Request) *Response { seen = r; return nil })
		done <- result{seen, err}
	}()
	waitFor(t, func() bool { return metricValue(h, "kitchen_requests_total") == 1 })

	if err := h.Reconfigure(ctx, 0, []byte("v2&tick=3600000")); err != nil {
		t.Fatal(err)
	}
	// Ids on the one VM: root 1, the paused stream 2, the new root 3.
	if got := whoami(t, h, 0); got != "root=3;config=v2&tick=3600000" {
		t.Errorf("after Reconfigure: %q", got)
	}
	if !strings.Contains(logs.String(), "vm start, vm config: , root 3") {
		t.Errorf("the new root did not get proxy_on_vm_start:\n%s", logs)
	}
	if strings.Contains(logs.String(), "root done 1") || strings.Contains(logs.String(), "root delete 1") {
		t.Fatalf("old root ended while its stream is paused:\n%s", logs)
	}
	// Both roots tick; the tick resumes the paused stream, which still has root 1.
	if err := h.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.seen == nil {
		t.Fatalf("paused request: %+v", r)
	}
	if v, _ := header(r.seen.Headers, "x-kitchen-root"); v != "1" {
		t.Errorf("paused stream's parent = %q, want 1", v)
	}
	if v, _ := header(r.seen.Headers, "x-kitchen-config"); v != "v1&tick=3600000" {
		t.Errorf("paused stream's configuration = %q", v)
	}
	out := logs.String()
	d, del := strings.Index(out, "root done 1"), strings.Index(out, "root delete 1")
	if d < 0 || del < d {
		t.Fatalf("old root: done at %d, delete at %d:\n%s", d, del, out)
	}
	// The deleted root's timer is gone: only root 3 ticks now.
	t1, t3 := metricValue(h, "kitchen_ticks_root_1"), metricValue(h, "kitchen_ticks_root_3")
	if err := h.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if metricValue(h, "kitchen_ticks_root_1") != t1 || metricValue(h, "kitchen_ticks_root_3") != t3+1 {
		t.Errorf("ticks after the old root ended: root 1 %d→%d, root 3 %d→%d", t1, metricValue(h, "kitchen_ticks_root_1"), t3, metricValue(h, "kitchen_ticks_root_3"))
	}
	// Without streams, the replaced root ends at once.
	if err := h.Reconfigure(ctx, 0, []byte("v3")); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "root delete 3") {
		t.Errorf("idle old root not deleted:\n%s", logs)
	}
	if got := whoami(t, h, 0); !strings.HasSuffix(got, ";config=v3") {
		t.Errorf("after the second Reconfigure: %q", got)
	}
	if err := h.Reconfigure(ctx, 1, []byte("x")); err == nil || !strings.Contains(err.Error(), "plugin 1 does not exist") {
		t.Errorf("Reconfigure of a missing plugin: %v", err)
	}
}

func TestReconfigureRefusedKeepsOldConfig(t *testing.T) {
	h, logs := newHost(t, "kitchen", Options{Workers: 2, PluginConfig: []byte("good"), MorePlugins: [][]byte{[]byte("other")}})
	ctx := testCtx(t)
	err := h.Reconfigure(ctx, 0, []byte("reject-me"))
	if err == nil {
		t.Fatal("Reconfigure accepted a configuration the guest refused")
	}
	for _, want := range []string{"worker 0:", "worker 1:", "proxy_on_configure returned false", "2 of 2 workers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	for i := 0; i < 4; i++ {
		if got := whoami(t, h, 0); got != "root=1;config=good" {
			t.Errorf("plugin 0 after a refused Reconfigure: %q", got)
		}
		if got := whoami(t, h, 1); got != "root=2;config=other" {
			t.Errorf("plugin 1 after a refused Reconfigure: %q", got)
		}
	}
	// The refused root (3 on each VM) got done and delete.
	if n := logs.count("root delete 3"); n != 2 {
		t.Errorf("refused root deleted %d times, want once per worker:\n%s", n, logs)
	}
	// A trap in proxy_on_configure: the VM is replaced, with the previous configuration.
	err = h.Reconfigure(ctx, 0, []byte("trap-configure"))
	if err == nil || !strings.Contains(err.Error(), "worker 0:") || !strings.Contains(err.Error(), "VM was replaced") {
		t.Fatalf("trapping Reconfigure: %v", err)
	}
	if st := h.Stats(); st.VMRestarts != 2 {
		t.Errorf("VMRestarts = %d, want 2", st.VMRestarts)
	}
	for i := 0; i < 4; i++ {
		if got := whoami(t, h, 0); got != "root=1;config=good" {
			t.Errorf("plugin 0 after a trapping Reconfigure: %q", got)
		}
	}
}

func TestTicksPerRoot(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1, PluginConfig: []byte("a&tick=3600000"), MorePlugins: [][]byte{[]byte("b")}})
	ctx := testCtx(t)
	if err := h.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if metricValue(h, "kitchen_ticks_root_1") != 1 {
		t.Fatalf("root 1 ticks = %d, want 1", metricValue(h, "kitchen_ticks_root_1"))
	}
	if _, ok := h.Metric("kitchen_ticks_root_2"); ok {
		t.Fatal("root 2 ticked without a period")
	}
	// A stream of plugin 1 sets the period: it applies to its root (2), whose timer fires
	// while root 1's hour-long period does not.
	if r := mustExchange(t, h, &Request{Path: "/set-tick?ms=5", Plugin: 1}, nil); string(r.Body) != "status=0" {
		t.Fatalf("/set-tick: %q", r.Body)
	}
	waitFor(t, func() bool { return metricValue(h, "kitchen_ticks_root_2") >= 3 })
	if n := metricValue(h, "kitchen_ticks_root_1"); n != 1 {
		t.Errorf("root 1 ticks = %d, want still 1", n)
	}
	// Period 0 stops root 2's ticks.
	mustExchange(t, h, &Request{Path: "/set-tick?ms=0", Plugin: 1}, nil)
	n := metricValue(h, "kitchen_ticks_root_2")
	if err := h.Tick(ctx); err != nil {
		t.Fatal(err)
	}
	if metricValue(h, "kitchen_ticks_root_2") != n || metricValue(h, "kitchen_ticks_root_1") != 2 {
		t.Errorf("after stopping root 2: root 1 %d, root 2 %d→%d", metricValue(h, "kitchen_ticks_root_1"), n, metricValue(h, "kitchen_ticks_root_2"))
	}
}

func TestRestartAfterTrapRecreatesAllRoots(t *testing.T) {
	c := newFakeClock()
	h, logs := newHost(t, "kitchen", reloadOptions(c, Options{Workers: 1, PluginConfig: []byte("p0"), MorePlugins: [][]byte{[]byte("p1")}}))
	ctx := testCtx(t)
	if err := h.Reconfigure(ctx, 1, []byte("p1-new")); err != nil {
		t.Fatal(err)
	}
	if got := whoami(t, h, 1); got != "root=3;config=p1-new" {
		t.Fatalf("plugin 1 after Reconfigure: %q", got)
	}
	if r := mustExchange(t, h, &Request{Path: "/trap", Plugin: 1}, nil); !isFailReply(r) {
		t.Fatalf("/trap: %+v", r)
	}
	c.Advance(2 * time.Second) // FailReload: the next request reloads the VM
	whoami(t, h, 0)
	if st := h.Stats(); st.VMRestarts != 1 {
		t.Fatalf("VMRestarts = %d", st.VMRestarts)
	}
	// The fresh VM has both roots again, with the latest configuration of each.
	if got := whoami(t, h, 0); got != "root=1;config=p0" {
		t.Errorf("plugin 0 on the fresh VM: %q", got)
	}
	if got := whoami(t, h, 1); got != "root=2;config=p1-new" {
		t.Errorf("plugin 1 on the fresh VM: %q", got)
	}
	if n := logs.count("configured root 2: p1-new"); n != 1 {
		t.Errorf("fresh VM's root 2 configured %d times with p1-new:\n%s", n, logs)
	}
}

func TestHTTPCallReplyGoesToCallersRoot(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pong") }))
	defer backend.Close()
	h, _ := newHost(t, "kitchen", Options{Workers: 1, MorePlugins: [][]byte{nil}, Clusters: map[string]string{"backend": backend.URL}})
	for p, want := range []string{"1", "2"} {
		var seen *Request
		mustExchange(t, h, &Request{Path: "/pause-call", Plugin: p}, func(r *Request) *Response { seen = r; return nil })
		if seen == nil {
			t.Fatalf("plugin %d: not resumed", p)
		}
		if v, _ := header(seen.Headers, "x-callout-root"); v != want {
			t.Errorf("plugin %d: reply delivered to root %q, want %s", p, v, want)
		}
	}
}

func TestExtensionRootContextID(t *testing.T) {
	calls := 0
	h, _ := newHost(t, "kitchen", Options{Workers: 1, MorePlugins: [][]byte{nil}, Extensions: []Extension{testAsyncExtension(&calls)}})
	for p, want := range []string{"root=1/0", "root=2/0"} {
		var seen *Request
		mustExchange(t, h, &Request{Path: "/ext?arg=root", Plugin: p}, func(r *Request) *Response { seen = r; return nil })
		if v, _ := header(seen.Headers, "x-ext-reply"); v != want {
			t.Errorf("plugin %d: %q, want %q", p, v, want)
		}
	}
}
