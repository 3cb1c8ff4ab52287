package rls

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// shapedDesc is the descriptor sluice.wasm sends for a rule with delay.
func shapedDesc(alg string, limit int64, window time.Duration, burst int64, key string, maxDelay time.Duration) *ratelimitv3.RateLimitDescriptor {
	d := inlineDesc("shape", alg, limit, window, burst, key)
	d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rlswire.MaxDelayUS, Value: strconv.FormatInt(int64(maxDelay/time.Microsecond), 10)})
	return d
}

// delayOf reads descriptor i's x-sluice-delay (0 without one).
func delayOf(t *testing.T, r *pb.RateLimitResponse, i int) time.Duration {
	t.Helper()
	var d time.Duration
	for _, h := range header(r, rlswire.DelayHeader) {
		j, us, ok := rlswire.ParseIndexed([]byte(h))
		if !ok {
			t.Fatalf("malformed %s %q", rlswire.DelayHeader, h)
		}
		if j == i {
			d = time.Duration(us) * time.Microsecond
		}
	}
	return d
}

// Two replicas, 40 concurrent calls on one shaped key at one (pinned)
// instant, 10 per 10 s with burst 1 and a max delay of 30 s: 31 admitted
// into the slots 0, 1 s, …, 30 s (each once), 9 refused with
// duration_until_reset the wait beyond the max delay; the delays travel in
// x-sluice-delay. The keys' TTLs run on Redis's clock, from the pinned
// instant: slots of seconds keep them alive however slow the calls are.
func TestShapedQueueAcrossReplicas(t *testing.T) {
	now := time.Now().UnixMicro()
	pinned := func() int64 { return now }
	_, r1 := serve(t, Options{InlineDomains: []string{"mesh"}, Now: pinned})
	_, r2 := serve(t, Options{InlineDomains: []string{"mesh"}, Now: pinned})
	for _, alg := range []string{"leaky_bucket", "token_bucket"} {
		t.Run(alg, func(t *testing.T) {
			d := shapedDesc(alg, 10, 10*time.Second, 1, uniq("k"), 30*time.Second)
			var mu sync.Mutex
			slots := map[time.Duration]int{}
			over := 0
			var wg sync.WaitGroup
			for i := 0; i < 40; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := []pb.RateLimitServiceClient{r1, r2}[i%2]
					r, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "mesh", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}, HitsAddend: 1})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if r.OverallCode == pb.RateLimitResponse_OK {
						slots[delayOf(t, r, 0)]++
						if len(header(r, rlswire.RefundHeader)) != 1 {
							t.Errorf("no refund token: %v", r)
						}
						return
					}
					over++
					if got := r.Statuses[0].DurationUntilReset.AsDuration(); got <= 0 || got > 9*time.Second || got%time.Second != 0 {
						t.Errorf("refused with duration_until_reset %v", got)
					}
					if len(header(r, rlswire.DelayHeader)) != 0 {
						t.Errorf("a delay on a refusal: %v", r)
					}
				}()
			}
			wg.Wait()
			if over != 9 || len(slots) != 31 {
				t.Fatalf("%d refused, slots %v; want 9 refused and 31 slots", over, slots)
			}
			for k := 0; k <= 30; k++ {
				if slots[time.Duration(k)*time.Second] != 1 {
					t.Fatalf("slot %d: %d admissions (%v)", k, slots[time.Duration(k)*time.Second], slots)
				}
			}
		})
	}
}

// A shaped descriptor in a call another descriptor denies is refunded with
// the call: its slot goes back, and the next call takes it.
func TestShapedRefundedWithTheCall(t *testing.T) {
	// The scripts' clock pinned: the delays are exact whatever time the
	// calls take. The key's TTL runs on Redis's clock: slots of 10 s keep
	// it alive on a loaded machine (slots of 100 ms did not).
	now := time.Now().UnixMicro()
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}, Now: func() int64 { return now }})
	d := shapedDesc("leaky_bucket", 10, 100*time.Second, 1, uniq("k"), 60*time.Second)
	if r := call(t, c, "mesh", d); r.OverallCode != pb.RateLimitResponse_OK || delayOf(t, r, 0) != 0 {
		t.Fatalf("first: %v", r)
	}
	if r := call(t, c, "mesh", d); r.OverallCode != pb.RateLimitResponse_OK || delayOf(t, r, 0) != 10*time.Second {
		t.Fatalf("second: %v", r)
	}
	deny := inlineDesc("deny", "fixed_window", 1, time.Minute, 0, uniq("k"))
	call(t, c, "mesh", deny)
	r := call(t, c, "mesh", d, deny)
	if r.OverallCode != pb.RateLimitResponse_OVER_LIMIT || len(header(r, rlswire.DelayHeader)) != 0 {
		t.Fatalf("denied call: %v", r)
	}
	// The 20 s slot was given back.
	if r := call(t, c, "mesh", d); r.OverallCode != pb.RateLimitResponse_OK || delayOf(t, r, 0) != 20*time.Second {
		t.Fatalf("after the refund: delay %v, %v", delayOf(t, r, 0), r)
	}
}

func TestShapedErrors(t *testing.T) {
	_, c := serve(t, Options{InlineDomains: []string{"mesh"}})
	for _, tc := range []struct {
		name string
		d    *ratelimitv3.RateLimitDescriptor
		msg  string
	}{
		{"window algorithm", shapedDesc("fixed_window", 10, time.Second, 0, "k", time.Second), "entry 6 (sluice.max_delay_us): applies only to token_bucket and leaky_bucket"},
		{"zero", shapedDesc("token_bucket", 10, time.Second, 0, "k", 0), "entry 6 (sluice.max_delay_us): must be a decimal integer >= 1"},
		{"too long", shapedDesc("token_bucket", 10, time.Second, 0, "k", time.Minute+time.Microsecond), "must be at most 60000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "mesh", Descriptors: []*ratelimitv3.RateLimitDescriptor{tc.d}})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("got %v, want INVALID_ARGUMENT containing %q", err, tc.msg)
			}
		})
	}
}
