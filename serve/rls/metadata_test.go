package rls

import (
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

const metadataConfig = `
domain: md
descriptors:
  - key: run
    descriptors:
      - key: service
        value: service_1
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
        metadata:
          service_with_quota: {name: service_1, tier: gold}
          only_1: true
      - key: service
        value: service_2
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 2}
        metadata:
          service_with_quota: {name: service_2, zone: b}
          weights: [1, 2]
  - {key: unl, rate_limit: {unlimited: true}, metadata: {unl: yes}}
`

// With Options.DynamicMetadata the response carries envoyproxy/ratelimit's
// dynamic metadata: the domain, every descriptor (entries as "k=v", its
// hits_addend), the request's hits_addend, and the merged metadata of the
// descriptors that passed (the first value wins; structs merge). Without
// it, none.
func TestDynamicMetadata(t *testing.T) {
	for _, charge := range []bool{false, true} {
		_, c := serve(t, Options{Config: parse(t, metadataConfig), DynamicMetadata: true, ChargeDenied: charge})
		k := uniq("md")
		one := func() *ratelimitv3.RateLimitDescriptor { return desc("run", k, "service", "service_1") }
		two := func() *ratelimitv3.RateLimitDescriptor { return desc("run", k, "service", "service_2") }
		r := rlCall(t, c, &pb.RateLimitRequest{Domain: "md", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			withHits(one(), 0, false), withHits(two(), 0, false), desc("unl", "x")}})
		got := protojson.Format(r.DynamicMetadata)
		want := `{"descriptors":[{"entries":["run=` + k + `","service=service_1"],"hitsAddend":0},{"entries":["run=` + k + `","service=service_2"],"hitsAddend":0},{"entries":["unl=x"]}],` +
			`"domain":"md","hitsAddend":3,"metadata":{"only_1":true,"service_with_quota":{"name":"service_1","tier":"gold","zone":"b"},"weights":[1,2]}}`
		if compact(got) != want {
			t.Errorf("charge %v: both pass:\n got %s\nwant %s", charge, compact(got), want)
		}
		// service_1 used up: only service_2's metadata.
		call(t, c, "md", one())
		call(t, c, "md", one())
		r = rlCall(t, c, &pb.RateLimitRequest{Domain: "md", Descriptors: []*ratelimitv3.RateLimitDescriptor{withHits(one(), 0, false), withHits(two(), 0, false)}})
		if r.Statuses[0].Code != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("charge %v: service_1 not over: %v", charge, r)
		}
		got = compact(protojson.Format(r.DynamicMetadata))
		if !strings.Contains(got, `"metadata":{"service_with_quota":{"name":"service_2","zone":"b"},"weights":[1,2]}`) || strings.Contains(got, `"hitsAddend":1}`) {
			t.Errorf("charge %v: service_1 over: %s", charge, got)
		}
	}
	_, c := serve(t, Options{Config: parse(t, metadataConfig)})
	if r := call(t, c, "md", desc("run", uniq("md"), "service", "service_2")); r.DynamicMetadata != nil {
		t.Errorf("dynamic metadata without the option: %v", r.DynamicMetadata)
	}
}

func compact(s string) string { return strings.Join(strings.Fields(s), "") }

func TestMetadataConfigErrors(t *testing.T) {
	_, err := ParseConfig([]string{"f.yaml"}, [][]byte{[]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: {a: {1: x}}\n")})
	if err == nil || !strings.Contains(err.Error(), "key 1 is not a string") {
		t.Errorf("non-string metadata key: %v", err)
	}
}
