package filter_test

import (
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/filter/abi"

	"github.com/sluice-proxy/sluice/filter"
)

// What the filter does when the network to the rate-limit service fails (issue 43).

// A fixed window of 20 per minute on two proxies: the local share is 10.
func faultConfig() string {
	return `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":20,"window":"1m","backend":"rls"}],
"failure_mode":"local","rls":{"cluster":"ratelimit","domain":"edge","timeout_ms":100,"instances":2}}`
}

// admittedWhileFailing sends n requests for user whose calls all fail (UNAVAILABLE, at
// once) and returns how many the local fallback admitted.
func admittedWhileFailing(r *rlsRig, user string, n int) int {
	admitted := 0
	for i := 0; i < n; i++ {
		id, _ := r.request(user)
		if lr := r.close(r.lastToken(), 14); lr == nil && r.continued(id) == 1 {
			admitted++
		}
		r.end(id)
	}
	return admitted
}

// The window where the failure begins: the fallback goes on from what the last remote answer
// said the fleet had used, so the fleet stays within its limit. With 20 of 20 used remotely
// this proxy admits nothing more; with 10 of 20 used it admits its share of the 10 left (5);
// a key the remote side never answered for starts from zero (its whole share, 10).
func TestLocalFallbackStartsFromTheRemoteUsage(t *testing.T) {
	for _, tc := range []struct {
		remaining uint32 // the last remote answer's
		want      int
	}{{0, 0}, {10, 5}, {19, 9}, {20, 10}} {
		t.Run(fmt.Sprint("remaining=", tc.remaining), func(t *testing.T) {
			r := startRLSRig(t, faultConfig())
			id, _ := r.request("carol")
			code := rlsv3.RateLimitResponse_OK
			if tc.remaining == 0 {
				code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			r.answer(r.lastToken(), okReply(status(code, tc.remaining, 30*time.Second)))
			r.end(id)
			if got := admittedWhileFailing(r, "carol", 15); got != tc.want {
				t.Errorf("admitted %d locally after the remote said %d of 20 remain, want %d", got, tc.remaining, tc.want)
			}
			if got := admittedWhileFailing(r, "dave", 15); got != 10 {
				t.Errorf("a key never answered remotely: admitted %d, want its share 10", got)
			}
			// The next window starts fresh on the fallback too.
			r.f.Now_ += int64(time.Minute)
			if got := admittedWhileFailing(r, "carol", 15); got != 10 {
				t.Errorf("next window: admitted %d, want 10", got)
			}
		})
	}
}

// A call that fails at its timeout_ms (from three quarters of it on: Envoy's timer can fire
// early by its event loop's iteration) is a timeout, whatever the status: real Envoy ends a
// gRPC call at its timeout with UNAVAILABLE ("upstream request timeout"). One that fails
// sooner is a failure only.
func TestRLSDeadlineIsATimeoutWhateverTheStatus(t *testing.T) {
	for _, tc := range []struct {
		after   time.Duration
		status  uint32
		timeout int64
	}{{0, 14, 0}, {50 * time.Millisecond, 14, 0}, {74 * time.Millisecond, 14, 0}, {75 * time.Millisecond, 14, 1}, {103 * time.Millisecond, 14, 1}, {10 * time.Millisecond, 4, 1}} {
		t.Run(fmt.Sprint(tc.after, "/", tc.status), func(t *testing.T) {
			r := startRLSRig(t, faultConfig())
			id, _ := r.request("bob")
			r.f.Now_ += int64(tc.after)
			r.close(r.lastToken(), tc.status)
			r.end(id)
			if n := r.metric(filter.MetricRLSFailures); n != 1 {
				t.Errorf("failures %d, want 1", n)
			}
			if n := r.metric(filter.MetricRLSTimeouts); n != tc.timeout {
				t.Errorf("timeouts %d, want %d", n, tc.timeout)
			}
		})
	}
}

// Leases under failure_mode local: a grant says what the fleet holds or has spent, and the
// fallback goes on from there too. Limit 20 per minute, lease 5, two proxies (share 10): a
// grant of 5 that leaves 10 beyond every lease (10 of 20 taken by the fleet), then the
// service fails: this proxy spends its pool (the 4 left after the first request) and then
// its share of the 10 no proxy held (5), not its whole share again (10).
func TestLocalFallbackStartsFromTheLeaseGrant(t *testing.T) {
	r := startRLSRig(t, `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":20,"window":"1m","backend":"rls","lease":5}],
"failure_mode":"local","rls":{"cluster":"ratelimit","domain":"edge","timeout_ms":100,"instances":2}}`)
	id, _ := r.request("carol")
	r.answer(r.lastToken(), grantReply(5, 10, time.Minute))
	if r.continued(id) != 1 {
		t.Fatal("the first request was not admitted by the grant")
	}
	r.end(id)
	admitted, calls := 0, len(r.f.order)
	for i := 0; i < 15; i++ {
		id, act := r.request("carol")
		if len(r.f.order) > calls {
			calls = len(r.f.order)
			if lr := r.close(r.lastToken(), 14); lr != nil {
				r.end(id)
				continue
			}
		}
		if act == abi.ActionContinue || r.continued(id) == 1 {
			admitted++
		}
		r.end(id)
	}
	if admitted != 4+5 {
		t.Errorf("admitted %d with the service failing after a grant that left 10 of 20, want 9 (the pool's 4, then 5 of the share)", admitted)
	}
}
