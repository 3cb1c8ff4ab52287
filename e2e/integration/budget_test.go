package integration

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
)

// Token budgets (rules[].cost) through the compiled module in the embedded host: the
// response body is read for its usage by proxy_on_response_body, the reservation settled at
// the stream's end; the guest allocates nothing per request once its bills are pooled
// (sluice_debug build, as TestGuestAllocationsPerRequest).
func TestGuestAllocationsPerSettledRequest(t *testing.T) {
	cfg := `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1h",
	  "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"usage":"openai"}}}],"response":{"headers":"both"}}`
	req := &host.Request{Method: "POST", Path: "/v1/chat/completions", Authority: "example.test", RemoteAddr: "192.0.2.10:40000",
		Headers: [][2]string{{"x-api-key", "k1"}, {"x-max-tokens", "400"}}}
	// Each reserved 400 and used 42.
	allocationsPerBudgetRequest(t, "settled request", host.Options{PluginConfig: []byte(cfg)}, req, "sluice.llm.refunded", 400-42)
}

// TestGuestAllocationsPerBodyReservation: a reservation read from the JSON request body
// (the headers held while the body is read, as with Envoy's
// allow_on_headers_stop_iteration), settled by the response's usage, allocates nothing
// in the guest per request once warm.
func TestGuestAllocationsPerBodyReservation(t *testing.T) {
	cfg := `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1h",
	  "cost":{"request":{"json":"max_tokens","default":500},"response":{"usage":"openai"}}}],"response":{"headers":"both"}}`
	req := &host.Request{Method: "POST", Path: "/v1/chat/completions", Authority: "example.test", RemoteAddr: "192.0.2.10:40000",
		Headers: [][2]string{{"x-api-key", "k1"}, {"content-type", "application/json"}},
		Body:    []byte(`{"model":"m","messages":[{"role":"user","content":"Count to five."}],"max_tokens":400}`)}
	// Each reserved the body's max_tokens, 400.
	allocationsPerBudgetRequest(t, "request reserved from its body", host.Options{PluginConfig: []byte(cfg), AllowOnHeadersStopIteration: true},
		req, "sluice.llm.reserved", 400)
}

// allocationsPerBudgetRequest sends req through the sluice_debug module (one worker, opts)
// to an upstream answering an OpenAI completion that used 42 tokens: 500 requests to warm
// up, then 10,000 during which metric must grow by per for each and the guest must
// allocate nothing.
func allocationsPerBudgetRequest(t *testing.T, what string, opts host.Options, req *host.Request, metric string, per int64) {
	t.Helper()
	opts.Wasm = filtertest.Wasm(t, "sluice_debug")
	opts.Workers = 1
	opts.Logger = slog.New(slog.NewTextHandler(new(bytes.Buffer), nil))
	h, err := host.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`)
	up := func(*host.Request) *host.Response {
		return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "application/json"}}, Body: body}
	}
	for i := 0; i < 500; i++ {
		h.Exchange(context.Background(), req, up)
	}
	m0, _ := h.Metric(filter.DebugAllocsMetric)
	v0, _ := h.Metric(metric)
	const n = 10000
	for i := 0; i < n; i++ {
		resp, err := h.Exchange(context.Background(), req, up)
		if err != nil || resp.Status != 200 || !bytes.Equal(resp.Body, body) {
			t.Fatalf("request %d: %v %+v", i, err, resp)
		}
	}
	m1, ok := h.Metric(filter.DebugAllocsMetric)
	if !ok {
		t.Fatal("no allocation metric")
	}
	v1, _ := h.Metric(metric)
	if got, want := v1.Value-v0.Value, int64(n)*per; got != want {
		t.Fatalf("%s moved by %d over %d requests, want %d", metric, got, n, want)
	}
	perReq := float64(m1.Value-m0.Value) / n
	t.Logf("%.4f guest heap allocations per %s (%d over %d); %s moved by %s", perReq, what, m1.Value-m0.Value, n, metric, strconv.FormatInt(v1.Value-v0.Value, 10))
	if perReq > 0.01 {
		t.Errorf("%.4f allocations per %s in the guest", perReq, what)
	}
}
