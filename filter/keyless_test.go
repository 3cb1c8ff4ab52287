package filter_test

import (
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// Requests missing their key (rules[].missing_key) on every target: natively, in the
// proxytest emulator and in the embedded host.

func keylessRule(missing, extra string) string {
	return `{"rules":[{"name":"k","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":2,"window":"1h"` +
		missing + extra + `}]}`
}

// skip (the default, and written out): a keyless request is not limited.
func TestMissingKeySkip(t *testing.T) {
	for _, missing := range []string{"", `,"missing_key":"skip"`} {
		forEachTarget(t, keylessRule(missing, ""), func(t *testing.T, tg target) {
			for i := 0; i < 5; i++ {
				if r := tg.do(req("10.1.0.1:1")); r.Status != 200 || r.Has("ratelimit") {
					t.Fatalf("%s: keyless request %d: %d %v", missing, i, r.Status, r.Headers)
				}
			}
		})
	}
}

// shared: every keyless request of the rule (header absent or empty, from any client)
// is counted under one key, apart from every real key.
func TestMissingKeyShared(t *testing.T) {
	cfg := `{"rules":[{"name":"k","key":[{"header":"x-api-key"},{"remote_ip":true}],"missing_key":"shared",
	  "algorithm":"fixed_window","limit":2,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		if r := tg.do(req("10.2.0.1:1")); r.Status != 200 || r.Header("x-ratelimit-remaining") != "1" {
			t.Fatalf("keyless 1: %d %v", r.Status, r.Headers)
		}
		if r := tg.do(req("10.2.0.2:1", "x-api-key", "")); r.Status != 200 || r.Header("x-ratelimit-remaining") != "0" {
			t.Fatalf("keyless 2 (empty header, another client): %d %v", r.Status, r.Headers)
		}
		r := tg.do(req("10.2.0.3:1"))
		if r.Status != 429 || r.Header("retry-after") == "" {
			t.Fatalf("keyless 3: %d %v, want 429", r.Status, r.Headers)
		}
		for _, key := range []string{"a", "%00"} {
			if r := tg.do(req("10.2.0.1:1", "x-api-key", key)); r.Status != 200 || r.Header("x-ratelimit-remaining") != "1" {
				t.Errorf("key %q: %d %v, want its own bucket", key, r.Status, r.Headers)
			}
		}
		if n := tg.metric("sluice.k.denied"); n != 1 {
			t.Errorf("denied %d, want 1", n)
		}
	})
}

// deny: a keyless request is refused with the rule's rejection: Retry-After and reset
// are the window, nothing remains; a keyed request is limited as usual.
func TestMissingKeyDeny(t *testing.T) {
	forEachTarget(t, keylessRule(`,"missing_key":"deny"`, ""), func(t *testing.T, tg target) {
		for _, r := range []filtertest.Request{req("10.3.0.1:1"), req("10.3.0.1:1", "x-api-key", "")} {
			resp := tg.do(r)
			if resp.Status != 429 || resp.Body != "rate limited\n" {
				t.Fatalf("keyless %v: %d %q, want 429", r.Headers, resp.Status, resp.Body)
			}
			for h, want := range map[string]string{
				"retry-after": "3600", "ratelimit": `"k";r=0;t=3600`, "ratelimit-policy": `"k";q=2;w=3600`,
				"x-ratelimit-limit": "2", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "3600",
			} {
				if got := resp.Header(h); got != want {
					t.Errorf("keyless: %s %q, want %q", h, got, want)
				}
			}
		}
		for i, want := range []int{200, 200, 429} {
			if r := tg.do(req("10.3.0.1:1", "x-api-key", "a")); r.Status != want {
				t.Errorf("keyed %d: %d, want %d", i, r.Status, want)
			}
		}
		if n := tg.metric("sluice.k.denied"); n != 3 {
			t.Errorf("denied %d, want 3", n)
		}
	})
}

// deny in shadow mode: counted as shadow_denied, let through, no headers from the rule.
func TestMissingKeyDenyShadow(t *testing.T) {
	forEachTarget(t, keylessRule(`,"missing_key":"deny"`, `,"mode":"shadow"`), func(t *testing.T, tg target) {
		for i := 0; i < 3; i++ {
			if r := tg.do(req("10.3.0.2:1")); r.Status != 200 || r.Has("ratelimit") {
				t.Fatalf("keyless %d: %d %v", i, r.Status, r.Headers)
			}
		}
		if n, d := tg.metric("sluice.k.shadow_denied"), tg.metric("sluice.k.denied"); n != 3 || d != 0 {
			t.Errorf("shadow_denied %d denied %d, want 3 and 0", n, d)
		}
	})
}

// A keyless request refused by a deny rule charges no other rule.
func TestMissingKeyDenyChargesNoRule(t *testing.T) {
	cfg := `{"rules":[{"name":"ip","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":2,"window":"1h"},
	  {"name":"k","key":[{"query":"api_key"}],"missing_key":"deny","algorithm":"fixed_window","limit":5,"window":"1m"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		for i := 0; i < 3; i++ {
			r := req("10.3.0.3:1")
			r.Path = "/x?api_key="
			if resp := tg.do(r); resp.Status != 429 || resp.Header("retry-after") != "60" {
				t.Fatalf("keyless %d: %d %v", i, resp.Status, resp.Headers)
			}
		}
		for i, want := range []int{200, 200, 429} {
			r := req("10.3.0.3:1")
			r.Path = "/x?api_key=a"
			if resp := tg.do(r); resp.Status != want {
				t.Errorf("keyed %d: %d, want %d", i, resp.Status, want)
			}
		}
	})
}

// match.headers "absent": a rule for the requests without the header (absent or empty).
func TestAbsentHeaderMatch(t *testing.T) {
	cfg := `{"rules":[{"name":"keyless","match":{"headers":[{"name":"x-api-key","absent":true}]},
	  "key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":1,"window":"1h"}]}`
	forEachTarget(t, cfg, func(t *testing.T, tg target) {
		if r := tg.do(req("10.6.0.1:1")); r.Status != 200 || r.Header("x-ratelimit-remaining") != "0" {
			t.Fatalf("first keyless: %d %v", r.Status, r.Headers)
		}
		if r := tg.do(req("10.6.0.1:1", "x-api-key", "")); r.Status != 429 {
			t.Errorf("second keyless (empty header): %d, want 429", r.Status)
		}
		for i := 0; i < 3; i++ {
			if r := tg.do(req("10.6.0.1:1", "x-api-key", "a")); r.Status != 200 || r.Has("ratelimit") {
				t.Errorf("keyed %d: %d %v, the rule must not match", i, r.Status, r.Headers)
			}
		}
		if r := tg.do(req("10.6.0.2:1")); r.Status != 200 {
			t.Errorf("keyless from another client: %d", r.Status)
		}
	})
}

// Remote rules: "shared" sends the shared key to the rate-limit service (the same for
// every keyless request, none of the keyed ones); "deny" refuses without any call.
func TestRLSMissingKey(t *testing.T) {
	cfg := `{"rules":[{"name":"s","key":[{"header":"x-user"}],"missing_key":"shared","algorithm":"fixed_window","limit":5,"window":"1h","backend":"rls"}],
"rls":{"cluster":"ratelimit","domain":"edge"}}`
	r := startRLSRig(t, cfg)
	keyOf := func(user string) string {
		t.Helper()
		id, act := r.request(user)
		if act != abi.ActionPause {
			t.Fatalf("user %q: action %v, want a call", user, act)
		}
		entries := descriptorEntries(r.f.sent[r.lastToken()], 0)
		r.answer(r.lastToken(), okReply(status(rlsv3.RateLimitResponse_OK, 4, time.Minute)))
		r.end(id)
		_, k, _ := strings.Cut(entries, "sluice.key=")
		return k
	}
	shared := keyOf("")
	if shared != "\x00" {
		t.Errorf("shared key %q", shared)
	}
	r.extra = nil
	for _, user := range []string{"a", "\x00"} {
		if k := keyOf(user); k == shared {
			t.Errorf("user %q has the shared key", user)
		}
	}

	cfg = strings.Replace(cfg, `"shared"`, `"deny"`, 1)
	r = startRLSRig(t, cfg)
	id, act := r.request("")
	if act != abi.ActionPause || r.f.Local == nil || r.f.Local.Status != 429 || len(r.f.order) != 0 {
		t.Fatalf("keyless: action %v local %+v calls %v: want 429 and no call", act, r.f.Local, r.f.order)
	}
	if got := headerOf(r.f.Local.Headers, "retry-after"); got != "3600" {
		t.Errorf("Retry-After %q", got)
	}
	r.end(id)
	if n := r.metric("sluice.s.denied"); n != 1 {
		t.Errorf("denied %d", n)
	}
	if _, act := r.request("bob"); act != abi.ActionPause || len(r.f.order) != 1 {
		t.Errorf("keyed: action %v calls %v", act, r.f.order)
	}
}

func TestRedisMissingKey(t *testing.T) {
	cfg := strings.Replace(redisRuleConfig("open", ""), `"backend":"redis"`, `"backend":"redis","missing_key":"shared"`, 1)
	r := startRedisRig(t, cfg)
	queryOf := func(user string) string {
		t.Helper()
		id, act := r.request(user)
		if act != abi.ActionPause {
			t.Fatalf("user %q: action %v, want a Redis call", user, act)
		}
		q := r.f.sent[r.lastToken()]
		r.answer(r.lastToken(), 0, replyAdmit)
		r.end(id)
		return q[strings.Index(q, "sluice:{"):]
	}
	a, b, keyed := queryOf(""), queryOf(""), queryOf("alice")
	if a != b || a == keyed {
		t.Errorf("keyless queries %q, %q; keyed %q: want the keyless ones equal and apart", a, b, keyed)
	}

	r = startRedisRig(t, strings.Replace(cfg, `"shared"`, `"deny"`, 1))
	id, act := r.request("")
	if lr := r.f.local[id]; act != abi.ActionPause || lr == nil || lr.Status != 429 || len(r.f.order) != 0 {
		t.Fatalf("keyless: action %v local %+v calls %v: want 429 and no call", act, lr, r.f.order)
	}
	if n := r.metric(filter.MetricNames("r1")[1]); n != 1 {
		t.Errorf("denied %d", n)
	}
}
