package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// The service decides on a Redis Cluster that speaks TLS only and requires
// client certificates; with a CA that did not sign the nodes' certificates
// every call is UNAVAILABLE, naming the certificate error.
func TestClusterBackendTLS(t *testing.T) {
	c, certs := redistest.StartTLSTest(t, "redis.sluice.test")

	open := func(tc *tls.Config) pb.RateLimitServiceClient {
		b, err := NewClusterBackend(c.Addrs[:1], "", "", redisclient.Options{TLS: tc}, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		_, client := serve(t, Options{Backend: b, InlineDomains: []string{"mesh"}})
		return client
	}
	client := open(&tls.Config{RootCAs: certs.Pool, Certificates: []tls.Certificate{certs.Client}, ServerName: certs.ServerName})
	// A key on every node (the one seed leads to the others): a limit of 2
	// admits two calls and denies the third.
	var keys []string
	seen := map[int]bool{}
	for len(seen) < len(c.Addrs) {
		k := uniq("tls")
		n, err := c.NodeOf("{mesh/r|" + k + "}")
		if err != nil {
			t.Fatal(err)
		}
		if !seen[n] {
			seen[n] = true
			keys = append(keys, k)
		}
	}
	for i, k := range keys {
		d := inlineDesc("r", "sliding_window", 2, time.Hour, 0, k)
		for j, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
			if r := call(t, client, "mesh", d); r.OverallCode != want {
				t.Fatalf("key %d, call %d: %v, want %v", i, j, r.OverallCode, want)
			}
		}
	}

	other, err := os.ReadFile(certs.OtherCAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(other)
	bad := open(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{certs.Client}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = bad.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "mesh",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{inlineDesc("r", "fixed_window", 2, time.Hour, 0, uniq("tls-bad"))}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("with the wrong CA: %v; want UNAVAILABLE naming the certificate error", err)
	}
}
