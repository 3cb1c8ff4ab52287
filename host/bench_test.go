package host

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

var benchRequest = Request{
	Method: "GET", Path: "/plain?x=1", Authority: "api.example",
	Headers: [][2]string{
		{"user-agent", "bench/1.0"}, {"accept", "*/*"}, {"x-api-key", "k-123"}, {"x-forwarded-for", "203.0.113.9"},
	},
	RemoteAddr: "10.0.0.1:1234", LocalAddr: "127.0.0.1:8080",
}

func okUpstream(*Request) *Response { return &Response{Status: 200} }

// One full request cycle through Exchange: context create, request headers, upstream,
// response headers, log, done, delete.
func benchExchange(b *testing.B, guestName string, workers int, parallel bool) {
	benchExchangeOpts(b, guestName, Options{Workers: workers}, parallel)
}

func benchExchangeOpts(b *testing.B, guestName string, opts Options, parallel bool) {
	h, _ := newHost(b, guestName, opts)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	if !parallel {
		for i := 0; i < b.N; i++ {
			req := benchRequest
			if _, err := h.Exchange(ctx, &req, okUpstream); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := benchRequest
			if _, err := h.Exchange(ctx, &req, okUpstream); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkExchangeMinimal(b *testing.B) { benchExchange(b, "minimal", 1, false) }
func BenchmarkExchangeKitchen(b *testing.B) { benchExchange(b, "kitchen", 1, false) }
func BenchmarkExchangeKitchenCallTimeout(b *testing.B) {
	benchExchangeOpts(b, "kitchen", Options{Workers: 1, CallTimeout: 10 * time.Second}, false)
}
func BenchmarkExchangeMinimalParallel(b *testing.B) { benchExchange(b, "minimal", 2, true) }
func BenchmarkExchangeKitchenParallel(b *testing.B) { benchExchange(b, "kitchen", 2, true) }

// The net/http path without a network: Handler with a recorder.
func BenchmarkHandlerMinimal(b *testing.B) {
	h, _ := newHost(b, "minimal", Options{Workers: 1})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	hd := h.Handler(up)
	req := httptest.NewRequest("GET", "/plain?x=1", nil)
	req.Header.Set("X-Api-Key", "k-123")
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec := httptest.NewRecorder()
		hd.ServeHTTP(rec, req)
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}

// The same upstream without the filter, for comparison.
func BenchmarkHandlerNoFilter(b *testing.B) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	req := httptest.NewRequest("GET", "/plain?x=1", nil)
	req.Header.Set("X-Api-Key", "k-123")
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		rec := httptest.NewRecorder()
		up.ServeHTTP(rec, req)
	}
}

func BenchmarkSharedDataSet(b *testing.B) {
	d := newSharedData()
	key, val := []byte("rule:key"), []byte("0123456789abcdef")
	d.SetBytes(key, val, 0)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_, cas, _ := d.GetInto(key, val[:0:0])
		d.SetBytes(key, val, cas)
	}
}
