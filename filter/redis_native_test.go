package filter_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Native tests of the Redis data path against a fake host whose Redis calls the test
// answers by hand: every reply shape, the guard, streams that end while waiting, refunds.
// (The fake implements RedisHost, which is what makes the plugin accept Redis rules; the
// filtertest host does not, and gets the sluice.wasm refusal.)

type redisFake struct {
	*filtertest.Host
	initStatus, callStatus abi.Status
	next                   uint32
	sent                   map[uint32]string // token -> query
	order                  []uint32
	reply                  []byte
	effective              uint32
	live                   map[uint32]bool
	continued              []uint32
	local                  map[uint32]*filtertest.LocalResponse
	tickMS                 uint32
	// inStream is the stream whose callback is running (0: a root-context callback, or
	// none). Answering or resuming another stream from it is recorded in foreign: in
	// proxy-wasm-cpp-host a local reply sent then stops the running stream (its VM-wide
	// stop-iteration flag).
	inStream uint32
	foreign  []string
}

var _ filter.RedisHost = (*redisFake)(nil)

func newRedisFake() *redisFake {
	return &redisFake{Host: filtertest.NewHost(), next: 100, sent: map[uint32]string{}, live: map[uint32]bool{}, local: map[uint32]*filtertest.LocalResponse{}}
}

func (f *redisFake) RedisInit(service, user, pass string, timeoutMS uint32) abi.Status {
	return f.initStatus
}

func (f *redisFake) RedisCall(service string, query []byte) (uint32, abi.Status) {
	if f.callStatus != abi.StatusOK {
		return 0, f.callStatus
	}
	f.next++
	f.sent[f.next] = string(query)
	f.order = append(f.order, f.next)
	return f.next, abi.StatusOK
}

func (f *redisFake) SetEffectiveContext(id uint32) abi.Status {
	if id != 1 && !f.live[id] {
		return abi.StatusNotFound
	}
	f.effective = id
	return abi.StatusOK
}

func (f *redisFake) ContinueStream() abi.Status {
	f.checkOwn("proxy_continue_stream")
	f.continued = append(f.continued, f.effective)
	return abi.StatusOK
}

func (f *redisFake) SetTickPeriod(ms uint32) abi.Status { f.tickMS = ms; return abi.StatusOK }

func (f *redisFake) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	if bt == abi.BufferRedisCallResponse {
		return f.reply, abi.StatusOK
	}
	return f.Host.GetBuffer(bt, start, max)
}

func (f *redisFake) checkOwn(call string) {
	if f.inStream != 0 && f.effective != f.inStream {
		f.foreign = append(f.foreign, fmt.Sprintf("%s for stream %d during stream %d's callback", call, f.effective, f.inStream))
	}
}

func (f *redisFake) SendLocalResponse(status int, details string, body []byte, headers []abi.Header, grpcStatus int32) abi.Status {
	f.checkOwn("proxy_send_local_response")
	f.Host.Local = nil
	st := f.Host.SendLocalResponse(status, details, body, headers, grpcStatus)
	f.local[f.effective] = f.Host.Local
	return st
}

type redisRig struct {
	t  *testing.T
	f  *redisFake
	vm *filter.VM
	id uint32
}

func startRedisRig(t *testing.T, cfg string) *redisRig {
	t.Helper()
	f := newRedisFake()
	f.Now_ = t0
	vm := filter.NewVM(f)
	f.Config = []byte(cfg)
	vm.OnContextCreate(1, 0)
	if !vm.OnVMStart(1, 0) || !vm.OnConfigure(1, len(cfg)) {
		t.Fatalf("plugin refused to start: %v", f.Logs)
	}
	t.Cleanup(func() {
		if len(f.foreign) > 0 {
			t.Errorf("streams answered from another stream's callback: %v", f.foreign)
		}
	})
	return &redisRig{t: t, f: f, vm: vm, id: 1}
}

// request starts a request for user and returns its context id and action.
func (r *redisRig) request(user string) (uint32, abi.Action) {
	r.id++
	id := r.id
	r.f.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/api"}, {"x-user", user}}
	r.f.live[id] = true
	r.f.effective = id
	r.vm.OnContextCreate(id, 1)
	r.f.inStream = id
	defer func() { r.f.inStream = 0 }()
	return id, r.vm.OnRequestHeaders(id, 3, true)
}

func (r *redisRig) end(id uint32) {
	r.f.inStream, r.f.effective = id, id
	defer func() { r.f.inStream = 0 }()
	r.vm.OnLog(id)
	r.vm.OnDone(id)
	r.vm.OnDelete(id)
	delete(r.f.live, id)
}

// answer delivers a reply (as the root context, like Higress).
func (r *redisRig) answer(token uint32, status uint32, reply string) {
	r.f.reply = []byte(reply)
	r.f.effective = 1
	r.vm.OnRedisCallResponse(1, token, status, len(reply))
}

func (r *redisRig) lastToken() uint32 {
	if len(r.f.order) == 0 {
		r.t.Fatal("no redis call made")
	}
	return r.f.order[len(r.f.order)-1]
}

func (r *redisRig) metric(name string) int64 {
	v, _ := r.f.Metrics.Get(name)
	return v
}

func (r *redisRig) continuedOnce(id uint32) bool {
	n := 0
	for _, c := range r.f.continued {
		if c == id {
			n++
		}
	}
	return n == 1
}

const (
	replyAdmit = "*7\r\n:1\r\n:100\r\n:99\r\n:36000000\r\n:0\r\n:1700000000000000\r\n:1\r\n"
	replyDeny  = "*7\r\n:0\r\n:100\r\n:0\r\n:36000000\r\n:5000000\r\n:1700000000000000\r\n:0\r\n"
)

func redisRuleConfig(failure string, extraRules string) string {
	return `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":100,"window":"1h","backend":"redis"}` + extraRules + `],
"failure_mode":"` + failure + `","redis":{"cluster":"rc","timeout_ms":50,"instances":50}}`
}

func TestRedisAdmitAndDeny(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("open", ""))
	if r.f.tickMS != 50 {
		t.Errorf("tick period %d ms, want the timeout (50)", r.f.tickMS)
	}
	id, act := r.request("alice")
	if act != abi.ActionPause {
		t.Fatalf("action %v, want Pause while Redis decides", act)
	}
	// A VM that has not yet seen a reply of this script sends its source (EVAL), so a
	// cold cluster costs no extra round trip; afterwards only the SHA-1 (EVALSHA).
	q := r.f.sent[r.lastToken()]
	if !strings.HasPrefix(q, "*12\r\n$4\r\nEVAL\r\n") || !strings.Contains(q, "sluice:{r1|#") {
		t.Fatalf("query %.60q", q)
	}
	r.answer(r.lastToken(), 0, replyAdmit)
	if !r.continuedOnce(id) || r.f.local[id] != nil {
		t.Fatalf("admitted: continued %v local %v", r.f.continued, r.f.local[id])
	}
	r.f.RespHeaders = [][2]string{{":status", "200"}}
	r.vm.OnResponseHeaders(id, 1, false)
	if got := fmt.Sprint(r.f.RespHeaders); !strings.Contains(got, "x-ratelimit-remaining 99") || !strings.Contains(got, "x-ratelimit-reset 36") {
		t.Errorf("response headers %s", got)
	}
	r.end(id)

	id, _ = r.request("alice")
	if q := r.f.sent[r.lastToken()]; !strings.HasPrefix(q, "*12\r\n$7\r\nEVALSHA\r\n$40\r\n") || !strings.Contains(q, "sluice:{r1|#") {
		t.Fatalf("warm query %.60q", q)
	}
	r.answer(r.lastToken(), 0, replyDeny)
	lr := r.f.local[id]
	if lr == nil || lr.Status != 429 || headerOf(lr.Headers, "retry-after") != "5" || len(r.f.continued) != 1 {
		t.Fatalf("denied: %+v, continued %v", lr, r.f.continued)
	}
	r.end(id)
	if r.metric(filter.MetricNames("r1")[0]) != 1 || r.metric(filter.MetricNames("r1")[1]) != 1 {
		t.Errorf("allowed/denied metrics %d/%d", r.metric(filter.MetricNames("r1")[0]), r.metric(filter.MetricNames("r1")[1]))
	}
}

func TestRedisNoScriptResendsEval(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	r.request("warm-up")
	r.answer(r.lastToken(), 0, replyAdmit)
	id, _ := r.request("alice")
	first := r.lastToken()
	r.answer(first, 0, "-NOSCRIPT No matching script. Please use EVAL.\r\n")
	second := r.lastToken()
	if second == first || !strings.HasPrefix(r.f.sent[second], "*12\r\n$4\r\nEVAL\r\n") {
		t.Fatalf("after NOSCRIPT: %q", r.f.sent[second])
	}
	if r.continuedOnce(id) || r.f.local[id] != nil {
		t.Fatal("answered before the EVAL reply")
	}
	r.answer(second, 0, replyAdmit)
	if !r.continuedOnce(id) || r.metric(filter.MetricRedisNoScript) != 1 {
		t.Fatalf("continued %v, noscript %d", r.f.continued, r.metric(filter.MetricRedisNoScript))
	}
	// For a second after a NOSCRIPT, calls go out as EVAL at once (a cold node costs the
	// requests in flight one more round trip, not a whole burst).
	id, _ = r.request("bob")
	if q := r.f.sent[r.lastToken()]; !strings.HasPrefix(q, "*12\r\n$4\r\nEVAL\r\n") {
		t.Fatalf("right after a NOSCRIPT: %.40q", q)
	}
	// A NOSCRIPT for an EVAL is a failure, not a loop.
	calls := len(r.f.order)
	r.answer(r.lastToken(), 0, "-NOSCRIPT x\r\n")
	if lr := r.f.local[id]; lr == nil || lr.Status != 503 || len(r.f.order) != calls {
		t.Fatalf("NOSCRIPT for EVAL under closed: %+v, %d calls", lr, len(r.f.order)-calls)
	}
	r.f.Now_ += 1e9 // the period is over: EVALSHA again
	r.request("carol")
	if q := r.f.sent[r.lastToken()]; !strings.HasPrefix(q, "*12\r\n$7\r\nEVALSHA\r\n") {
		t.Fatalf("a second after the NOSCRIPT: %.40q", q)
	}
}

// Every reply Redis or the host could produce that is not a decision yields the failure
// mode — never a panic, never a hung request.
func TestRedisBadRepliesFollowFailureMode(t *testing.T) {
	bad := []struct {
		name   string
		status uint32
		reply  string
	}{
		{"network error", 1, ""},
		{"timeout", 2, ""},
		{"unknown status", 7, ""},
		{"error reply", 0, "-ERR something\r\n"},
		{"MOVED", 0, "-MOVED 1234 127.0.0.1:7001\r\n"},
		{"CLUSTERDOWN", 0, "-CLUSTERDOWN The cluster is down\r\n"},
		{"nil", 0, "$-1\r\n"},
		{"integer", 0, ":1\r\n"},
		{"short array", 0, "*2\r\n:1\r\n:2\r\n"},
		{"wrong element", 0, "*7\r\n:1\r\n$3\r\n100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\r\n"},
		{"out of range", 0, "*7\r\n:2\r\n:100\r\n:99\r\n:1\r\n:0\r\n:1\r\n:1\r\n"},
		{"truncated", 0, replyAdmit[:20]},
		{"trailing bytes", 0, replyAdmit + "+OK\r\n"},
		{"garbage", 0, "hello"},
		{"empty", 0, ""},
	}
	for _, mode := range []string{"open", "closed", "local"} {
		for _, b := range bad {
			t.Run(mode+"/"+b.name, func(t *testing.T) {
				r := startRedisRig(t, redisRuleConfig(mode, ""))
				id, act := r.request("alice")
				if act != abi.ActionPause {
					t.Fatalf("action %v", act)
				}
				r.answer(r.lastToken(), b.status, b.reply)
				lr := r.f.local[id]
				switch mode {
				case "open", "local": // local: 100/50 = 2 per hour on this proxy, so admitted
					if !r.continuedOnce(id) || lr != nil {
						t.Fatalf("continued %v local %+v", r.f.continued, lr)
					}
				case "closed":
					if lr == nil || lr.Status != 503 || lr.Body != "rate limiter unavailable\n" || len(r.f.continued) != 0 {
						t.Fatalf("local response %+v, continued %v", lr, r.f.continued)
					}
				}
				names := map[string]string{"open": filter.MetricRedisFailOpen, "closed": filter.MetricRedisFailClosed, "local": filter.MetricRedisFailLocal}
				if r.metric(names[mode]) != 1 || r.metric(filter.MetricRedisFailures) != 1 {
					t.Errorf("%s = %d, failures = %d", names[mode], r.metric(names[mode]), r.metric(filter.MetricRedisFailures))
				}
			})
		}
	}
}

func TestRedisLocalFallbackDividesTheLimit(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("local", "")) // 100 per hour over 50 instances: 2 here
	var admitted, denied int
	for i := 0; i < 5; i++ {
		id, _ := r.request("alice")
		r.answer(r.lastToken(), 1, "")
		if r.continuedOnce(id) {
			admitted++
		} else if lr := r.f.local[id]; lr != nil && lr.Status == 429 {
			denied++
		}
		r.end(id)
	}
	if admitted != 2 || denied != 3 {
		t.Fatalf("fallback admitted %d denied %d, want 2 and 3", admitted, denied)
	}
}

func TestRedisCallRefusedOrInitFailed(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	r.f.callStatus = abi.StatusNotFound
	id, act := r.request("alice")
	if act != abi.ActionPause || r.f.local[id] == nil || r.f.local[id].Status != 503 {
		t.Fatalf("refused call under closed: action %v local %+v", act, r.f.local[id])
	}
	r2 := newRedisFake()
	r2.initStatus = abi.StatusUnimplemented // a host without the extension
	vm := filter.NewVM(r2)
	cfg := redisRuleConfig("open", "")
	r2.Config = []byte(cfg)
	vm.OnContextCreate(1, 0)
	if !vm.OnConfigure(1, len(cfg)) {
		t.Fatal("a failed proxy_redis_init refuses the plugin; want failure_mode instead")
	}
	r2.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/"}, {"x-user", "a"}}
	r2.live[2] = true
	vm.OnContextCreate(2, 1)
	if act := vm.OnRequestHeaders(2, 3, true); act != abi.ActionContinue || len(r2.sent) != 0 {
		t.Fatalf("init failed, open: action %v, calls %d", act, len(r2.sent))
	}
	if !strings.Contains(fmt.Sprint(r2.Logs), "proxy_redis_init") {
		t.Errorf("init failure not logged: %v", r2.Logs)
	}
}

func TestRedisGuardWhenTheHostNeverAnswers(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	id, _ := r.request("alice")
	token := r.lastToken()
	r.f.Now_ += 50e6 // the timeout, not yet the margin
	r.vm.OnTick(1)
	if r.f.local[id] != nil {
		t.Fatal("guard fired before timeout_ms + margin")
	}
	r.f.Now_ += 11e6
	r.vm.OnTick(1)
	if lr := r.f.local[id]; lr == nil || lr.Status != 503 || r.metric(filter.MetricRedisTimeouts) != 1 {
		t.Fatalf("guard: %+v, timeouts %d", lr, r.metric(filter.MetricRedisTimeouts))
	}
	// The late reply is dropped: no second answer, no panic.
	r.answer(token, 0, replyAdmit)
	if len(r.f.continued) != 0 {
		t.Fatalf("late reply resumed the stream: %v", r.f.continued)
	}
}

func TestRedisStreamGoneWhileWaitingIsRefunded(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("open", ""))
	id, _ := r.request("alice")
	token := r.lastToken()
	r.end(id) // the client went away
	r.answer(token, 0, replyAdmit)
	if len(r.f.continued) != 0 || len(r.f.local) != 0 {
		t.Fatalf("answered a gone stream: %v %v", r.f.continued, r.f.local)
	}
	refund := r.f.sent[r.lastToken()]
	if r.lastToken() == token || !strings.HasSuffix(refund, "$1\r\n1\r\n$16\r\n1700000000000000\r\n$1\r\n1\r\n") {
		t.Fatalf("no refund of the admission: %q", refund)
	}
	// The refund's reply never comes: the guard forgets it (bounded state), counted.
	r.f.Now_ += 61e6
	r.vm.OnTick(1)
	if r.metric(filter.MetricRedisRefunds) != 1 || r.metric(filter.MetricRedisRefundFailures) != 1 {
		t.Errorf("refunds %d, refund failures %d", r.metric(filter.MetricRedisRefunds), r.metric(filter.MetricRedisRefundFailures))
	}
}

// Two Redis rules, one denies: the request is denied and the rule that admitted it is
// refunded. A local rule that denies stops the request before any Redis call.
func TestRedisMultiRule(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("open", `,
{"name":"r2","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":5,"window":"1m","backend":"redis"},
{"name":"l1","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":1,"window":"1h"}`))
	id, _ := r.request("alice")
	if len(r.f.order) != 2 {
		t.Fatalf("%d calls, want one per Redis rule", len(r.f.order))
	}
	t1, t2 := r.f.order[0], r.f.order[1]
	r.answer(t2, 0, replyDeny)
	if r.f.local[id] != nil {
		t.Fatal("answered before every rule replied")
	}
	r.answer(t1, 0, replyAdmit)
	if lr := r.f.local[id]; lr == nil || lr.Status != 429 {
		t.Fatalf("one rule denied: %+v", lr)
	}
	refund := r.f.sent[r.lastToken()]
	if len(r.f.order) != 3 || !strings.Contains(refund, "sluice:{r1|") || !strings.HasSuffix(refund, "$1\r\n1\r\n$16\r\n1700000000000000\r\n$1\r\n1\r\n") {
		t.Fatalf("refund of r1: %q (%d calls)", refund, len(r.f.order))
	}
	r.end(id)
	// The local rule was not charged by the denied request: this one is admitted.
	id, _ = r.request("alice")
	r.answer(r.f.order[3], 0, replyAdmit)
	r.answer(r.f.order[4], 0, replyAdmit)
	if !r.continuedOnce(id) {
		t.Fatalf("admitted request not resumed: %v %+v", r.f.continued, r.f.local[id])
	}
	r.end(id)
	// Now the local rule (1 per hour) denies at once: no Redis call.
	calls := len(r.f.order)
	id, act := r.request("alice")
	if act != abi.ActionPause || r.f.local[id] == nil || r.f.local[id].Status != 429 || len(r.f.order) != calls {
		t.Fatalf("local denial: action %v, local %+v, calls %d -> %d", act, r.f.local[id], calls, len(r.f.order))
	}
}

func headerOf(h [][2]string, name string) string {
	for _, kv := range h {
		if strings.EqualFold(kv[0], name) {
			return kv[1]
		}
	}
	return ""
}

// Any reply bytes, any status: the paused request is answered exactly once (resumed or
// rejected) and nothing panics.
func FuzzRedisReply(f *testing.F) {
	for _, s := range []string{replyAdmit, replyDeny, "-NOSCRIPT x\r\n", "-MOVED 1 a:1\r\n", "*7\r\n", "$-1\r\n", ":1\r\n", "*-1\r\n", "*1\r\n*1\r\n*1\r\n:1\r\n"} {
		f.Add(uint32(0), []byte(s))
	}
	f.Add(uint32(2), []byte(""))
	f.Fuzz(func(t *testing.T, status uint32, reply []byte) {
		for _, mode := range []string{"open", "closed", "local"} {
			r := startRedisRig(t, redisRuleConfig(mode, ""))
			id, _ := r.request("alice")
			r.answer(r.lastToken(), status, string(reply))
			if len(r.f.order) == 2 { // NOSCRIPT: the EVAL went out; answer it with the same bytes
				r.answer(r.lastToken(), status, string(reply))
			}
			answered := len(r.f.continued)
			if r.f.local[id] != nil {
				answered++
			}
			if answered != 1 {
				t.Fatalf("%s: status %d reply %q: continued %v local %+v", mode, status, reply, r.f.continued, r.f.local[id])
			}
			for _, l := range r.f.Logs {
				if strings.Contains(l.Msg, "panic") {
					t.Fatalf("%s: %s", mode, l.Msg)
				}
			}
		}
	})
}

// The Redis data path (request, EVALSHA, reply, resume) allocates a bounded, small amount
// per request in steady state (the map entries for the token and the paused stream).
func TestRedisRequestAllocations(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("open", ""))
	r.f.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/api"}, {"x-user", "alice"}}
	cycle := func() {
		r.id++
		id := r.id
		r.f.live[id] = true
		r.f.effective = id
		r.vm.OnContextCreate(id, 1)
		r.vm.OnRequestHeaders(id, 3, true)
		r.answer(r.f.next, 0, replyAdmit)
		r.vm.OnLog(id)
		r.vm.OnDelete(id)
		delete(r.f.live, id)
		r.f.continued = r.f.continued[:0]
		clear(r.f.sent)
		r.f.order = r.f.order[:0]
	}
	for i := 0; i < 100; i++ {
		cycle()
	}
	allocs := testing.AllocsPerRun(1000, cycle)
	t.Logf("allocations per Redis-decided request (filter and fake host): %.1f", allocs)
	if allocs > 8 {
		t.Errorf("%.1f allocations per request", allocs)
	}
}

// A request arriving after another's guard deadline does not answer that other request:
// in cpp-host a local reply sent during bob's callback would stop bob (the VM-wide
// stop-iteration flag). The next tick answers alice; bob's decision is his own.
func TestRedisGuardDuringAnotherRequest(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	old, _ := r.request("alice")
	r.f.Now_ += 61e6 // past alice's guard; no tick came
	id, act := r.request("bob")
	if lr := r.f.local[old]; lr != nil {
		t.Fatalf("alice answered during bob's callback: %+v", lr)
	}
	if act != abi.ActionPause || r.f.effective != id {
		t.Fatalf("bob: action %v, effective context %d, want %d", act, r.f.effective, id)
	}
	if q := r.f.sent[r.lastToken()]; !strings.Contains(q, "sluice:{r1|#") || len(r.f.order) != 2 {
		t.Fatalf("bob's call: %.80q", q)
	}
	r.f.effective = 1
	r.vm.OnTick(1)
	if lr := r.f.local[old]; lr == nil || lr.Status != 503 || r.f.local[id] != nil {
		t.Fatalf("after the tick: alice %+v, bob %+v", lr, r.f.local[id])
	}
	r.answer(r.lastToken(), 0, replyAdmit)
	if !r.continuedOnce(id) {
		t.Fatalf("bob not resumed: %v", r.f.continued)
	}
}

// A request that no rule applies to, arriving after a waiting request's guard deadline,
// goes on at once and answers nobody else.
func TestRedisGuardNotRunByAnUnlimitedRequest(t *testing.T) {
	r := startRedisRig(t, redisRuleConfig("closed", ""))
	old, _ := r.request("alice")
	r.f.Now_ += 61e6
	r.id++
	id := r.id
	r.f.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/api"}} // no x-user
	r.f.live[id], r.f.effective, r.f.inStream = true, id, id
	r.vm.OnContextCreate(id, 1)
	act := r.vm.OnRequestHeaders(id, 2, true)
	r.f.inStream = 0
	if act != abi.ActionContinue || len(r.f.local) != 0 || len(r.f.continued) != 0 {
		t.Fatalf("unlimited request: action %v, local replies %v, continued %v", act, r.f.local, r.f.continued)
	}
	r.f.effective = 1
	r.vm.OnTick(1)
	if lr := r.f.local[old]; lr == nil || lr.Status != 503 {
		t.Fatalf("alice after the tick: %+v", lr)
	}
}
