package cycle

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/sluice-proxy/sluice/host"
)

// BenchmarkCycleCalls breaks one request cycle down by Proxy-Wasm call: how many times each
// callback (proxy_on_*) and each host call runs per request, and the wall time inside it
// (callbacks include the host calls they make). It uses wazero's function listeners, which
// add their own overhead: read the times as proportions. One worker; the listener is not
// safe for more.
//
//	go test ./bench/cycle -run '^$' -bench CycleCalls -benchtime 5000x -v
func BenchmarkCycleCalls(b *testing.B) {
	wasm := sluiceModule(b)
	sluice, err := os.ReadFile(wasm)
	if err != nil {
		b.Fatal(err)
	}
	cfg := func(match, headers string) string {
		return `{"rules":[{"name":"b",` + match + `"key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1h"}],"response":{"headers":"` + headers + `"}}`
	}
	for _, c := range []struct {
		name, config string
		wasm         []byte
	}{
		{"noop-module", "", nil},
		{"sluice/no-rule-applies", cfg(`"match":{"headers":[{"name":"x-never","exact":"1"}]},`, "both"), sluice},
		{"sluice/allow/headers-none", cfg("", "none"), sluice},
		{"sluice/allow/headers-both", cfg("", "both"), sluice},
	} {
		mod := c.wasm
		if mod == nil {
			mod = noopModule(b)
		}
		// A fresh compilation cache: listeners are compiled into the code, so a module
		// compiled earlier without them must not be reused.
		rec := &callRecorder{calls: map[string]int{}, wall: map[string]time.Duration{}}
		ctx := experimental.WithFunctionListenerFactory(context.Background(), rec)
		h, err := host.New(ctx, host.Options{Wasm: mod, PluginConfig: []byte(c.config), Workers: 1,
			CompilationCache: wazero.NewCompilationCache()})
		if err != nil {
			b.Fatal(err)
		}
		defer h.Close(context.Background())
		req := &host.Request{Method: "GET", Path: "/api/items?id=7", Authority: "example.test",
			Headers: [][2]string{{"user-agent", "bench"}, {"accept", "*/*"}}, RemoteAddr: "192.0.2.10:40000"}
		up := func(*host.Request) *host.Response {
			return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "text/plain"}}}
		}
		b.Run(c.name, func(b *testing.B) {
			for range 100 {
				h.Exchange(context.Background(), req, up)
			}
			rec.reset()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if resp, err := h.Exchange(context.Background(), req, up); err != nil || resp.Status != 200 {
					b.Fatalf("%+v %v", resp, err)
				}
			}
			b.StopTimer()
			if b.N > 1 {
				b.Log("\n" + rec.table(b.N))
			}
			b.ReportMetric(float64(rec.total)/float64(b.N), "wasm-calls/op")
		})
	}
}

// callRecorder counts calls and wall time per function; it listens to the module's exports
// and to every imported (host) function.
type callRecorder struct {
	calls map[string]int
	wall  map[string]time.Duration
	stack []time.Time
	total int
}

func (r *callRecorder) reset() {
	clear(r.calls)
	clear(r.wall)
	r.total = 0
}

func (r *callRecorder) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	mod, name, isImport := def.Import()
	if isImport {
		return &callListener{r, mod + "." + name}
	}
	if names := def.ExportNames(); len(names) > 0 {
		return &callListener{r, names[0]}
	}
	return nil
}

func (r *callRecorder) table(n int) string {
	names := make([]string, 0, len(r.calls))
	for k := range r.calls {
		names = append(names, k)
	}
	sort.Strings(names)
	var s strings.Builder
	for _, k := range names {
		fmt.Fprintf(&s, "  %-36s %5.2f calls/req %8.0f ns/req\n", k, float64(r.calls[k])/float64(n), float64(r.wall[k])/float64(n))
	}
	return s.String()
}

type callListener struct {
	r    *callRecorder
	name string
}

func (l *callListener) Before(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
	l.r.calls[l.name]++
	l.r.total++
	l.r.stack = append(l.r.stack, time.Now())
}

func (l *callListener) After(context.Context, api.Module, api.FunctionDefinition, []uint64) {
	t := l.r.stack[len(l.r.stack)-1]
	l.r.stack = l.r.stack[:len(l.r.stack)-1]
	l.r.wall[l.name] += time.Since(t)
}

func (l *callListener) Abort(context.Context, api.Module, api.FunctionDefinition, error) {
	l.r.stack = l.r.stack[:len(l.r.stack)-1]
}
