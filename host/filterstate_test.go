package host

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// proxy_set_property as Envoy serves it: a value per stream, replaced by a second set,
// readable by proxy_get_property in the same stream (one segment only), NOT_FOUND from a
// root context, invisible to other streams; Response.FilterState hands it over.
func TestSetPropertyPerStream(t *testing.T) {
	h, logs := newHost(t, "kitchen", Options{Workers: 1})
	var seen string
	up := func(r *Request) *Response {
		for _, p := range r.Headers {
			if p[0] == "x-set-property" {
				seen = p[1]
			}
		}
		return &Response{Status: 200}
	}
	resp := mustExchange(t, h, &Request{Path: "/set-property"}, up)
	want := "set test.a=0;set test.a=0;set test.b=0;get test.a=2/0;get test.b=x/0;get test.c=/1;get test.a=/1;root=1"
	if seen != want {
		t.Errorf("guest saw\n %s\nwant\n %s", seen, want)
	}
	if wantFS := []FilterState{{"test.a", "2"}, {"test.b", "x"}}; !reflect.DeepEqual(resp.FilterState, wantFS) {
		t.Errorf("FilterState %v, want %v", resp.FilterState, wantFS)
	}
	// The next stream (same worker, same VM) starts with none.
	resp = mustExchange(t, h, &Request{Path: "/get-property"}, nil)
	if string(resp.Body) != "test.a=/1" || resp.FilterState != nil {
		t.Errorf("another stream: %q, FilterState %v", resp.Body, resp.FilterState)
	}
	if logs.count("proxy_set_property") != 0 {
		t.Errorf("proxy_set_property reported as unimplemented:\n%s", logs)
	}
}

// A stream never holds more than maxFilterState names; replacing one still works.
func TestFilterStateBound(t *testing.T) {
	var r streamRecord
	for i := 0; i < maxFilterState; i++ {
		if !r.set([]byte("k"+strings.Repeat("x", i)), []byte("v")) {
			t.Fatalf("set %d refused", i)
		}
	}
	if r.set([]byte("one-more"), []byte("v")) {
		t.Error("a name beyond the bound was kept")
	}
	if !r.set([]byte("k"), []byte("w")) {
		t.Error("replacing a kept name was refused")
	}
	if v, ok := r.get([]byte("k")); !ok || v != "w" {
		t.Errorf("k = %q %v", v, ok)
	}
}

// Options.AccessLog gets one entry per request through Handler and Exchange: the request,
// the status and body size the client got, a local reply's details, and the filter state.
func TestAccessLogEntries(t *testing.T) {
	var mu sync.Mutex
	var got []AccessLogEntry
	h, _ := newHost(t, "kitchen", Options{Workers: 2, AccessLog: func(e AccessLogEntry) {
		mu.Lock()
		got = append(got, e)
		mu.Unlock()
	}})
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello") })
	srv := httptest.NewServer(h.Handler(upstream))
	defer srv.Close()
	for _, p := range []string{"/set-property?q=1", "/local"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mustExchange(t, h, &Request{Method: "POST", Path: "/set-property", Authority: "api.example", RemoteAddr: "10.0.0.1:1234"}, nil)

	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("%d entries, want 3: %+v", len(got), got)
	}
	fs := []FilterState{{"test.a", "2"}, {"test.b", "x"}}
	e := got[0]
	if e.Method != "GET" || e.Path != "/set-property?q=1" || e.Status != 200 || e.BodyBytes != 5 || e.Details != "" ||
		!reflect.DeepEqual(e.FilterState, fs) || e.Protocol != "HTTP/1.1" || !strings.HasPrefix(e.RemoteAddr, "127.0.0.1:") || e.Start.IsZero() || e.Duration <= 0 {
		t.Errorf("handler entry %+v", e)
	}
	if e := got[1]; e.Path != "/local" || e.Status != 403 || e.BodyBytes != 5 || e.Details != "denied_by_kitchen" || e.FilterState != nil {
		t.Errorf("local reply entry %+v", e)
	}
	if e := got[2]; e.Method != "POST" || e.Authority != "api.example" || e.RemoteAddr != "10.0.0.1:1234" || e.Status != 200 || !reflect.DeepEqual(e.FilterState, fs) {
		t.Errorf("exchange entry %+v", e)
	}
}
