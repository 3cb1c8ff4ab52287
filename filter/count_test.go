package filter_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// loginCfg: 5 failed logins (401, 403) per user per 15 minutes; successes are not charged.
const loginCfg = `{"rules":[{"name":"login","match":{"path_prefix":"/login"},"key":[{"header":"x-user"}],
  "algorithm":"token_bucket","limit":5,"window":"15m","count":{"status":[401,403]}}]}`

// start sends the request headers of a login of user; it returns the stream's id and
// whether the filter let it through.
func (r *costRig) start(user string) (uint32, bool) {
	h := r.h
	r.next++
	id := r.next
	h.ReqHeaders = [][2]string{{":method", "POST"}, {":path", "/login"}, {":authority", "x"}, {"x-user", user}}
	h.Properties = map[string]string{}
	h.Local = nil
	r.vm.OnContextCreate(id, 1)
	r.vm.OnRequestHeaders(id, len(h.ReqHeaders), false)
	if h.Local != nil {
		filtertest.EndStream(r.vm, id)
		return id, false
	}
	return id, true
}

// finish answers stream id with status (0: the stream is reset before any response) and
// ends it.
func (r *costRig) finish(id uint32, status int, hdrs ...[2]string) {
	if status > 0 {
		r.h.RespHeaders = append([][2]string{{":status", strconv.Itoa(status)}}, hdrs...)
		filtertest.ResponseHeaders(r.vm, id, len(r.h.RespHeaders), true)
	}
	filtertest.EndStream(r.vm, id)
}

// Successes are never charged; the sixth failure is refused at its headers, and so is a
// correct password afterwards (the attacker locked out stays out) until a unit refills.
func TestCountFailedLogins(t *testing.T) {
	r := startCostRig(t, loginCfg)
	for i := 0; i < 50; i++ {
		id, ok := r.start("alice")
		if !ok {
			t.Fatalf("success %d refused", i)
		}
		r.finish(id, 200)
	}
	for i := 0; i < 5; i++ {
		id, ok := r.start("alice")
		if !ok {
			t.Fatalf("failure %d refused", i)
		}
		r.finish(id, 401)
	}
	if _, ok := r.start("alice"); ok {
		t.Fatal("sixth attempt admitted after 5 failures")
	}
	if _, ok := r.start("bob"); !ok {
		t.Fatal("another user refused")
	}
	// One unit refills every 3 minutes (5 per 15m).
	r.h.Now_ += int64(3 * time.Minute)
	id, ok := r.start("alice")
	if !ok {
		t.Fatal("no attempt after 3 minutes")
	}
	r.finish(id, 403)
	if _, ok := r.start("alice"); ok {
		t.Fatal("a second attempt after 3 minutes")
	}
	for name, want := range map[string]int64{"sluice.login.allowed": 57, "sluice.login.denied": 2, "sluice.login.refunded": 50} {
		if got := r.metric(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// Attempts in flight hold their unit until their response: of 8 concurrent attempts only 5
// go upstream; responses arriving in any order settle their own stream; a stream reset
// before its response stays charged.
func TestCountInFlightAndOutOfOrder(t *testing.T) {
	r := startCostRig(t, loginCfg)
	var ids []uint32
	admitted := 0
	for i := 0; i < 8; i++ {
		if id, ok := r.start("carol"); ok {
			ids = append(ids, id)
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("%d of 8 concurrent attempts admitted, want 5", admitted)
	}
	// Out of order: the last two succeed, the first is reset, the others fail.
	r.finish(ids[4], 200)
	r.finish(ids[3], 200)
	r.finish(ids[0], 0)
	r.finish(ids[2], 401)
	r.finish(ids[1], 500)    // not counted: refunded
	for i := 0; i < 2; i++ { // 5 − (reset + one 401) = 3 left... two are refunded: 3 free units
		id, ok := r.start("carol")
		if !ok {
			t.Fatalf("attempt %d after the refunds refused", i)
		}
		r.finish(id, 401)
	}
	id, ok := r.start("carol")
	if !ok {
		t.Fatal("the third unit is not free")
	}
	r.finish(id, 401)
	if _, ok := r.start("carol"); ok {
		t.Fatal("admitted with 5 charged: reset + 4 failures")
	}
}

// A header condition: only responses saying x-login: failed count.
func TestCountHeader(t *testing.T) {
	r := startCostRig(t, `{"rules":[{"name":"h","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":1,"window":"1h",
	  "count":{"status":["2xx"],"header":{"name":"x-login","exact":"failed"}}}]}`)
	for i := 0; i < 3; i++ {
		id, _ := r.start("d")
		r.finish(id, 200, [2]string{"x-login", "ok"})
	}
	id, _ := r.start("d")
	r.finish(id, 200, [2]string{"x-login", "failed"})
	if _, ok := r.start("d"); ok {
		t.Fatal("admitted after the counted response")
	}
}

// On the rls backend a response that does not count is a settlement of -cost (sluice.settle);
// one that counts sends nothing.
func TestCountOverRLS(t *testing.T) {
	r := startRLSRig(t, `{"rules":[{"name":"login","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":5,"window":"15m",
	  "backend":"rls","count":{"status":[401]}}],"rls":{"cluster":"ratelimit","domain":"edge"}}`)
	for _, c := range []struct {
		status string
		settle bool
	}{{"200", true}, {"401", false}} {
		id, _ := r.request("alice")
		tok := r.lastToken()
		r.answer(tok, okReply(status(rlsv3.RateLimitResponse_OK, 4, time.Second)))
		r.f.RespHeaders = [][2]string{{":status", c.status}}
		r.f.effective = id
		r.vm.OnResponseHeaders(id, 1, true)
		r.end(id)
		last := r.lastToken()
		got := descriptorEntries(r.f.sent[last], 0)
		if c.settle && (last == tok || !strings.HasSuffix(got, "sluice.settle=-1")) {
			t.Errorf("%s: last call %q, want a settlement of -1", c.status, got)
		}
		if !c.settle && last != tok {
			t.Errorf("%s: a call after the decision: %q", c.status, got)
		}
	}
}
