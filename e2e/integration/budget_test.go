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
	wasm := filtertest.Wasm(t, "sluice_debug")
	cfg := `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1h",
	  "cost":{"request":{"header":"x-max-tokens","default":500},"response":{"usage":"openai"}}}],"response":{"headers":"both"}}`
	h, err := host.New(context.Background(), host.Options{Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1,
		Logger: slog.New(slog.NewTextHandler(new(bytes.Buffer), nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`)
	up := func(*host.Request) *host.Response {
		return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "application/json"}}, Body: body}
	}
	req := &host.Request{Method: "POST", Path: "/v1/chat/completions", Authority: "example.test", RemoteAddr: "192.0.2.10:40000",
		Headers: [][2]string{{"x-api-key", "k1"}, {"x-max-tokens", "400"}}}
	for i := 0; i < 500; i++ {
		h.Exchange(context.Background(), req, up)
	}
	m0, _ := h.Metric(filter.DebugAllocsMetric)
	r0, _ := h.Metric("sluice.llm.refunded")
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
	r1, _ := h.Metric("sluice.llm.refunded")
	if got, want := r1.Value-r0.Value, int64(n*(400-42)); got != want {
		t.Fatalf("refunded %d over %d requests, want %d (each reserved 400 and used 42)", got, n, want)
	}
	per := float64(m1.Value-m0.Value) / n
	t.Logf("%.4f guest heap allocations per settled request (%d over %d); refunded %s units", per, m1.Value-m0.Value, n, strconv.FormatInt(r1.Value-r0.Value, 10))
	if per > 0.01 {
		t.Errorf("%.4f allocations per settled request in the guest", per)
	}
}

// TestGuestAllocationsPerBodyReservation: a reservation read from the JSON request body
// (the headers held while the body is read, as with Envoy's
// allow_on_headers_stop_iteration), settled by the response's usage, allocates nothing
// in the guest per request once warm.
func TestGuestAllocationsPerBodyReservation(t *testing.T) {
	wasm := filtertest.Wasm(t, "sluice_debug")
	cfg := `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1h",
	  "cost":{"request":{"json":"max_tokens","default":500},"response":{"usage":"openai"}}}],"response":{"headers":"both"}}`
	h, err := host.New(context.Background(), host.Options{Wasm: wasm, PluginConfig: []byte(cfg), Workers: 1, AllowOnHeadersStopIteration: true,
		Logger: slog.New(slog.NewTextHandler(new(bytes.Buffer), nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	body := []byte(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`)
	up := func(*host.Request) *host.Response {
		return &host.Response{Status: 200, Headers: [][2]string{{"content-type", "application/json"}}, Body: body}
	}
	req := &host.Request{Method: "POST", Path: "/v1/chat/completions", Authority: "example.test", RemoteAddr: "192.0.2.10:40000",
		Headers: [][2]string{{"x-api-key", "k1"}, {"content-type", "application/json"}},
		Body:    []byte(`{"model":"m","messages":[{"role":"user","content":"Count to five."}],"max_tokens":400}`)}
	for i := 0; i < 500; i++ {
		h.Exchange(context.Background(), req, up)
	}
	m0, _ := h.Metric(filter.DebugAllocsMetric)
	r0, _ := h.Metric("sluice.llm.reserved")
	const n = 10000
	for i := 0; i < n; i++ {
		resp, err := h.Exchange(context.Background(), req, up)
		if err != nil || resp.Status != 200 || !bytes.Equal(resp.Body, body) {
			t.Fatalf("request %d: %v %+v", i, err, resp)
		}
	}
	m1, _ := h.Metric(filter.DebugAllocsMetric)
	r1, _ := h.Metric("sluice.llm.reserved")
	if got, want := r1.Value-r0.Value, int64(n*400); got != want {
		t.Fatalf("reserved %d over %d requests, want %d (each the body's max_tokens, 400)", got, n, want)
	}
	per := float64(m1.Value-m0.Value) / n
	t.Logf("%.4f guest heap allocations per request reserved from its body (%d over %d)", per, m1.Value-m0.Value, n)
	if per > 0.01 {
		t.Errorf("%.4f allocations per request in the guest", per)
	}
}
