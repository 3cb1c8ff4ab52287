package host

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host/fakeclock"
)

// The bodywait guest (testdata/guests/bodywait) under Options.AllowOnHeadersStopIteration,
// Envoy's allow_on_headers_stop_iteration.

// waitUntil polls cond until it holds, failing the test after a deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll reports whether cond holds within 15 s, polling it.
func poll(cond func() bool) bool { return pollFor(15*time.Second, cond) }

// The bodywait guest ticks every 5 ms of the host's clock, a fake one here: a test makes
// each tick it needs happen.
const bodywaitTick = 5 * time.Millisecond

// tick steps the host's clock by one tick period and waits for the tick it makes due.
func tick(t *testing.T, h *Host) {
	t.Helper()
	n := metricValue(h, "bodywait_ticks")
	h.clock.(*fakeclock.Clock).Advance(bodywaitTick)
	waitUntil(t, "a tick", func() bool { return metricValue(h, "bodywait_ticks") > n })
}

// tickWhen steps the host's clock by one tick period once cond holds, from a goroutine of
// its own: for a test that blocks on a response waiting for that tick.
func tickWhen(h *Host, cond func() bool) {
	go func() {
		poll(cond)
		h.clock.(*fakeclock.Clock).Advance(bodywaitTick)
	}()
}

// heldUpstream records what reached it: whether it was called, the bytes of the body read so
// far, and answers with the body and the headers the guest added.
type heldUpstream struct {
	called atomic.Int32
	read   atomic.Int64
}

func (u *heldUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.called.Add(1)
	var body bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := r.Body.Read(buf)
		body.Write(buf[:n])
		u.read.Add(int64(n))
		if err != nil {
			break
		}
	}
	for _, k := range []string{"X-Bodywait-Seen", "X-Bodywait-Len", "X-Resumed-By"} {
		w.Header().Set("Up-"+k, r.Header.Get(k))
	}
	w.Header().Set("Up-Content-Length", strconv.FormatInt(r.ContentLength, 10))
	w.Write(body.Bytes())
}

func newHeldServer(t *testing.T, opts Options) (*Host, *heldUpstream, *httptest.Server) {
	t.Helper()
	if opts.Workers == 0 {
		opts.Workers = 1
	}
	opts.Clock = fakeclock.New()
	h, _ := newHost(t, "bodywait", opts)
	up := &heldUpstream{}
	srv := httptest.NewServer(h.Handler(up))
	t.Cleanup(srv.Close)
	return h, up, srv
}

// rawRequest opens a connection and sends a request's head with a Content-Length; the test
// writes the body in the pieces it wants, so that each reaches the host as one read.
func rawRequest(t *testing.T, srv *httptest.Server, method, path string, length int, hdr ...string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n", method, path, length)
	for i := 0; i+1 < len(hdr); i += 2 {
		head += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	if _, err := io.WriteString(c, head+"\r\n"); err != nil {
		t.Fatal(err)
	}
	return c
}

func send(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

func readResponse(t *testing.T, c net.Conn) (*http.Response, string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func fnv32(s string) string {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return strconv.FormatUint(uint64(h), 16)
}

// Body chunks reach proxy_on_request_body while the headers are held — the upstream is not
// called — each time with everything buffered so far; Continue from the body callback sends
// the headers (with what the guest added from the body) and the whole body upstream, and a
// later chunk reaches proxy_on_request_body alone.
func TestHeldBodyContinue(t *testing.T) {
	h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
	parts := []string{"abcde", "fghijkl", "mnEND", "tail"}
	c := rawRequest(t, srv, "POST", "/continue", len(strings.Join(parts, "")))
	for i, p := range parts[:2] {
		send(t, c, p)
		waitUntil(t, fmt.Sprintf("body call %d", i+1), func() bool { return metricValue(h, "bodywait_body_calls") == int64(i+1) })
		if up.called.Load() != 0 {
			t.Fatalf("the upstream was called while the headers were held (after chunk %d)", i+1)
		}
	}
	send(t, c, parts[2])
	waitUntil(t, "the upstream to have the held body", func() bool { return up.read.Load() == 17 })
	send(t, c, parts[3])
	resp, body := readResponse(t, c)
	want := strings.Join(parts, "")
	if resp.StatusCode != 200 || body != want {
		t.Fatalf("%d %q, want 200 %q", resp.StatusCode, body, want)
	}
	if got := resp.Header.Get("X-Bodywait-Calls"); got != "5/0,12/0,17/0,4/1" {
		t.Errorf("proxy_on_request_body calls %q, want 5/0,12/0,17/0,4/1", got)
	}
	if got, want := resp.Header.Get("Up-X-Bodywait-Seen"), fnv32("abcdefghijklmnEND"); got != want || resp.Header.Get("Up-X-Bodywait-Len") != "17" {
		t.Errorf("the upstream saw x-bodywait-seen %q len %q, want %q 17", got, resp.Header.Get("Up-X-Bodywait-Len"), want)
	}
	if up.called.Load() != 1 {
		t.Errorf("upstream called %d times", up.called.Load())
	}
}

// A body of many reads, held to its end: the guest had all of it, and the upstream gets it
// byte for byte.
func TestHeldBodyLarge(t *testing.T) {
	_, _, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
	big := make([]byte, 300<<10)
	x := uint32(1)
	for i := range big {
		x = x*1103515245 + 12345
		big[i] = 'a' + byte(x>>16)%26 // no "END" in it
	}
	resp, body := get(t, srv.Client(), "POST", srv.URL+"/continue", bytes.NewReader(big))
	if resp.StatusCode != 200 || body != string(big) {
		t.Fatalf("status %d, %d bytes back (want %d, equal)", resp.StatusCode, len(body), len(big))
	}
	calls := strings.Split(resp.Header.Get("X-Bodywait-Calls"), ",")
	if len(calls) < 2 || calls[len(calls)-1] != strconv.Itoa(len(big))+"/1" {
		t.Fatalf("calls %v: want several, the last %d/1", calls, len(big))
	}
	prev := 0
	for _, c := range calls[:len(calls)-1] {
		n, err := strconv.Atoi(strings.TrimSuffix(c, "/0"))
		if err != nil || n <= prev {
			t.Fatalf("calls %v: each before the last must be n/0 with n growing", calls)
		}
		prev = n
	}
	if got := resp.Header.Get("Up-X-Bodywait-Seen"); got != fnv32(string(big)) {
		t.Errorf("x-bodywait-seen %q, want %q", got, fnv32(string(big)))
	}
	if got := resp.Header.Get("Up-Content-Length"); got != strconv.Itoa(len(big)) {
		t.Errorf("upstream content-length %s", got)
	}
}

// proxy_continue_stream from proxy_on_tick while the body still flows: the headers and the
// buffered body go upstream; a later chunk reaches proxy_on_request_body on its own.
func TestHeldBodyContinueFromTick(t *testing.T) {
	h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
	c := rawRequest(t, srv, "POST", "/tick", 9)
	send(t, c, "abc")
	waitUntil(t, "body call 1", func() bool { return metricValue(h, "bodywait_body_calls") == 1 })
	if up.called.Load() != 0 {
		t.Fatal("the upstream was called while the headers were held")
	}
	send(t, c, "GO")
	waitUntil(t, "body call 2", func() bool { return metricValue(h, "bodywait_body_calls") == 2 })
	tick(t, h)
	waitUntil(t, "the upstream to have the held body", func() bool { return up.read.Load() == 5 })
	send(t, c, "rest")
	resp, body := readResponse(t, c)
	if resp.StatusCode != 200 || body != "abcGOrest" || resp.Header.Get("Up-X-Resumed-By") != "tick" {
		t.Fatalf("%d %q %v", resp.StatusCode, body, resp.Header)
	}
	if got := resp.Header.Get("X-Bodywait-Calls"); got != "3/0,5/0,4/1" {
		t.Errorf("calls %q, want 3/0,5/0,4/1", got)
	}
}

// A local reply from proxy_on_request_body while the headers are held ends the request: the
// upstream is never called, the rest of the body is not waited for, and the HTTP/1
// connection closes after the reply, as Envoy's does.
func TestHeldBodyLocalReply(t *testing.T) {
	h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
	base := runtime.NumGoroutine()
	c := rawRequest(t, srv, "POST", "/local", 100)
	send(t, c, "abc")
	waitUntil(t, "body call 1", func() bool { return metricValue(h, "bodywait_body_calls") == 1 })
	send(t, c, "STOP")
	resp, body := readResponse(t, c)
	if resp.StatusCode != 403 || body != "stopped after 7 bytes" || resp.Header.Get("X-Bodywait-Local") != "yes" || !resp.Close {
		t.Fatalf("%d %q close=%v %v", resp.StatusCode, body, resp.Close, resp.Header)
	}
	if got := resp.Header.Get("X-Bodywait-Calls"); got != "3/0,7/0" {
		t.Errorf("calls %q, want 3/0,7/0", got)
	}
	waitUntil(t, "the stream's end", func() bool { return metricValue(h, "bodywait_deletes") == 1 })
	c.Close()
	waitUntil(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
	if up.called.Load() != 0 {
		t.Error("the upstream was called")
	}
}

// Past Options.BufferLimit the held request is answered 413 "Payload Too Large" (Envoy's
// local reply when a buffering filter passes the buffer limit); up to it, it is not. The
// default limit is Envoy's 1 MiB.
func TestHeldBodyTooLarge(t *testing.T) {
	for _, tc := range []struct {
		limit, size int
		path        string
		want        int
	}{
		{64 << 10, 100 << 10, "/forever", 413},
		{0, 1 << 20, "/continue", 200},
		{0, 1<<20 + 1, "/continue", 413},
	} {
		t.Run(fmt.Sprintf("limit%d-size%d", tc.limit, tc.size), func(t *testing.T) {
			h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true, BufferLimit: tc.limit})
			c := rawRequest(t, srv, "POST", tc.path, tc.size)
			go c.Write(bytes.Repeat([]byte("z"), tc.size)) // the server may stop reading
			resp, body := readResponse(t, c)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
			limit := tc.limit
			if limit == 0 {
				limit = DefaultBufferLimit
			}
			calls := strings.Split(resp.Header.Get("X-Bodywait-Calls"), ",")
			last, _ := strconv.Atoi(strings.Split(calls[len(calls)-1], "/")[0])
			if tc.want == 200 {
				if len(body) != tc.size || last != tc.size {
					t.Fatalf("%d bytes up, last call %v", len(body), calls[len(calls)-1])
				}
				return
			}
			// Answered before the end of the body (when the limit is well below it), the
			// connection closes.
			unread := tc.size-limit > heldChunk
			if body != "Payload Too Large" || resp.Header.Get("Content-Type") != "text/plain" || resp.Close != unread {
				t.Errorf("413: %q %v", body, resp.Header)
			}
			if last > limit || last == 0 {
				t.Errorf("the guest had %d bytes, limit %d (calls %v)", last, limit, calls)
			}
			if up.called.Load() != 0 {
				t.Error("the upstream was called")
			}
			waitUntil(t, "the stream's end", func() bool { return metricValue(h, "bodywait_deletes") == 1 })
		})
	}
}

// A client that goes away while the headers are held — mid-body, or with its body sent —
// ends the stream (proxy_on_log/done/delete), and no goroutine is left behind.
func TestHeldBodyClientGone(t *testing.T) {
	for _, tc := range []struct {
		name   string
		length int
		sent   string
	}{{"mid-body", 1000, "abc"}, {"body-sent", 3, "abc"}} {
		t.Run(tc.name, func(t *testing.T) {
			h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
			base := runtime.NumGoroutine()
			c := rawRequest(t, srv, "POST", "/forever", tc.length)
			send(t, c, tc.sent)
			waitUntil(t, "body call 1", func() bool { return metricValue(h, "bodywait_body_calls") == 1 })
			c.Close()
			waitUntil(t, "the stream's end", func() bool { return metricValue(h, "bodywait_deletes") == 1 })
			waitUntil(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
			if up.called.Load() != 0 {
				t.Error("the upstream was called")
			}
		})
	}
}

// Requests without a body are not affected: one that is not paused goes through, one paused
// in proxy_on_request_headers waits for proxy_continue_stream as before, and neither has a
// body callback.
func TestHeldBodyNoBody(t *testing.T) {
	h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
	resp, _ := get(t, srv.Client(), "GET", srv.URL+"/nopause", nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Bodywait-Calls") != "" {
		t.Fatalf("nopause: %d %v", resp.StatusCode, resp.Header)
	}
	// Once the request has started (its tick comes after its proxy_on_request_headers,
	// on the same worker).
	tickWhen(h, func() bool { return h.Stats().Requests == 2 })
	resp, _ = get(t, srv.Client(), "GET", srv.URL+"/tick", nil)
	if resp.StatusCode != 200 || resp.Header.Get("Up-X-Resumed-By") != "tick" || resp.Header.Get("X-Bodywait-Calls") != "" {
		t.Fatalf("tick: %d %v", resp.StatusCode, resp.Header)
	}
	// A body that is not held streams through proxy_on_request_body as before.
	resp, body := get(t, srv.Client(), "POST", srv.URL+"/nopause", strings.NewReader("payload"))
	if resp.StatusCode != 200 || body != "payload" || resp.Header.Get("X-Bodywait-Calls") != "7/1" {
		t.Fatalf("nopause with a body: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if up.called.Load() != 3 {
		t.Errorf("upstream called %d times", up.called.Load())
	}
}

// With the option off (Envoy's default), Pause from proxy_on_request_headers holds the body
// too: proxy_on_request_body is not called until the guest continues, then gets the body.
func TestHeldBodyOptionOff(t *testing.T) {
	h, up, srv := newHeldServer(t, Options{})
	c := rawRequest(t, srv, "POST", "/gated", 3)
	send(t, c, "abc")
	waitUntil(t, "the request headers", func() bool { return h.Stats().Requests == 1 })
	t0 := metricValue(h, "bodywait_ticks")
	for range 3 {
		tick(t, h)
	}
	waitUntil(t, "three ticks", func() bool { return metricValue(h, "bodywait_ticks") >= t0+3 })
	if n := metricValue(h, "bodywait_body_calls"); n != 0 || up.called.Load() != 0 {
		t.Fatalf("before the continue: %d body calls, upstream called %d times; want none", n, up.called.Load())
	}
	h.SharedData().Set("bodywait.go", []byte("1"), 0)
	tick(t, h)
	resp, body := readResponse(t, c)
	if resp.StatusCode != 200 || body != "abc" || resp.Header.Get("X-Bodywait-Calls") != "3/1" || resp.Header.Get("Up-X-Resumed-By") != "tick" {
		t.Fatalf("%d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// Exchange under the option: the whole body reaches proxy_on_request_body while the headers
// are held; Continue sends both on, and buffering past the limit answers 413.
func TestHeldBodyExchange(t *testing.T) {
	h, _ := newHost(t, "bodywait", Options{Workers: 1, AllowOnHeadersStopIteration: true, BufferLimit: 8})
	var got *Request
	up := func(r *Request) *Response { got = r; return &Response{Status: 200} }
	resp := mustExchange(t, h, &Request{Method: "POST", Path: "/continue", Body: []byte("xyEND")}, up)
	if resp.Status != 200 || got == nil || string(got.Body) != "xyEND" || resp.Header("x-bodywait-calls") != "5/1" {
		t.Fatalf("%d %v %+v", resp.Status, resp.Headers, got)
	}
	if v := (&Response{Headers: got.Headers}).Header("x-bodywait-seen"); v != fnv32("xyEND") {
		t.Errorf("x-bodywait-seen %q", v)
	}
	got = nil
	resp = mustExchange(t, h, &Request{Method: "POST", Path: "/forever", Body: []byte("0123456789")}, up)
	if resp.Status != 413 || string(resp.Body) != "Payload Too Large" || got != nil || resp.Details != "request_payload_too_large" {
		t.Fatalf("%d %q %q upstream=%v", resp.Status, resp.Body, resp.Details, got != nil)
	}
}

// gRPC over HTTP/2, the same way: messages reach proxy_on_request_body while the headers
// are held; a local reply, and 413, are trailers-only gRPC responses.
func TestHeldBodyGRPC(t *testing.T) {
	h, _ := newHost(t, "bodywait", Options{Workers: 1, AllowOnHeadersStopIteration: true, BufferLimit: 16})
	up := &heldUpstream{}
	srv := h2cServer(t, h.Handler(up))
	start := func(path string) (*io.PipeWriter, chan *http.Response) {
		pr, pw := io.Pipe()
		req, _ := http.NewRequest("POST", srv.URL+path, pr)
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		done := make(chan *http.Response, 1)
		go func() {
			resp, err := h2cClient().Do(req)
			if err != nil {
				t.Error(err)
				resp = nil
			}
			done <- resp
		}()
		return pw, done
	}
	calls := int64(0)
	write := func(pw *io.PipeWriter, s string) {
		t.Helper()
		io.WriteString(pw, s)
		calls++
		waitUntil(t, "a body call", func() bool { return metricValue(h, "bodywait_body_calls") == calls })
	}

	pw, done := start("/continue")
	write(pw, "msg1")
	if up.called.Load() != 0 {
		t.Fatal("the upstream was called while the headers were held")
	}
	write(pw, "END")
	waitUntil(t, "the upstream to have the held body", func() bool { return up.read.Load() == 7 })
	pw.Close()
	resp := <-done
	if resp == nil {
		t.FailNow()
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 || string(body) != "msg1END" || resp.Header.Get("X-Bodywait-Calls") != "4/0,7/0,0/1" {
		t.Fatalf("continue: %s %d %q %v", resp.Proto, resp.StatusCode, body, resp.Header)
	}

	for _, c := range []struct{ path, second, status, message string }{
		{"/local", "STOP", "7", "stopped after 8 bytes"},
		{"/forever", "0123456789abcdef", "2", "Payload Too Large"},
	} {
		pw, done := start(c.path)
		write(pw, "msg1")
		io.WriteString(pw, c.second)
		resp := <-done
		if resp == nil {
			t.FailNow()
		}
		resp.Body.Close()
		pw.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Grpc-Status") != c.status || resp.Header.Get("Grpc-Message") != c.message || resp.Header.Get("Content-Type") != "application/grpc" {
			t.Errorf("%s: %d %v, want grpc-status %s %q", c.path, resp.StatusCode, resp.Header, c.status, c.message)
		}
		calls = metricValue(h, "bodywait_body_calls")
	}
	if up.called.Load() != 1 {
		t.Errorf("upstream called %d times, want 1", up.called.Load())
	}
}

// cpp-host's VM-wide stop flag keeps its meaning under the option: a stream whose
// proxy_on_request_headers sent a local reply for another (held) stream and returned
// Continue gets StopAllIterationAndWatermark — its body waits with its headers, and
// proxy_on_request_body is not called until the guest continues it.
func TestHeldBodyVMWideStop(t *testing.T) {
	h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
	a := rawRequest(t, srv, "POST", "/victim", 10)
	send(t, a, "abc")
	waitUntil(t, "the victim's body call", func() bool { return metricValue(h, "bodywait_body_calls") == 1 })
	b := rawRequest(t, srv, "POST", "/quirk", 3)
	send(t, b, "xyz")
	resp, body := readResponse(t, a)
	if resp.StatusCode != 429 || body != "answered by another stream" {
		t.Fatalf("victim: %d %q", resp.StatusCode, body)
	}
	t0 := metricValue(h, "bodywait_ticks")
	for range 3 {
		tick(t, h)
	}
	waitUntil(t, "three ticks", func() bool { return metricValue(h, "bodywait_ticks") >= t0+3 })
	if n := metricValue(h, "bodywait_body_calls"); n != 1 || up.called.Load() != 0 {
		t.Fatalf("before the continue: %d body calls (want the victim's 1), upstream called %d times", n, up.called.Load())
	}
	h.SharedData().Set("bodywait.quirk", []byte("1"), 0)
	tick(t, h)
	resp, body = readResponse(t, b)
	if resp.StatusCode != 200 || body != "xyz" || resp.Header.Get("X-Bodywait-Calls") != "3/1" {
		t.Fatalf("quirk: %d %q %v", resp.StatusCode, body, resp.Header)
	}
}

// proxy_continue_stream from the held stream's own proxy_on_request_body ends the hold too,
// whatever the callback returns; a trap in it answers with Envoy's failure reply.
func TestHeldBodySelfContinueAndTrap(t *testing.T) {
	h, up, srv := newHeldServer(t, Options{AllowOnHeadersStopIteration: true})
	c := rawRequest(t, srv, "POST", "/self", 9)
	send(t, c, "abc")
	waitUntil(t, "body call 1", func() bool { return metricValue(h, "bodywait_body_calls") == 1 })
	send(t, c, "END")
	waitUntil(t, "the upstream to have the held body", func() bool { return up.read.Load() == 6 })
	send(t, c, "xyz")
	resp, body := readResponse(t, c)
	if resp.StatusCode != 200 || body != "abcENDxyz" || resp.Header.Get("X-Bodywait-Calls") != "3/0,6/0,3/1" {
		t.Fatalf("self: %d %q %v", resp.StatusCode, body, resp.Header)
	}
	c = rawRequest(t, srv, "POST", "/trap", 100)
	send(t, c, "abc")
	waitUntil(t, "body call 4", func() bool { return metricValue(h, "bodywait_body_calls") == 4 })
	send(t, c, "BOOM")
	resp, body = readResponse(t, c)
	if resp.StatusCode != 503 || body != "" || !resp.Close {
		t.Fatalf("trap: %d %q close=%v %v", resp.StatusCode, body, resp.Close, resp.Header)
	}
	if up.called.Load() != 1 {
		t.Errorf("upstream called %d times, want 1", up.called.Load())
	}
}
