package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/internal/redistest"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

func testCerts(t *testing.T) *redistest.Certs {
	t.Helper()
	c, err := redistest.NewCerts(t.TempDir(), "rls.sluice.test")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Bad TLS flags and files stop `sluice serve` and `sluice run` at start,
// naming the flag and the file; the help lists the flags.
func TestServeTLSFlags(t *testing.T) {
	certs := testCerts(t)
	notPEM := writeFile(t, "not.pem", "hello\n")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	base := []string{"--redis-cluster", "127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		out  string
	}{
		{[]string{"--redis-tls-ca", certs.CAFile}, nil, "--redis-tls-ca needs --redis-tls"},
		{[]string{"--redis-tls-insecure-skip-verify"}, nil, "--redis-tls-insecure-skip-verify needs --redis-tls"},
		{[]string{"--redis-tls", "--redis-tls-ca", missing}, nil, "--redis-tls-ca: open " + missing},
		{[]string{"--redis-tls", "--redis-tls-ca", notPEM}, nil, "--redis-tls-ca " + notPEM + ": no PEM certificate in it"},
		{[]string{"--redis-tls", "--redis-tls-cert", certs.ClientCertFile}, nil, "--redis-tls-cert and --redis-tls-key go together"},
		{[]string{"--redis-tls", "--redis-tls-cert", certs.ClientCertFile, "--redis-tls-key", certs.ServerKeyFile}, nil,
			"--redis-tls-cert " + certs.ClientCertFile + " with key " + certs.ServerKeyFile + ": tls: private key does not match public key"},
		{[]string{"--redis-tls", "--redis-tls-cert", notPEM, "--redis-tls-key", certs.ClientKeyFile}, nil, "tls: failed to find any PEM data in certificate input"},
		{nil, map[string]string{"REDIS_TLS": "maybe"}, `$REDIS_TLS="maybe" is not a boolean`},
		{nil, map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CACERT": notPEM}, "--redis-tls-ca " + notPEM + ": no PEM certificate in it"},
		{[]string{"--tls-cert", certs.ServerCertFile}, nil, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-client-ca", certs.CAFile}, nil, "--tls-client-ca needs --tls-cert and --tls-key"},
		{[]string{"--tls-client-san", "x"}, nil, "--tls-client-san needs --tls-cert, --tls-key and --tls-client-ca"},
		{[]string{"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--tls-client-san", "x"}, nil, "--tls-client-san needs --tls-client-ca"},
		{[]string{"--tls-cert", certs.ServerCertFile, "--tls-key", missing}, nil, "--tls-cert " + certs.ServerCertFile + " with key " + missing + ": open " + missing},
		{[]string{"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--tls-client-ca", notPEM}, nil, "--tls-client-ca " + notPEM + ": no PEM certificate in it"},
		{nil, map[string]string{"GRPC_SERVER_USE_TLS": "true"}, "$GRPC_SERVER_USE_TLS is true but neither --tls-cert nor $GRPC_SERVER_TLS_CERT is set"},
	} {
		var name []string
		for _, a := range tc.args {
			name = append(name, filepath.Base(a))
		}
		for k, v := range tc.env {
			name = append(name, k+"="+filepath.Base(v))
		}
		t.Run(strings.Join(name, " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr bytes.Buffer
			code := dispatch(append(append([]string{"serve"}, base...), tc.args...), &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.out) || strings.Contains(stderr.String(), "panic") {
				t.Errorf("exit %d, stderr %q; want exit 2 with %q", code, stderr.String(), tc.out)
			}
		})
	}
	// Without REDIS_TLS the other variables are ignored, as envoyproxy/ratelimit does.
	t.Setenv("REDIS_TLS_CACERT", notPEM)
	if cfg, code := parseServeFlags(base, io.Discard, io.Discard); cfg == nil || cfg.tls.redis != nil {
		t.Errorf("REDIS_TLS_CACERT alone: exit %d, config %v", code, cfg)
	}
	os.Unsetenv("REDIS_TLS_CACERT")

	// sluice run --redis-cluster: the same flags (redis.go's hook), the same errors.
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	redisFlags(fs)
	if err := fs.Parse([]string{"--redis-cluster", "rc=127.0.0.1:1", "--redis-tls", "--redis-tls-ca", notPEM}); err != nil {
		t.Fatal(err)
	}
	if _, err := redisApply(&host.Options{}); err == nil || err.Error() != "--redis-tls-ca "+notPEM+": no PEM certificate in it" {
		t.Errorf("run with a bad --redis-tls-ca: %v", err)
	}
	fs = flag.NewFlagSet("run", flag.ContinueOnError)
	redisFlags(fs)
	if err := fs.Parse([]string{"--redis-cluster", "rc=127.0.0.1:1", "--redis-tls", "--redis-tls-ca", certs.CAFile}); err != nil {
		t.Fatal(err)
	}
	if runRedisTLS.on != true {
		t.Error("run: --redis-tls not parsed")
	} else if cleanup, err := redisApply(&host.Options{}); err != nil {
		t.Errorf("run with a good --redis-tls-ca: %v", err)
	} else {
		cleanup()
	}
	redisClusters = redisClusterFlag{}

	var help bytes.Buffer
	dispatch([]string{"serve", "--help"}, &help, io.Discard)
	for _, f := range []string{"-redis-tls ", "-redis-tls-ca", "-redis-tls-cert", "-redis-tls-key", "-redis-tls-server-name",
		"-redis-tls-skip-hostname-verification", "-redis-tls-insecure-skip-verify", "-tls-cert", "-tls-key", "-tls-client-ca", "-tls-client-san"} {
		if !strings.Contains(help.String(), f) {
			t.Errorf("serve --help lacks %s", f)
		}
	}
}

// startServeArgs parses args as `sluice serve` does and runs it until the
// test ends, returning the gRPC address and the log.
func startServeArgs(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	var errOut bytes.Buffer
	cfg, code := parseServeFlags(append([]string{"--listen", "127.0.0.1:0", "--inline-domains", "mesh"}, args...), io.Discard, &errOut)
	if cfg == nil {
		t.Fatalf("flags: exit %d, %s", code, errOut.String())
	}
	ctx, stop := context.WithCancel(context.Background())
	log := &syncBuffer{}
	addrs := make(chan serveAddrs, 1)
	done := make(chan error, 1)
	go func() { done <- serve(ctx, *cfg, nil, log, func(a serveAddrs) { addrs <- a }) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case a := <-addrs:
		return a.grpc, log
	case err := <-done:
		t.Fatalf("serve: %v\n%s", err, log.String())
	}
	return "", nil
}

// tlsDecide sends one call with an inline limit of 1 per hour on key and
// returns the answer.
func tlsDecide(ctx context.Context, conn *grpc.ClientConn, key string) (pb.RateLimitResponse_Code, error) {
	e := func(k, v string) *ratelimitv3.RateLimitDescriptor_Entry {
		return &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		e(rlswire.Rule, "tls"), e(rlswire.Algorithm, "fixed_window"), e(rlswire.Limit, "1"),
		e(rlswire.WindowUS, "3600000000"), e(rlswire.Burst, "0"), e(rlswire.Key, key)}}
	r, err := pb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "mesh",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if err != nil {
		return 0, err
	}
	return r.OverallCode, nil
}

func dialTLS(t *testing.T, addr string, tc *tls.Config) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// The gRPC listener with --tls-cert, --tls-key and --tls-client-ca: a client
// trusting the CA with a client certificate decides (and health answers); one
// without a client certificate, one trusting another CA, a cleartext one
// and one offering only TLS 1.1 are refused, each with an error, no hang.
// Without --tls-client-ca a client needs no certificate.
func TestServeGRPCTLS(t *testing.T) {
	skipShort(t, "sluice serve on a Redis Cluster")
	c := testCluster(t)
	certs := testCerts(t)
	addr, log := startServeArgs(t, "--redis-cluster", strings.Join(c.Addrs, ","),
		"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile, "--tls-client-ca", certs.CAFile)
	if !strings.Contains(log.String(), "grpc_transport=mtls redis_transport=cleartext") {
		t.Errorf("start-up line: %s", log.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := uniqKey("tls")

	good := dialTLS(t, addr, &tls.Config{RootCAs: certs.Pool, Certificates: []tls.Certificate{certs.Client}})
	for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
		if got, err := tlsDecide(ctx, good, key); err != nil || got != want {
			t.Fatalf("mTLS call %d: %v %v, want %v", i, got, err, want)
		}
	}
	if r, err := healthpb.NewHealthClient(good).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"}); err != nil ||
		r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health over mTLS: %v %v", r, err)
	}

	otherPEM, err := os.ReadFile(certs.OtherCAFile)
	if err != nil {
		t.Fatal(err)
	}
	other := x509.NewCertPool()
	other.AppendCertsFromPEM(otherPEM)
	for _, tc := range []struct {
		name string
		tls  *tls.Config
		want string // in the error
	}{
		// Refused after the handshake (TLS 1.3): the client's next write
		// or read fails; what it says depends on which comes first.
		{"no client certificate", &tls.Config{RootCAs: certs.Pool}, ""},
		{"another CA", &tls.Config{RootCAs: other, Certificates: []tls.Certificate{certs.Client}}, "certificate signed by unknown authority"},
		{"cleartext", nil, ""},
	} {
		_, err := tlsDecide(ctx, dialTLS(t, addr, tc.tls), key)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want UNAVAILABLE with %q", tc.name, err, tc.want)
		}
	}
	old := &tls.Config{RootCAs: certs.Pool, Certificates: []tls.Certificate{certs.Client}, MaxVersion: tls.VersionTLS11}
	if conn, err := tls.Dial("tcp", addr, old); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 handshake succeeded")
	}

	// Server TLS only: any client trusting the CA.
	addr2, _ := startServeArgs(t, "--redis-cluster", strings.Join(c.Addrs, ","),
		"--tls-cert", certs.ServerCertFile, "--tls-key", certs.ServerKeyFile)
	plain := dialTLS(t, addr2, &tls.Config{RootCAs: certs.Pool, ServerName: certs.ServerName})
	if got, err := tlsDecide(ctx, plain, uniqKey("tls")); err != nil || got != pb.RateLimitResponse_OK {
		t.Fatalf("TLS without a client certificate: %v %v", got, err)
	}
}

// uniqKey makes a key unique to this run.
func uniqKey(prefix string) string { return prefix + "-" + time.Now().Format("150405.000000000") }

// `sluice serve --redis-tls…` decides on a Redis Cluster that speaks TLS
// only and requires client certificates; --redis-tls-skip-hostname-verification
// still verifies the chain; a wrong CA is logged at start with the reason and
// calls are UNAVAILABLE; --redis-tls-insecure-skip-verify logs a warning.
func TestServeRedisTLS(t *testing.T) {
	skipShort(t, "sluice serve on a TLS Redis Cluster")
	redistest.SkipShort(t)
	certs := testCerts(t)
	dir, err := os.MkdirTemp("", "sluice-serve-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, err := redistest.StartTLS(dir, 3, &redistest.TLS{Certs: certs, AuthClients: "yes"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	seed := c.Addrs[0]
	client := []string{"--redis-tls-cert", certs.ClientCertFile, "--redis-tls-key", certs.ClientKeyFile}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for _, tc := range []struct {
		name string
		args []string
		log  string // in the log
	}{
		{"ca", []string{"--redis-tls-ca", certs.CAFile}, "redis_transport=tls"},
		{"server name", []string{"--redis-tls-ca", certs.CAFile, "--redis-tls-server-name", certs.ServerName}, "redis_transport=tls"},
		{"skip hostname", []string{"--redis-tls-ca", certs.CAFile, "--redis-tls-server-name", "not-in-the.cert", "--redis-tls-skip-hostname-verification"},
			"the names in the Redis nodes' certificates are not verified (their chain is)"},
		{"insecure", []string{"--redis-tls-ca", certs.OtherCAFile, "--redis-tls-insecure-skip-verify"}, "level=WARN msg=\"sluice serve: --redis-tls-insecure-skip-verify: the Redis nodes' certificates are not verified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--redis-cluster", seed, "--redis-tls"}, append(client, tc.args...)...)
			addr, log := startServeArgs(t, args...)
			conn := dialTLS(t, addr, nil)
			key := uniqKey("redis-tls")
			for i, want := range []pb.RateLimitResponse_Code{pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT} {
				if got, err := tlsDecide(ctx, conn, key); err != nil || got != want {
					t.Fatalf("call %d: %v %v, want %v\n%s", i, got, err, want, log.String())
				}
			}
			if s := log.String(); !strings.Contains(s, tc.log) || strings.Contains(s, "does not answer yet") {
				t.Errorf("log lacks %q or has an error:\n%s", tc.log, s)
			}
		})
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"wrong CA", append([]string{"--redis-tls-ca", certs.OtherCAFile}, client...), "certificate signed by unknown authority"},
		{"wrong CA, skip hostname", append([]string{"--redis-tls-ca", certs.OtherCAFile, "--redis-tls-skip-hostname-verification"}, client...), "certificate signed by unknown authority"},
		{"wrong name", append([]string{"--redis-tls-ca", certs.CAFile, "--redis-tls-server-name", "not-in-the.cert"}, client...), "not not-in-the.cert"},
		{"no client certificate", []string{"--redis-tls-ca", certs.CAFile}, "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, log := startServeArgs(t, append([]string{"--redis-cluster", seed, "--redis-tls"}, tc.args...)...)
			if s := log.String(); !strings.Contains(s, "Redis over TLS does not answer yet") || !strings.Contains(s, tc.want) {
				t.Errorf("start-up log lacks the reason %q:\n%s", tc.want, s)
			}
			_, err := tlsDecide(ctx, dialTLS(t, addr, nil), uniqKey("redis-tls"))
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("call: %v; want UNAVAILABLE", err)
			}
		})
	}
}

// The listener reloads its certificate, key and client CAs when the files
// change (a rotation): after the files of a second PKI replace the first's,
// new connections verify against the second (its client certificate
// accepted, the first's refused) without a restart, and the change is
// logged. Connections made before keep working.
func TestServeGRPCTLSReload(t *testing.T) {
	skipShort(t, "sluice serve on a Redis Cluster")
	c := testCluster(t)
	a := testCerts(t)
	addr, log := startServeArgs(t, "--redis-cluster", strings.Join(c.Addrs, ","),
		"--tls-cert", a.ServerCertFile, "--tls-key", a.ServerKeyFile, "--tls-client-ca", a.CAFile)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	withA := &tls.Config{RootCAs: a.Pool, Certificates: []tls.Certificate{a.Client}}
	before := dialTLS(t, addr, withA)
	if _, err := tlsDecide(ctx, before, uniqKey("reload")); err != nil {
		t.Fatalf("first PKI: %v", err)
	}

	b := testCerts(t)
	for _, f := range [][2]string{{b.ServerKeyFile, a.ServerKeyFile}, {b.ServerCertFile, a.ServerCertFile}, {b.CAFile, a.CAFile}} {
		if err := os.Rename(f[0], f[1]); err != nil {
			t.Fatal(err)
		}
	}
	withB := &tls.Config{RootCAs: b.Pool, Certificates: []tls.Certificate{b.Client}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := tlsDecide(cctx, dialTLS(t, addr, withB), uniqKey("reload"))
		ccancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second PKI is not served 20 s after the files changed: %v\n%s", err, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := tlsDecide(ctx, dialTLS(t, addr, withA), uniqKey("reload")); status.Code(err) != codes.Unavailable {
		t.Errorf("a client of the first PKI after the rotation: %v, want UNAVAILABLE", err)
	}
	if _, err := tlsDecide(ctx, before, uniqKey("reload")); err != nil {
		t.Errorf("a connection made before the rotation: %v", err)
	}
	if !strings.Contains(log.String(), "TLS files reloaded") {
		t.Errorf("no reload logged:\n%s", log.String())
	}
}

// --tls-client-san: a client whose certificate (of the trusted CA) names
// one of the names decides; one whose certificate names none is refused.
func TestServeGRPCTLSClientSAN(t *testing.T) {
	skipShort(t, "sluice serve on a Redis Cluster")
	c := testCluster(t)
	certs := testCerts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &tls.Config{RootCAs: certs.Pool, Certificates: []tls.Certificate{certs.Client}}
	for _, tc := range []struct {
		san string
		ok  bool
	}{
		{"other-client, sluice-test-client", true}, // the test client's DNS name
		{"other-client", false},
	} {
		addr, _ := startServeArgs(t, "--redis-cluster", strings.Join(c.Addrs, ","), "--tls-cert", certs.ServerCertFile,
			"--tls-key", certs.ServerKeyFile, "--tls-client-ca", certs.CAFile, "--tls-client-san", tc.san)
		_, err := tlsDecide(ctx, dialTLS(t, addr, client), uniqKey("san"))
		if tc.ok && err != nil {
			t.Errorf("--tls-client-san %q: %v, want an answer", tc.san, err)
		}
		if !tc.ok && status.Code(err) != codes.Unavailable {
			t.Errorf("--tls-client-san %q: %v, want UNAVAILABLE (the handshake refused)", tc.san, err)
		}
	}
}
