package filter_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
)

// The third target: the compiled module in sluice's own embedded host
// (host/), which has Envoy's shared-data semantics, calls proxy_on_delete
// and runs several workers.

func init() {
	targets = append(targets, targetKind{"wasm-host", func(t *testing.T, cfg string) target {
		return startHost(t, cfg, 1)
	}})
}

type hostTarget struct {
	t *testing.T
	h *host.Host
}

func newHost(t testing.TB, cfg string, workers int, logs *bytes.Buffer) (*host.Host, error) {
	t.Helper()
	wasm, err := filtertest.BuildWasm("")
	if err != nil {
		t.Fatal(err)
	}
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
