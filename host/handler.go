package host

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Handler returns an http.Handler that runs every request through the filter and forwards
// the ones it lets through to upstream. The request the upstream sees carries the headers,
// method, path and authority as the filter left them; the response headers pass
// proxy_on_response_headers before they are written; bodies stream (a body callback that
// returns Pause buffers until Continue or the end of the body). source.address is
// r.RemoteAddr, destination.address the local address of the connection. Requests go
// through plugin 0; PluginHandler chooses another.
func (h *Host) Handler(upstream http.Handler) http.Handler {
	return h.PluginHandler(0, upstream)
}

// PluginHandler is Handler for the requests of one plugin (see Options.MorePlugins): a
// second listener of the same module. A plugin the Host does not have answers every request
// with 500 and a message that says so.
func (h *Host) PluginHandler(plugin int, upstream http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		h.serveHTTP(rw, r, plugin, upstream)
	})
}

func (h *Host) serveHTTP(rw http.ResponseWriter, r *http.Request, plugin int, upstream http.Handler) {
	if !h.enter() {
		http.Error(rw, "host closed", http.StatusServiceUnavailable)
		return
	}
	defer h.leave()
	if err := h.checkPlugin(plugin); err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	ctx := r.Context()
	s := h.newStream(plugin)
	s.connection(r)
	s.routeName, s.clusterName = h.route(r.URL.RequestURI())
	kv := requestPairs(r)
	s.reqHeaders.kv = kv
	s.grpc, s.head = isGRPCRequest(&s.reqHeaders), r.Method == http.MethodHead
	hasBody := r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
	s.reqHeadersEOS = !hasBody
	var held *heldBody // the body after proxy_on_request_headers held the headers (held.go)
	if hasBody && h.opts.AllowOnHeadersStopIteration {
		// Before the body is read: a reply sent before its end must not wait for it.
		http.NewResponseController(rw).EnableFullDuplex()
		var err error
		if held, err = s.runHeld(ctx, rw, r); err != nil {
			return // client gone or host closed
		}
		defer held.stop()
	} else if err := s.run(ctx, stepReqHeaders); err != nil {
		return // client gone or host closed
	}
	iw := &interceptor{rw: rw, s: s, h: h, ctx: r}
	if s.failed {
		s.w.failed.Add(1)
		if !s.passes() {
			held.answerEarly()
			iw.headersDone, iw.discard = true, true
			iw.writeLocalHeaders(s.failReply())
			return
		}
	}
	if s.local != nil {
		held.answerEarly()
		lr := s.local
		s.local = nil
		iw.writeLocal(lr)
		return
	}
	var prefix []byte // the body the filter had while it held the headers: it goes first
	if hasBody {
		if held != nil {
			// Full duplex since before the headers ran.
			prefix, s.reqBody = s.reqBody, nil
			r.Body = held.upstream(prefix, s.reqBodyEOS)
		} else {
			// The request body streams upstream while the response streams down, as in
			// Envoy: without full duplex net/http closes the request body once the
			// response starts, and the upstream transport's last read (its check for the
			// end of the body) then fails and breaks the upstream connection off
			// mid-response.
			http.NewResponseController(rw).EnableFullDuplex()
			r.Body = &onceEOF{src: r.Body}
		}
	}
	out := r
	if !s.failed {
		out = s.upstreamRequest(h, r, len(kv), hasBody, held, prefix)
	}
	if held != nil {
		held.fixLength(out, prefix, s.reqBodyEOS)
	}
	serveUpstream(upstream, iw, out)
	iw.end()
	if hasBody && held == nil && r.ProtoMajor == 1 {
		drainDuplex(r.Body)
	}
}

// connection records what the stream knows of r's connection: addresses and protocol.
func (s *stream) connection(r *http.Request) {
	s.remoteAddr = r.RemoteAddr
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		s.localAddr = la.String()
	}
	s.protocol = r.Proto
	if r.ProtoMajor == 2 {
		s.protocol = "HTTP/2" // Envoy's name (Utility::getProtocolString), not Go's "HTTP/2.0"
	}
}

// requestPairs is r's header map as Envoy gives it to a filter: the same pseudo-headers
// for HTTP/1.1 and HTTP/2 (for HTTP/2 net/http fills r.Host from :authority and the URL
// from :path), lower-case names, repeated headers joined where Envoy joins them.
func requestPairs(r *http.Request) [][2]string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	kv := make([][2]string, 0, len(r.Header)+4)
	kv = append(kv, [2]string{":authority", r.Host}, [2]string{":path", r.URL.RequestURI()},
		[2]string{":method", r.Method}, [2]string{":scheme", scheme})
	for k, vs := range r.Header {
		lk := lower(k)
		if len(vs) > 1 {
			if d, ok := joinDelim(lk, false, r.ProtoMajor == 2); ok {
				kv = append(kv, [2]string{lk, strings.Join(vs, d)})
				continue
			}
		}
		for _, v := range vs {
			if lk == "te" {
				var keep bool
				if v, keep = sanitizeTE(v); !keep {
					continue
				}
			}
			kv = append(kv, [2]string{lk, v})
		}
	}
	return kv
}

// upstreamRequest is the request the upstream gets: r itself when the filter neither
// edited its headers (it had pairs of them) nor reads its body, else a clone with the
// filter's headers and a body that passes through the filter.
func (s *stream) upstreamRequest(h *Host, r *http.Request, pairs int, hasBody bool, held *heldBody, prefix []byte) *http.Request {
	filterBody := hasBody && s.vm != nil && s.vm.onRequestBody != nil
	changed := s.reqHeaders.edited || len(s.reqHeaders.kv) != pairs
	if !changed && !filterBody {
		return r
	}
	out := r.Clone(r.Context())
	if changed {
		applyRequest(out, &s.reqHeaders)
	}
	if filterBody {
		if held != nil {
			out.Body = held.filtered(s, h, r, prefix, s.reqBodyEOS)
		} else {
			out.Body = &bodyFilter{src: r.Body, s: s, h: h, r: r}
		}
	}
	return out
}

// maxDrain bounds what drainDuplex reads of a request body nobody read (net/http's own
// bound on what it discards before reusing a connection).
const maxDrain = 256 << 10

// drainDuplex reads what is left of an HTTP/1 request body in full duplex before the
// handler returns. An upstream that answered without reading it (httputil.ReverseProxy on
// a refused connection) otherwise leaves net/http reading the connection's next request
// while a read of this one is in flight: "http: panic serving …: invalid concurrent
// Body.Read call", and the connection reset (TestUpstreamFailureAnswersAsEnvoy). A body the
// upstream read is at its end already; past maxDrain net/http closes the connection.
func drainDuplex(body io.Reader) {
	io.Copy(io.Discard, io.LimitReader(body, maxDrain))
}

// serveUpstream runs the upstream handler. One that breaks off its response panics
// (httputil.ReverseProxy, when the upstream connection fails mid-body, aborts with
// http.ErrAbortHandler): the stream is reset as Envoy resets it on an upstream reset — the
// filter gets the body bytes that came before the break, no end of the body, then
// proxy_on_log, proxy_on_done and proxy_on_delete — and the panic goes on, so that net/http
// breaks the client's response off too.
func serveUpstream(upstream http.Handler, iw *interceptor, out *http.Request) {
	defer func() {
		if p := recover(); p != nil {
			if iw.err == nil {
				// What the upstream sent before it broke off reaches the filter first,
				// as Envoy's codec hands it on before the reset.
				iw.process(false, false)
			}
			if iw.err == nil {
				iw.err = errUpstreamReset
				iw.s.w.postAsync(job{s: iw.s, abort: true})
			}
			panic(p)
		}
	}()
	upstream.ServeHTTP(iw, out)
}

// errUpstreamReset marks a stream whose upstream broke off the response.
var errUpstreamReset = errors.New("host: the upstream broke off the response")

// maxCanonicalKeys bounds Host.canonicalKey's cache.
const maxCanonicalKeys = 256

// canonicalKey is http.CanonicalHeaderKey for the lower-case names of response headers
// (the upstream's, the filter's additions, a local reply's), cached (bounded, copy-on-write:
// lookups take no lock): responses carry the same few names again and again, and each would
// otherwise be a new string. Request header names, which clients choose, are not cached.
func (h *Host) canonicalKey(name string) string {
	if m := h.canon.Load(); m != nil {
		if k, ok := (*m)[name]; ok {
			return k
		}
	}
	k := http.CanonicalHeaderKey(name)
	h.canonMu.Lock()
	defer h.canonMu.Unlock()
	old := h.canon.Load()
	if old == nil || len(*old) < maxCanonicalKeys {
		nm := make(map[string]string, 1)
		if old != nil {
			nm = make(map[string]string, len(*old)+1)
			for a, b := range *old {
				nm[a] = b
			}
		}
		nm[name] = k
		h.canon.Store(&nm)
	}
	return k
}

// addedHeadersRoom is spare capacity in header maps for the entries a filter adds (a rate
// limiter adds up to five), so that adding them does not grow the slice.
const addedHeadersRoom = 6

// onlyAdded reports whether m holds its first base entries unchanged followed by regular
// (not pseudo) headers the filter added.
func onlyAdded(m *headerMap, base int) bool {
	if m.edited || len(m.kv) < base {
		return false
	}
	for _, p := range m.kv[base:] {
		if strings.HasPrefix(p[0], ":") {
			return false
		}
	}
	return true
}

// applyRequest rewrites out from the filtered request header map.
func applyRequest(out *http.Request, m *headerMap) {
	hdr := make(http.Header, len(m.kv))
	for _, p := range m.kv {
		switch p[0] {
		case ":method":
			out.Method = p[1]
		case ":authority":
			out.Host = p[1]
		case ":path":
			if u, err := url.ParseRequestURI(p[1]); err == nil {
				out.URL.Path, out.URL.RawPath, out.URL.RawQuery = u.Path, u.RawPath, u.RawQuery
				out.RequestURI = p[1]
			}
		case ":scheme":
		default:
			if !strings.HasPrefix(p[0], ":") {
				hdr[http.CanonicalHeaderKey(p[0])] = append(hdr[http.CanonicalHeaderKey(p[0])], p[1])
			}
		}
	}
	out.Header = hdr
}

// bodyFilter passes the request body through proxy_on_request_body, chunk by chunk.
type bodyFilter struct {
	src   io.ReadCloser
	s     *stream
	h     *Host
	r     *http.Request
	out   []byte // filtered bytes not yet returned
	eof   bool
	total int64
	buf   []byte
	err   error
}

func (b *bodyFilter) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	for len(b.out) == 0 {
		if b.eof {
			return 0, io.EOF
		}
		if b.buf == nil {
			b.buf = make([]byte, 32<<10)
		}
		n, err := b.src.Read(b.buf)
		if err != nil && err != io.EOF {
			return 0, err
		}
		b.total += int64(n)
		// With a known length the last bytes carry end_of_stream: no extra empty call.
		eos := err == io.EOF || (b.r.ContentLength > 0 && b.total >= b.r.ContentLength)
		s := b.s
		s.reqBody = append(s.reqBody, b.buf[:n]...)
		if n == 0 && !eos {
			continue
		}
		s.reqBodyEOS = eos
		if s.failed {
			b.out, s.reqBody = s.reqBody, nil
		} else {
			if err := s.run(b.r.Context(), stepReqBody); err != nil {
				b.err = err
				return 0, err
			}
			if s.failed && !s.passes() {
				b.err = errFilterFailed
				return 0, errFilterFailed
			}
			if s.bodyAction == actionContinue || eos || s.failed {
				b.out, s.reqBody = s.reqBody, nil
			}
		}
		b.eof = eos
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

func (b *bodyFilter) Close() error { return b.src.Close() }

// onceEOF reads src until its end and then answers io.EOF without reading src again:
// the server may close a request body it has seen the end of (HTTP/2, or HTTP/1 where full
// duplex is not available), and a read after that close is an error, not the end.
type onceEOF struct {
	src io.ReadCloser
	eof bool
}

func (b *onceEOF) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	n, err := b.src.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *onceEOF) Close() error { return b.src.Close() }

type filterError struct{}

func (filterError) Error() string { return "host: the filter failed while reading the request body" }

var errFilterFailed error = filterError{}

// interceptor runs the response phase around the upstream's ResponseWriter. To spare
// hand-offs to the worker it holds back the status until the first body bytes, the first
// Flush or the end, and holds back one body chunk until the next Write, Flush or the end:
// a response written in one piece then costs one job (headers, body with end_of_stream,
// log/done/delete) instead of four.
type interceptor struct {
	rw   http.ResponseWriter
	s    *stream
	h    *Host
	ctx  *http.Request
	code int    // status from the upstream; 0 until it writes or returns
	held []byte // body bytes not yet given to the filter

	respBase int // entries of the response header map before the filter ran

	headersDone bool // the response phase for headers ran and the status is written
	discard     bool // the upstream's body is dropped (local response or failure)
	direct      bool // body bypasses the filter
	bodyFilter  bool // the guest exports proxy_on_response_body
	err         error
}

func (iw *interceptor) Header() http.Header { return iw.rw.Header() }

func (iw *interceptor) WriteHeader(code int) {
	if iw.code != 0 || iw.headersDone {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		iw.rw.WriteHeader(code)
		return
	}
	iw.code = code
}

func (iw *interceptor) Write(p []byte) (int, error) {
	if iw.code == 0 {
		iw.code = http.StatusOK
	}
	if iw.err != nil {
		return 0, iw.err
	}
	if !iw.headersDone && iw.held == nil && len(p) > 0 {
		iw.held = append(make([]byte, 0, len(p)), p...)
		return len(p), nil
	}
	if !iw.headersDone || len(iw.held) > 0 {
		iw.process(false, false)
		if iw.err != nil {
			return 0, iw.err
		}
	}
	switch {
	case iw.discard:
		return len(p), nil
	case iw.direct:
		return iw.rw.Write(p)
	}
	iw.held = append(iw.held, p...)
	return len(p), nil
}

func (iw *interceptor) Flush() {
	if iw.code == 0 {
		iw.code = http.StatusOK
	}
	if !iw.headersDone || len(iw.held) > 0 {
		iw.process(false, false)
	}
	if iw.discard || iw.err != nil || (!iw.direct && len(iw.s.respBody) > 0) {
		return // nothing to flush, or the filter is buffering
	}
	if f, ok := iw.rw.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (iw *interceptor) Unwrap() http.ResponseWriter { return iw.rw }

// end finishes the stream after the upstream returned: what is held, end of body, then
// log/done/delete.
func (iw *interceptor) end() {
	if iw.code == 0 {
		iw.code = http.StatusOK
	}
	iw.process(true, true)
}

// process runs, in one job on the worker, whatever is pending: the response headers (if
// not done yet), the held body bytes (eos marks the end of the body), and, with finish,
// proxy_on_log/done/delete. Then it writes what the filter released.
func (iw *interceptor) process(eos, finish bool) {
	if iw.err != nil {
		return // the stream was given up (client gone): the worker owns it now
	}
	s := iw.s
	steps, bodyStep := iw.pendingSteps(eos, finish)
	failedBefore := s.failed
	if steps != 0 {
		if err := s.run(iw.ctx.Context(), steps); err != nil {
			iw.discard = true
			iw.err = err
			return
		}
	}
	if s.failed && !failedBefore {
		s.w.failed.Add(1)
	}
	if !iw.headersDone && iw.writeHeaders(failedBefore) {
		return
	}
	iw.writeBody(bodyStep, failedBefore)
}

// pendingSteps hands the stream what the filter has not seen yet — the response headers
// (once), the held body bytes (eos marks the end of the body) — and returns the steps to
// run: those, and with finish proxy_on_log/done/delete. bodyStep tells whether the body
// step is among them.
func (iw *interceptor) pendingSteps(eos, finish bool) (steps uint8, bodyStep bool) {
	s := iw.s
	if !iw.headersDone && !s.failed {
		iw.takeHeaders(eos)
		steps |= stepRespHeaders
	}
	if !s.failed && !iw.discard && iw.bodyFilter && (len(iw.held) > 0 || (eos && !(steps != 0 && s.respHeadersEOS))) {
		s.respBody = append(s.respBody, iw.held...)
		iw.held = iw.held[:0]
		s.respBodyEOS = eos
		steps |= stepRespBody
		bodyStep = true
	}
	if finish && !s.failed {
		steps |= stepFinish
	}
	return steps, bodyStep
}

// takeHeaders gives the stream the upstream's status and headers (names in lower case) as
// the response header map.
func (iw *interceptor) takeHeaders(eos bool) {
	s := iw.s
	hdr := iw.rw.Header()
	kv := make([][2]string, 0, len(hdr)+1+addedHeadersRoom)
	kv = append(kv, [2]string{":status", strconv.Itoa(iw.code)})
	for k, vs := range hdr {
		lk := lower(k)
		if len(vs) > 1 {
			if d, ok := joinDelim(lk, true, false); ok {
				kv = append(kv, [2]string{lk, strings.Join(vs, d)})
				continue
			}
		}
		for _, v := range vs {
			kv = append(kv, [2]string{lk, v})
		}
	}
	s.respHeaders.kv = kv
	iw.respBase = len(kv)
	s.respHeadersEOS = eos && len(iw.held) == 0
	iw.bodyFilter = s.vm != nil && s.vm.onRespBody != nil
}

// writeHeaders writes the status and headers the response phase left (or the failure reply when the
// filter failed closed, or the filter's local response) and decides whether the body
// still passes through the filter. done is true when the response is complete.
func (iw *interceptor) writeHeaders(failedBefore bool) (done bool) {
	s := iw.s
	iw.headersDone = true
	hdr := iw.rw.Header()
	switch {
	case s.failed && !s.passes() && !failedBefore:
		iw.discard = true
		clear(hdr)
		iw.writeLocalHeaders(s.failReply())
		return true
	case s.failed:
		// Fail-open (or a trap in the request phase with FailOpen): pass through unfiltered.
		iw.direct = true
		iw.rw.WriteHeader(iw.code)
	case s.local != nil:
		iw.discard = true
		clear(hdr)
		iw.writeLocalHeaders(s.local)
		iw.rw.Write(s.local.body)
		return true
	case onlyAdded(&s.respHeaders, iw.respBase):
		// The filter only added regular headers (or none): write back the additions.
		for _, p := range s.respHeaders.kv[iw.respBase:] {
			k := iw.h.canonicalKey(p[0])
			hdr[k] = append(hdr[k], p[1])
		}
		iw.direct = !iw.bodyFilter
		iw.rw.WriteHeader(iw.code)
	default:
		// The filter changed or removed headers: the map becomes the response's headers.
		clear(hdr)
		status := iw.code
		for _, p := range s.respHeaders.kv {
			if p[0] == ":status" {
				if n, err := strconv.Atoi(p[1]); err == nil {
					status = n
				}
				continue
			}
			if strings.HasPrefix(p[0], ":") {
				continue
			}
			k := iw.h.canonicalKey(p[0])
			hdr[k] = append(hdr[k], p[1])
		}
		iw.direct = !iw.bodyFilter
		iw.rw.WriteHeader(status)
	}
	return false
}

// writeBody writes what the body step released (all of it once the filter continues or
// the body ended), or what is held when the body bypasses the filter; after a failure
// with the headers already out it cuts the body short.
func (iw *interceptor) writeBody(bodyStep, failedBefore bool) {
	s := iw.s
	switch {
	case iw.discard:
		iw.held = iw.held[:0]
	case s.failed && !failedBefore && !s.passes():
		// Headers are out already: all we can do is cut the body short.
		iw.discard = true
		iw.err = errFilterFailed
	case bodyStep && !s.failed:
		if s.bodyAction == actionContinue || s.respBodyEOS {
			out := s.respBody
			s.respBody = nil
			if len(out) > 0 {
				if _, err := iw.rw.Write(out); err != nil {
					iw.err = err
				}
			}
		}
	case bodyStep: // failed open during the body step: release what the filter had
		iw.direct = true
		out := s.respBody
		s.respBody = nil
		iw.rw.Write(out)
	}
	if iw.direct && len(iw.held) > 0 {
		if _, err := iw.rw.Write(iw.held); err != nil {
			iw.err = err
		}
		iw.held = iw.held[:0]
	}
}

// writeLocal answers with a local response sent in the request phase; the response phase of
// the filter still runs on it, as in Envoy.
func (iw *interceptor) writeLocal(lr *localReply) {
	s := iw.s
	iw.headersDone = true
	iw.discard = true
	if !s.failed {
		kv := make([][2]string, 0, len(lr.headers)+1)
		kv = append(kv, [2]string{":status", strconv.Itoa(lr.status)})
		kv = append(kv, lr.headers...)
		s.respHeaders.kv = kv
		s.respHeadersEOS = len(lr.body) == 0
		if err := s.run(iw.ctx.Context(), stepRespHeaders|stepFinish); err != nil {
			return
		}
		if !s.failed {
			st := lr.status
			hs := make([][2]string, 0, len(s.respHeaders.kv))
			for _, p := range s.respHeaders.kv {
				if p[0] == ":status" {
					if n, err := strconv.Atoi(p[1]); err == nil {
						st = n
					}
					continue
				}
				hs = append(hs, p)
			}
			out := *lr
			out.status, out.headers = st, hs
			lr = &out
		}
	}
	iw.writeLocalHeaders(lr)
	iw.rw.Write(lr.body)
}

func (iw *interceptor) writeLocalHeaders(lr *localReply) {
	hdr := iw.rw.Header()
	for _, p := range lr.headers {
		if strings.HasPrefix(p[0], ":") {
			continue
		}
		k := iw.h.canonicalKey(p[0])
		hdr[k] = append(hdr[k], p[1])
	}
	switch {
	case !lr.trailersOnly:
		hdr.Set("Content-Length", strconv.Itoa(len(lr.body)))
	case iw.ctx.ProtoMajor == 2:
		// Envoy removes content-length from a gRPC reply; a nil entry keeps net/http from
		// adding "content-length: 0" to the one HEADERS frame. (On HTTP/1.1 the codec
		// frames the empty body with it, as Envoy's does.)
		hdr["Content-Length"] = nil
	}
	iw.rw.WriteHeader(lr.status)
}
