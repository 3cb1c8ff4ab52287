package filter_test

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// On the rls backend a plan's parameters travel in the request's descriptor; the decision's
// Limit is the plan's; each request under a plan is a call of its own.
func TestPlansOverRLS(t *testing.T) {
	r := startRLSRig(t, `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"token_bucket","limit":100,"window":"1m","burst":20,"backend":"rls",
	  "overrides":{"by":{"header":"x-user"},"values":{"acme":{"limit":7,"burst":3,"window":"1h"}}}}],
	  "rls":{"cluster":"ratelimit","domain":"edge"}}`)
	for _, c := range []struct{ user, want, limit string }{
		{"acme", "sluice.rule=r1 sluice.algorithm=token_bucket sluice.limit=7 sluice.window_us=3600000000 sluice.burst=3 sluice.key=", "3"},
		{"bob", "sluice.rule=r1 sluice.algorithm=token_bucket sluice.limit=100 sluice.window_us=60000000 sluice.burst=20 sluice.key=", "20"},
	} {
		id, _ := r.request(c.user)
		tok := r.lastToken()
		got := descriptorEntries(r.f.sent[tok], 0)
		if !strings.HasPrefix(got, c.want) {
			t.Errorf("%s: entries %q, want prefix %q", c.user, got, c.want)
		}
		if l := r.answer(tok, okReply(status(rlsv3.RateLimitResponse_OK, 1, time.Second))); l != nil {
			t.Fatalf("%s: local response %+v", c.user, l)
		}
		r.f.RespHeaders = [][2]string{{":status", "200"}}
		r.f.effective = id
		r.vm.OnResponseHeaders(id, 1, false)
		var lim string
		for _, kv := range r.f.RespHeaders {
			if kv[0] == "x-ratelimit-limit" {
				lim = kv[1]
			}
		}
		if lim != c.limit {
			t.Errorf("%s: x-ratelimit-limit %q, want %s (%v)", c.user, lim, c.limit, r.f.RespHeaders)
		}
		r.end(id)
	}
	// Two requests of acme at once: two calls (a plan's request is not coalesced).
	before := len(r.f.order)
	r.request("acme")
	r.request("acme")
	if n := len(r.f.order) - before; n != 2 {
		t.Errorf("%d calls for two requests under a plan, want 2", n)
	}
}

// On the redis backend a plan's parameters are the script's arguments (the script's reply
// then carries the plan's limit, as for a rule's own).
func TestPlansOverRedis(t *testing.T) {
	r := startRedisRig(t, `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":100,"window":"1h","backend":"redis",
	  "overrides":{"by":{"header":"x-user"},"values":{"acme":7}}}],"redis":{"cluster":"rc"}}`)
	for _, c := range []struct{ user, arg string }{{"acme", "$1\r\n7\r\n"}, {"bob", "$3\r\n100\r\n"}} {
		id, _ := r.request(c.user)
		if q := r.f.sent[r.lastToken()]; !strings.Contains(q, c.arg) {
			t.Errorf("%s: query %q lacks the limit %q", c.user, q, c.arg)
		}
		r.answer(r.lastToken(), 0, replyAdmit)
		r.end(id)
	}
}
