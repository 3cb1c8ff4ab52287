package rls

import (
	"context"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// admitAll is a Backend that admits every script call with a fixed reply,
// and every window counter's (counter.go): an empty counter, one charged
// unit; so the fuzzer exercises the service's parsing and bookkeeping only.
type admitAll struct{}

func (admitAll) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	switch {
	case strings.Contains(string(cmd), "\r\nGET\r\n"):
		return []byte("$-1\r\n"), nil
	case strings.Contains(string(cmd), "\r\nINCRBY\r\n"), strings.Contains(string(cmd), "\r\nPEXPIREAT\r\n"):
		return []byte(":1\r\n"), nil
	case strings.Contains(string(cmd), "\r\nDECRBY\r\n"), strings.Contains(string(cmd), chargedSHA):
		return []byte(":0\r\n"), nil
	}
	return []byte("*7\r\n:1\r\n:10\r\n:9\r\n:1000\r\n:0\r\n:1700000000000000\r\n:0\r\n"), nil
}

// FuzzShouldRateLimit: any request gets a response with one status per
// descriptor, or INVALID_ARGUMENT / PERMISSION_DENIED; never a panic.
// Input: domain, then descriptors separated by '\n', entries by '|',
// key and value by '='.
func FuzzShouldRateLimit(f *testing.F) {
	f.Add("mesh", "sluice.rule=r|sluice.algorithm=token_bucket|sluice.limit=10|sluice.window_us=1000000|sluice.burst=0|sluice.key=k", uint32(1), uint64(7), uint32(0))
	f.Add("mesh", "sluice.rule=r|sluice.algorithm=sliding_log|sluice.limit=10|sluice.window_us=1|sluice.burst=0|sluice.key=k|sluice.refund=1:2", uint32(0), uint64(0), uint32(2))
	f.Add("mesh", "sluice.rule=r|sluice.algorithm=fixed_window|sluice.limit=10|sluice.window_us=1000000|sluice.burst=0|sluice.key=k|sluice.lease=5:3\nuser=x", uint32(1), uint64(0), uint32(0))
	f.Add("mesh", "sluice.rule=r|sluice.algorithm=token_bucket|sluice.limit=10|sluice.window_us=1000000|sluice.burst=0|sluice.key=k|sluice.return=1:17", uint32(1), uint64(0), uint32(0))
	f.Add("web", "user=x\nfree=1\nspecial=a|b=c", uint32(3), uint64(1<<63), uint32(9))
	f.Add("web", "files=shared-a\nquota_a=1\nquota_b=2", uint32(1), uint64(0), uint32(0))
	cfg, err := ParseConfig([]string{"c"}, [][]byte{[]byte(compatConfig)})
	if err != nil {
		f.Fatal(err)
	}
	s := New(Options{Backend: admitAll{}, InlineDomains: []string{"mesh"}, Config: cfg, Headers: &DefaultHeaderNames})
	f.Fuzz(func(t *testing.T, domain, descs string, hits uint32, perHits uint64, override uint32) {
		req := &pb.RateLimitRequest{Domain: domain, HitsAddend: hits}
		for i, d := range strings.Split(descs, "\n") {
			rd := &ratelimitv3.RateLimitDescriptor{}
			for _, e := range strings.Split(d, "|") {
				k, v, _ := strings.Cut(e, "=")
				rd.Entries = append(rd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
			}
			if i == 1 {
				rd.HitsAddend = wrapperspb.UInt64(perHits)
			}
			if override != 0 && i == 0 {
				rd.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: override / 8, Unit: typev3.RateLimitUnit(override % 8)}
			}
			req.Descriptors = append(req.Descriptors, rd)
		}
		r, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.PermissionDenied {
				t.Fatalf("error %v", err)
			}
			return
		}
		if len(r.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(r.Statuses), len(req.Descriptors))
		}
	})
}

// FuzzParseConfig: any YAML is a configuration or an error naming the file.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(compatConfig))
	f.Add([]byte(readmeConfig))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: \"a*b*\"\n    share_threshold: true\n    rate_limit: {unit: year, requests_per_unit: 4294967295, algorithm: sliding_window}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig([]string{"f.yaml"}, [][]byte{data})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml: ") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		c.Summary()
		c.lookup("d", &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "ab"}}})
	})
}
