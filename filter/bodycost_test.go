package filter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Native tests of reservations read from the request body (bodycost.go): a fake host
// that holds each stream's headers and body as Envoy does with
// allow_on_headers_stop_iteration (the body buffered while the callback answers
// StopIterationAndBuffer, proxy_get_buffer_bytes serving all of it), ticks on a clock
// the test moves, and records resumes.

type bodyHost struct {
	*holdHost
	hdrs   map[uint32][][2]string
	bodies map[uint32][]byte
}

func (h *bodyHost) cur() uint32 {
	if h.inStream != 0 {
		return h.inStream
	}
	return h.effective
}

func (h *bodyHost) SetEffectiveContext(id uint32) abi.Status {
	st := h.holdHost.SetEffectiveContext(id)
	if st == abi.StatusOK {
		h.ReqHeaders = h.hdrs[id]
	}
	return st
}

func (h *bodyHost) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	if bt != abi.BufferRequestBody {
		return h.Host.GetBuffer(bt, start, max)
	}
	b := h.bodies[h.cur()]
	if start < 0 || start > len(b) {
		return nil, abi.StatusBadArgument
	}
	b = b[start:]
	if max < len(b) {
		b = b[:max]
	}
	return append([]byte(nil), b...), abi.StatusOK
}

type bodyRig struct {
	t    *testing.T
	h    *bodyHost
	vm   *filter.VM
	next uint32
}

func startBodyRig(t *testing.T, cfg string) *bodyRig {
	t.Helper()
	hh := &holdHost{Host: &filtertest.Host{Shared: filtertest.NewSharedData(), Metrics: filtertest.NewMetrics(), Now_: t0, Config: []byte(cfg)},
		live: map[uint32]bool{}, released: map[uint32]int64{}, local: map[uint32]*filtertest.LocalResponse{}, recorded: map[uint32][]uint64{}}
	h := &bodyHost{holdHost: hh, hdrs: map[uint32][][2]string{}, bodies: map[uint32][]byte{}}
	vm := filter.NewVM(h)
	vm.OnContextCreate(1, 0)
	if !vm.OnVMStart(1, 0) || !vm.OnConfigure(1, len(cfg)) {
		t.Fatalf("plugin refused to start: %v", hh.Logs)
	}
	t.Cleanup(func() {
		if hh.foreign > 0 {
			t.Errorf("%d streams resumed from a stream's callback", hh.foreign)
		}
	})
	return &bodyRig{t: t, h: h, vm: vm, next: 10}
}

// start sends the headers of a POST of key to path (body: end of stream at the
// headers when false); it returns the stream and the action.
func (r *bodyRig) start(key, path string, body bool) (uint32, abi.Action) {
	h := r.h
	r.next++
	id := r.next
	h.live[id] = true
	h.hdrs[id] = [][2]string{{":method", "POST"}, {":path", path}, {":authority", "x"}, {"x-api-key", key}, {"content-type", "application/json"}}
	h.ReqHeaders = h.hdrs[id]
	h.Properties = map[string]string{}
	h.Local = nil
	r.vm.OnContextCreate(id, 1)
	h.inStream = id
	act := r.vm.OnRequestHeaders(id, len(h.ReqHeaders), !body)
	h.inStream = 0
	return id, act
}

// chunk delivers the next piece of id's body (the host buffers it after what
// came before); it returns the action.
func (r *bodyRig) chunk(id uint32, piece string, eos bool) abi.Action {
	h := r.h
	h.bodies[id] = append(h.bodies[id], piece...)
	h.ReqHeaders = h.hdrs[id]
	h.Local = nil
	h.inStream = id
	act := r.vm.OnRequestBody(id, len(h.bodies[id]), eos)
	h.inStream = 0
	if act == abi.ActionContinue {
		h.bodies[id] = nil // gone upstream: the next chunk comes alone
	}
	return act
}

// end runs the stream's log, done and delete.
func (r *bodyRig) end(id uint32) {
	h := r.h
	delete(h.live, id)
	h.inStream = id
	r.vm.OnLog(id)
	r.vm.OnDone(id)
	r.vm.OnDelete(id)
	h.inStream = 0
}

// advance moves the clock to `to`, delivering each tick when the period says.
func (r *bodyRig) advance(to int64) {
	h := r.h
	for h.tickMS > 0 && h.nextTick <= to {
		h.Now_ = h.nextTick
		h.nextTick += int64(h.tickMS) * 1e6
		r.vm.OnTick(1)
	}
	h.Now_ = to
}

func (r *bodyRig) metric(name string) int64 {
	v, _ := r.h.Metrics.Get(name)
	return v
}

const bodyCfg = `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h",
 "match":{"path_prefix":"/v1/"},
 "cost":{"request":{"json":"max_tokens","default":500,"max_body":256,"body_timeout":"2s"}}}]}`

// The reservation is the body's field, read as the chunks come while the headers wait:
// nothing goes on before the decision, a reservation that does not fit is refused at the
// body (with the exact Retry-After), and the headers and body go on together when admitted.
func TestBodyReservation(t *testing.T) {
	r := startBodyRig(t, bodyCfg)
	id, act := r.start("k", "/v1/chat", true)
	if act != abi.ActionPause {
		t.Fatalf("headers of a request whose reservation is in its body: %v, want Pause", act)
	}
	// The number split across chunks counts only once it is complete.
	if act := r.chunk(id, `{"model":"m","max_tokens":3`, false); act != abi.ActionPause {
		t.Fatalf("first chunk: %v, want Pause (StopIterationAndBuffer)", act)
	}
	if act := r.chunk(id, `00,"messages":[]}`, true); act != abi.ActionContinue {
		t.Fatalf("last chunk: %v, want Continue (admitted)", act)
	}
	r.end(id)
	if got := r.metric("sluice.llm.reserved"); got != 300 {
		t.Fatalf("reserved %d, want 300", got)
	}
	// 800 does not fit in the 700 left: refused at its body, Retry-After for 100 units
	// at 1000/h = 360 s.
	id, _ = r.start("k", "/v1/chat", true)
	if act := r.chunk(id, `{"max_tokens":800}`, true); act == abi.ActionContinue {
		t.Fatal("a reservation of 800 with 700 left went on")
	}
	lr := r.h.Local
	if lr == nil || lr.Status != 429 || header(lr.Headers, "retry-after") != "360" {
		t.Fatalf("refusal: %+v, want 429 with retry-after 360", lr)
	}
	r.end(id)
	// A request without a body reserves the default at its headers.
	id, act = r.start("k", "/v1/chat", false)
	if act != abi.ActionContinue {
		t.Fatalf("a request without a body: %v, want Continue at its headers", act)
	}
	r.end(id)
	if got := r.metric("sluice.llm.reserved"); got != 800 {
		t.Fatalf("reserved %d, want 800 (300 + the default 500)", got)
	}
	// A request the rule does not match goes on at its headers, body or not.
	id, act = r.start("k", "/other", true)
	if act != abi.ActionContinue {
		t.Fatalf("a request no body rule matches: %v, want Continue", act)
	}
	if act := r.chunk(id, `{"max_tokens":1}`, true); act != abi.ActionContinue {
		t.Fatalf("its body: %v, want Continue", act)
	}
	r.end(id)
	if len(r.h.released) != 0 {
		t.Fatalf("resumed from a tick: %v (every decision here was in a callback)", r.h.released)
	}
}

// What the body holds decides the reservation; anything but a whole number from 1 in the
// first max_body bytes reserves the default.
func TestBodyReservationValues(t *testing.T) {
	cases := []struct {
		name  string
		body  []string
		units int64
	}{
		{"plain", []string{`{"max_tokens":42}`}, 42},
		{"last of a repeated key", []string{`{"max_tokens":1,"x":2,`, `"max_tokens":150}`}, 150},
		{"nested elsewhere", []string{`{"a":{"max_tokens":9},"max_tokens":7}`}, 7},
		{"absent", []string{`{"model":"m"}`}, 500},
		{"null", []string{`{"max_tokens":null}`}, 500},
		{"string", []string{`{"max_tokens":"300"}`}, 500},
		{"fraction", []string{`{"max_tokens":12.5}`}, 500},
		{"zero", []string{`{"max_tokens":0}`}, 500},
		{"negative", []string{`{"max_tokens":-5}`}, 500},
		{"beyond the limit", []string{`{"max_tokens":1000000001}`}, 500},
		{"huge", []string{`{"max_tokens":` + strings.Repeat("9", 400) + `}`}, 500},
		{"not JSON", []string{`max_tokens=300`}, 500},
		{"cut short", []string{`{"max_tokens":300`}, 500},
		{"empty", []string{``}, 500},
		{"beyond max_body", []string{`{"pad":"` + strings.Repeat("x", 300) + `","max_tokens":10}`}, 500},
		{"within max_body, rest malformed", []string{`{"max_tokens":10,`, strings.Repeat("}", 300)}, 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := startBodyRig(t, bodyCfg)
			id, _ := r.start("k", "/v1/chat", true)
			act := abi.ActionPause
			for i, p := range c.body {
				act = r.chunk(id, p, i == len(c.body)-1)
			}
			if act != abi.ActionContinue {
				// max_body reached before the end: decided then; the rest flows.
				t.Fatalf("body: %v, want Continue", act)
			}
			r.end(id)
			if got := r.metric("sluice.llm.reserved"); got != c.units {
				t.Fatalf("reserved %d, want %d", got, c.units)
			}
		})
	}
}

// A body longer than max_body is decided when max_body bytes have come: the later
// chunks flow on.
func TestBodyReservationMaxBody(t *testing.T) {
	r := startBodyRig(t, bodyCfg)
	id, _ := r.start("k", "/v1/chat", true)
	if act := r.chunk(id, `{"max_tokens":64,"pad":"`+strings.Repeat("x", 100), false); act != abi.ActionPause {
		t.Fatalf("first chunk: %v, want Pause", act)
	}
	if act := r.chunk(id, strings.Repeat("x", 200), false); act != abi.ActionContinue {
		t.Fatalf("the chunk that reaches max_body: %v, want Continue", act)
	}
	if act := r.chunk(id, strings.Repeat("x", 5000)+`"}`, true); act != abi.ActionContinue {
		t.Fatalf("a chunk after the decision: %v, want Continue", act)
	}
	r.end(id)
	if got := r.metric("sluice.llm.reserved"); got != 64 {
		t.Fatalf("reserved %d, want 64", got)
	}
}

// A host that never passes the body while the headers wait (Envoy without
// allow_on_headers_stop_iteration) gets every such request decided at body_timeout on
// the default, resumed from the tick, counted, and one warning naming the setting; a
// slow body is decided with what has come.
func TestBodyReservationTimeout(t *testing.T) {
	r := startBodyRig(t, bodyCfg)
	id, act := r.start("k", "/v1/chat", true)
	if act != abi.ActionPause {
		t.Fatalf("headers: %v, want Pause", act)
	}
	if r.h.tickMS == 0 {
		t.Fatal("no tick armed for the body timeout")
	}
	r.advance(t0 + int64(2*time.Second) - 1)
	if _, ok := r.h.released[id]; ok {
		t.Fatal("resumed before body_timeout")
	}
	r.advance(t0 + int64(2*time.Second) + int64(time.Second))
	at, ok := r.h.released[id]
	if !ok || at < t0+int64(2*time.Second) {
		t.Fatalf("resumed: %v at %d, want at body_timeout (2 s)", ok, at-t0)
	}
	r.end(id)
	if got := r.metric("sluice.llm.reserved"); got != 500 {
		t.Fatalf("reserved %d, want the default 500", got)
	}
	if got := r.metric("sluice.llm.body_timeouts"); got != 1 {
		t.Fatalf("body_timeouts %d, want 1", got)
	}
	warned := 0
	for _, l := range r.h.Logs {
		if strings.Contains(l.Msg, "allow_on_headers_stop_iteration") {
			warned++
		}
	}
	if warned != 1 {
		t.Fatalf("%d warnings naming allow_on_headers_stop_iteration, want 1: %v", warned, r.h.Logs)
	}
	// A body that comes too slowly: decided at the timeout on what came.
	start := r.h.Now_
	id, _ = r.start("k", "/v1/chat", true)
	r.chunk(id, `{"max_tokens":42,"messages":[`, false)
	r.advance(start + int64(3*time.Second))
	if _, ok := r.h.released[id]; !ok {
		t.Fatal("a slow body was not decided at body_timeout")
	}
	if act := r.chunk(id, `]}`, true); act != abi.ActionContinue {
		t.Fatalf("the rest of the body after the decision: %v, want Continue", act)
	}
	r.end(id)
	if got := r.metric("sluice.llm.reserved"); got != 542 {
		t.Fatalf("reserved %d, want 542 (500 + 42)", got)
	}
	if got := r.metric("sluice.llm.body_timeouts"); got != 2 {
		t.Fatalf("body_timeouts %d, want 2", got)
	}
	if r.h.tickMS != 0 {
		t.Fatalf("tick period %d ms with nothing waiting, want 0", r.h.tickMS)
	}
}

// A client that goes away while its body is read ends the wait: nothing resumes it; the
// root context's end decides what still waits.
func TestBodyReservationEnds(t *testing.T) {
	r := startBodyRig(t, bodyCfg)
	gone, _ := r.start("k", "/v1/chat", true)
	r.chunk(gone, `{"max_tokens":`, false)
	r.end(gone)
	waiting, _ := r.start("k", "/v1/chat", true)
	r.chunk(waiting, `{"max_tokens":77`, false)
	r.advance(t0 + int64(time.Second))
	r.h.inStream = 0
	if r.vm.OnDone(1) != true {
		t.Fatal("root proxy_on_done answered false")
	}
	if _, ok := r.h.released[gone]; ok {
		t.Fatal("a stream that ended was resumed")
	}
	if _, ok := r.h.released[waiting]; !ok {
		t.Fatal("the root's end left a request waiting for its body")
	}
	r.end(waiting)
	if got := r.metric("sluice.llm.reserved"); got != 500 {
		t.Fatalf("reserved %d, want 500 (the cut 77 is not committed: the default)", got)
	}
	if r.vm.Streams() != 0 {
		t.Fatalf("%d streams left", r.vm.Streams())
	}
}

// A request read from its body and then held for its slot (delay) keeps its body with
// its headers until released: a later chunk must not let it go early.
func TestBodyReservationHeld(t *testing.T) {
	cfg := `{"rules":[{"name":"llm","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":10,"window":"1s","burst":10,
 "delay":{"max":"3s"},"cost":{"request":{"json":"n","default":1,"max_body":16}}}]}`
	r := startBodyRig(t, cfg)
	id, _ := r.start("k", "/", true)
	if act := r.chunk(id, `{"n":10}`, true); act != abi.ActionContinue {
		t.Fatalf("10 of a full bucket of 10: %v, want Continue", act)
	}
	r.end(id)
	id, _ = r.start("k", "/", true)
	if act := r.chunk(id, `{"n":5,"pad":"xxxxxxxx`, false); act != abi.ActionPause {
		t.Fatalf("5 on an empty bucket (0.5 s to wait): %v, want Pause (held)", act)
	}
	if act := r.chunk(id, `xxxx"}`, true); act != abi.ActionPause {
		t.Fatalf("a chunk while held: %v, want Pause (StopIterationAndBuffer)", act)
	}
	r.advance(t0 + int64(time.Second))
	at, ok := r.h.released[id]
	if !ok || at < t0+int64(500*time.Millisecond) || at > t0+int64(502*time.Millisecond) {
		t.Fatalf("released %v at +%v, want at +500ms", ok, time.Duration(at-t0))
	}
	r.end(id)
	if got := r.metric("sluice.llm.reserved"); got != 15 {
		t.Fatalf("reserved %d, want 15", got)
	}
}
