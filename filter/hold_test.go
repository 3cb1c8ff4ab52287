package filter_test

import (
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Native tests of shaping (hold.go): workers over one shared data, each a VM
// on a fake host with a clock the test moves, ticks it delivers when their
// period says, and resumes it records with the time.

type holdHost struct {
	*filtertest.Host
	tickMS    uint32
	nextTick  int64 // when the tick period says the next proxy_on_tick is due
	effective uint32
	live      map[uint32]bool
	released  map[uint32]int64 // stream → when it was resumed
	local     map[uint32]*filtertest.LocalResponse
	recorded  map[uint32][]uint64
	inStream  uint32
	foreign   int // resumes from a stream callback
}

func (h *holdHost) SetEffectiveContext(id uint32) abi.Status {
	if !h.live[id] {
		return abi.StatusNotFound
	}
	h.effective = id
	return abi.StatusOK
}

func (h *holdHost) ContinueStream() abi.Status {
	if h.inStream != 0 {
		h.foreign++
	}
	h.released[h.effective] = h.Now_
	return abi.StatusOK
}

func (h *holdHost) SetTickPeriod(ms uint32) abi.Status {
	h.tickMS = ms
	h.nextTick = h.Now_ + int64(ms)*1e6
	return abi.StatusOK
}

func (h *holdHost) RecordMetric(id uint32, v uint64) abi.Status {
	h.recorded[id] = append(h.recorded[id], v)
	return abi.StatusOK
}

// SendLocalResponse records a response sent from a root callback (a refusal
// of held requests) by the effective stream.
func (h *holdHost) SendLocalResponse(status int, details string, body []byte, headers []abi.Header, grpcStatus int32) abi.Status {
	st := h.Host.SendLocalResponse(status, details, body, headers, grpcStatus)
	if h.inStream == 0 && h.Local != nil {
		h.local[h.effective] = h.Local
		h.Local = nil
	}
	return st
}

type holdWorker struct {
	h  *holdHost
	vm *filter.VM
}

type holdRig struct {
	t       *testing.T
	shared  *filtertest.SharedData
	metrics *filtertest.Metrics
	w       []*holdWorker
	next    uint32
	now     int64
}

func startHoldRig(t *testing.T, cfg string, workers int) *holdRig {
	t.Helper()
	r := &holdRig{t: t, shared: filtertest.NewSharedData(), metrics: filtertest.NewMetrics(), next: 10, now: t0}
	for i := 0; i < workers; i++ {
		h := &holdHost{Host: &filtertest.Host{Shared: r.shared, Metrics: r.metrics, Now_: t0, Config: []byte(cfg)},
			live: map[uint32]bool{}, released: map[uint32]int64{}, local: map[uint32]*filtertest.LocalResponse{},
			recorded: map[uint32][]uint64{}}
		vm := filter.NewVM(h)
		vm.OnContextCreate(1, 0)
		if !vm.OnVMStart(1, 0) || !vm.OnConfigure(1, len(cfg)) {
			t.Fatalf("plugin refused to start: %v", h.Logs)
		}
		r.w = append(r.w, &holdWorker{h, vm})
	}
	t.Cleanup(func() {
		for _, w := range r.w {
			if w.h.foreign > 0 {
				t.Errorf("%d streams resumed from a stream's callback", w.h.foreign)
			}
		}
	})
	return r
}

// request sends a request of user to worker i; it returns the stream id, the
// action, and the local response if one was sent.
func (r *holdRig) request(i int, user string) (uint32, abi.Action, *filtertest.LocalResponse) {
	w := r.w[i]
	r.next++
	id := r.next
	w.h.live[id] = true
	w.h.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/"}, {":authority", "x"}, {"x-user", user}}
	w.h.Properties = map[string]string{}
	w.h.Local = nil
	w.vm.OnContextCreate(id, 1)
	w.h.inStream = id
	act := w.vm.OnRequestHeaders(id, 4, true)
	w.h.inStream = 0
	lr := w.h.Local
	if lr != nil {
		r.end(i, id)
	}
	return id, act, lr
}

// respond runs a released stream's response and end; it returns the
// response headers the filter added.
func (r *holdRig) respond(i int, id uint32) map[string]string {
	w := r.w[i]
	w.h.RespHeaders = [][2]string{{":status", "200"}}
	w.h.inStream = id
	w.vm.OnResponseHeaders(id, 1, false)
	w.h.inStream = 0
	got := map[string]string{}
	for _, kv := range w.h.RespHeaders[1:] {
		got[kv[0]] = kv[1]
	}
	r.end(i, id)
	return got
}

func (r *holdRig) end(i int, id uint32) {
	w := r.w[i]
	delete(w.h.live, id)
	w.h.inStream = id
	w.vm.OnLog(id)
	w.vm.OnDone(id)
	w.vm.OnDelete(id)
	w.h.inStream = 0
}

// advance moves every worker's clock to `to`, delivering each tick when its
// period says (in time order across workers).
func (r *holdRig) advance(to int64) {
	for {
		var w *holdWorker
		for _, x := range r.w {
			if x.h.tickMS > 0 && x.h.nextTick <= to && (w == nil || x.h.nextTick < w.h.nextTick) {
				w = x
			}
		}
		if w == nil {
			break
		}
		at := w.h.nextTick
		for _, x := range r.w {
			x.h.Now_ = at
		}
		w.h.nextTick = at + int64(w.h.tickMS)*1e6 // re-armed after the tick, unless it sets a new period
		w.vm.OnTick(1)
	}
	for _, x := range r.w {
		x.h.Now_ = to
	}
	r.now = to
}

func (r *holdRig) metric(name string) int64 {
	v, _ := r.metrics.Get(name)
	return v
}

const shapeCfg = `{"rules":[{"name":"db","key":[{"header":"x-user"}],"algorithm":"leaky_bucket",
 "limit":10,"window":"1s","burst":1,"delay":{"max":"3s"}}]}`

// The shaping issue's check, natively: 50 concurrent requests over two
// workers at a 10/s leaky bucket (burst 1) with delay.max 3s. One goes at
// once, 30 are held and released 100 ms apart exactly (each at its tick,
// never before its slot), the other 19 are refused at once with
// Retry-After 1; the metrics count it all; the responses say how long
// each was held.
func TestHoldBurstOf50(t *testing.T) {
	r := startHoldRig(t, shapeCfg, 2)
	type req struct {
		w  int
		id uint32
	}
	var held []req
	continued, refused := 0, 0
	for i := 0; i < 50; i++ {
		id, act, lr := r.request(i%2, "alice")
		switch {
		case lr != nil:
			if lr.Status != 429 || header(lr.Headers, "retry-after") != "1" {
				t.Fatalf("request %d: %d %v", i, lr.Status, lr.Headers)
			}
			refused++
		case act == abi.ActionContinue:
			continued++
			r.respond(i%2, id)
		default:
			held = append(held, req{i % 2, id})
		}
	}
	if continued != 1 || len(held) != 30 || refused != 19 {
		t.Fatalf("continued %d, held %d, refused %d; want 1, 30, 19", continued, len(held), refused)
	}
	if g := r.metric("sluice.db.held"); g != 30 {
		t.Fatalf("held gauge %d, want 30", g)
	}
	for i, want := range []uint32{200, 100} { // worker 1 holds the first slot, worker 0 the second
		if got := r.w[i].h.tickMS; got != want {
			t.Fatalf("worker %d: tick period %d ms, want %d (its first release)", i, got, want)
		}
	}
	r.advance(t0 + int64(4*time.Second))
	var at []int64
	for _, q := range held {
		rel, ok := r.w[q.w].h.released[q.id]
		if !ok {
			t.Fatalf("stream %d never released", q.id)
		}
		at = append(at, rel)
		hd := r.respond(q.w, q.id)
		ms, _ := strconv.ParseInt(hd[filter.DelayHeader], 10, 64)
		if ms != (rel-t0)/1e6 {
			t.Fatalf("stream %d released at +%v says %s: %q", q.id, time.Duration(rel-t0), filter.DelayHeader, hd[filter.DelayHeader])
		}
	}
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	for k, a := range at {
		if want := t0 + int64(k+1)*int64(100*time.Millisecond); a != want {
			t.Fatalf("release %d at +%v, want +%v", k, time.Duration(a-t0), time.Duration(want-t0))
		}
	}
	for name, want := range map[string]int64{
		"sluice.db.allowed": 31, "sluice.db.denied": 19, "sluice.db.delayed": 30, "sluice.db.delay_refused": 19,
		"sluice.db.held": 0, "sluice.db.delay_abandoned": 0,
	} {
		if got := r.metric(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	var hist []uint64
	for _, w := range r.w {
		for _, v := range w.h.recorded {
			hist = append(hist, v...)
		}
	}
	sort.Slice(hist, func(i, j int) bool { return hist[i] < hist[j] })
	if len(hist) != 30 || hist[0] != 100 || hist[29] != 3000 {
		t.Fatalf("delay histogram %v", hist)
	}
	for _, w := range r.w {
		if w.h.tickMS != 0 {
			t.Fatalf("tick period %d ms after the last release, want 0 (no remote rule)", w.h.tickMS)
		}
	}
}

// A client that goes away while held: the latest slot is given back (the
// next request gets it), an earlier one is not (requests are queued behind
// it).
func TestHoldAbandonGivesBackTheLatestSlot(t *testing.T) {
	r := startHoldRig(t, shapeCfg, 1)
	r.request(0, "bob") // at once
	a, _, _ := r.request(0, "bob")
	b, _, _ := r.request(0, "bob")
	c, act, _ := r.request(0, "bob") // slots +100, +200, +300 ms
	if act != abi.ActionPause {
		t.Fatalf("third held request: %v", act)
	}
	r.end(0, c) // the latest: given back
	d, _, _ := r.request(0, "bob")
	r.end(0, b) // not the latest: d is queued behind it
	e, _, _ := r.request(0, "bob")
	r.advance(t0 + int64(time.Second))
	h := r.w[0].h
	for id, want := range map[uint32]time.Duration{a: 100 * time.Millisecond, d: 300 * time.Millisecond, e: 400 * time.Millisecond} {
		if got := time.Duration(h.released[id] - t0); got != want {
			t.Errorf("stream %d released at +%v, want +%v", id, got, want)
		}
	}
	if _, ok := h.released[b]; ok {
		t.Error("an abandoned stream was resumed")
	}
	if got := r.metric("sluice.db.delay_abandoned"); got != 2 {
		t.Errorf("delay_abandoned %d, want 2", got)
	}
	if got := r.metric("sluice.db.held"); got != 0 {
		t.Errorf("held gauge %d, want 0", got)
	}
}

// max_held bounds the held requests per worker: beyond it a request is
// decided as by a meter, behind the slots taken (refused with Retry-After
// 30: the two held requests have the next two 10 s slots), and counted as
// delay_refused.
func TestHoldMaxHeld(t *testing.T) {
	cfg := `{"rules":[{"name":"db","key":[{"header":"x-user"}],"algorithm":"token_bucket",
 "limit":1,"window":"10s","delay":{"max":"1m","max_held":2}}]}`
	r := startHoldRig(t, cfg, 1)
	if _, act, _ := r.request(0, "u"); act != abi.ActionContinue {
		t.Fatal("first request not admitted at once")
	}
	for i := 0; i < 2; i++ {
		if _, act, lr := r.request(0, "u"); act != abi.ActionPause || lr != nil {
			t.Fatalf("request %d not held", i)
		}
	}
	_, _, lr := r.request(0, "u")
	if lr == nil || lr.Status != 429 || header(lr.Headers, "retry-after") != "30" {
		t.Fatalf("beyond max_held: %+v, want 429 with Retry-After 30", lr)
	}
	if got := r.metric("sluice.db.delay_refused"); got != 1 {
		t.Errorf("delay_refused %d, want 1", got)
	}
}

// The root context ending refuses what it holds: 429 with the remaining
// wait as Retry-After, the slots given back where they are the latest.
func TestHoldRefusedWhenTheRootEnds(t *testing.T) {
	r := startHoldRig(t, shapeCfg, 1)
	r.request(0, "c")
	a, _, _ := r.request(0, "c")
	if r.w[0].vm.OnDone(1) != true {
		t.Fatal("OnDone of the root answered false")
	}
	lr := r.w[0].h.local[a]
	if lr == nil || lr.Status != 429 || header(lr.Headers, "retry-after") != "1" {
		t.Fatalf("held request at the root's end: %+v", lr)
	}
	if got := r.metric("sluice.db.held"); got != 0 {
		t.Errorf("held gauge %d, want 0", got)
	}
	r.advance(t0 + int64(time.Second))
	if len(r.w[0].h.released) != 0 {
		t.Fatalf("released after the root ended: %v", r.w[0].h.released)
	}
}

func header(h [][2]string, name string) string {
	for _, kv := range h {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}
