package host

import (
	"context"
	"encoding/binary"
	"testing"
)

// The counter guest (testdata/guests/counter), bench/envoy's floor under an exact
// shared-data admission: every request goes through, and each one with an x-key counts
// once in that key's shared-data entry, with the time of its last request.
func TestCounterGuest(t *testing.T) {
	h, _ := newHost(t, "counter", Options{Workers: 2})
	send := func(key string) {
		t.Helper()
		req := &Request{Method: "GET", Path: "/", Authority: "x"}
		if key != "" {
			req.Headers = [][2]string{{"x-key", key}}
		}
		resp, err := h.Exchange(context.Background(), req, func(*Request) *Response { return &Response{Status: 200} })
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != 200 || resp.Local {
			t.Fatalf("key %q: %d local=%v", key, resp.Status, resp.Local)
		}
	}
	for i := 0; i < 40; i++ {
		send("a")
		if i%4 == 0 {
			send("b")
		}
	}
	send("")
	for key, want := range map[string]uint64{"floor:a": 40, "floor:b": 10} {
		v, _, ok := h.SharedData().Get(key)
		if !ok || len(v) != 25 {
			t.Fatalf("%s: %x, %v", key, v, ok)
		}
		if n, at := binary.LittleEndian.Uint64(v), binary.LittleEndian.Uint64(v[8:]); n != want || at == 0 {
			t.Errorf("%s: count %d at %d, want %d at a nonzero time", key, n, at, want)
		}
	}
	if n := h.SharedData().Len(); n != 2 {
		t.Errorf("%d shared-data entries, want 2 (a request without x-key counts nowhere)", n)
	}
}
