package host

import (
	"context"
	"testing"
)

// The denier guest (testdata/guests/denier), bench/envoy's floor under a Proxy-Wasm denial:
// every request refused with 429, its body and its two headers, none reaching the upstream.
func TestDenierGuest(t *testing.T) {
	h, _ := newHost(t, "denier", Options{Workers: 1})
	for i := 0; i < 3; i++ {
		resp, err := h.Exchange(context.Background(), &Request{Method: "GET", Path: "/", Authority: "x"}, func(*Request) *Response {
			t.Error("the upstream was called")
			return &Response{Status: 200}
		})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"content-type": "text/plain; charset=utf-8", "retry-after": "3600"}
		got := map[string]string{}
		for _, kv := range resp.Headers {
			got[kv[0]] = kv[1]
		}
		if resp.Status != 429 || !resp.Local || string(resp.Body) != "rate limited\n" || resp.Details != "denier" ||
			got["content-type"] != want["content-type"] || got["retry-after"] != want["retry-after"] {
			t.Fatalf("request %d: %d local=%v %q %q %v", i, resp.Status, resp.Local, resp.Body, resp.Details, resp.Headers)
		}
	}
}
