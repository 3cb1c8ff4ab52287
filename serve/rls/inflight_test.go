package rls

import (
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

func inFlightDesc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	vals := []string{"gpu", "concurrency", "10", "2000000", "0", "alice", "a:ff:1:10000"}
	keys := append(rlswire.Fixed[:], rlswire.InFlight)
	for i := 0; i+1 < len(kv); i += 2 {
		for j, k := range keys {
			if k == kv[i] {
				vals[j] = kv[i+1]
			}
		}
	}
	d := &ratelimitv3.RateLimitDescriptor{}
	for j, k := range keys {
		if vals[j] != "-" {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: vals[j]})
		}
	}
	return d
}

// An in-flight descriptor is recognized by its algorithm and read strictly; a malformed
// one is an error naming what is wrong, never a panic or a decision.
func TestParseInFlight(t *testing.T) {
	if !isInFlight([]*ratelimitv3.RateLimitDescriptor{inFlightDesc()}) || isInFlight([]*ratelimitv3.RateLimitDescriptor{inFlightDesc(), inFlightDesc()}) ||
		isInFlight([]*ratelimitv3.RateLimitDescriptor{inFlightDesc(rlswire.Algorithm, "fixed_window")}) {
		t.Fatal("isInFlight")
	}
	q, retry, err := parseInFlight(inFlightDesc(), "mesh")
	if err != nil || q.Op != redisrl.ConcurrencyAcquire || q.Holder != 0xff || q.Limit != 10 || q.N != 1 || q.TTL != 10*time.Second ||
		retry != 2*time.Second || string(q.Key) != "sluice:{mesh/gpu|alice}:cc" {
		t.Fatalf("%+v %v %v", q, retry, err)
	}
	for _, tc := range []struct{ k, v, want string }{
		{rlswire.InFlight, "a:ff:0:10000", "sluice.inflight must be"},
		{rlswire.InFlight, "x:ff:1:10000", "sluice.inflight must be"},
		{rlswire.InFlight, "-", "7 entries"},
		{rlswire.Limit, "0", "limit 1..1000000000"},
		{rlswire.Limit, "abc", "limit 1..1000000000"},
		{rlswire.WindowUS, "0", "window_us"},
		{rlswire.Burst, "3", "burst 0"},
		{rlswire.Rule, "", "rule name"},
	} {
		_, _, err := parseInFlight(inFlightDesc(tc.k, tc.v), "mesh")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q: %v, want %q", tc.k, tc.v, err, tc.want)
		}
	}
}
