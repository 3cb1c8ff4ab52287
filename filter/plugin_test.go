package filter_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

func req(src string, hdrs ...string) filtertest.Request {
	r := filtertest.Request{Source: src}
	for i := 0; i+1 < len(hdrs); i += 2 {
		r.Headers = append(r.Headers, [2]string{hdrs[i], hdrs[i+1]})
	}
	return r
}

// resetSeconds parses t= of a RateLimit header.
func param(t *testing.T, v, name string) int64 {
	t.Helper()
	for _, p := range strings.Split(v, ";") {
		if strings.HasPrefix(p, name+"=") {
			n, err := strconv.ParseInt(p[len(name)+1:], 10, 64)
			if err != nil {
				t.Fatalf("%s in %q: %v", name, v, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in %q", name, v)
	return 0
}

const perIPConfig = `{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],
  "algorithm":"fixed_window","limit":3,"window":"1h"}]}`

func TestLimitPerRemoteIP(t *testing.T) {
	forEachTarget(t, perIPConfig, func(t *testing.T, tg target) {
		for i := 0; i < 3; i++ {
			r := tg.do(req("10.0.0.1:1234"))
			if r.Status != 200 {
				t.Fatalf("request %d: status %d, want 200", i+1, r.Status)
			}
			rl := r.Header("ratelimit")
			if !strings.HasPrefix(rl, `"per-ip";r=`+strconv.Itoa(2-i)+";t=") {
				t.Errorf("request %d: RateLimit = %q", i+1, rl)
			}
			if reset := param(t, rl, "t"); reset < 1 || reset > 3600 {
				t.Errorf("request %d: t=%d, want 1..3600", i+1, reset)
			}
			if got := r.Header("ratelimit-policy"); got != `"per-ip";q=3;w=3600` {
				t.Errorf("RateLimit-Policy = %q", got)
			}
			if got := r.Header("x-ratelimit-limit"); got != "3" {
				t.Errorf("X-RateLimit-Limit = %q", got)
			}
			if got := r.Header("x-ratelimit-remaining"); got != strconv.Itoa(2-i) {
				t.Errorf("X-RateLimit-Remaining = %q", got)
			}
			if got := r.Header("x-ratelimit-reset"); got != strconv.FormatInt(param(t, rl, "t"), 10) {
				t.Errorf("X-RateLimit-Reset = %q, RateLimit %q", got, rl)
			}
		}
		// The same client from another port is the same key.
		r := tg.do(req("10.0.0.1:999"))
		if r.Status != 429 || !r.Local {
			t.Fatalf("4th request: status %d local %v, want a local 429", r.Status, r.Local)
		}
		if r.Body != "rate limited\n" {
			t.Errorf("body %q", r.Body)
		}
		ra, err := strconv.Atoi(r.Header("retry-after"))
		if err != nil || ra < 1 || ra > 3600 {
			t.Errorf("Retry-After %q", r.Header("retry-after"))
		}
		if got := r.Header("ratelimit"); !strings.HasPrefix(got, `"per-ip";r=0;t=`) {
			t.Errorf("denied RateLimit = %q", got)
		}
		if got := r.Header("x-ratelimit-remaining"); got != "0" {
			t.Errorf("denied X-RateLimit-Remaining = %q", got)
		}
		if r.Header("x-test-error") != "" {
			t.Error(r.Header("x-test-error"))
		}
		// Another client is not affected.
		if r := tg.do(req("10.0.0.2:1234")); r.Status != 200 {
			t.Errorf("other client: status %d", r.Status)
		}
		if got := tg.metric("sluice.per-ip.allowed"); got != 4 {
			t.Errorf("allowed metric = %d, want 4", got)
		}
		if got := tg.metric("sluice.per-ip.denied"); got != 1 {
			t.Errorf("denied metric = %d, want 1", got)
		}
	})
}

func TestMetricNames(t *testing.T) {
	got := filter.MetricNames("api")
	want := [5]string{"sluice.api.allowed", "sluice.api.denied", "sluice.api.shadow_denied", "sluice.api.store_errors", "sluice.api.slot_shared"}
	if got != want {
		t.Errorf("MetricNames = %v", got)
	}
}
