package host

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

// closedAddr returns an address nothing listens on (a port just released).
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// A stopped upstream: Envoy 1.40.0's reply (503, its text) to HTTP/1.1, trailers-only
// UNAVAILABLE to gRPC over HTTP/2 and HTTP/1.1, the guest's response phase on both, and the
// cause logged.
func TestUpstreamFailureAnswersAsEnvoy(t *testing.T) {
	logs := &logBuffer{}
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	target, _ := url.Parse("http://" + closedAddr(t))
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP1(true)
	rp := &httputil.ReverseProxy{
		Transport:    tr,
		Rewrite:      func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		ErrorHandler: UpstreamErrorHandler(newTestLogger(logs), target.String(), time.Hour),
	}
	srv := h2cServer(t, h.Handler(rp))

	const want = "upstream connect error or disconnect/reset before headers. reset reason: remote connection failure"
	resp, body := get(t, srv.Client(), "GET", srv.URL+"/x", nil)
	if resp.StatusCode != 503 || body != want || resp.Header.Get("Content-Type") != "text/plain" {
		t.Errorf("HTTP/1.1: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if resp.Header.Get("X-Kitchen-Response") == "" {
		t.Errorf("the guest's response phase did not run on the failure reply: %v", resp.Header)
	}
	for _, c := range []struct {
		name   string
		client *http.Client
		proto  int
	}{{"h2c", h2cClient(), 2}, {"http1", srv.Client(), 1}} {
		resp, body := get(t, c.client, "POST", srv.URL+"/pkg.Svc/Method", strings.NewReader("\x00\x00\x00\x00\x00"), "Content-Type", "application/grpc", "TE", "trailers")
		if resp.ProtoMajor != c.proto || resp.StatusCode != 200 || body != "" ||
			resp.Header.Get("Content-Type") != "application/grpc" || resp.Header.Get("Grpc-Status") != "14" ||
			resp.Header.Get("Grpc-Message") != strings.ReplaceAll(want, "%", "%25") {
			t.Errorf("gRPC over %s: HTTP/%d %d %q %v", c.name, resp.ProtoMajor, resp.StatusCode, body, resp.Header)
		}
		if c.proto == 2 && resp.ContentLength > 0 {
			t.Errorf("gRPC over h2c: content-length %d", resp.ContentLength)
		}
	}
	if n := logs.count("host: upstream request failed"); n != 1 {
		t.Errorf("%d failure lines in an hour, want 1:\n%s", n, logs)
	}
	for _, s := range []string{"upstream=" + target.String(), `reason="remote connection failure"`, "connection refused"} {
		if !strings.Contains(logs.String(), s) {
			t.Errorf("failure line lacks %q:\n%s", s, logs)
		}
	}
}

// One line per interval per upstream; the next says how many were held back. A client that
// went away is not logged.
func TestUpstreamFailureLogIsRateLimited(t *testing.T) {
	logs := &logBuffer{}
	now := time.Unix(1000, 0)
	u := &upstreamLog{log: newTestLogger(logs), upstream: "http://up", every: 10 * time.Second, now: func() time.Time { return now }}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	fail := func() {
		u.handle(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), refused)
	}
	for range 3 {
		fail()
	}
	now = now.Add(9 * time.Second)
	fail()
	if n := logs.count("upstream request failed"); n != 1 || strings.Contains(logs.String(), "held_back") {
		t.Fatalf("within 10 s: %d lines\n%s", n, logs)
	}
	now = now.Add(time.Second)
	fail()
	if n := logs.count("upstream request failed"); n != 2 || logs.count("held_back=3") != 1 {
		t.Fatalf("after 10 s: %d lines\n%s", n, logs)
	}
	now = now.Add(time.Minute)
	gone := httptest.NewRequest("GET", "/", nil)
	ctx, cancel := context.WithCancel(gone.Context())
	cancel()
	rec := httptest.NewRecorder()
	u.handle(rec, gone.WithContext(ctx), context.Canceled)
	if n := logs.count("upstream request failed"); n != 2 {
		t.Errorf("a client that went away was logged:\n%s", logs)
	}
}

func TestUpstreamResetReason(t *testing.T) {
	_, refused := net.Dial("tcp", closedAddr(t))
	timeout := &net.OpError{Op: "dial", Net: "tcp", Err: timeoutErr{}}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{refused, "remote connection failure"},
		{timeout, "connection timeout"},
		{&net.DNSError{Err: "no such host", Name: "nope.invalid"}, "remote connection failure"},
		{io.ErrUnexpectedEOF, "connection termination"},
		{errors.New("net/http: HTTP/1.x transport connection broken: malformed HTTP response"), "connection termination"},
	} {
		if got := UpstreamResetReason(tc.err); got != tc.want {
			t.Errorf("UpstreamResetReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }
