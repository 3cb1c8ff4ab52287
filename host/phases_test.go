package host

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// BenchmarkSluicePhases times each callback of one request cycle of the compiled sluice
// module on a worker, without the hand-offs and allocations of Exchange, and counts the
// host calls a request makes: it shows where the guest's time goes. One rule, token bucket
// per client IP, never denying, headers "both". Metrics are ns per request for each
// callback (the host calls it makes included) and host calls per request by name.
//
//	go test ./host -run '^$' -bench SluicePhases
func BenchmarkSluicePhases(b *testing.B) {
	wasm := sluiceModule(b)
	counts := map[string]*int{}
	saved := builtinHostCalls
	wrapped := make(map[string]hostCall, len(saved))
	for name, hc := range saved {
		n, fn := new(int), hc.fn
		counts[name] = n
		hc.fn = func(v *vm, s []uint64) Status { *n++; return fn(v, s) }
		wrapped[name] = hc
	}
	builtinHostCalls = wrapped
	cfg := `{"rules":[{"name":"bench","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}],"response":{"headers":"both"}}`
	h, err := New(context.Background(), Options{Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1})
	builtinHostCalls = saved
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close(context.Background())
	names := [...]string{"create", "request-headers", "response-headers", "log", "done", "delete"}
	var d [len(names)]time.Duration
	var missing int
	cycle := func(w *worker, timed bool) {
		v := w.vm
		s := &stream{h: h, w: w, vm: v, remoteAddr: "192.0.2.10:40000", protocol: "HTTP/1.1", created: true}
		s.reqHeaders.kv = [][2]string{{":authority", "example.test"}, {":path", "/api/items?id=7"}, {":method", "GET"}, {":scheme", "http"}, {"user-agent", "bench"}, {"accept", "*/*"}}
		s.respHeaders.kv = append(make([][2]string, 0, 8), [2]string{":status", "200"}, [2]string{"content-type", "text/plain"})
		id := v.nextContext
		v.nextContext++
		s.id = id
		v.streams[id] = s
		v.cur, v.curID = s, id
		var t [len(names) + 1]time.Time
		t[0] = time.Now()
		v.call(v.onContextCreate, uint64(id), rootContextID)
		t[1] = time.Now()
		v.call(v.onRequestHeaders, uint64(id), uint64(len(s.reqHeaders.kv)), 1)
		t[2] = time.Now()
		s.respPhase = true
		v.call(v.onResponseHeaders, uint64(id), uint64(len(s.respHeaders.kv)), 1)
		t[3] = time.Now()
		v.call(v.onLog, uint64(id))
		t[4] = time.Now()
		v.call(v.onDone, uint64(id))
		t[5] = time.Now()
		v.call(v.onDelete, uint64(id))
		t[6] = time.Now()
		delete(v.streams, id)
		v.cur, v.curID = nil, rootContextID
		if len(s.respHeaders.kv) != 7 {
			missing++
		}
		if timed {
			for i := range d {
				d[i] += t[i+1].Sub(t[i])
			}
		}
	}
	done := make(chan struct{})
	var before map[string]int
	h.workers[0].post(context.Background(), job{fn: func(w *worker) {
		defer close(done)
		for i := 0; i < 100; i++ {
			cycle(w, false)
		}
		before = map[string]int{}
		for name, n := range counts {
			before[name] = *n
		}
		missing = 0
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			cycle(w, true)
		}
		b.StopTimer()
	}})
	<-done
	if missing > 0 {
		b.Fatalf("%d of %d responses did not get the five rate-limit headers", missing, b.N)
	}
	for i, name := range names {
		b.ReportMetric(float64(d[i])/float64(b.N), name+"-ns/op")
	}
	var calls []string
	for name, n := range counts {
		if *n > before[name] {
			calls = append(calls, name)
		}
	}
	sort.Strings(calls)
	total := 0
	for _, name := range calls {
		total += *counts[name] - before[name]
		b.ReportMetric(float64(*counts[name]-before[name])/float64(b.N), name+"/op")
	}
	b.ReportMetric(float64(total)/float64(b.N), "hostcalls/op")
}

// sluiceModule builds the sluice module (../cmd/sluice-wasm) as `make build` ships it:
// compiled for wasip1 and patched by internal/wasmpatch. The host's tests know it only as
// a module: they import nothing of the filter.
func sluiceModule(tb testing.TB) []byte {
	tb.Helper()
	if testing.Short() {
		tb.Skip("builds the sluice module (go build, GOOS=wasip1): not under -short")
	}
	out := filepath.Join(tb.TempDir(), "sluice.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./cmd/sluice-wasm")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("building the sluice module: %v\n%s", err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		tb.Fatal(err)
	}
	if b, err = wasmpatch.PollOneoff(b); err != nil {
		tb.Fatal(err)
	}
	return b
}
