package filter_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// loginWindowCfg: 5 failed logins per user per 15-minute window.
func loginWindowCfg(alg string) string {
	return `{"rules":[{"name":"login","match":{"path_prefix":"/login"},"key":[{"header":"x-user"}],
  "algorithm":"` + alg + `","limit":5,"window":"15m","count":{"status":[401,403]}}]}`
}

// fixed_window: successes are given back (unlimited); five failures lock the user out for the
// rest of the window, right password or not; the next window lets them try again.
func TestCountFixedWindowLogins(t *testing.T) {
	r := startCostRig(t, loginWindowCfg("fixed_window"))
	end := t0 - t0%int64(15*time.Minute) + int64(15*time.Minute) // t0 is 12:10, the window ends at 12:15
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
	// Locked out for the rest of the window: a refill would have let one in after 3 minutes.
	for _, at := range []int64{t0, t0 + int64(3*time.Minute), end - 1} {
		r.h.Now_ = at
		if _, ok := r.start("alice"); ok {
			t.Fatalf("attempt %v before the window's end admitted", time.Duration(end-at))
		}
	}
	if _, ok := r.start("bob"); !ok {
		t.Fatal("another user refused")
	}
	r.h.Now_ = end
	for i := 0; i < 5; i++ {
		id, ok := r.start("alice")
		if !ok {
			t.Fatalf("attempt %d in the next window refused", i)
		}
		r.finish(id, 403)
	}
	if _, ok := r.start("alice"); ok {
		t.Fatal("sixth failure of the next window admitted")
	}
	for name, want := range map[string]int64{"sluice.login.allowed": 61, "sluice.login.denied": 4, "sluice.login.refunded": 50} {
		if got := r.metric(name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
}

// In flight, out of order, reset: of 8 concurrent attempts 5 go upstream; the two
// successes give their units back, the reset keeps its own.
func TestCountFixedWindowInFlight(t *testing.T) {
	r := startCostRig(t, loginWindowCfg("fixed_window"))
	var ids []uint32
	for i := 0; i < 8; i++ {
		if id, ok := r.start("carol"); ok {
			ids = append(ids, id)
		}
	}
	if len(ids) != 5 {
		t.Fatalf("%d of 8 concurrent attempts admitted, want 5", len(ids))
	}
	r.finish(ids[4], 200)
	r.finish(ids[0], 0)
	r.finish(ids[3], 200)
	r.finish(ids[2], 401)
	r.finish(ids[1], 401)
	for i := 0; i < 2; i++ {
		id, ok := r.start("carol")
		if !ok {
			t.Fatalf("attempt %d after the give-backs refused", i)
		}
		r.finish(id, 401)
	}
	if _, ok := r.start("carol"); ok {
		t.Fatal("admitted with 5 counted: a reset and four failures")
	}
}

// A give-back is made to the window the attempt was counted in: an attempt admitted in one
// window and answered in the next gives nothing to the new window under fixed_window, and
// gives back exactly its weight under sliding_window.
func TestCountWindowAcrossBoundary(t *testing.T) {
	end := t0 - t0%int64(15*time.Minute) + int64(15*time.Minute)
	for _, c := range []struct {
		alg  string
		want int // failures admitted in the next window after a give-back across it
	}{{"fixed_window", 5}, {"sliding_window", 5}} {
		t.Run(c.alg, func(t *testing.T) {
			r := startCostRig(t, loginWindowCfg(c.alg))
			r.h.Now_ = end - int64(time.Second)
			var ids []uint32
			for i := 0; i < 5; i++ {
				id, ok := r.start("dave")
				if !ok {
					t.Fatalf("attempt %d refused", i)
				}
				ids = append(ids, id)
			}
			r.h.Now_ = end // the responses come in the next window: all successes
			for _, id := range ids {
				r.finish(id, 200)
			}
			n := 0
			for i := 0; i < 10; i++ {
				id, ok := r.start("dave")
				if !ok {
					break
				}
				n++
				r.finish(id, 401)
			}
			if n != c.want {
				t.Fatalf("%d failures admitted after the give-backs, want %d", n, c.want)
			}
			if got := r.metric("sluice.login.refunded"); c.alg == "sliding_window" && got != 5 || c.alg == "fixed_window" && got != 0 {
				t.Fatalf("refunded = %d", got)
			}
		})
	}
}

// On the rls backend a fixed_window response that does not count sends sluice.refund with
// the token the service answered the admission with; one that counts sends nothing.
func TestCountWindowOverRLS(t *testing.T) {
	r := startRLSRig(t, `{"rules":[{"name":"login","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"15m",
	  "backend":"rls","count":{"status":[401]}}],"rls":{"cluster":"ratelimit","domain":"edge"}}`)
	for _, c := range []struct {
		status string
		back   bool
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
		if c.back && (last == tok || !strings.HasSuffix(got, "sluice.refund=1700000000000000:40")) {
			t.Errorf("%s: last call %q, want a refund of the admission", c.status, got)
		}
		if !c.back && last != tok {
			t.Errorf("%s: a call after the decision: %q", c.status, got)
		}
	}
}

// On the Redis backend a fixed_window response that does not count runs the script's refund
// op with the stamp and ref of the admission's reply; one that counts sends nothing.
func TestCountWindowOverRedis(t *testing.T) {
	r := startRedisRig(t, `{"rules":[{"name":"login","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":5,"window":"15m",
	  "backend":"redis","count":{"status":[401]}}],"failure_mode":"closed","redis":{"cluster":"rc","timeout_ms":50}}`)
	bulk := func(s string) string { return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n" }
	for _, c := range []struct {
		status string
		back   bool
	}{{"200", true}, {"401", false}} {
		id, _ := r.budgetRequest("alice", "")
		tok := r.lastToken()
		r.answer(tok, 0, replyAdmit)
		r.f.RespHeaders = [][2]string{{":status", c.status}}
		r.f.effective, r.f.inStream = id, id
		r.vm.OnResponseHeaders(id, 1, true)
		r.f.inStream = 0
		r.end(id)
		last := r.lastToken()
		q := r.f.sent[last]
		want := bulk("1") + bulk("0") + bulk("1") + bulk("1700000000000000") + bulk("1")
		if c.back && (last == tok || !strings.HasSuffix(q, want) || !strings.Contains(q, "}:fw2")) {
			t.Errorf("%s: last call %q, want the refund of the admission", c.status, q)
		}
		if !c.back && last != tok {
			t.Errorf("%s: a call after the decision: %q", c.status, q)
		}
	}
}
