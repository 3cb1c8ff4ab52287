package filter_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Native tests of the rls backend against a fake host whose gRPC calls the test answers by
// hand. The messages the filter encodes are decoded, and the replies it decodes encoded,
// with go-control-plane's generated code: the hand-written codec is checked against the
// real protobuf schema.

type rlsFake struct {
	*filtertest.Host
	callStatus abi.Status
	next       uint32
	sent       map[uint32]*rlsv3.RateLimitRequest
	raw        map[uint32][]byte
	order      []uint32
	cancelled  []uint32
	cluster    string
	timeoutMS  uint32
	reply      []byte
	effective  uint32
	live       map[uint32]bool
	continued  []uint32
	tickMS     uint32
	inStream   uint32 // the stream whose callback runs (0: root callback)
	quiet      bool   // keep no record of the calls (allocation test)
	foreign    []string
	done       int // proxy_done calls
	t          *testing.T
}

var _ filter.GrpcHost = (*rlsFake)(nil)

func (f *rlsFake) GrpcCall(cluster, service, method string, msg []byte, timeoutMS uint32) (uint32, abi.Status) {
	if f.callStatus != abi.StatusOK {
		return 0, f.callStatus
	}
	if service != "envoy.service.ratelimit.v3.RateLimitService" || method != "ShouldRateLimit" {
		f.t.Errorf("grpc call to %s/%s", service, method)
	}
	f.next++
	f.order = append(f.order, f.next)
	if f.quiet {
		return f.next, abi.StatusOK
	}
	req := new(rlsv3.RateLimitRequest)
	if err := proto.Unmarshal(msg, req); err != nil {
		f.t.Errorf("the filter's RateLimitRequest does not decode: %v (%x)", err, msg)
	}
	f.sent[f.next] = req
	f.raw[f.next] = append([]byte(nil), msg...)
	f.cluster, f.timeoutMS = cluster, timeoutMS
	return f.next, abi.StatusOK
}

func (f *rlsFake) GrpcCancel(token uint32) abi.Status {
	f.cancelled = append(f.cancelled, token)
	return abi.StatusOK
}

func (f *rlsFake) SetEffectiveContext(id uint32) abi.Status {
	if f.inStream != 0 {
		f.foreign = append(f.foreign, fmt.Sprintf("proxy_set_effective_context(%d) during stream %d's callback", id, f.inStream))
	}
	if id != 1 && !f.live[id] {
		return abi.StatusNotFound
	}
	f.effective = id
	return abi.StatusOK
}

func (f *rlsFake) ContinueStream() abi.Status {
	if f.inStream != 0 {
		f.foreign = append(f.foreign, fmt.Sprintf("proxy_continue_stream during stream %d's callback", f.inStream))
	}
	f.continued = append(f.continued, f.effective)
	return abi.StatusOK
}

func (f *rlsFake) Done() abi.Status { f.done++; return abi.StatusOK }

func (f *rlsFake) SetTickPeriod(ms uint32) abi.Status { f.tickMS = ms; return abi.StatusOK }

func (f *rlsFake) GetBuffer(bt abi.BufferType, start, max int) ([]byte, abi.Status) {
	if bt == abi.BufferGrpcReceive {
		return f.reply, abi.StatusOK
	}
	return f.Host.GetBuffer(bt, start, max)
}

type rlsRig struct {
	t     *testing.T
	f     *rlsFake
	vm    *filter.VM
	id    uint32
	extra [][2]string // more request headers
}

func startRLSRig(t *testing.T, cfg string) *rlsRig {
	t.Helper()
	f := &rlsFake{Host: filtertest.NewHost(), next: 100, sent: map[uint32]*rlsv3.RateLimitRequest{},
		raw: map[uint32][]byte{}, live: map[uint32]bool{}, t: t}
	f.Now_ = t0
	vm := filter.NewVM(f)
	f.Config = []byte(cfg)
	vm.OnContextCreate(1, 0)
	if !vm.OnVMStart(1, 0) || !vm.OnConfigure(1, len(cfg)) {
		t.Fatalf("plugin refused to start: %v", f.Logs)
	}
	t.Cleanup(func() {
		if len(f.foreign) > 0 {
			t.Errorf("streams resumed from another stream's callback: %v", f.foreign)
		}
	})
	return &rlsRig{t: t, f: f, vm: vm, id: 1}
}

// request starts a request for user and returns its context id and action; a local
// response it gets is in local().
func (r *rlsRig) request(user string) (uint32, abi.Action) {
	r.id++
	id := r.id
	r.f.ReqHeaders = append([][2]string{{":method", "GET"}, {":path", "/api"}, {"x-user", user}}, r.extra...)
	r.f.live[id] = true
	r.f.effective = id
	r.f.Local = nil
	r.vm.OnContextCreate(id, 1)
	r.f.inStream = id
	defer func() { r.f.inStream = 0 }()
	return id, r.vm.OnRequestHeaders(id, 3, true)
}

func (r *rlsRig) end(id uint32) {
	r.f.effective = id
	r.vm.OnLog(id)
	r.vm.OnDelete(id)
	delete(r.f.live, id)
}

// answer delivers a reply message as the root context (proxy_on_grpc_receive); the local
// response it caused, if any, is returned.
func (r *rlsRig) answer(token uint32, resp *rlsv3.RateLimitResponse) *filtertest.LocalResponse {
	b, err := proto.Marshal(resp)
	if err != nil {
		r.t.Fatal(err)
	}
	return r.answerRaw(token, b)
}

func (r *rlsRig) answerRaw(token uint32, b []byte) *filtertest.LocalResponse {
	r.f.reply = b
	r.f.effective = 1
	r.f.Local = nil
	r.vm.OnGrpcReceive(1, token, len(b))
	return r.f.Local
}

func (r *rlsRig) close(token, status uint32) *filtertest.LocalResponse {
	r.f.effective = 1
	r.f.Local = nil
	r.vm.OnGrpcClose(1, token, status)
	return r.f.Local
}

func (r *rlsRig) lastToken() uint32 {
	r.t.Helper()
	if len(r.f.order) == 0 {
		r.t.Fatal("no grpc call made")
	}
	return r.f.order[len(r.f.order)-1]
}

func (r *rlsRig) metric(name string) int64 {
	v, _ := r.f.Metrics.Get(name)
	return v
}

func (r *rlsRig) continued(id uint32) int {
	n := 0
	for _, c := range r.f.continued {
		if c == id {
			n++
		}
	}
	return n
}

func rlsConfig(failure, extraRules string) string {
	return `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":100,"window":"1m","burst":20,"backend":"rls"}` + extraRules + `],
"failure_mode":"` + failure + `","rls":{"cluster":"ratelimit","domain":"edge","timeout_ms":40,"instances":10}}`
}

func status(code rlsv3.RateLimitResponse_Code, remaining uint32, d time.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{Code: code, LimitRemaining: remaining, DurationUntilReset: durationpb.New(d)}
}

func okReply(statuses ...*rlsv3.RateLimitResponse_DescriptorStatus) *rlsv3.RateLimitResponse {
	overall := rlsv3.RateLimitResponse_OK
	var hdrs []*corev3.HeaderValue
	for i, s := range statuses {
		if s.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			overall = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		hdrs = append(hdrs, &corev3.HeaderValue{Key: "x-sluice-refund", Value: fmt.Sprintf("%d:%d:%d", i, 1700000000000000+i, 40+i)})
	}
	if overall != rlsv3.RateLimitResponse_OK {
		hdrs = nil
	}
	return &rlsv3.RateLimitResponse{OverallCode: overall, Statuses: statuses, ResponseHeadersToAdd: hdrs}
}

func descriptorEntries(req *rlsv3.RateLimitRequest, i int) string {
	var parts []string
	for _, e := range req.GetDescriptors()[i].GetEntries() {
		parts = append(parts, e.GetKey()+"="+e.GetValue())
	}
	return strings.Join(parts, " ")
}

// The request carries, per applying rule, the inline descriptor of the wire contract in
// its order; domain and hits_addend; the cluster and timeout of the "rls" object. The key
// is escaped so the proto string is UTF-8 ('%' and invalid bytes as %XX). Enforcing rules
// share one call; a shadow rule has its own.
func TestRLSRequestEncoding(t *testing.T) {
	r := startRLSRig(t, rlsConfig("open",
		`,{"name":"r2","key":[{"header":"x-user"},{"method":true}],"algorithm":"sliding_window","limit":7,"window":"1s","backend":"rls"}`+
			`,{"name":"s3","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls","mode":"shadow"}`+
			`,{"name":"l4","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h"}`))
	if r.f.tickMS != 40 {
		t.Errorf("tick period %d ms, want rls.timeout_ms (40)", r.f.tickMS)
	}
	id, act := r.request("a%b\xff\xfe✓")
	if act != abi.ActionPause {
		t.Fatalf("action %v, want Pause while the service decides", act)
	}
	if len(r.f.order) != 2 || r.f.cluster != "ratelimit" || r.f.timeoutMS != 40 {
		t.Fatalf("calls %v to %q timeout %d: want 2 to ratelimit, 40 ms", r.f.order, r.f.cluster, r.f.timeoutMS)
	}
	enf, sh := r.f.sent[r.f.order[0]], r.f.sent[r.f.order[1]]
	if enf.GetDomain() != "edge" || enf.GetHitsAddend() != 1 || len(enf.GetDescriptors()) != 2 || len(sh.GetDescriptors()) != 1 {
		t.Fatalf("enforcing call %v, shadow call %v", enf, sh)
	}
	// The key is the rule's key as the filter builds it (each part length-prefixed: a
	// header part "\x02<len>value", the method "\x06<len>GET"), opaque to the service.
	want := []string{
		"sluice.rule=r1 sluice.algorithm=token_bucket sluice.limit=100 sluice.window_us=60000000 sluice.burst=20 sluice.key=\x02\x08a%25b%FF%FE✓",
		"sluice.rule=r2 sluice.algorithm=sliding_window sluice.limit=7 sluice.window_us=1000000 sluice.burst=0 sluice.key=\x02\x08a%25b%FF%FE✓\x06\x03GET",
	}
	for i, w := range want {
		if got := descriptorEntries(enf, i); got != w {
			t.Errorf("descriptor %d:\n got %q\nwant %q", i, got, w)
		}
	}
	if got := descriptorEntries(sh, 0); !strings.HasPrefix(got, "sluice.rule=s3 sluice.algorithm=fixed_window sluice.limit=5 sluice.window_us=3600000000 sluice.burst=0 sluice.key=") {
		t.Errorf("shadow descriptor %q", got)
	}
	// The shadow rule denies: the request goes on, with the enforcing rules' decisions.
	r.answer(r.f.order[1], okReply(status(rlsv3.RateLimitResponse_OVER_LIMIT, 0, 3*time.Second)))
	if r.continued(id) != 0 {
		t.Fatal("resumed before every call answered")
	}
	if lr := r.answer(r.f.order[0], okReply(status(rlsv3.RateLimitResponse_OK, 19, 3*time.Second), status(rlsv3.RateLimitResponse_OK, 6, time.Second))); lr != nil || r.continued(id) != 1 {
		t.Fatalf("local response %v, continued %v", lr, r.f.continued)
	}
	if n := r.metric("sluice.s3.shadow_denied"); n != 1 {
		t.Errorf("s3 shadow_denied %d", n)
	}
	if n := r.metric("sluice.r1.allowed") + r.metric("sluice.r2.allowed") + r.metric("sluice.l4.allowed"); n != 3 {
		t.Errorf("allowed %d, want 3", n)
	}
}

// An admission resumes the request with the service's remaining and reset in the response
// headers; a denial answers with the configured rejection, Retry-After from
// duration_until_reset.
func TestRLSAdmitAndDeny(t *testing.T) {
	r := startRLSRig(t, rlsConfig("open", ""))
	id, _ := r.request("alice")
	if lr := r.answer(r.lastToken(), okReply(status(rlsv3.RateLimitResponse_OK, 17, 9*time.Second))); lr != nil || r.continued(id) != 1 {
		t.Fatalf("admitted: local %v continued %v", lr, r.f.continued)
	}
	r.f.RespHeaders = [][2]string{{":status", "200"}}
	r.f.effective = id
	r.vm.OnResponseHeaders(id, 1, false)
	if got := headerOf(r.f.RespHeaders, "ratelimit"); got != `"r1";r=17;t=9` {
		t.Errorf("RateLimit %q", got)
	}
	if got := headerOf(r.f.RespHeaders, "x-ratelimit-limit"); got != "20" {
		t.Errorf("X-RateLimit-Limit %q, want the burst", got)
	}
	r.end(id)

	id, _ = r.request("alice")
	lr := r.answer(r.lastToken(), okReply(status(rlsv3.RateLimitResponse_OVER_LIMIT, 0, 2500*time.Millisecond)))
	if lr == nil || lr.Status != 429 || r.continued(id) != 0 {
		t.Fatalf("denied: local %+v continued %v", lr, r.f.continued)
	}
	if got := headerOf(lr.Headers, "retry-after"); got != "3" {
		t.Errorf("Retry-After %q, want 3 (2.5 s rounded up)", got)
	}
	if n := r.metric("sluice.r1.denied"); n != 1 {
		t.Errorf("denied %d", n)
	}
	if n := r.metric(filter.MetricRLSCalls); n != 2 {
		t.Errorf("calls %d", n)
	}
}

// Every way the service can fail to decide follows failure_mode: a gRPC status
// (UNAVAILABLE, DEADLINE_EXCEEDED), a reply that does not decode or answers the wrong
// number of descriptors, a call the host refuses, and no reply at all (the guard, which
// cancels the call).
func TestRLSFailuresFollowFailureMode(t *testing.T) {
	bad := map[string]func(r *rlsRig){
		"unavailable": func(r *rlsRig) { r.close(r.lastToken(), 14) },
		"deadline":    func(r *rlsRig) { r.close(r.lastToken(), 4) },
		"garbage":     func(r *rlsRig) { r.answerRaw(r.lastToken(), []byte{0x12, 0x7f, 0x01}) },
		"no statuses": func(r *rlsRig) {
			r.answer(r.lastToken(), &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK})
		},
		"unknown code": func(r *rlsRig) {
			r.answer(r.lastToken(), &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{}}})
		},
		"guard": func(r *rlsRig) {
			r.f.Now_ += int64(60 * time.Millisecond)
			r.f.effective = 1
			r.vm.OnTick(1)
			if len(r.f.cancelled) != 1 || r.f.cancelled[0] != r.lastToken() {
				r.t.Errorf("guard cancelled %v, want the call %d", r.f.cancelled, r.lastToken())
			}
			lr := r.f.Local
			if late := r.answer(r.lastToken(), okReply(status(rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Second))); late != nil {
				r.t.Errorf("a reply after the guard answered: %+v", late) // too late: ignored
			}
			r.f.Local = lr
		},
	}
	for name, fail := range bad {
		for _, mode := range []string{"open", "closed", "local"} {
			t.Run(name+"/"+mode, func(t *testing.T) {
				r := startRLSRig(t, rlsConfig(mode, ""))
				id, act := r.request("bob")
				if act != abi.ActionPause {
					t.Fatalf("action %v", act)
				}
				fail(r)
				switch mode {
				case "open", "local":
					if r.continued(id) != 1 || r.f.Local != nil {
						t.Fatalf("continued %v local %v", r.f.continued, r.f.Local)
					}
				case "closed":
					if r.continued(id) != 0 || r.f.Local == nil || r.f.Local.Status != 503 {
						t.Fatalf("continued %v local %+v, want 503", r.f.continued, r.f.Local)
					}
				}
				if n := r.metric(filter.MetricRLSFailures); n != 1 {
					t.Errorf("failures %d", n)
				}
				if n := r.metric("sluice.rls.fail_" + mode); n != 1 {
					t.Errorf("fail_%s %d", mode, n)
				}
				wantTimeout := int64(0)
				if name == "deadline" || name == "guard" {
					wantTimeout = 1
				}
				if n := r.metric(filter.MetricRLSTimeouts); n != wantTimeout {
					t.Errorf("timeouts %d, want %d", n, wantTimeout)
				}
			})
		}
	}
	t.Run("refused", func(t *testing.T) {
		r := startRLSRig(t, rlsConfig("closed", ""))
		r.f.callStatus = abi.StatusBadArgument
		_, act := r.request("bob")
		if act != abi.ActionPause || r.f.Local == nil || r.f.Local.Status != 503 {
			t.Fatalf("refused call under closed: action %v local %+v", act, r.f.Local)
		}
	})
}

// failure_mode local decides on this proxy with the limit divided by rls.instances: burst
// 20 / 10 → 2 admitted, then denied.
func TestRLSLocalFallbackDividesTheLimit(t *testing.T) {
	r := startRLSRig(t, rlsConfig("local", ""))
	var got []int
	for i := 0; i < 4; i++ {
		id, _ := r.request("carol")
		lr := r.close(r.lastToken(), 14)
		if lr != nil {
			got = append(got, lr.Status)
		} else if r.continued(id) == 1 {
			got = append(got, 200)
		}
		r.end(id)
	}
	if fmt.Sprint(got) != "[200 200 429 429]" {
		t.Errorf("outcomes %v, want [200 200 429 429]", got)
	}
}

// A request the service admitted but that ends up denied — a local rule denies at resume
// (another request charged it meanwhile), or the stream ended while waiting — is refunded
// with the tokens of the reply, in one call of refund descriptors.
func TestRLSRefunds(t *testing.T) {
	r := startRLSRig(t, rlsConfig("open", `,{"name":"l2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":1,"window":"1h"}`))
	a, _ := r.request("dave")
	ta := r.lastToken()
	b, _ := r.request("dave") // l2 has not been charged yet: b waits too
	tb := r.lastToken()
	r.answer(ta, okReply(status(rlsv3.RateLimitResponse_OK, 19, time.Second)))
	if r.continued(a) != 1 {
		t.Fatal("a not resumed")
	}
	lr := r.answer(tb, okReply(status(rlsv3.RateLimitResponse_OK, 18, time.Second)))
	if lr == nil || lr.Status != 429 || r.continued(b) != 0 {
		t.Fatalf("b: local %+v, want 429 from l2", lr)
	}
	refund := r.f.sent[r.lastToken()]
	if r.lastToken() == tb || len(refund.GetDescriptors()) != 1 {
		t.Fatalf("no refund call: %v", refund)
	}
	got := descriptorEntries(refund, 0)
	if !strings.HasPrefix(got, "sluice.rule=r1 ") || !strings.HasSuffix(got, " sluice.key=\x02\x04dave sluice.refund=1700000000000000:40") {
		t.Errorf("refund descriptor %q", got)
	}
	if n := r.metric(filter.MetricRLSRefunds); n != 1 {
		t.Errorf("refunds %d", n)
	}
	r.answer(r.lastToken(), okReply(status(rlsv3.RateLimitResponse_OK, 19, time.Second)))

	// The stream ends while its call is in flight: the admission is refunded.
	c, _ := r.request("erin")
	tc := r.lastToken()
	r.end(c)
	r.answer(tc, okReply(status(rlsv3.RateLimitResponse_OK, 19, time.Second)))
	if r.lastToken() == tc || r.continued(c) != 0 {
		t.Fatalf("ended stream: calls %v continued %v", r.f.order, r.f.continued)
	}
	if got := descriptorEntries(r.f.sent[r.lastToken()], 0); !strings.HasSuffix(got, " sluice.key=\x02\x04erin sluice.refund=1700000000000000:40") {
		t.Errorf("refund descriptor %q", got)
	}
	// A refund call that fails is counted.
	r.close(r.lastToken(), 14)
	if n := r.metric(filter.MetricRLSRefundFailures); n != 1 {
		t.Errorf("refund failures %d", n)
	}
}

// Two enforcing RLS rules share one call; when the service denies one, it has refunded the
// other itself (no x-sluice-refund token): the request is denied and no refund call follows.
func TestRLSDeniedCallIsNotRefundedAgain(t *testing.T) {
	r := startRLSRig(t, rlsConfig("open", `,{"name":"r2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}`))
	id, _ := r.request("frank")
	if len(r.f.sent[r.lastToken()].GetDescriptors()) != 2 {
		t.Fatalf("one call with both rules expected: %v", r.f.sent[r.lastToken()])
	}
	calls := len(r.f.order)
	lr := r.answer(r.lastToken(), okReply(status(rlsv3.RateLimitResponse_OK, 19, time.Second), status(rlsv3.RateLimitResponse_OVER_LIMIT, 0, 30*time.Second)))
	if lr == nil || lr.Status != 429 || r.continued(id) != 0 || headerOf(lr.Headers, "retry-after") != "30" {
		t.Fatalf("local %+v", lr)
	}
	if len(r.f.order) != calls || r.metric(filter.MetricRLSRefunds) != 0 || r.metric(filter.MetricRLSRefundFailures) != 0 {
		t.Errorf("calls %d → %d, refunds %d, refund failures %d: want no refund", calls, len(r.f.order), r.metric(filter.MetricRLSRefunds), r.metric(filter.MetricRLSRefundFailures))
	}
	if r.metric("sluice.r2.denied") != 1 || r.metric("sluice.r1.denied") != 0 {
		t.Errorf("denied r1 %d r2 %d", r.metric("sluice.r1.denied"), r.metric("sluice.r2.denied"))
	}
}

// In a "_rules_" scope the rule is named <scope>.<rule> at the service, as its counters
// are, so two scopes' rules of the same name never share a limit.
func TestRLSScopedRuleName(t *testing.T) {
	r := startRLSRig(t, `{"_rules_":[{"_match_domain_":["*"],"scope":"edge","rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":10,"window":"1m","backend":"rls"}],
"rls":{"cluster":"ratelimit","domain":"edge"}}]}`)
	r.extra = [][2]string{{":authority", "a.test"}}
	r.request("gail")
	if len(r.f.order) != 1 {
		t.Fatalf("calls %v (logs %v)", r.f.order, r.f.Logs)
	}
	if got := descriptorEntries(r.f.sent[r.lastToken()], 0); !strings.HasPrefix(got, "sluice.rule=edge.r1 ") {
		t.Errorf("descriptor %q", got)
	}
}

// Without proxy_grpc_call (the nogrpc test build, which the proxytest emulator needs) the
// plugin refuses rls rules with a clear message.
func TestRLSRefusedWithoutGrpcCalls(t *testing.T) {
	f := filtertest.NewHost()
	cfg := rlsConfig("open", "")
	f.Config = []byte(cfg)
	vm := filter.NewVM(f)
	vm.OnContextCreate(1, 0)
	if vm.OnConfigure(1, len(cfg)) {
		t.Fatal("configured rls rules on a host without gRPC calls")
	}
	if !strings.Contains(fmt.Sprint(f.Logs), `backend \"rls\": the host has no gRPC calls`) && !strings.Contains(fmt.Sprint(f.Logs), `backend "rls": the host has no gRPC calls`) {
		t.Errorf("logs %v", f.Logs)
	}
}

// The rls data path (request, call, reply, resume) allocates a bounded, small amount per
// request in steady state: the map entries for the token and the paused stream, as the
// Redis path does.
func TestRLSRequestAllocations(t *testing.T) {
	r := startRLSRig(t, rlsConfig("open", ""))
	reply, err := proto.Marshal(okReply(status(rlsv3.RateLimitResponse_OK, 17, 9*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	r.f.ReqHeaders = [][2]string{{":method", "GET"}, {":path", "/api"}, {"x-user", "alice"}}
	r.f.reply = reply
	cycle := func() {
		r.id++
		id := r.id
		r.f.live[id] = true
		r.f.effective = id
		r.vm.OnContextCreate(id, 1)
		r.vm.OnRequestHeaders(id, 3, true)
		r.f.effective = 1
		r.vm.OnGrpcReceive(1, r.f.next, len(reply))
		r.vm.OnLog(id)
		r.vm.OnDelete(id)
		delete(r.f.live, id)
		r.f.continued = r.f.continued[:0]
		clear(r.f.sent)
		clear(r.f.raw)
		r.f.order = r.f.order[:0]
	}
	r.f.quiet = true
	for i := 0; i < 100; i++ {
		cycle()
	}
	if r.metric("sluice.r1.allowed") != 100 {
		t.Fatalf("allowed %d of 100 warm-up requests", r.metric("sluice.r1.allowed"))
	}
	allocs := testing.AllocsPerRun(1000, cycle)
	t.Logf("allocations per rls-decided request (filter and fake host): %.1f", allocs)
	if allocs > 8 {
		t.Errorf("%.1f allocations per request", allocs)
	}
}

// An outage fails every request: the plugin logs one store-error line per 10 s, the next
// one saying how many went unlogged, while the metric counts each failure.
func TestStoreErrorLogIsRateLimited(t *testing.T) {
	r := startRLSRig(t, rlsConfig("open", ""))
	storeLines := func() []string {
		var out []string
		for _, l := range r.f.Logs {
			if strings.Contains(fmt.Sprint(l), "UNAVAILABLE") {
				out = append(out, fmt.Sprint(l))
			}
		}
		return out
	}
	fail := func(n int) {
		for range n {
			if _, act := r.request("bob"); act != abi.ActionPause {
				t.Fatalf("action %v", act)
			}
			r.close(r.lastToken(), 14)
		}
	}
	fail(50)
	if got := storeLines(); len(got) != 1 || strings.Contains(got[0], "more store errors") {
		t.Fatalf("after 50 failures in one instant: %d lines %q, want 1 plain line", len(got), got)
	}
	r.f.Now_ += int64(9 * time.Second)
	fail(1)
	if got := storeLines(); len(got) != 1 {
		t.Fatalf("9 s later: %d lines, want still 1", len(got))
	}
	r.f.Now_ += int64(time.Second)
	fail(1)
	got := storeLines()
	if len(got) != 2 || !strings.Contains(got[1], "(and 50 more store errors since the last line)") {
		t.Fatalf("10 s later: lines %q, want a second one counting the 50 unlogged", got)
	}
	if n := r.metric(filter.MetricRLSFailures); n != 52 {
		t.Errorf("failures metric %d, want 52: every failure counted", n)
	}
}
