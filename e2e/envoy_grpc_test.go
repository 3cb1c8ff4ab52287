package e2e

import (
	"bytes"
	"context"
	_ "embed"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"text/template"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// gRPC through real Envoy: grpc-go client → Envoy (sluice) → grpc-go server over
// an HTTP/2 cluster.

//go:embed envoy/grpc.yaml.tmpl
var grpcEnvoyTemplate string

// grpcEnvoyTmpl has envoy.yaml.tmpl's functions (quote, indent).
var grpcEnvoyTmpl = template.Must(template.Must(envoyTmpl.Clone()).New("grpc.yaml").Parse(grpcEnvoyTemplate))

// renderEnvoyGRPC renders envoy/grpc.yaml.tmpl: the listener "ingress" running sluice with
// config, routing everything to the HTTP/2 cluster "grpc" at site.UpstreamPort.
func renderEnvoyGRPC(site EnvoySite, config string) ([]byte, error) {
	var b bytes.Buffer
	err := grpcEnvoyTmpl.Execute(&b, envoyBootstrap{EnvoySite: site, Name: "grpc", Config: config})
	return b.Bytes(), err
}

const (
	envoyGRPCConfig = `{"rules":[{"name":"health","match":{"path_prefix":"/grpc.health.v1.Health/"},
 "key":[{"header":"x-tenant"}],"algorithm":"sliding_log","limit":5,"window":"1h"}]}`
	envoyGRPCWorkers = 2
)

// TestEnvoyGRPCBootstrap: the gRPC bootstrap is a valid Envoy v3 configuration whose
// cluster speaks HTTP/2 only.
func TestEnvoyGRPCBootstrap(t *testing.T) {
	y, err := renderEnvoyGRPC(testSite, envoyGRPCConfig)
	if err != nil {
		t.Fatal(err)
	}
	b := parseBootstrap(t, y)
	cs := b.GetStaticResources().GetClusters()
	if len(cs) != 1 || cs[0].GetName() != "grpc" {
		t.Fatalf("clusters %v, want one named grpc", cs)
	}
	if !strings.Contains(string(y), "http2_protocol_options: {}") || !strings.Contains(string(y), "port_value: "+strconv.Itoa(testSite.UpstreamPort)) {
		t.Errorf("the cluster is not HTTP/2 to the site's upstream:\n%s", y)
	}
}

// TestEnvoyGRPC: unary health checks from grpc-go through each Envoy to a grpc-go server (an
// HTTP/2 cluster), limited to 5 per tenant: of 20 calls exactly 5 OK (SERVING, with the
// rate-limit header the response phase adds) and 15 RESOURCE_EXHAUSTED "rate limited" with
// grpc-retry-pushback-ms, Retry-After and the rate-limit header in the trailers; another tenant is not limited;
// exactly the 6 admitted calls reach the server (none of the denied), over HTTP/2
// connections Envoy opened (at most one per worker); no VM failed.
func TestEnvoyGRPC(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cl := &countingListener{Listener: ln}
		var calls atomic.Int64
		srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			calls.Add(1)
			return h(ctx, req)
		}))
		healthpb.RegisterHealthServer(srv, health.NewServer())
		go srv.Serve(cl)
		t.Cleanup(srv.Stop)
		port := ln.Addr().(*net.TCPAddr).Port

		e := startEnvoyAs(t, tg, a, envoyGRPCWorkers, func(site EnvoySite) ([]byte, error) {
			site.UpstreamPort = port
			return renderEnvoyGRPC(site, envoyGRPCConfig)
		})
		hc := healthpb.NewHealthClient(grpcClient(t, envoyProxy(t, e)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		checkHealthLimited(ctx, t, hc)
		if n := calls.Load(); n != 6 {
			t.Errorf("the server got %d calls, want the 6 admitted ones", n)
		}
		if n := cl.n.Load(); n < 1 || n > envoyGRPCWorkers {
			t.Errorf("the server accepted %d connections, want 1 to %d (HTTP/2, one per worker at most)", n, envoyGRPCWorkers)
		}
		st, err := e.Stats("cluster.grpc.upstream_")
		if err != nil {
			t.Fatal(err)
		}
		if st["cluster.grpc.upstream_cx_http2_total"] != cl.n.Load() || st["cluster.grpc.upstream_rq_total"] != 6 {
			t.Errorf("cluster grpc: upstream_cx_http2_total %d (the server accepted %d), upstream_rq_total %d (want 6)",
				st["cluster.grpc.upstream_cx_http2_total"], cl.n.Load(), st["cluster.grpc.upstream_rq_total"])
		}
		checkHealthyAs(t, e, a, envoyGRPCWorkers)
		t.Logf("the server got %d calls over %d HTTP/2 connections", calls.Load(), cl.n.Load())
	})
}
