package host

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoUpstream answers with the request line and headers it received, then the body.
func echoUpstream() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		var b strings.Builder
		b.WriteString(r.Method + " " + r.URL.RequestURI() + " host=" + r.Host + "\n")
		for k, vs := range r.Header {
			for _, v := range vs {
				b.WriteString(strings.ToLower(k) + ": " + v + "\n")
			}
		}
		b.WriteString("body=" + string(body) + "\n")
		io.WriteString(w, b.String())
	})
}

func get(t *testing.T, c *http.Client, method, url string, body io.Reader, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
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

func TestHandler(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 2})
	srv := httptest.NewServer(h.Handler(echoUpstream()))
	defer srv.Close()
	c := srv.Client()

	resp, body := get(t, c, "GET", srv.URL+"/echo-headers?a=b", nil, "X-Replace", "x", "X-Remove", "y")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	for _, want := range []string{"GET /echo-headers?a=b host=127.0.0.1:", "x-added: 1\n", "x-replace: replaced\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("upstream saw no %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "x-remove") {
		t.Errorf("x-remove reached the upstream:\n%s", body)
	}
	if resp.Header.Get("X-Kitchen-Response") == "" || resp.Header.Get("X-Response-Code") != "200" {
		t.Errorf("response headers: %v", resp.Header)
	}

	resp, body = get(t, c, "GET", srv.URL+"/local", nil)
	if resp.StatusCode != 403 || body != "nope\n" || resp.Header.Get("X-Local") != "yes" || resp.Header.Get("X-Kitchen-Response") == "" {
		t.Errorf("local: %d %q %v", resp.StatusCode, body, resp.Header)
	}

	_, body = get(t, c, "GET", srv.URL+"/props", nil)
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, want := range []string{"source.address=127.0.0.1:", "destination.address=" + addr + ";0", "request.host=" + addr + ";0", "request.scheme=http;0"} {
		if !strings.Contains(body, want) {
			t.Errorf("props lack %q:\n%s", want, body)
		}
	}

	resp, _ = get(t, c, "GET", srv.URL+"/resp-status", nil)
	if resp.StatusCode != 201 {
		t.Errorf("resp-status: %d", resp.StatusCode)
	}
	resp, body = get(t, c, "GET", srv.URL+"/resp-local", nil)
	if resp.StatusCode != 418 || body != "teapot\n" {
		t.Errorf("resp-local: %d %q", resp.StatusCode, body)
	}
}

// chunked writes its body in pieces, flushing between them.
func chunkedUpstream(parts ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Request-Body", string(in))
		for _, p := range parts {
			io.WriteString(w, p)
			w.(http.Flusher).Flush()
		}
	})
}

func TestHandlerBodies(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	srv := httptest.NewServer(h.Handler(chunkedUpstream("ab", "cd", "ef")))
	defer srv.Close()
	// A body in several reads: the guest buffers (Pause) until the end, then rewrites it.
	pr, pw := io.Pipe()
	go func() {
		for _, s := range []string{"hel", "lo ", "world"} {
			pw.Write([]byte(s))
		}
		pw.Close()
	}()
	resp, body := get(t, srv.Client(), "POST", srv.URL+"/body", pr)
	if resp.Header.Get("X-Request-Body") != "HELLO WORLD" {
		t.Errorf("upstream got %q", resp.Header.Get("X-Request-Body"))
	}
	if body != "[abcdef]" {
		t.Errorf("client got %q, want [abcdef]", body)
	}
	// Untouched bodies stream through.
	big := bytes.Repeat([]byte("z"), 1<<20)
	resp, body = get(t, srv.Client(), "POST", srv.URL+"/plain", bytes.NewReader(big))
	if len(resp.Header.Get("X-Request-Body")) != len(big) || body != "abcdef" {
		t.Errorf("pass-through: %d bytes up, %q down", len(resp.Header.Get("X-Request-Body")), body)
	}
}

func TestHandlerTrap(t *testing.T) {
	for _, policy := range []string{"closed", "reload", "legacy-open"} {
		c := newFakeClock()
		opts := Options{Workers: 1}
		switch policy {
		case "reload":
			opts = reloadOptions(c, opts)
		case "legacy-open":
			opts.FailOpen = true
		}
		h, _ := newHost(t, "trapper", opts)
		srv := httptest.NewServer(h.Handler(echoUpstream()))
		for _, phase := range []string{"request", "response"} {
			resp, body := get(t, srv.Client(), "GET", srv.URL+"/", nil, "x-trap", "panic", "x-trap-phase", phase)
			want, wantBody := 503, ""
			if policy == "legacy-open" {
				want, wantBody = 200, body
			}
			if resp.StatusCode != want || body != wantBody || (want == 503 && resp.Header.Get("Content-Length") != "0") {
				t.Errorf("%s phase=%s: status %d %v, want %d (%q)", policy, phase, resp.StatusCode, resp.Header, want, body)
			}
			c.Advance(2 * time.Second)
			resp, _ = get(t, srv.Client(), "GET", srv.URL+"/", nil)
			switch policy {
			case "closed":
				if resp.StatusCode != 503 {
					t.Errorf("closed, after trap: %d %v", resp.StatusCode, resp.Header)
				}
			case "reload":
				if resp.StatusCode != 200 || resp.Header.Get("X-Vm-Served") != "1" {
					t.Errorf("reload, after trap: %d %v", resp.StatusCode, resp.Header)
				}
			case "legacy-open":
				if resp.StatusCode != 200 || resp.Header.Get("X-Vm-Served") != "" {
					t.Errorf("legacy-open, after trap: %d %v (want the filter skipped)", resp.StatusCode, resp.Header)
				}
			}
		}
		srv.Close()
	}
}

func TestAdminHandler(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 2, PluginConfig: []byte(`{"rules":[]}`)})
	mustExchange(t, h, &Request{Path: "/x"}, nil)
	srv := httptest.NewServer(h.AdminHandler())
	defer srv.Close()
	resp, body := get(t, srv.Client(), "GET", srv.URL+"/metrics", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, "kitchen_requests_total 1\n") || !strings.Contains(body, "sluice_host_requests_total 1\n") {
		t.Errorf("/metrics %d:\n%s", resp.StatusCode, body)
	}
	_, body = get(t, srv.Client(), "GET", srv.URL+"/status", nil)
	for _, want := range []string{`"plugin_config": "{\"rules\":[]}"`, `"requests": 1`, `"vm_restarts": 0`, `"memory_bytes": `, `"abi_version": "0.2.1"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q:\n%s", want, body)
		}
	}
	resp, body = get(t, srv.Client(), "GET", srv.URL+"/healthz", nil)
	if resp.StatusCode != 200 || body != "ok\n" {
		t.Errorf("/healthz %d %q", resp.StatusCode, body)
	}
}

// A flushed chunk reaches the client before the upstream writes the next one, through a
// guest that exports proxy_on_response_body (kitchen does).
func TestHandlerStreamsFlushedChunks(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	readFirst := make(chan struct{})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-readFirst
		io.WriteString(w, "second\n")
	})
	srv := httptest.NewServer(h.Handler(up))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first\n" {
		close(readFirst)
		t.Fatalf("first chunk: %q %v", buf, err)
	}
	close(readFirst)
	rest, _ := io.ReadAll(resp.Body)
	if string(rest) != "second\n" {
		t.Fatalf("rest = %q", rest)
	}
	if resp.Header.Get("X-Kitchen-Response") == "" {
		t.Errorf("response phase skipped: %v", resp.Header)
	}
}

func TestHandlerConcurrent(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 4})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get("X-Id")+"/"+r.Header.Get("X-Added"))
	})
	srv := httptest.NewServer(h.Handler(up))
	defer srv.Close()
	c := srv.Client()
	const goroutines, each = 50, 20
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				id := fmt.Sprintf("%d-%d", g, i)
				req, _ := http.NewRequest("GET", srv.URL+"/echo-headers", nil)
				req.Header.Set("X-Id", id)
				resp, err := c.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != id+"/1" || resp.Header.Get("X-Kitchen-Response") == "" {
					t.Errorf("request %s got %q %v", id, b, resp.Header)
				}
			}
		}(g)
	}
	wg.Wait()
	if st := h.Stats(); st.Requests != goroutines*each || st.Failed != 0 {
		t.Errorf("stats %+v", st)
	}
	if m, _ := h.Metric("kitchen_deletes_total"); m.Value != goroutines*each {
		t.Errorf("deletes = %d", m.Value)
	}
}

// A request paused in on_request_headers resumes from proxy_on_http_call_response, through
// the net/http path.
func TestHandlerPauseAndContinue(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "pong")
	}))
	defer backend.Close()
	h, _ := newHost(t, "kitchen", Options{Workers: 2, Clusters: map[string]string{"backend": backend.URL}})
	srv := httptest.NewServer(h.Handler(echoUpstream()))
	defer srv.Close()
	resp, body := get(t, srv.Client(), "GET", srv.URL+"/pause-call", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, "x-callout-body: pong\n") || !strings.Contains(body, "x-callout-status: 200\n") {
		t.Errorf("resumed request: %d\n%s", resp.StatusCode, body)
	}
	resp, body = get(t, srv.Client(), "GET", srv.URL+"/pause-call-local", nil)
	if resp.StatusCode != 429 || body != "callout said 200: pong" {
		t.Errorf("local reply from the callback: %d %q", resp.StatusCode, body)
	}
}

// An upstream that breaks off its response mid-body (httputil.ReverseProxy aborts the
// handler with http.ErrAbortHandler) resets the stream as Envoy does on an upstream reset:
// the guest still gets proxy_on_log and proxy_on_delete for it, and the client's response is
// broken off.
func TestHandlerUpstreamBreaksOff(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part of it")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	srv := httptest.NewServer(h.Handler(up))
	defer srv.Close()
	before := map[string]int64{}
	for _, name := range []string{"kitchen_logs_total", "kitchen_deletes_total"} {
		m, _ := h.Metric(name)
		before[name] = m.Value
	}
	resp, err := srv.Client().Get(srv.URL + "/plain")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("the client's response was not broken off")
	}
	for _, name := range []string{"kitchen_logs_total", "kitchen_deletes_total"} {
		if !pollFor(10*time.Second, func() bool { m, _ := h.Metric(name); return m.Value == before[name]+1 }) {
			m, _ := h.Metric(name)
			t.Fatalf("%s: %d, want %d: the stream was not ended", name, m.Value, before[name]+1)
		}
	}
}

// TestHandlerRequestBodyEndsOnce: an upstream that reads the request body to its end,
// starts its response and then reads the body again (as http.Transport does, checking for
// bytes beyond the Content-Length, while the response already streams down) gets io.EOF
// again, not net/http's "invalid Read on closed Body", which made the upstream transport
// break its connection off mid-response.
func TestHandlerRequestBodyEndsOnce(t *testing.T) {
	for _, guestName := range []string{"minimal", "kitchen"} {
		t.Run(guestName, func(t *testing.T) {
			h, _ := newHost(t, guestName, Options{Workers: 1})
			again := make(chan error, 1)
			up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, err := io.ReadAll(r.Body)
				if err != nil || string(body) != "the request" {
					again <- fmt.Errorf("the body: %q, %v", body, err)
					return
				}
				io.WriteString(w, "the start of the answer")
				w.(http.Flusher).Flush()
				n, err := r.Body.Read(make([]byte, 16))
				if n != 0 || err != io.EOF {
					again <- fmt.Errorf("a read after the end, once the response started: %d, %v; want 0, io.EOF", n, err)
					return
				}
				again <- nil
				io.WriteString(w, ", and its end")
			})
			srv := httptest.NewServer(h.Handler(up))
			defer srv.Close()
			resp, err := srv.Client().Post(srv.URL+"/plain", "text/plain", strings.NewReader("the request"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err := <-again; err != nil {
				t.Fatal(err)
			}
			if err != nil || string(got) != "the start of the answer, and its end" {
				t.Fatalf("the client got %q, %v", got, err)
			}
		})
	}
}
