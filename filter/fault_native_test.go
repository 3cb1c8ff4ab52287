package filter_test

import (
	"fmt"
	"testing"
	"time"

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

// A call that fails once its timeout_ms has passed is a timeout, whatever the status: real
// Envoy ends a gRPC call at its timeout with UNAVAILABLE ("upstream request timeout"). One
// that fails sooner is a failure only.
func TestRLSDeadlineIsATimeoutWhateverTheStatus(t *testing.T) {
	for _, tc := range []struct {
		after   time.Duration
		status  uint32
		timeout int64
	}{{0, 14, 0}, {50 * time.Millisecond, 14, 0}, {100 * time.Millisecond, 14, 1}, {103 * time.Millisecond, 14, 1}, {10 * time.Millisecond, 4, 1}} {
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
