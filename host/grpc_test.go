package host

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

func TestPercentEncodeGRPCMessage(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"rate limited", "rate limited"},
		{"rate limited\n", "rate limited%0A"},
		{"100% sure", "100%25 sure"},
		{"~tilde", "%7Etilde"}, // Envoy encodes '~' too (ch >= '~')
		{"é", "%C3%A9"},
		{"\x00\x1f\x20\x7d\x7f", "%00%1F }%7F"},
	} {
		if got := percentEncodeGRPCMessage(c.in); got != c.want {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}

func TestHTTPToGRPCStatus(t *testing.T) {
	for code, want := range map[int]int{400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14, 200: 2, 418: 2, 500: 2} {
		if got := httpToGRPCStatus(code); got != want {
			t.Errorf("%d: %d, want %d", code, got, want)
		}
	}
}

func TestSanitizeTE(t *testing.T) {
	for _, c := range []struct {
		in, want string
		keep     bool
	}{
		{"trailers", "trailers", true},
		{"gzip, trailers", "trailers", true},
		{" trailers ,deflate", "trailers", true},
		{"gzip", "", false},
		{"trailersx", "", false},
	} {
		if got, keep := sanitizeTE(c.in); got != c.want || keep != c.keep {
			t.Errorf("%q: %q %v, want %q %v", c.in, got, keep, c.want, c.keep)
		}
	}
}

func TestIsGRPCContentType(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc": true, "application/grpc+proto": true, "application/grpc-web": false,
		"application/grpc;x=y": false, "Application/grpc": false, "": false,
	} {
		if got := isGRPCContentType(ct); got != want {
			t.Errorf("%q: %v", ct, got)
		}
	}
}

// A local reply to a gRPC request becomes the trailers-only response Envoy
// sends, and the guest's response phase sees it so (status 200, end of stream).
func TestGRPCLocalReplyExchange(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	do := func(method, ct string, hdrs ...string) *Response {
		t.Helper()
		req := &Request{Method: method, Path: "/local-grpc", Authority: "a.test", Headers: [][2]string{{"content-type", ct}}}
		for i := 0; i+1 < len(hdrs); i += 2 {
			req.Headers = append(req.Headers, [2]string{hdrs[i], hdrs[i+1]})
		}
		resp, err := h.Exchange(context.Background(), req, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Local || resp.Failed {
			t.Fatalf("not a local reply: %+v", resp)
		}
		return resp
	}
	for _, c := range []struct {
		name                string
		method, ct          string
		hdrs                []string
		grpcStatus, message string
		argument            int32
	}{
		{"given status, encoded message", "POST", "application/grpc", []string{"x-grpc-status", "8", "x-body", "slow down: 100% ~é\n"}, "8", "slow down: 100%25 %7E%C3%A9%0A", 8},
		{"no status: from 429", "POST", "application/grpc+proto", []string{"x-body", "x"}, "14", "x", -1},
		{"unknown status: from 403", "POST", "application/grpc", []string{"x-code", "403", "x-grpc-status", "17"}, "7", "", 17},
		{"the guest's own grpc-status wins", "POST", "application/grpc", []string{"x-grpc-status", "8", "x-add-grpc-status", "3"}, "3", "", 8},
		{"HEAD: no message", "HEAD", "application/grpc", []string{"x-grpc-status", "0", "x-body", "hi"}, "0", "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := do(c.method, c.ct, c.hdrs...)
			if r.Status != 200 || len(r.Body) != 0 || r.GRPCStatus != c.argument {
				t.Errorf("status %d body %q grpc argument %d, want 200, no body, %d", r.Status, r.Body, r.GRPCStatus, c.argument)
			}
			m := headerMap{kv: r.Headers}
			if ct := values(r.Headers, "content-type"); len(ct) != 1 || ct[0] != "application/grpc" {
				t.Errorf("content-type %q", ct)
			}
			if gs := values(r.Headers, "grpc-status"); len(gs) != 1 || gs[0] != c.grpcStatus {
				t.Errorf("grpc-status %q, want %s", gs, c.grpcStatus)
			}
			if got, _ := m.get("grpc-message"); got != c.message {
				t.Errorf("grpc-message %q, want %q", got, c.message)
			}
			if _, ok := m.get("content-length"); ok {
				t.Error("content-length kept")
			}
			if got, _ := m.get("x-seen"); got != "200 "+c.grpcStatus+" eos=1" {
				t.Errorf("the guest's response phase saw %q, want %q", got, "200 "+c.grpcStatus+" eos=1")
			}
			if got, _ := m.get("x-local"); got != "yes" {
				t.Errorf("the guest's headers lost: %v", r.Headers)
			}
		})
	}
	// Not gRPC (Envoy's test): the reply is as the guest sent it.
	r := do("POST", "application/grpc-web", "x-body", "plain\n")
	if r.Status != 429 || string(r.Body) != "plain\n" || values(r.Headers, "grpc-status") != nil {
		t.Errorf("grpc-web: %d %q %v", r.Status, r.Body, r.Headers)
	}
}

func values(kv [][2]string, name string) []string {
	var out []string
	for _, p := range kv {
		if p[0] == name {
			out = append(out, p[1])
		}
	}
	return out
}

// h2cServer serves handler with HTTP/1.1 and HTTP/2 cleartext, as `sluice run` does.
func h2cServer(t *testing.T, handler http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(handler)
	// net/http recovers a panic of a connection's goroutine and logs it: a test fails on it.
	var logs logBuffer
	srv.Config.ErrorLog = log.New(&logs, "", 0)
	t.Cleanup(func() {
		if strings.Contains(logs.String(), "panic") {
			t.Errorf("net/http logged a panic:\n%.2000s", logs.String())
		}
	})
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func h2cClient() *http.Client {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: tr}
}

// On HTTP/2 the gRPC local reply is one HEADERS frame with END_STREAM: a
// trailers-only response, read here frame by frame.
func TestGRPCLocalReplyIsTrailersOnlyOnHTTP2(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	srv := h2cServer(t, h.Handler(echoUpstream()))
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(conn, conn)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", "a.test"}, {":path", "/local-grpc"},
		{"content-type", "application/grpc"}, {"te", "trailers"}, {"x-grpc-status", "8"}, {"x-body", "rate limited"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.DataFrame:
			t.Fatalf("DATA frame (%d bytes, end %v): not trailers-only", len(f.Data()), f.StreamEnded())
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				t.Fatal("HEADERS without END_STREAM: not trailers-only")
			}
			got := map[string]string{}
			for _, hf := range f.Fields {
				got[hf.Name] = hf.Value
			}
			if got[":status"] != "200" || got["grpc-status"] != "8" || got["grpc-message"] != "rate limited" || got["content-type"] != "application/grpc" {
				t.Errorf("headers %v", got)
			}
			if v, ok := got["content-length"]; ok {
				t.Errorf("content-length %q (Envoy removes it)", v)
			}
			return
		case *http2.GoAwayFrame, *http2.RSTStreamFrame:
			t.Fatalf("%v", f)
		}
	}
}

// Through the handler over HTTP/2: the same pseudo-headers as HTTP/1.1, the
// upstream's trailers forwarded, the guest's response headers added, the request
// body streamed both ways (the upstream answers before the request body ends).
func TestHandlerHTTP2(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.Header().Set("Trailer", "Grpc-Status")
		w.Header().Set("X-Proto", r.Proto)
		w.Header().Set("X-Te", r.Header.Get("Te"))
		w.WriteHeader(200)
		http.NewResponseController(w).Flush() // the client waits for the headers before it sends
		buf := make([]byte, 5)
		for { // echo each message as it comes: the request body must stream
			if _, err := io.ReadFull(r.Body, buf); err != nil {
				break
			}
			w.Write(buf)
			http.NewResponseController(w).Flush()
		}
		w.Header().Set("Grpc-Status", "0")
		w.Header().Set(http.TrailerPrefix+"Grpc-Message", "done")
	})
	srv := h2cServer(t, h.Handler(upstream))
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", srv.URL+"/stream", pr)
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := h2cClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 {
		t.Fatalf("%s %d", resp.Proto, resp.StatusCode)
	}
	if resp.Header.Get("X-Kitchen-Response") == "" {
		t.Errorf("the guest's response header is missing: %v", resp.Header)
	}
	if resp.Header.Get("X-Te") != "trailers" {
		t.Errorf("te %q", resp.Header.Get("X-Te"))
	}
	buf := make([]byte, 5)
	for _, msg := range []string{"one..", "two.."} {
		io.WriteString(pw, msg) // the next message is written only after the echo of this one
		if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != msg {
			t.Fatalf("echo %q %v, want %q", buf, err, msg)
		}
	}
	pw.Close()
	if rest, _ := io.ReadAll(resp.Body); len(rest) != 0 {
		t.Errorf("extra body %q", rest)
	}
	if resp.Trailer.Get("Grpc-Status") != "0" || resp.Trailer.Get("Grpc-Message") != "done" {
		t.Errorf("trailers %v", resp.Trailer)
	}
}

// The guest sees request.protocol as Envoy names it, and the same
// pseudo-headers on HTTP/1.1 and HTTP/2.
func TestHandlerHTTP2Properties(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	srv := h2cServer(t, h.Handler(echoUpstream()))
	for _, c := range []struct {
		client *http.Client
		proto  string
	}{{srv.Client(), "HTTP/1.1"}, {h2cClient(), "HTTP/2"}} {
		_, body := get(t, c.client, "GET", srv.URL+"/props?x=1", nil)
		for _, want := range []string{"request.protocol=" + c.proto + ";0", "request.path=/props?x=1;0", "request.method=GET;0", "request.scheme=http;0", "request.host=" + srv.Listener.Addr().String() + ";0"} {
			if !strings.Contains(body, want) {
				t.Errorf("%s: %q missing from\n%s", c.proto, want, body)
			}
		}
	}
}
