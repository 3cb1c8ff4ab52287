package filter

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Tests of the remote-call engine (remote.go) on its own, through a third
// codec: toyCodec, a trivial text protocol over proxy_grpc_call. It is the
// whole of what the toy backend contributes — the seven methods of
// remoteCodec and nothing else — and the engine gives it what it gives
// Redis and RLS: pausing, coalescing, the guard, failure_mode, refunds, the
// streams that end while waiting.
//
// The configuration has no third backend name, so the rules are configured
// as backend "rls" (the toy rides the same transport) and the test swaps
// the engine the configuration built for one over the toy codec
// (startToy). The VM's gRPC callbacks then deliver the toy's replies to it
// unchanged: they look a token up in the engine's calls. A real third
// backend would add, outside the engine, its name in config, a case in
// Plugin.setup, and — on a transport of its own — the VM callback that
// hands the host's replies to remote.onReply/onFailure.
//
// The wire format. A call's message is one line per decision (after an
// "alt" line when the codec resends it in its second form):
//
//	D <rule> <hex key>        a decision (routeShared, routeOwn)
//	B <rule> <hex key> <n>    n coalesced decisions of one (rule, key)
//	R <rule> <hex key>        a refund
//	X                         a decision given up by the guard (a resend)
//
// A decision call is answered by one line per decision, in order:
// "+<remaining> <reset ms>" admits, "-<remaining> <retry ms>" denies,
// anything else fails that decision; a different number of lines fails the
// call. "RETRY" makes the codec resend the call in its alt form; "SKIP"
// makes it a faulty codec, which hands out none of the call's decisions. A
// refund is answered "OK".

const (
	toyService = "toy.Limiter"
	toyMethod  = "Decide"
	toyT0      = int64(1_767_225_600) * 1e9
	toyTimeout = 40 * time.Millisecond
	toyGuard   = toyTimeout + remoteGuardMargin // when the guard gives up on a call
)

var toyNames = remoteNames{
	calls: "sluice.toy.calls", failures: "sluice.toy.failures", timeouts: "sluice.toy.timeouts",
	failOpen: "sluice.toy.fail_open", failClosed: "sluice.toy.fail_closed", failLocal: "sluice.toy.fail_local",
	refunds: "sluice.toy.refunds", refundFailures: "sluice.toy.refund_failures",
	leased: "sluice.toy.leased", returned: "sluice.toy.returned",
}

// toyCodec is the third backend's codec.
type toyCodec struct {
	p      *Plugin
	e      *remote
	gh     GrpcHost
	rt     route      // how every rule's decisions travel
	refund refundKind // what becomes of an admission of a denied request
	msg    []byte     // the message being encoded
}

// toyWait is the toy's per-request data: the key each rule named.
type toyWait struct{ keys [][]byte }

var _ remoteCodec = (*toyCodec)(nil)

func (tc *toyCodec) newWait(n int) any {
	w := &toyWait{keys: make([][]byte, n)}
	for i := range w.keys {
		w.keys[i] = make([]byte, 0, 64)
	}
	return w
}

func (tc *toyCodec) prepare(w *remoteWait, i int, r *rule, _ bool) ([]byte, route) {
	x := w.x.(*toyWait)
	x.keys[i] = append(x.keys[i][:0], r.key...)
	return x.keys[i], tc.rt
}

func (tc *toyCodec) refundable(*remoteWait, int) refundKind { return tc.refund }

func appendToyLine(m []byte, op byte, rule string, key []byte) []byte {
	m = append(m, op, ' ')
	m = append(m, rule...)
	m = append(m, ' ')
	m = hex.AppendEncode(m, key)
	return m
}

func (tc *toyCodec) send(c *remoteCall, _ int64) (uint32, string) {
	m := tc.msg[:0]
	if c.alt {
		m = append(m, "alt\n"...)
	}
	switch {
	case c.kind == callDecide && c.q != nil:
		m = appendToyLine(m, 'B', tc.p.rules[c.q.rule].id, c.q.key)
		m = append(m, ' ')
		m = strconv.AppendInt(m, int64(len(c.slots)), 10)
		m = append(m, '\n')
	case c.kind == callDecide || c.kind == callRefund:
		op := byte('D')
		if c.kind == callRefund {
			op = 'R'
		}
		for _, sl := range c.slots {
			if sl.w == nil {
				m = append(m, "X\n"...)
				continue
			}
			m = appendToyLine(m, op, tc.p.rules[sl.i].id, sl.w.x.(*toyWait).keys[sl.i])
			m = append(m, '\n')
		}
	default:
		return 0, "no leases"
	}
	tc.msg = m
	token, st := tc.gh.GrpcCall(tc.p.cfg.RLS.Cluster, toyService, toyMethod, m, uint32(tc.p.cfg.RLS.TimeoutMS))
	if st != abi.StatusOK {
		return 0, "toy call: " + st.String()
	}
	return token, ""
}

func (tc *toyCodec) reply(c *remoteCall, size int, _ int64) outcome {
	b, st := tc.p.host.GetBuffer(abi.BufferGrpcReceive, 0, size)
	if st != abi.StatusOK {
		return outcome{why: "reading the reply: " + st.String()}
	}
	if string(b) == "RETRY" && !c.alt {
		c.alt = true
		return outcome{retry: true}
	}
	if string(b) == "SKIP" {
		return outcome{} // a faulty codec: a call answered, its decisions not handed out
	}
	if c.kind != callDecide {
		if string(b) == "OK" {
			return outcome{}
		}
		return outcome{why: "refund answered " + strconv.Quote(string(b))}
	}
	n := 0
	if len(b) > 0 {
		n = 1 + bytes.Count(b, []byte{'\n'})
	}
	if n != len(c.slots) {
		return outcome{why: strconv.Itoa(n) + " answers for " + strconv.Itoa(len(c.slots)) + " decisions"}
	}
	for k, sl := range c.slots {
		line := b
		if j := bytes.IndexByte(b, '\n'); j >= 0 {
			line, b = b[:j], b[j+1:]
		}
		if sl.w == nil {
			continue // given up by the guard
		}
		d, ok := parseToyAnswer(line, tc.p.rules[sl.i].cfg.Burst)
		if !ok {
			tc.e.failRule(sl.w, sl.i, "answer "+strconv.Itoa(k)+" "+strconv.Quote(string(line)), false)
			continue
		}
		tc.e.decided(sl, d)
	}
	return outcome{}
}

// parseToyAnswer reads "+<remaining> <reset ms>" or "-<remaining> <retry ms>".
func parseToyAnswer(line []byte, limit int64) (algorithms.Decision, bool) {
	if len(line) < 4 || (line[0] != '+' && line[0] != '-') {
		return algorithms.Decision{}, false
	}
	sp := bytes.IndexByte(line, ' ')
	if sp < 0 {
		return algorithms.Decision{}, false
	}
	rem, ok1 := toyUint(line[1:sp])
	ms, ok2 := toyUint(line[sp+1:])
	if !ok1 || !ok2 {
		return algorithms.Decision{}, false
	}
	d := algorithms.Decision{Allowed: line[0] == '+', Limit: limit, Remaining: rem, ResetAfter: time.Duration(ms) * time.Millisecond}
	if !d.Allowed {
		d.RetryAfter = d.ResetAfter
	}
	return d, true
}

func toyUint(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 12 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

func (tc *toyCodec) failure(_ *remoteCall, status uint32) (string, bool) {
	return "gRPC status " + strconv.FormatUint(uint64(status), 10), status == grpcDeadlineExceeded
}

func (tc *toyCodec) cancel(token uint32) { tc.gh.GrpcCancel(token) }

// toyHost is the fake host: filtertest's, plus the gRPC calls (recorded, and
// answered by the test) and the calls that resume a stream. Request headers
// are read without allocating, for the allocation test.
type toyHost struct {
	*filtertest.Host
	refuse    abi.Status // GrpcCall fails with it
	next      uint32
	order     []uint32          // tokens, in call order
	sent      map[uint32]string // token → message
	cancelled []uint32
	reply     []byte
	effective uint32
	ended     map[uint32]bool // streams the host no longer has
	continued []uint32
	tickMS    uint32
	inStream  uint32 // the stream whose callback runs (0: a root callback)
	foreign   []string
	quiet     bool // record no messages (allocation test)
	added     int
	bytes     map[string][]byte
}

var _ GrpcHost = (*toyHost)(nil)

func (h *toyHost) GrpcCall(cluster, service, method string, msg []byte, timeoutMS uint32) (uint32, abi.Status) {
	if h.refuse != abi.StatusOK {
		return 0, h.refuse
	}
	if !h.quiet && (cluster != "toycluster" || service != toyService || method != toyMethod || timeoutMS != 40) {
		h.foreign = append(h.foreign, fmt.Sprintf("call %s %s/%s timeout %d", cluster, service, method, timeoutMS))
	}
	h.next++
	h.order = append(h.order, h.next)
	if !h.quiet {
		h.sent[h.next] = string(msg)
	}
	return h.next, abi.StatusOK
}

func (h *toyHost) GrpcCancel(token uint32) abi.Status {
	h.cancelled = append(h.cancelled, token)
	return abi.StatusOK
}

func (h *toyHost) Done() abi.Status                   { return abi.StatusOK }
func (h *toyHost) SetTickPeriod(ms uint32) abi.Status { h.tickMS = ms; return abi.StatusOK }

func (h *toyHost) SetEffectiveContext(id uint32) abi.Status {
	if h.inStream != 0 {
		h.foreign = append(h.foreign, fmt.Sprintf("proxy_set_effective_context(%d) during stream %d's callback", id, h.inStream))
	}
	if h.ended[id] {
		return abi.StatusNotFound
	}
	h.effective = id
	return abi.StatusOK
}

func (h *toyHost) ContinueStream() abi.Status {
	if h.inStream != 0 {
		h.foreign = append(h.foreign, fmt.Sprintf("proxy_continue_stream during stream %d's callback", h.inStream))
	}
	h.continued = append(h.continued, h.effective)
	return abi.StatusOK
}

func (h *toyHost) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	if bt == abi.BufferGrpcReceive {
		return h.reply[:min(max, len(h.reply))], abi.StatusOK
	}
	return h.Host.GetBuffer(bt, start, max)
}

func (h *toyHost) GetHeader(mt abi.MapType, name string) ([]byte, abi.Status) {
	if mt != abi.MapRequestHeaders {
		return h.Host.GetHeader(mt, name)
	}
	for _, kv := range h.ReqHeaders {
		if strings.EqualFold(kv[0], name) {
			b, ok := h.bytes[kv[1]]
			if !ok {
				b = []byte(kv[1])
				h.bytes[kv[1]] = b
			}
			return b, abi.StatusOK
		}
	}
	return nil, abi.StatusNotFound
}

func (h *toyHost) AddHeader(mt abi.MapType, name string, value []byte) abi.Status {
	h.added++
	if h.quiet {
		return abi.StatusOK
	}
	return h.Host.AddHeader(mt, name, value)
}

// toyRig is a VM whose root context (1) decides its remote rules through
// the toy codec.
type toyRig struct {
	t  *testing.T
	h  *toyHost
	vm *VM
	p  *Plugin
	tc *toyCodec
	e  *remote
	id uint32
}

// toyConfig is rule t1 (token_bucket, burst 20) and extra rules, under
// failure_mode mode; the rules the toy decides say backend "rls".
func toyConfig(mode, extra string) string {
	return `{"rules":[{"name":"t1","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":100,"window":"1m","burst":20,"backend":"rls"}` + extra + `],
"failure_mode":"` + mode + `","rls":{"cluster":"toycluster","domain":"d","timeout_ms":40,"instances":10}}`
}

// startToy configures cfg and gives its remote rules to a toy engine: all
// the toy needs is newRemote with its codec.
func startToy(t *testing.T, cfg string, rt route, refundShared bool) *toyRig {
	t.Helper()
	h := &toyHost{Host: filtertest.NewHost(), next: 100, sent: map[uint32]string{}, ended: map[uint32]bool{}, bytes: map[string][]byte{}}
	h.Now_ = toyT0
	h.Config = []byte(cfg)
	vm := NewVM(h)
	vm.OnContextCreate(1, 0)
	if !vm.OnVMStart(1, 0) || !vm.OnConfigure(1, len(cfg)) {
		t.Fatalf("plugin refused to start: %v", h.Logs)
	}
	p := vm.plugins[1]
	tc := &toyCodec{p: p, gh: h, rt: rt, msg: make([]byte, 0, 256)}
	e, err := newRemote(p, tc, h, p.rules, remoteSpec{
		name: "toy", backend: config.BackendRLS, timeoutMS: p.cfg.RLS.TimeoutMS, instances: p.cfg.RLS.Instances,
		names: toyNames, refundShared: refundShared,
	})
	if err != nil {
		t.Fatal(err)
	}
	tc.e, p.remote = e, e
	h.tickMS = 0
	p.setTickPeriod()
	if h.tickMS != 40 {
		t.Errorf("tick period %d ms, want timeout_ms 40", h.tickMS)
	}
	t.Cleanup(func() {
		if len(h.foreign) > 0 {
			t.Errorf("host calls out of place: %v", h.foreign)
		}
	})
	return &toyRig{t: t, h: h, vm: vm, p: p, tc: tc, e: e, id: 1}
}

// request starts a request of user (its own stream callback) and returns
// its context id and action; a local response it got is in h.Local.
func (r *toyRig) request(user string) (uint32, abi.Action) {
	r.id++
	id := r.id
	r.h.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/api"}, {"x-user", user}}
	r.h.effective = id
	r.h.Local = nil
	r.vm.OnContextCreate(id, 1)
	r.h.inStream = id
	defer func() { r.h.inStream = 0 }()
	return id, r.vm.OnRequestHeaders(id, 3, true)
}

// end ends stream id (the client went away): the access log and delete.
func (r *toyRig) end(id uint32) {
	r.h.effective = id
	r.vm.OnLog(id)
	r.vm.OnDelete(id)
	r.h.ended[id] = true
}

// answer delivers reply body to token as the root context
// (proxy_on_grpc_receive) and returns the local response it caused.
func (r *toyRig) answer(token uint32, body string) *filtertest.LocalResponse {
	r.h.reply = []byte(body)
	r.h.effective, r.h.Local = 1, nil
	r.vm.OnGrpcReceive(1, token, len(body))
	return r.h.Local
}

// close fails token with a gRPC status (proxy_on_grpc_close).
func (r *toyRig) close(token, status uint32) *filtertest.LocalResponse {
	r.h.effective, r.h.Local = 1, nil
	r.vm.OnGrpcClose(1, token, status)
	return r.h.Local
}

// at sets the clock to toyT0+d and ticks the root context.
func (r *toyRig) at(d time.Duration) *filtertest.LocalResponse {
	r.h.Now_ = toyT0 + int64(d)
	r.h.effective, r.h.Local = 1, nil
	r.vm.OnTick(1)
	return r.h.Local
}

func (r *toyRig) calls() int { return len(r.h.order) }

func (r *toyRig) last() uint32 {
	r.t.Helper()
	if len(r.h.order) == 0 {
		r.t.Fatal("no call made")
	}
	return r.h.order[len(r.h.order)-1]
}

func (r *toyRig) msg(token uint32) string { return r.h.sent[token] }

func (r *toyRig) metric(name string) int64 {
	v, _ := r.h.Metrics.Get(name)
	return v
}

func (r *toyRig) continued(id uint32) int {
	n := 0
	for _, c := range r.h.continued {
		if c == id {
			n++
		}
	}
	return n
}

// responseHeaders runs stream id's response headers and returns those added.
func (r *toyRig) responseHeaders(id uint32) [][2]string {
	r.h.RespHeaders = [][2]string{{":status", "200"}}
	r.h.effective = id
	r.vm.OnResponseHeaders(id, 1, false)
	return r.h.RespHeaders[1:]
}

func toyHeader(hs [][2]string, name string) string {
	for _, kv := range hs {
		if strings.EqualFold(kv[0], name) {
			return kv[1]
		}
	}
	return ""
}

// toyKey is the hex of the key the filter builds for user (a header part:
// tag 2, length, value).
func toyKey(user string) string {
	return hex.EncodeToString(append([]byte{2, byte(len(user))}, user...))
}

// metrics checks the toy's counters (names without "sluice.toy.").
func (r *toyRig) metrics(want map[string]int64) {
	r.t.Helper()
	for name, v := range want {
		if got := r.metric("sluice.toy." + name); got != v {
			r.t.Errorf("sluice.toy.%s = %d, want %d", name, got, v)
		}
	}
}

// A request pauses until its reply; the decoded decision admits it (the
// rate-limit headers from the decision) or denies it (the configured
// rejection, Retry-After from the decision).
func TestToyRemoteDecides(t *testing.T) {
	r := startToy(t, toyConfig("open", ""), routeKey, false)
	id, act := r.request("alice")
	if act != abi.ActionPause || r.h.Local != nil {
		t.Fatalf("action %v local %+v, want Pause until the reply", act, r.h.Local)
	}
	tok := r.last()
	if got, want := r.msg(tok), "B t1 "+toyKey("alice")+" 1\n"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	r.at(10 * time.Millisecond) // a tick before the guard is due changes nothing
	if r.continued(id) != 0 || len(r.h.cancelled) != 0 {
		t.Fatalf("resumed %v cancelled %v before the reply", r.h.continued, r.h.cancelled)
	}
	if lr := r.answer(tok, "+17 9000"); lr != nil || r.continued(id) != 1 {
		t.Fatalf("admitted: local %+v continued %v", lr, r.h.continued)
	}
	hs := r.responseHeaders(id)
	if got := toyHeader(hs, "ratelimit"); got != `"t1";r=17;t=9` {
		t.Errorf("RateLimit %q, want the decision's remaining and reset", got)
	}
	if got := toyHeader(hs, "x-ratelimit-limit"); got != "20" {
		t.Errorf("X-RateLimit-Limit %q, want the decision's limit", got)
	}
	r.end(id)
	if r.answer(tok, "+1 1") != nil || r.continued(id) != 1 {
		t.Error("a second reply to an answered token was not dropped")
	}

	id, _ = r.request("alice")
	lr := r.answer(r.last(), "-0 2500")
	if lr == nil || lr.Status != 429 || r.continued(id) != 0 {
		t.Fatalf("denied: local %+v continued %v", lr, r.h.continued)
	}
	if got := toyHeader(lr.Headers, "retry-after"); got != "3" {
		t.Errorf("Retry-After %q, want 3 (2.5 s rounded up)", got)
	}
	if got := toyHeader(lr.Headers, "ratelimit"); got != `"t1";r=0;t=3` {
		t.Errorf("RateLimit %q", got)
	}
	if r.metric("sluice.t1.allowed") != 1 || r.metric("sluice.t1.denied") != 1 {
		t.Errorf("allowed %d denied %d", r.metric("sluice.t1.allowed"), r.metric("sluice.t1.denied"))
	}
	r.metrics(map[string]int64{"calls": 2, "failures": 0, "refunds": 0})
	if r.e.inFlight() || len(r.e.waits) != 0 || len(r.e.queues) != 0 {
		t.Errorf("left behind: calls %d waits %d queues %d", len(r.e.calls), len(r.e.waits), len(r.e.queues))
	}
}

// Coalescing (routeKey): while a (rule, key)'s call is in flight, the
// requests for it wait and go together in the next call, decided in arrival
// order; another key has its own call; a batch holds at most maxBatch.
func TestToyRemoteCoalesces(t *testing.T) {
	r := startToy(t, toyConfig("open", ""), routeKey, false)
	a, _ := r.request("u")
	ta := r.last()
	b, actB := r.request("u")
	c, actC := r.request("u")
	if r.calls() != 1 || actB != abi.ActionPause || actC != abi.ActionPause {
		t.Fatalf("calls %d, actions %v %v: want b and c queued behind a's call", r.calls(), actB, actC)
	}
	d, _ := r.request("v")
	td := r.last()
	if r.calls() != 2 || r.msg(td) != "B t1 "+toyKey("v")+" 1\n" {
		t.Fatalf("another key: calls %d message %q", r.calls(), r.msg(td))
	}
	r.answer(ta, "+19 1000")
	if r.continued(a) != 1 || r.calls() != 3 {
		t.Fatalf("a's reply: continued %v calls %d, want a resumed and b, c sent", r.h.continued, r.calls())
	}
	tbc := r.last()
	if got, want := r.msg(tbc), "B t1 "+toyKey("u")+" 2\n"; got != want {
		t.Fatalf("batch %q, want %q", got, want)
	}
	lr := r.answer(tbc, "+18 1000\n-0 4000")
	if r.continued(b) != 1 || r.continued(c) != 0 || lr == nil || lr.Status != 429 || toyHeader(lr.Headers, "retry-after") != "4" {
		t.Fatalf("batch reply: continued %v local %+v, want b admitted, c denied (arrival order)", r.h.continued, lr)
	}
	if r.calls() != 3 {
		t.Errorf("calls %d after the queue drained", r.calls())
	}
	r.answer(td, "+19 1000")
	if r.continued(d) != 1 {
		t.Error("d not resumed")
	}
	r.metrics(map[string]int64{"calls": 3})
	if len(r.e.queues) != 0 || len(r.e.qfree) == 0 {
		t.Errorf("queues %d (free %d): a drained queue is recycled", len(r.e.queues), len(r.e.qfree))
	}

	t.Run("maxBatch", func(t *testing.T) {
		r := startToy(t, toyConfig("open", ""), routeKey, false)
		first, _ := r.request("hot")
		var ids []uint32
		for range maxBatch + 2 {
			id, _ := r.request("hot")
			ids = append(ids, id)
		}
		if r.calls() != 1 {
			t.Fatalf("calls %d", r.calls())
		}
		r.answer(r.last(), "+1 1")
		if r.continued(first) != 1 || r.calls() != 2 || !strings.HasSuffix(r.msg(r.last()), " "+strconv.Itoa(maxBatch)+"\n") {
			t.Fatalf("calls %d message %q: want one call of %d", r.calls(), r.msg(r.last()), maxBatch)
		}
		r.answer(r.last(), strings.Repeat("+1 1\n", maxBatch-1)+"+1 1")
		if r.calls() != 3 || !strings.HasSuffix(r.msg(r.last()), " 2\n") {
			t.Fatalf("calls %d message %q: want the last 2 in a third call", r.calls(), r.msg(r.last()))
		}
		r.answer(r.last(), "+1 1\n+1 1")
		for _, id := range ids {
			if r.continued(id) != 1 {
				t.Fatalf("request %d resumed %d times", id, r.continued(id))
			}
		}
		r.metrics(map[string]int64{"calls": 3})
	})

	// routeShared: a request's rules in one call; routeOwn: a call each.
	two := toyConfig("open", `,{"name":"t2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}`)
	t.Run("shared", func(t *testing.T) {
		r := startToy(t, two, routeShared, false)
		id, _ := r.request("w")
		if got, want := r.msg(r.last()), "D t1 "+toyKey("w")+"\nD t2 "+toyKey("w")+"\n"; r.calls() != 1 || got != want {
			t.Fatalf("calls %d message %q, want %q", r.calls(), got, want)
		}
		if lr := r.answer(r.last(), "+19 1000\n+3 2000"); lr != nil || r.continued(id) != 1 {
			t.Fatalf("local %+v continued %v", lr, r.h.continued)
		}
		// The most restrictive decision gives the headers.
		if got := toyHeader(r.responseHeaders(id), "ratelimit"); got != `"t2";r=3;t=2` {
			t.Errorf("RateLimit %q", got)
		}
		r.metrics(map[string]int64{"calls": 1})
	})
	t.Run("own", func(t *testing.T) {
		r := startToy(t, two, routeOwn, false)
		id, _ := r.request("w")
		if r.calls() != 2 || r.msg(r.h.order[0]) != "D t1 "+toyKey("w")+"\n" || r.msg(r.h.order[1]) != "D t2 "+toyKey("w")+"\n" {
			t.Fatalf("calls %v %v", r.h.order, r.h.sent)
		}
		r.answer(r.h.order[1], "+3 2000")
		if r.continued(id) != 0 {
			t.Fatal("resumed before every call answered")
		}
		r.answer(r.h.order[0], "+19 1000")
		if r.continued(id) != 1 {
			t.Fatal("not resumed")
		}
		r.metrics(map[string]int64{"calls": 2})
	})
}

// The guard: a call with no reply within timeout_ms + the margin is
// cancelled at the host and its rules fail with a timeout; failure_mode
// decides (open admits, closed answers 503, local decides on shared data).
// A reply that arrives later is dropped.
func TestToyRemoteGuard(t *testing.T) {
	for _, mode := range []string{"open", "closed", "local"} {
		t.Run(mode, func(t *testing.T) {
			r := startToy(t, toyConfig(mode, ""), routeKey, false)
			id, _ := r.request("bob")
			tok := r.last()
			if lr := r.at(toyGuard - 1); lr != nil || len(r.h.cancelled) != 0 || r.continued(id) != 0 {
				t.Fatalf("just before the guard: local %+v cancelled %v continued %v", lr, r.h.cancelled, r.h.continued)
			}
			lr := r.at(toyGuard)
			if len(r.h.cancelled) != 1 || r.h.cancelled[0] != tok {
				t.Fatalf("cancelled %v, want the call %d", r.h.cancelled, tok)
			}
			switch mode {
			case "closed":
				if lr == nil || lr.Status != 503 || lr.Body != failureBody || r.continued(id) != 0 {
					t.Fatalf("local %+v continued %v, want 503", lr, r.h.continued)
				}
			default:
				if lr != nil || r.continued(id) != 1 {
					t.Fatalf("local %+v continued %v, want admitted", lr, r.h.continued)
				}
			}
			if mode == "local" {
				if keys := r.h.Shared.Keys("sluice::t1:fallback:"); len(keys) != 1 {
					t.Errorf("fallback keys %v: failure_mode local decides on shared data", keys)
				}
			}
			r.metrics(map[string]int64{"failures": 1, "timeouts": 1, "fail_" + mode: 1, "calls": 1})
			if late := r.answer(tok, "-0 1000"); late != nil || r.continued(id) > 1 {
				t.Errorf("a reply after the guard answered: %+v", late)
			}
			if r.e.inFlight() || len(r.e.waits) != 0 || len(r.e.queues) != 0 {
				t.Errorf("left behind: calls %d waits %d queues %d", len(r.e.calls), len(r.e.waits), len(r.e.queues))
			}
		})
	}

	// A request queued behind a call the guard gives up on goes in a new
	// call, with a guard of its own from then.
	t.Run("queued", func(t *testing.T) {
		r := startToy(t, toyConfig("open", ""), routeKey, false)
		a, _ := r.request("q")
		ta := r.last()
		r.h.Now_ = toyT0 + int64(5*time.Millisecond)
		b, _ := r.request("q")
		r.at(toyGuard)
		if r.continued(a) != 1 || r.continued(b) != 0 || r.calls() != 2 || fmt.Sprint(r.h.cancelled) != fmt.Sprint([]uint32{ta}) {
			t.Fatalf("continued %v calls %d cancelled %v: want a failed open, b in a new call", r.h.continued, r.calls(), r.h.cancelled)
		}
		r.at(toyGuard + 10*time.Millisecond) // past b's own first deadline
		if r.continued(b) != 0 {
			t.Fatal("b given up before its own call's guard")
		}
		if r.answer(r.last(), "+7 1000"); r.continued(b) != 1 {
			t.Fatal("b not resumed by its call's reply")
		}
		if got := toyHeader(r.responseHeaders(b), "ratelimit"); got != `"t1";r=7;t=1` {
			t.Errorf("b's headers %q: want its remote decision", got)
		}
		r.metrics(map[string]int64{"failures": 1, "timeouts": 1, "fail_open": 1, "calls": 2})
	})

	// The guard also runs after a reply: another call's reply past a's
	// deadline gives a up, with no tick.
	t.Run("on reply", func(t *testing.T) {
		r := startToy(t, toyConfig("closed", ""), routeKey, false)
		a, _ := r.request("a")
		ta := r.last()
		r.h.Now_ = toyT0 + int64(30*time.Millisecond)
		b, _ := r.request("b")
		tb := r.last()
		r.h.Now_ = toyT0 + int64(toyGuard)
		r.answer(tb, "+1 1000")
		if r.continued(b) != 1 || r.continued(a) != 0 || fmt.Sprint(r.h.cancelled) != fmt.Sprint([]uint32{ta}) {
			t.Fatalf("continued %v cancelled %v", r.h.continued, r.h.cancelled)
		}
		r.metrics(map[string]int64{"failures": 1, "timeouts": 1, "fail_closed": 1})
	})

	// A shared call is guarded by its wait: both rules fail, the call is
	// cancelled once.
	t.Run("shared", func(t *testing.T) {
		r := startToy(t, toyConfig("open", `,{"name":"t2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}`), routeShared, false)
		id, _ := r.request("s")
		r.at(toyGuard)
		if r.continued(id) != 1 || len(r.h.cancelled) != 1 {
			t.Fatalf("continued %v cancelled %v", r.h.continued, r.h.cancelled)
		}
		r.metrics(map[string]int64{"failures": 2, "timeouts": 2, "fail_open": 2})
	})
}

// A call that fails — a failure status, a reply that does not decode, a
// call the host refuses — fails its rules, and failure_mode decides; a bad
// answer fails only its own decision.
func TestToyRemoteFailures(t *testing.T) {
	bad := map[string]struct {
		fail    func(r *toyRig)
		timeout int64
	}{
		"unavailable": {func(r *toyRig) { r.close(r.last(), 14) }, 0},
		"deadline":    {func(r *toyRig) { r.close(r.last(), 4) }, 1},
		"no answers":  {func(r *toyRig) { r.answer(r.last(), "") }, 0},
		"two answers": {func(r *toyRig) { r.answer(r.last(), "+1 1\n+1 1") }, 0},
		"bad answer":  {func(r *toyRig) { r.answer(r.last(), "?") }, 0},
	}
	for name, c := range bad {
		for _, mode := range []string{"open", "closed", "local"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				r := startToy(t, toyConfig(mode, ""), routeKey, false)
				id, _ := r.request("carol")
				c.fail(r)
				if mode == "closed" {
					if r.h.Local == nil || r.h.Local.Status != 503 || r.continued(id) != 0 {
						t.Fatalf("local %+v continued %v, want 503", r.h.Local, r.h.continued)
					}
				} else if r.h.Local != nil || r.continued(id) != 1 {
					t.Fatalf("local %+v continued %v, want admitted", r.h.Local, r.h.continued)
				}
				r.metrics(map[string]int64{"failures": 1, "timeouts": c.timeout, "fail_" + mode: 1})
				if n := r.metric("sluice.t1.store_errors"); n != 1 {
					t.Errorf("store_errors %d", n)
				}
				if len(r.h.Logs) == 0 || !strings.Contains(r.h.Logs[len(r.h.Logs)-1].Msg, "rule t1: toy: ") {
					t.Errorf("logs %v: want the failure named after the backend", r.h.Logs)
				}
				if r.e.inFlight() || len(r.e.waits) != 0 || len(r.e.queues) != 0 {
					t.Errorf("left behind: calls %d waits %d queues %d", len(r.e.calls), len(r.e.waits), len(r.e.queues))
				}
			})
		}
	}
	// Refused at once: the request is decided in its own callback.
	t.Run("refused", func(t *testing.T) {
		r := startToy(t, toyConfig("closed", ""), routeKey, false)
		r.h.refuse = abi.StatusBadArgument
		_, act := r.request("dan")
		if act != abi.ActionPause || r.h.Local == nil || r.h.Local.Status != 503 {
			t.Fatalf("action %v local %+v, want 503 at once", act, r.h.Local)
		}
		r.metrics(map[string]int64{"failures": 1, "timeouts": 0, "fail_closed": 1, "calls": 0})
		if len(r.e.waits) != 0 || len(r.e.queues) != 0 {
			t.Errorf("left behind: waits %d queues %d", len(r.e.waits), len(r.e.queues))
		}
	})
	// One bad answer of a shared call fails that rule only.
	t.Run("one of two", func(t *testing.T) {
		r := startToy(t, toyConfig("closed", `,{"name":"t2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}`), routeShared, false)
		id, _ := r.request("eve")
		if lr := r.answer(r.last(), "+1 1\n!"); lr == nil || lr.Status != 503 || r.continued(id) != 0 {
			t.Fatalf("local %+v", lr)
		}
		r.metrics(map[string]int64{"failures": 1, "fail_closed": 1})
		if r.metric("sluice.t2.store_errors") != 1 || r.metric("sluice.t1.store_errors") != 0 {
			t.Errorf("store_errors t1 %d t2 %d", r.metric("sluice.t1.store_errors"), r.metric("sluice.t2.store_errors"))
		}
	})
	// A codec that settles a call without handing out a decision of it
	// (a bug in the codec) fails that decision then and there: the request
	// is not left to the guard, holding a call that is recycled already.
	for _, rt := range []route{routeKey, routeShared} {
		t.Run(fmt.Sprint("undecided/route=", rt), func(t *testing.T) {
			r := startToy(t, toyConfig("closed", ""), rt, false)
			id, _ := r.request("gil")
			if lr := r.answer(r.last(), "SKIP"); lr == nil || lr.Status != 503 || r.continued(id) != 0 {
				t.Fatalf("local %+v continued %v, want 503 at the reply", lr, r.h.continued)
			}
			r.metrics(map[string]int64{"failures": 1, "timeouts": 0, "fail_closed": 1})
			if len(r.e.waits) != 0 || len(r.e.queues) != 0 {
				t.Errorf("left behind: waits %d queues %d", len(r.e.waits), len(r.e.queues))
			}
		})
	}
	// A codec may ask for the call again in another form (Redis: EVAL
	// after NOSCRIPT): the engine resends it under a new token.
	t.Run("retry", func(t *testing.T) {
		r := startToy(t, toyConfig("open", ""), routeKey, false)
		id, _ := r.request("fay")
		first := r.last()
		r.answer(first, "RETRY")
		if r.calls() != 2 || r.continued(id) != 0 || !strings.HasPrefix(r.msg(r.last()), "alt\nB t1 ") {
			t.Fatalf("calls %d message %q continued %v", r.calls(), r.msg(r.last()), r.h.continued)
		}
		if r.answer(first, "+1 1"); r.continued(id) != 0 {
			t.Fatal("the first token still answers")
		}
		r.answer(r.last(), "+9 1000")
		if r.continued(id) != 1 || toyHeader(r.responseHeaders(id), "ratelimit") != `"t1";r=9;t=1` {
			t.Fatalf("continued %v", r.h.continued)
		}
		r.metrics(map[string]int64{"calls": 2, "failures": 0})
		// The host refuses the resend: the call fails.
		id, _ = r.request("fay")
		r.h.refuse = abi.StatusInternalFailure
		r.answer(r.last(), "RETRY")
		if r.continued(id) != 1 {
			t.Fatal("a refused resend did not fail open")
		}
		r.metrics(map[string]int64{"failures": 1, "fail_open": 1})
	})
}

// A request the remote side admitted but that is denied after all — by a
// local rule at resume, or by another remote rule — sends the admission
// back (fire and forget), as the codec says: a refund call (one for all or
// one each), a lost one, or none.
func TestToyRemoteRefunds(t *testing.T) {
	local := toyConfig("open", `,{"name":"l2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":1,"window":"1h"}`)
	t.Run("local denial", func(t *testing.T) {
		r := startToy(t, local, routeOwn, false)
		// Two requests of user wait (l2 is charged at the first one's
		// resume); t1 admits both, l2 denies the second: its admission is
		// sent back. deny returns the refund's token.
		deny := func(user string, before func()) uint32 {
			t.Helper()
			a, _ := r.request(user)
			ta := r.last()
			b, _ := r.request(user)
			tb := r.last()
			r.answer(ta, "+19 1000")
			if before != nil {
				before()
			}
			lr := r.answer(tb, "+18 1000")
			if r.continued(a) != 1 || lr == nil || lr.Status != 429 || r.continued(b) != 0 {
				t.Fatalf("%s: continued %v local %+v, want a admitted, b denied by l2", user, r.h.continued, lr)
			}
			if r.h.refuse == abi.StatusOK && (r.last() == tb || r.msg(r.last()) != "R t1 "+toyKey(user)+"\n") {
				t.Fatalf("%s: refund call %q", user, r.msg(r.last()))
			}
			return r.last()
		}
		r.answer(deny("dave", nil), "OK")
		r.metrics(map[string]int64{"refunds": 1, "calls": 2, "refund_failures": 0})
		if r.metric("sluice.l2.denied") != 1 || r.metric("sluice.t1.allowed") != 1 {
			t.Errorf("l2 denied %d, t1 allowed %d", r.metric("sluice.l2.denied"), r.metric("sluice.t1.allowed"))
		}
		if r.e.inFlight() {
			t.Error("the refund is still in flight after its reply")
		}
		// A refund that fails, that nobody answers, or that the host
		// refuses is counted.
		r.close(deny("dave2", nil), 14)
		r.metrics(map[string]int64{"refunds": 2, "refund_failures": 1})
		r.h.Now_ = toyT0 + int64(time.Second)
		refund := deny("dave3", nil)
		r.at(time.Second + toyGuard - 1)
		if len(r.h.cancelled) != 0 {
			t.Fatalf("cancelled %v before the refund's guard", r.h.cancelled)
		}
		r.at(time.Second + toyGuard)
		if fmt.Sprint(r.h.cancelled) != fmt.Sprint([]uint32{refund}) {
			t.Errorf("cancelled %v, want the refund %d", r.h.cancelled, refund)
		}
		r.metrics(map[string]int64{"refunds": 3, "refund_failures": 2})
		deny("dave4", func() { r.h.refuse = abi.StatusInternalFailure })
		r.metrics(map[string]int64{"refunds": 4, "refund_failures": 3, "timeouts": 0, "failures": 0, "calls": 8})
	})

	// t1 admits, t2 denies: t1's admission goes back; shared, the
	// request's refunds go in one call.
	two := toyConfig("open", `,{"name":"t2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}`+
		`,{"name":"t3","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}`)
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprint("remote denial/shared=", shared), func(t *testing.T) {
			r := startToy(t, two, routeShared, shared)
			_, _ = r.request("gus")
			lr := r.answer(r.last(), "+19 1000\n-0 30000\n+4 1000")
			if lr == nil || lr.Status != 429 || toyHeader(lr.Headers, "retry-after") != "30" {
				t.Fatalf("local %+v", lr)
			}
			k := toyKey("gus")
			var got []string
			for _, tok := range r.h.order[1:] {
				got = append(got, r.msg(tok))
			}
			want := []string{"R t1 " + k + "\n", "R t3 " + k + "\n"}
			if shared {
				want = []string{"R t1 " + k + "\nR t3 " + k + "\n"}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("refund calls %q, want %q", got, want)
			}
			r.metrics(map[string]int64{"refunds": 2, "calls": 1})
		})
	}

	for _, c := range []struct {
		kind     refundKind
		failures int64
	}{{refundLost, 1}, {refundNone, 0}} {
		t.Run(fmt.Sprint("refundable=", c.kind), func(t *testing.T) {
			r := startToy(t, local, routeOwn, false)
			r.tc.refund = c.kind
			a, _ := r.request("hal")
			ta := r.last()
			r.request("hal")
			tb := r.last()
			r.answer(ta, "+19 1000")
			if lr := r.answer(tb, "+18 1000"); lr == nil || r.continued(a) != 1 {
				t.Fatalf("local %+v", lr)
			}
			if r.calls() != 2 {
				t.Errorf("calls %d: want no refund call", r.calls())
			}
			r.metrics(map[string]int64{"refunds": 0, "refund_failures": c.failures})
		})
	}
}

// A stream that ends while it waits is not resumed nor answered; an
// admission made for it is refunded, a denial needs nothing.
func TestToyRemoteStreamEnds(t *testing.T) {
	r := startToy(t, toyConfig("closed", ""), routeKey, false)
	a, _ := r.request("ivy")
	ta := r.last()
	r.end(a)
	if lr := r.answer(ta, "+19 1000"); lr != nil || r.continued(a) != 0 {
		t.Fatalf("ended stream answered %+v / resumed %v", lr, r.h.continued)
	}
	if r.calls() != 2 || r.msg(r.last()) != "R t1 "+toyKey("ivy")+"\n" {
		t.Fatalf("calls %d, last %q: want a refund", r.calls(), r.msg(r.last()))
	}
	r.metrics(map[string]int64{"refunds": 1})
	r.answer(r.last(), "OK")

	// Denied, or failed: nothing to refund, nothing answered.
	b, _ := r.request("ivy")
	r.end(b)
	r.answer(r.last(), "-0 1000")
	c, _ := r.request("ivy")
	r.end(c)
	r.at(toyGuard)
	if r.continued(b)+r.continued(c) != 0 || r.h.Local != nil || r.calls() != 4 {
		t.Fatalf("continued %v local %+v calls %d", r.h.continued, r.h.Local, r.calls())
	}
	r.metrics(map[string]int64{"refunds": 1, "failures": 1, "timeouts": 1})
	if r.metric("sluice.toy.fail_closed") != 0 {
		t.Error("failure_mode counted for a request nobody decides")
	}

	// Queued when it ended: its decision still goes out with the batch, and
	// its admission comes back; the others of the batch are unaffected.
	d, _ := r.request("jo")
	e, _ := r.request("jo")
	f, _ := r.request("jo")
	r.end(e)
	r.answer(r.last(), "+19 1000")
	batch := r.last()
	if !strings.HasSuffix(r.msg(batch), " 2\n") {
		t.Fatalf("batch %q", r.msg(batch))
	}
	r.answer(batch, "+18 1000\n+17 1000")
	if r.continued(d) != 1 || r.continued(f) != 1 || r.continued(e) != 0 {
		t.Fatalf("continued %v", r.h.continued)
	}
	if r.msg(r.last()) != "R t1 "+toyKey("jo")+"\n" {
		t.Errorf("last call %q, want e's refund", r.msg(r.last()))
	}
	r.metrics(map[string]int64{"refunds": 2})

	// The filter saw the stream end, and the host would still take its id:
	// the engine's own record (the stream waits on no wait) is enough.
	h, _ := r.request("lee")
	r.vm.OnLog(h)
	r.vm.OnDelete(h)
	r.answer(r.last(), "+19 1000")
	if r.continued(h) != 0 || r.h.Local != nil || r.msg(r.last()) != "R t1 "+toyKey("lee")+"\n" {
		t.Fatalf("continued %v local %+v last %q", r.h.continued, r.h.Local, r.msg(r.last()))
	}
	r.metrics(map[string]int64{"refunds": 3})

	// The host no longer has the stream (it cannot be made the effective
	// context) though the filter never saw it end: the same.
	g, _ := r.request("kim")
	r.h.ended[g] = true
	r.answer(r.last(), "+19 1000")
	if r.continued(g) != 0 || r.h.Local != nil || r.msg(r.last()) != "R t1 "+toyKey("kim")+"\n" {
		t.Fatalf("continued %v local %+v last %q", r.h.continued, r.h.Local, r.msg(r.last()))
	}
	r.metrics(map[string]int64{"refunds": 4})
}

// The engine's path (request, call, reply, resume, response headers)
// allocates nothing per request in steady state with the toy codec, whose
// encoding and decoding reuse their buffers; the host here records nothing.
func TestToyRemoteAllocations(t *testing.T) {
	for _, rt := range []route{routeKey, routeShared, routeOwn} {
		t.Run(fmt.Sprint("route=", rt), func(t *testing.T) {
			r := startToy(t, toyConfig("open", ""), rt, false)
			r.h.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/api"}, {"x-user", "alice"}}
			r.h.reply = []byte("+17 9000")
			r.h.quiet = true
			cycle := func() {
				r.id++
				id := r.id
				r.h.effective = id
				r.vm.OnContextCreate(id, 1)
				r.vm.OnRequestHeaders(id, 3, true)
				r.h.effective = 1
				r.vm.OnGrpcReceive(1, r.h.next, len(r.h.reply))
				r.h.effective = id
				r.vm.OnResponseHeaders(id, 1, false)
				r.vm.OnLog(id)
				r.vm.OnDelete(id)
				r.h.continued = r.h.continued[:0]
				r.h.order = r.h.order[:0]
				r.h.Now_ += int64(time.Millisecond)
			}
			for range 100 {
				cycle()
			}
			if r.metric("sluice.t1.allowed") != 100 || r.h.added != 100*5 {
				t.Fatalf("allowed %d, headers added %d of 100 warm-up requests", r.metric("sluice.t1.allowed"), r.h.added)
			}
			if allocs := testing.AllocsPerRun(1000, cycle); allocs != 0 {
				t.Errorf("%.2f allocations per request", allocs)
			}
			if r.e.inFlight() || len(r.e.waits) != 0 {
				t.Error("calls or waits left")
			}
		})
	}
}
