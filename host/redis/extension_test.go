package redis

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

var cluster *redistest.Cluster

func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &cluster)) }

var (
	guestOnce sync.Once
	guestWasm []byte
	guestErr  error
)

// testGuest builds testdata/guest (standard Go, wasip1, c-shared) once per test binary.
func testGuest(t testing.TB) []byte {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the test guest (go build, GOOS=wasip1): not under -short")
	}
	guestOnce.Do(func() {
		dir, err := os.MkdirTemp("", "redisext-guest-")
		if err != nil {
			guestErr = err
			return
		}
		out := filepath.Join(dir, "guest.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, ".")
		cmd.Dir = filepath.Join("testdata", "guest")
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			guestErr = fmt.Errorf("building the test guest: %v\n%s", err, msg)
			return
		}
		guestWasm, guestErr = os.ReadFile(out)
		os.RemoveAll(dir)
	})
	if guestErr != nil {
		t.Fatal(guestErr)
	}
	return guestWasm
}

// newHost starts a host running the test guest with the redis extension on the test
// cluster, known as "rc" (and a second name "other" that the guest never initialises).
func newHost(t *testing.T, config string, workers int) (*host.Host, *Stats) {
	redistest.SkipShort(t)
	t.Helper()
	c := redisclient.New(map[string][]string{"rc": cluster.Addrs, "other": cluster.Addrs}, redisclient.Options{})
	t.Cleanup(func() { c.Close() })
	st := new(Stats)
	ctx := context.Background()
	h, err := host.New(ctx, host.Options{
		Wasm:         testGuest(t),
		PluginConfig: []byte(config),
		Workers:      workers,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		Extensions:   []host.Extension{NewExtension(c, st)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(ctx) })
	return h, st
}

func exchange(t *testing.T, h *host.Host, headers ...string) *host.Response {
	t.Helper()
	req := &host.Request{Path: "/"}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Headers = append(req.Headers, [2]string{headers[i], headers[i+1]})
	}
	resp, err := h.Exchange(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// keysOnEveryNode returns one key per cluster node, in node order.
func keysOnEveryNode(t *testing.T, prefix string) []string {
	t.Helper()
	keys := make([]string, len(cluster.Addrs))
	found := 0
	for i := 0; found < len(keys) && i < 10000; i++ {
		k := prefix + strconv.Itoa(i)
		n, err := cluster.NodeOf(k)
		if err != nil {
			t.Fatal(err)
		}
		if keys[n] == "" {
			keys[n] = k
			found++
		}
	}
	if found < len(keys) {
		t.Fatal("no key for some node")
	}
	return keys
}

func TestCallsReachEveryNode(t *testing.T) {
	h, st := newHost(t, "rc - - 500", 2)
	keys := keysOnEveryNode(t, "redisext:route:")
	var set, get []string
	for i, k := range keys {
		set = append(set, "SET "+k+" v"+strconv.Itoa(i))
		get = append(get, "GET "+k)
	}
	// All SETs in parallel from one stream, then all GETs.
	r := exchange(t, h, "x-redis", strings.Join(set, "|"))
	want := strings.Repeat(`0:"$2\r\nOK\r\n"`+"\n", len(keys))
	if r.Status != 200 || string(r.Body) != want[:len(want)-1] {
		t.Fatalf("SET: %d %q", r.Status, r.Body)
	}
	// Calls belong to the root context (1), as in Higress; the stream is another context.
	if r.Header("x-callback-context") != "1" || r.Header("x-stream-context") == "1" {
		t.Errorf("callback context %q, stream %q", r.Header("x-callback-context"), r.Header("x-stream-context"))
	}
	r = exchange(t, h, "x-redis", strings.Join(get, "|"))
	var lines []string
	for i := range keys {
		lines = append(lines, `0:"$2\r\nv`+strconv.Itoa(i)+`\r\n"`)
	}
	if r.Status != 200 || string(r.Body) != strings.Join(lines, "\n") {
		t.Fatalf("GET: %d %q", r.Status, r.Body)
	}
	if got := st.Calls.Load(); got != int64(2*len(keys)) {
		t.Errorf("Calls = %d", got)
	}
	if st.Replies.Load() != st.Calls.Load() || st.Failures.Load() != 0 {
		t.Errorf("replies %d failures %d", st.Replies.Load(), st.Failures.Load())
	}
}

// With two plugins in one VM, a call's reply goes to the root context of the stream that
// made it: plugin 1's root (2), not the first root.
func TestCallbackGoesToTheCallersRoot(t *testing.T) {
	redistest.SkipShort(t)
	c := redisclient.New(map[string][]string{"rc": cluster.Addrs}, redisclient.Options{})
	t.Cleanup(func() { c.Close() })
	st := new(Stats)
	ctx := context.Background()
	h, err := host.New(ctx, host.Options{
		Wasm:         testGuest(t),
		PluginConfig: []byte("rc - - 500"),
		MorePlugins:  [][]byte{[]byte("rc - - 500")},
		Workers:      1,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		Extensions:   []host.Extension{NewExtension(c, st)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(ctx) })
	for plugin, want := range []string{"1", "2"} {
		r, err := h.Exchange(ctx, &host.Request{Path: "/", Plugin: plugin, Headers: [][2]string{{"x-redis", "PING"}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != 200 || r.Header("x-callback-context") != want {
			t.Errorf("plugin %d: %d %q, callback context %q, want %s", plugin, r.Status, r.Body, r.Header("x-callback-context"), want)
		}
	}
	if st.Undelivered.Load() != 0 {
		t.Errorf("Undelivered = %d", st.Undelivered.Load())
	}
}

func TestReplyTypes(t *testing.T) {
	h, _ := newHost(t, "rc - - 500", 1)
	k := "redisext:{types}"
	// Commands of one request run in parallel: send the dependent ones one by one.
	var got []string
	for _, c := range []string{"DEL " + k + " " + k + "l", "GET " + k, "RPUSH " + k + "l a b", "LRANGE " + k + "l 0 -1", "NOSUCHCOMMAND x", "DEL " + k + "l"} {
		r := exchange(t, h, "x-redis", c)
		if r.Status != 200 {
			t.Fatalf("%s: %d %q", c, r.Status, r.Body)
		}
		got = append(got, string(r.Body))
	}
	want := []string{`0:":0\r\n"`, `0:"$-1\r\n"`, `0:":2\r\n"`, `0:"*2\r\n$1\r\na\r\n$1\r\nb\r\n"`}
	for i, w := range want {
		if got[i] != w {
			t.Errorf("reply %d = %s, want %s", i, got[i], w)
		}
	}
	if !strings.HasPrefix(got[4], `0:"-ERR unknown command`) {
		t.Errorf("error reply = %s", got[4])
	}
}

func TestContinueStream(t *testing.T) {
	h, _ := newHost(t, "rc - - 500", 1)
	var seen *host.Request
	resp, err := h.Exchange(context.Background(), &host.Request{Path: "/", Headers: [][2]string{{"x-redis", "PING"}, {"x-mode", "continue"}}},
		func(r *host.Request) *host.Response { seen = r; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if resp.Status != 200 || resp.Local || seen == nil {
		t.Fatalf("resp = %+v", resp)
	}
	var got string
	for _, kv := range seen.Headers {
		if kv[0] == "x-redis-replies" {
			got = kv[1]
		}
	}
	if want := strconv.Quote(`0:"$4\r\nPONG\r\n"`); got != want {
		t.Errorf("upstream saw x-redis-replies %s, want %s", got, want)
	}
}

func TestRefusedCalls(t *testing.T) {
	h, st := newHost(t, "rc - - 500", 1)
	for _, c := range []struct{ svc, cmd, want string }{
		{"nosuch", "PING", "call 0 status=1 init=0"},     // unknown service: NOT_FOUND
		{"other", "PING", "call 0 status=1 init=0"},      // configured but never initialised: NOT_FOUND
		{"rc", "garbage", "call 0 status=2 init=0"},      // not a RESP array: BAD_ARGUMENT
		{"rc", "PING|garbage", "call 1 status=2 init=0"}, // the first call still completes, unheard
	} {
		r := exchange(t, h, "x-service", c.svc, "x-redis", c.cmd)
		if r.Status != 500 || string(r.Body) != c.want {
			t.Errorf("%s %q: %d %q, want %q", c.svc, c.cmd, r.Status, r.Body, c.want)
		}
	}
	if st.Refused.Load() != 4 {
		t.Errorf("Refused = %d", st.Refused.Load())
	}
}

func TestInitUnknownService(t *testing.T) {
	h, _ := newHost(t, "nosuch - - 500", 1)
	r := exchange(t, h, "x-redis", "PING")
	if r.Status != 500 || string(r.Body) != "call 0 status=1 init=1" {
		t.Errorf("%d %q", r.Status, r.Body)
	}
}

func TestTimeoutIsReported(t *testing.T) {
	redistest.SkipShort(t)
	const timeout = 100 * time.Millisecond
	h, st := newHost(t, "rc - - 100", 1)
	k := "redisext:timeout"
	node, err := cluster.NodeOf(k)
	if err != nil {
		t.Fatal(err)
	}
	// Warm the connection first, so the timeout below is the paused node's, not a dial's.
	if r := exchange(t, h, "x-redis", "SET "+k+" 1"); r.Status != 200 {
		t.Fatalf("%d %q", r.Status, r.Body)
	}
	if err := cluster.Pause(node); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := exchange(t, h, "x-redis", "GET "+k)
	took := time.Since(start)
	if err := cluster.Resume(node); err != nil {
		t.Fatal(err)
	}
	if r.Status != 200 || string(r.Body) != `2:""` {
		t.Errorf("paused node: %d %q, want the timeout status 2 and no reply", r.Status, r.Body)
	}
	// Status 2 above is the call's own timeout: the wait ended at the deadline, not before.
	if took < timeout {
		t.Errorf("took %v with a %v timeout", took, timeout)
	}
	if st.Failures.Load() != 1 {
		t.Errorf("Failures = %d", st.Failures.Load())
	}
	// The node is back: calls succeed again with the same client.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r = exchange(t, h, "x-redis", "GET "+k)
		if string(r.Body) == `0:"$1\r\n1\r\n"` {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after resume: %q", r.Body)
		}
	}
}

// Many streams on several workers, one key: every INCR runs exactly once and every stream
// gets its own reply (tokens never cross streams).
func TestConcurrentCallsOneKey(t *testing.T) {
	h, _ := newHost(t, "rc - - 2000", 4)
	k := "redisext:incr"
	exchange(t, h, "x-redis", "DEL "+k)
	const n = 400
	got := make([]int, n)
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := h.Exchange(context.Background(), &host.Request{Path: "/", Headers: [][2]string{{"x-redis", "INCR " + k}}}, nil)
			if err != nil {
				errs <- err.Error()
				return
			}
			var v int
			if _, err := fmt.Sscanf(string(r.Body), "0:\":%d\\r\\n\"", &v); err != nil {
				errs <- fmt.Sprintf("%d %q", r.Status, r.Body)
				return
			}
			got[i] = v
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	sort.Ints(got)
	for i, v := range got {
		if v != i+1 {
			t.Fatalf("replies sorted: position %d holds %d (want 1..%d each once)", i, v, n)
		}
	}
}
