package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// gRPC through `sluice run --upstream h2c://…`, with grpc-go on both sides: the
// standard health service and the interop TestService (bidirectional streaming).

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// echoService answers FullDuplexCall with each request's payload, as it comes.
type echoService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (echoService) FullDuplexCall(stream grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	for {
		in, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: in.GetPayload()}); err != nil {
			return err
		}
	}
}

type grpcUpstream struct {
	addr   string
	ln     *countingListener
	health *health.Server
}

func startGRPCUpstream(t *testing.T) *grpcUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	s := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	testgrpc.RegisterTestServiceServer(s, echoService{})
	go s.Serve(cl)
	t.Cleanup(s.Stop)
	return &grpcUpstream{addr: ln.Addr().String(), ln: cl, health: hs}
}

// startGRPCProxy runs `sluice run` with cfg in front of the h2c upstream.
func startGRPCProxy(t *testing.T, cfg, upstream string, extra ...string) *proxy {
	t.Helper()
	cmd := sluiceCmd(t, writeConfig(t, Scenario{Config: cfg}), 2)
	cmd.Args = append(cmd.Args, "--upstream", "h2c://"+upstream)
	cmd.Args = append(cmd.Args, extra...)
	return startHostCmd(t, cmd)
}

func grpcClient(t *testing.T, p *proxy) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(p.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func tenant(ctx context.Context, name string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-tenant", name)
}

// checkPushback requires a rejection's trailers to carry grpc-retry-pushback-ms (the exact
// wait in ms, rounded up) and Retry-After (the same wait in seconds, rounded up), both
// within the window (maxMS).
func checkPushback(t *testing.T, md metadata.MD, maxMS int64) {
	t.Helper()
	ms, err1 := strconv.ParseInt(strings.Join(md.Get("grpc-retry-pushback-ms"), ","), 10, 64)
	secs, err2 := strconv.ParseInt(strings.Join(md.Get("retry-after"), ","), 10, 64)
	if err1 != nil || err2 != nil || ms < 1 || ms > maxMS || (ms+999)/1000 != secs {
		t.Errorf("grpc-retry-pushback-ms %q, retry-after %q: want ms in [1, %d] and retry-after = ceil(ms/1000)", md.Get("grpc-retry-pushback-ms"), md.Get("retry-after"), maxMS)
	}
}

// A limit of 5 per tenant on the health service: of 20 calls, exactly 5 OK and 15
// RESOURCE_EXHAUSTED with the pushback; another tenant is not limited; HTTP/1.1 still works on
// the same port (and gets the plain 429); one upstream connection carries every call; the
// admin server counts the denials.
func TestGRPCUnaryThroughSluiceRun(t *testing.T) {
	up := startGRPCUpstream(t)
	p := startGRPCProxy(t, `{"rules":[{"name":"health","match":{"path_prefix":"/grpc.health.v1.Health/"},
 "key":[{"header":"x-tenant"}],"algorithm":"sliding_log","limit":5,"window":"1h"}]}`, up.addr)
	hc := healthpb.NewHealthClient(grpcClient(t, p))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	checkHealthLimited(ctx, t, hc)
	// HTTP/1.1 on the same port, the same rule and tenant: the plain rejection.
	req, _ := http.NewRequestWithContext(ctx, "POST", p.url+"/grpc.health.v1.Health/Check", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 1 || resp.StatusCode != 429 || string(body) != "rate limited\n" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("HTTP/1.1: %s %d %q %v", resp.Proto, resp.StatusCode, body, resp.Header)
	}
	if n := up.ln.n.Load(); n != 1 {
		t.Errorf("the upstream accepted %d connections for 6 calls, want 1 (h2c connection reuse)", n)
	}
	metrics := adminGet(t, p.admin+"/metrics")
	if !strings.Contains(metrics, "\nsluice_health_denied 16\n") || !strings.Contains(metrics, "\nsluice_health_allowed 6\n") {
		t.Errorf("admin /metrics: want sluice_health_denied 16 and sluice_health_allowed 6 in\n%s", metrics)
	}
}

func adminGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}

// Streaming calls are limited when the stream starts: an admitted stream carries messages
// both ways as they come (server streaming: health Watch; bidirectional: a ping-pong that
// would deadlock if a request body were buffered) and ends with the upstream's trailers
// (status OK); the next stream is refused at once with RESOURCE_EXHAUSTED and the pushback.
func TestGRPCStreamingThroughSluiceRun(t *testing.T) {
	up := startGRPCUpstream(t)
	p := startGRPCProxy(t, `{"rules":[
 {"name":"watch","match":{"path_prefix":"/grpc.health.v1.Health/Watch"},"key":[{"header":"x-tenant"}],"algorithm":"fixed_window","limit":1,"window":"1h"},
 {"name":"duplex","match":{"path_prefix":"/grpc.testing.TestService/"},"key":[{"header":"x-tenant"}],"algorithm":"token_bucket","limit":1,"window":"10m"}]}`, up.addr)
	cc := grpcClient(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	t.Run("server streaming", func(t *testing.T) {
		hc := healthpb.NewHealthClient(cc)
		wctx, wcancel := context.WithCancel(tenant(ctx, "acme"))
		defer wcancel()
		w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if m, err := w.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("first update: %v %v", m, err)
		}
		up.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		if m, err := w.Recv(); err != nil || m.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("second update: %v %v", m, err)
		}
		wcancel()
		w2, err := hc.Watch(tenant(ctx, "acme"), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := w2.Recv()
		if st := status.Convert(err); st.Code() != codes.ResourceExhausted {
			t.Fatalf("second stream: %v %v, want ResourceExhausted", m, err)
		}
		checkPushback(t, w2.Trailer(), 3600_000)
	})

	t.Run("bidirectional", func(t *testing.T) {
		tc := testgrpc.NewTestServiceClient(cc)
		s, err := tc.FullDuplexCall(tenant(ctx, "acme"))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			msg := []byte(fmt.Sprintf("ping %d", i))
			if err := s.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: msg}}); err != nil {
				t.Fatal(err)
			}
			r, err := s.Recv()
			if err != nil || string(r.GetPayload().GetBody()) != string(msg) {
				t.Fatalf("echo %d: %v %v", i, r, err)
			}
		}
		s.CloseSend()
		if _, err := s.Recv(); err != io.EOF {
			t.Fatalf("end of stream: %v, want io.EOF (status OK in the trailers)", err)
		}
		s2, err := tc.FullDuplexCall(tenant(ctx, "acme"))
		if err != nil {
			t.Fatal(err)
		}
		s2.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: []byte("x")}})
		_, err = s2.Recv()
		if st := status.Convert(err); st.Code() != codes.ResourceExhausted || st.Message() != "rate limited" {
			t.Fatalf("second stream: %v, want ResourceExhausted", err)
		}
		checkPushback(t, s2.Trailer(), 600_000)
	})
}

// failure_mode closed answers a gRPC call UNAVAILABLE when the store cannot decide: here a
// Redis rule (sluice-redis.wasm) whose cluster refuses connections.
func TestGRPCFailureClosedThroughSluiceRun(t *testing.T) {
	up := startGRPCUpstream(t)
	wasm := filtertest.Wasm(t, "redis")
	wasmPath := filepath.Join(t.TempDir(), "sluice-redis.wasm")
	if err := os.WriteFile(wasmPath, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	gone, err := net.Listen("tcp", "127.0.0.1:0") // a port that refuses connections once closed
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	cfg := writeConfig(t, Scenario{Config: `{"rules":[{"name":"remote","backend":"redis","key":[{"header":"x-tenant"}],
 "algorithm":"fixed_window","limit":5,"window":"1h"}],"redis":{"cluster":"gone","timeout_ms":200},"failure_mode":"closed"}`})
	_, bin := buildArtifacts(t)
	p := startHostCmd(t, exec.Command(bin, "run", "--wasm", wasmPath, "--config", cfg,
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--workers", "1", "--log-level", "error",
		"--upstream", "h2c://"+up.addr, "--redis-cluster", "gone="+gone.Addr().String()))
	hc := healthpb.NewHealthClient(grpcClient(t, p))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; i < 3; i++ {
		_, err := hc.Check(tenant(ctx, "acme"), &healthpb.HealthCheckRequest{})
		if st := status.Convert(err); st.Code() != codes.Unavailable || st.Message() != "rate limiter unavailable" {
			t.Errorf("call %d: %v, want Unavailable \"rate limiter unavailable\"", i+1, err)
		}
	}
	// Without the rule's key the store is not asked: the call goes through.
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call no rule applies to: %v", err)
	}
}

// checkHealthLimited makes 20 health checks as tenant acme through a proxy whose rule
// "health" allows 5 per hour per tenant: exactly 5 OK (SERVING, a ratelimit header) and 15
// RESOURCE_EXHAUSTED "rate limited" with the pushback, Retry-After and ratelimit in the
// trailers; then another tenant is not limited.
func checkHealthLimited(ctx context.Context, t *testing.T, hc healthpb.HealthClient) {
	t.Helper()
	counts := map[codes.Code]int{}
	for i := 0; i < 20; i++ {
		var header, trailer metadata.MD
		resp, err := hc.Check(tenant(ctx, "acme"), &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
		st := status.Convert(err)
		counts[st.Code()]++
		switch st.Code() {
		case codes.OK:
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("call %d: %v", i+1, resp)
			}
			// The response phase adds the rate-limit headers to the upstream's HTTP/2 response.
			if got := header.Get("ratelimit"); len(got) != 1 || !strings.HasPrefix(got[0], `"health";r=`) {
				t.Errorf("call %d: ratelimit header %q (headers %v)", i+1, got, header)
			}
		case codes.ResourceExhausted:
			if st.Message() != "rate limited" {
				t.Errorf("call %d: message %q", i+1, st.Message())
			}
			checkPushback(t, trailer, 3600_000)
			if got := trailer.Get("ratelimit"); len(got) != 1 || !strings.HasPrefix(got[0], `"health";r=0;`) {
				t.Errorf("call %d: ratelimit %q in trailers %v", i+1, got, trailer)
			}
		default:
			t.Errorf("call %d: %v (header %v, trailer %v)", i+1, err, header, trailer)
		}
	}
	if counts[codes.OK] != 5 || counts[codes.ResourceExhausted] != 15 {
		t.Errorf("codes %v, want 5 OK and 15 ResourceExhausted", counts)
	}
	if _, err := hc.Check(tenant(ctx, "other"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
}
