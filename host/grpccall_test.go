package host

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// echoServer is a real grpc-go server that serves any method with the raw codec: Echo
// answers "echo:" + the message, Deny fails with PERMISSION_DENIED, Hang waits for the
// caller to give up. It records the metadata it saw.
func echoServer(t *testing.T) (addr string, seenMD func() []string, hung <-chan struct{}) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var md []string
	hang := make(chan struct{}, 16)
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		var in []byte
		if err := ss.RecvMsg(&in); err != nil {
			return err
		}
		if m, ok := metadata.FromIncomingContext(ss.Context()); ok {
			mu.Lock()
			md = append(md, strings.Join(m.Get("x-tenant"), ","))
			mu.Unlock()
		}
		switch method {
		case "/sluice.test.Echo/Echo":
			out := append([]byte("echo:"), in...)
			return ss.SendMsg(&out)
		case "/sluice.test.Echo/Deny":
			return status.Error(codes.PermissionDenied, "no")
		case "/sluice.test.Echo/Hang":
			hang <- struct{}{}
			<-ss.Context().Done()
			return ss.Context().Err()
		}
		return status.Error(codes.Unimplemented, method)
	}))
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return "http://" + lis.Addr().String(), func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), md...) }, hang
}

// proxy_grpc_call against a real gRPC server, as Envoy serves it: the call belongs to the
// root context; a reply arrives as proxy_on_grpc_receive with the message in
// BufferGrpcReceive, a failure as proxy_on_grpc_close with the status — no metadata
// callbacks; tokens are cpp-host's call ids (5, 9, … per VM).
func TestGrpcCall(t *testing.T) {
	addr, seenMD, _ := echoServer(t)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := "http://" + dead.Addr().String()
	dead.Close()
	c := newFakeClock()
	h, _ := newHost(t, "grpccaller", Options{Workers: 1, Clusters: map[string]string{"backend": addr, "dead": deadAddr}, Clock: c})

	var seen *Request
	resp := mustExchange(t, h, &Request{Path: "/call", Headers: [][2]string{{"x-method", "Echo"}, {"x-msg", "hi\x00\xff"}, {"x-md", "x-tenant=acme"}}},
		func(r *Request) *Response { seen = r; return nil })
	if resp.Status != 200 || seen == nil {
		t.Fatalf("resp %+v", resp)
	}
	want := map[string]string{"x-grpc-reply": "echo:hi\x00\xff", "x-grpc-root": "1", "x-grpc-token": "5"}
	for k, v := range want {
		if got, _ := header(seen.Headers, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if md := seenMD(); len(md) != 1 || md[0] != "acme" {
		t.Errorf("server saw metadata %q", md)
	}
	for method, code := range map[string]codes.Code{"Deny": codes.PermissionDenied, "Nope": codes.Unimplemented} {
		seen = nil
		mustExchange(t, h, &Request{Path: "/call", Headers: [][2]string{{"x-method", method}}}, func(r *Request) *Response { seen = r; return nil })
		if got, _ := header(seen.Headers, "x-grpc-close"); got != strconv.Itoa(int(code)) {
			t.Errorf("%s: x-grpc-close %q, want %d", method, got, code)
		}
	}
	// The timeout argument bounds the call: 50 ms of the host's clock, which the test steps
	// once the call has armed its timer (the only timer of this host).
	seen = nil
	go func() {
		if poll(func() bool { return c.Timers() == 1 }) {
			c.Advance(50 * time.Millisecond)
		}
	}()
	mustExchange(t, h, &Request{Path: "/call", Headers: [][2]string{{"x-method", "Hang"}, {"x-timeout-ms", "50"}}}, func(r *Request) *Response { seen = r; return nil })
	if got, _ := header(seen.Headers, "x-grpc-close"); got != strconv.Itoa(int(codes.DeadlineExceeded)) {
		t.Errorf("Hang with a 50 ms timeout: x-grpc-close %q", got)
	}
	// A cluster nobody listens on: UNAVAILABLE through proxy_on_grpc_close.
	seen = nil
	mustExchange(t, h, &Request{Path: "/call", Headers: [][2]string{{"x-method", "Echo"}, {"x-service", "dead"}}}, func(r *Request) *Response { seen = r; return nil })
	if got, _ := header(seen.Headers, "x-grpc-close"); got != strconv.Itoa(int(codes.Unavailable)) {
		t.Errorf("dead cluster: x-grpc-close %q", got)
	}
	for _, r := range []*Request{seen} {
		if v, ok := header(r.Headers, "x-grpc-unexpected"); ok {
			t.Errorf("metadata callback for a unary call: %s", v)
		}
	}
	// An unknown cluster name: PARSE_FAILURE at once (Envoy: no thread-local cluster).
	resp = mustExchange(t, h, &Request{Path: "/call", Headers: [][2]string{{"x-service", "nope"}}}, nil)
	if resp.Status != 502 || string(resp.Body) != "refused 4" {
		t.Errorf("unknown cluster: %d %q", resp.Status, resp.Body)
	}
	// A serialized GrpcService naming the cluster works like its name.
	gs, _ := proto.Marshal(&corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: "backend"}}})
	seen = nil
	mustExchange(t, h, &Request{Path: "/call", Headers: [][2]string{{"x-method", "Echo"}, {"x-service", string(gs)}, {"x-msg", "p"}}}, func(r *Request) *Response { seen = r; return nil })
	if got, _ := header(seen.Headers, "x-grpc-reply"); got != "echo:p" {
		t.Errorf("GrpcService target: x-grpc-reply %q", got)
	}
	// Cancel: OK once, then NOT_FOUND; no callback follows (the stream is answered by the
	// guest itself, and nothing else arrives).
	resp = mustExchange(t, h, &Request{Path: "/cancel", Headers: [][2]string{{"x-method", "Hang"}}}, nil)
	if !strings.HasPrefix(string(resp.Body), "call 0 token ") || !strings.HasSuffix(string(resp.Body), " cancel 0 again 1") {
		t.Errorf("cancel: %q", resp.Body)
	}
	// What is not supported answers as cpp-host / Envoy do.
	resp = mustExchange(t, h, &Request{Path: "/statuses"}, nil)
	if got := string(resp.Body); got != "stream 12 send(call id) 2 send(stream id) 1 cancel(http id) 2 close(unknown call) 1" {
		t.Errorf("statuses: %q", got)
	}
}

// A call in flight when the host closes does not hold Close up; the exchange waiting for it
// ends.
func TestGrpcCallHostClosing(t *testing.T) {
	addr, _, hung := echoServer(t)
	h, _ := newHost(t, "grpccaller", Options{Workers: 1, Clusters: map[string]string{"backend": addr}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.Exchange(ctx, &Request{Path: "/call", Headers: [][2]string{{"x-method", "Hang"}}}, nil)
	}()
	<-hung // the call reached the server
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
}
