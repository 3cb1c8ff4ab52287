package filter

import (
	"bytes"
	"testing"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// The hand-written decoder reads what go-control-plane encodes: codes, remaining,
// durations, refund tokens (value or raw_value), with unknown fields (current_limit,
// request headers, raw_body) skipped.
func TestRLSDecodeRoundTrip(t *testing.T) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 4294967295, DurationUntilReset: durationpb.New(90*time.Second + 5)},
			{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, Name: "r"}},
		},
		ResponseHeadersToAdd: []*corev3.HeaderValue{
			{Key: "x-other", Value: "1"},
			{Key: rlswire.RefundHeader, Value: "1:1700000000000001:-3"},
			{Key: rlswire.RefundHeader, RawValue: []byte("0:17:42")},
		},
		RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "a", Value: "b"}},
		RawBody:             []byte("body"),
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var r rlsResponse
	r.init(2)
	if err := r.decode(b, 2); err != nil {
		t.Fatal(err)
	}
	if r.overall != rlsCodeOK || r.st[0] != (rlsStatus{code: 1, remaining: 4294967295, dur: 90*time.Second + 5}) || r.st[1] != (rlsStatus{code: 1}) {
		t.Errorf("decoded %+v", r)
	}
	if r.refunds[0] != (rlsRefund{true, 17, 42}) || r.refunds[1] != (rlsRefund{true, 1700000000000001, -3}) {
		t.Errorf("refunds %+v", r.refunds)
	}
	for _, n := range []int{1, 0} {
		if err := r.decode(b, n); err == nil {
			t.Errorf("2 statuses decoded for %d descriptors", n)
		}
	}
}

// An acquire's reply: quota.requests (valid_until and id skipped) and the
// x-sluice-lease stamp and validity by descriptor index; a malformed or
// out-of-range x-sluice-lease is an error.
func TestRLSDecodeLease(t *testing.T) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 7, DurationUntilReset: durationpb.New(time.Minute),
				Quota: &rlsv3.RateLimitResponse_Quota{Requests: 10, Id: "x",
					ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: timestamppb.New(time.Unix(1, 0))}}},
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, DurationUntilReset: durationpb.New(time.Second)},
		},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: rlswire.LeaseHeader, Value: "0:1700000000000000:2500000"}},
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var r rlsResponse
	r.init(2)
	if err := r.decode(b, 2); err != nil {
		t.Fatal(err)
	}
	if r.st[0] != (rlsStatus{code: 1, remaining: 7, dur: time.Minute, quota: 10}) || r.st[1] != (rlsStatus{code: 2, dur: time.Second}) {
		t.Errorf("statuses %+v", r.st)
	}
	if r.leases[0] != (rlsLease{true, 1700000000000000, 2500 * time.Millisecond}) || r.leases[1].ok {
		t.Errorf("leases %+v", r.leases)
	}
	for _, v := range []string{"0:1", "2:1:1", "0:-1:5", "0:1:-5", "0:1:99999999999999999"} {
		resp.ResponseHeadersToAdd[0].Value = v
		b, _ := proto.Marshal(resp)
		if err := r.decode(b, 2); err == nil {
			t.Errorf("%s %q accepted", rlswire.LeaseHeader, v)
		}
	}
}

// The key escape makes any byte string a proto string: valid UTF-8 stays, '%' and every
// byte outside valid UTF-8 become %XX, and the escape is injective (distinct keys stay
// distinct).
func TestRLSEscapeKey(t *testing.T) {
	for in, want := range map[string]string{"abc": "abc", "%": "%25", "\xff": "%FF", "é✓": "é✓", "\xc3": "%C3", "\xed\xa0\x80": "%ED%A0%80", "\x00": "\x00"} {
		got := escapeKey(nil, []byte(in))
		if string(got) != want || escapedKeyLen([]byte(in)) != len(want) {
			t.Errorf("escapeKey(%q) = %q (len %d), want %q", in, got, escapedKeyLen([]byte(in)), want)
		}
	}
}

func FuzzRLSEscapeKey(f *testing.F) {
	f.Add([]byte("a%b\xff"), []byte("a%25b%FF"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ea, eb := escapeKey(nil, a), escapeKey(nil, b)
		if !utf8.Valid(ea) || len(ea) != escapedKeyLen(a) {
			t.Fatalf("escapeKey(%q) = %q", a, ea)
		}
		if !bytes.Equal(a, b) && bytes.Equal(ea, eb) {
			t.Fatalf("%q and %q escape alike: %q", a, b, ea)
		}
	})
}

// Hostile replies get an error, never a panic, and never more statuses than descriptors.
func FuzzRLSResponse(f *testing.F) {
	ok, _ := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1, LimitRemaining: 3, DurationUntilReset: durationpb.New(time.Second)}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: rlswire.RefundHeader, Value: "0:1:2"}}})
	f.Add(ok, uint8(1))
	lease, _ := proto.Marshal(&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1, LimitRemaining: 3, DurationUntilReset: durationpb.New(time.Second),
			Quota: &rlsv3.RateLimitResponse_Quota{Requests: 5}}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: rlswire.LeaseHeader, Value: "0:1:2"}}})
	f.Add(lease, uint8(1))
	f.Add([]byte{0x12, 0x7f}, uint8(1))
	f.Add([]byte{0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, uint8(0))
	f.Add([]byte{0x12, 0x04, 0x22, 0x02, 0x08, 0x7f}, uint8(1))
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		var r rlsResponse
		r.init(4)
		err := r.decode(b, int(n%6))
		if err != nil {
			return
		}
		if r.n != int(n%6) || (r.overall != rlsCodeOK && r.overall != rlsCodeOverLimit) {
			t.Fatalf("accepted %d statuses for %d, overall %d", r.n, n%6, r.overall)
		}
		for k := 0; k < r.n; k++ {
			if r.st[k].dur < 0 || r.st[k].dur > maxRLSDuration {
				t.Fatalf("duration %v", r.st[k].dur)
			}
			if l := r.leases[k]; l.ok && (l.stamp < 0 || l.valid < 0 || l.valid > maxRLSDuration) {
				t.Fatalf("lease %+v", l)
			}
		}
	})
}
