package filter_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// Shaping with backend "rls": the descriptor carries the max delay, the
// service's x-sluice-delay holds the request.

func rlsShapeConfig(failure string, maxHeld int) string {
	return `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"leaky_bucket","limit":10,"window":"1s","burst":1,"backend":"rls",
"delay":{"max":"3s","max_held":` + fmt.Sprint(maxHeld) + `}}],
"failure_mode":"` + failure + `","rls":{"cluster":"ratelimit","domain":"edge","timeout_ms":40,"instances":2}}`
}

// delayedReply is the service's OK with a delay header for descriptor 0.
func delayedReply(value string) *rlsv3.RateLimitResponse {
	r := okReply(status(rlsv3.RateLimitResponse_OK, 0, time.Second))
	if value != "" {
		r.ResponseHeadersToAdd = append(r.ResponseHeadersToAdd, &corev3.HeaderValue{Key: rlswire.DelayHeader, Value: value})
	}
	return r
}

func (r *rlsRig) tick(at int64) {
	r.f.Now_ = t0 + at
	r.f.effective = 1
	r.vm.OnTick(1)
}

func TestRLSShapingHoldsUntilTheSlot(t *testing.T) {
	r := startRLSRig(t, rlsShapeConfig("closed", 2))
	id, _ := r.request("alice")
	req := r.f.sent[r.lastToken()]
	want := "sluice.rule=r1 sluice.algorithm=leaky_bucket sluice.limit=10 sluice.window_us=1000000 sluice.burst=1 sluice.key=" + descriptorKey(req) + " sluice.max_delay_us=3000000"
	if got := descriptorEntries(req, 0); got != want {
		t.Fatalf("descriptor\n got %s\nwant %s", got, want)
	}
	if lr := r.answer(r.lastToken(), delayedReply("0:250000")); lr != nil || r.continued(id) != 0 {
		t.Fatalf("not held: %+v, continued %v", lr, r.f.continued)
	}
	if r.metric(filter.RuleMetric("r1", "held")) != 1 {
		t.Fatal("held gauge")
	}
	r.tick(249_000_000)
	if r.continued(id) != 0 {
		t.Fatal("released early")
	}
	r.tick(250_000_000)
	if r.continued(id) != 1 {
		t.Fatalf("not released at the slot: %v", r.f.continued)
	}
	r.end(id)

	// max_held: two held, the third's descriptor has no max delay.
	for i := 0; i < 2; i++ {
		r.request("bob")
		r.answer(r.lastToken(), delayedReply(fmt.Sprintf("0:%d", (i+1)*100_000)))
	}
	r.request("bob")
	if got := descriptorEntries(r.f.sent[r.lastToken()], 0); len(got) == 0 || strings.Contains(got, rlswire.MaxDelayUS) {
		t.Fatalf("at max_held: %s", got)
	}
	// A delay on a call that sent no max delay fails the rule (closed: 503).
	if lr := r.answer(r.lastToken(), delayedReply("0:1")); lr == nil || lr.Status != 503 {
		t.Fatalf("a delay without a max delay: %+v", lr)
	}
}

func TestRLSShapingBadDelay(t *testing.T) {
	for _, failure := range []string{"closed", "open"} {
		for name, value := range map[string]string{
			"beyond max":  "0:3000001",
			"negative":    "0:-5",
			"huge":        "0:99999999999999999999",
			"bad index":   "1:5",
			"not numbers": "0:x",
		} {
			t.Run(failure+"/"+name, func(t *testing.T) {
				r := startRLSRig(t, rlsShapeConfig(failure, 1000))
				id, _ := r.request("alice")
				lr := r.answer(r.lastToken(), delayedReply(value))
				if failure == "closed" && (lr == nil || lr.Status != 503) {
					t.Fatalf("closed: %+v", lr)
				}
				if failure == "open" && (lr != nil || r.continued(id) != 1) {
					t.Fatalf("open: %+v, continued %v", lr, r.f.continued)
				}
				if r.metric(filter.RuleMetric("r1", "delayed")) != 0 || r.metric(filter.MetricRLSFailures) != 1 {
					t.Fatalf("delayed %d, failures %d", r.metric(filter.RuleMetric("r1", "delayed")), r.metric(filter.MetricRLSFailures))
				}
			})
		}
	}
	// A delay on a refusal fails the rule too.
	r := startRLSRig(t, rlsShapeConfig("closed", 1000))
	r.request("alice")
	deny := okReply(status(rlsv3.RateLimitResponse_OVER_LIMIT, 0, time.Second))
	deny.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: rlswire.DelayHeader, Value: "0:5"}}
	if lr := r.answer(r.lastToken(), deny); lr == nil || lr.Status != 503 {
		t.Fatalf("a delay on a refusal: %+v", lr)
	}
}

// descriptorKey is the sluice.key entry of descriptor 0.
func descriptorKey(req *rlsv3.RateLimitRequest) string {
	for _, e := range req.GetDescriptors()[0].GetEntries() {
		if e.GetKey() == rlswire.Key {
			return e.GetValue()
		}
	}
	return ""
}
