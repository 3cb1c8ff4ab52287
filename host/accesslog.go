package host

import (
	"context"
	"net/http"
	"time"
)

// AccessLogEntry is one request as Options.AccessLog receives it, once the request is
// over: what Envoy's access log would have of it, and the filter state the filter set
// (filterstate.go).
type AccessLogEntry struct {
	// Start is when the host got the request, Duration how long it took until the
	// response was written (or the client gone), on the host's Clock.
	Start    time.Time
	Duration time.Duration
	Plugin   int
	// Method, Path (with the query), Authority and Protocol as the client sent them;
	// RemoteAddr is the peer ("ip:port"; Exchange: Request.RemoteAddr).
	Method, Path, Authority, Protocol, RemoteAddr string
	// Status is the response status the client got (0: none, the client went away or the
	// upstream broke off before the headers); BodyBytes the response body bytes written.
	Status    int
	BodyBytes int64
	// Details are the details of the local reply that answered ("" when the upstream
	// did): the filter's (proxy_send_local_response), or "wasm_fail_stream" for a filter
	// that failed — Envoy's %RESPONSE_CODE_DETAILS%.
	Details string
	// FilterState is what the filter set with proxy_set_property, in the order first set
	// (nil: nothing).
	FilterState []FilterState
}

// accessRecorder sees the status and the body bytes the client gets. It unwraps to the
// writer it wraps, so http.ResponseController (full duplex, flushes) reaches the real one.
type accessRecorder struct {
	rw     http.ResponseWriter
	status int
	bytes  int64
}

func (a *accessRecorder) Header() http.Header { return a.rw.Header() }

func (a *accessRecorder) WriteHeader(code int) {
	if a.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		a.status = code
	}
	a.rw.WriteHeader(code)
}

func (a *accessRecorder) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	n, err := a.rw.Write(p)
	a.bytes += int64(n)
	return n, err
}

func (a *accessRecorder) Flush() {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	http.NewResponseController(a.rw).Flush()
}

func (a *accessRecorder) Unwrap() http.ResponseWriter { return a.rw }

// accessLogged wraps rw for Options.AccessLog (set) and returns the function that writes
// the entry of stream s for r once the handler is done.
func (h *Host) accessLogged(rw http.ResponseWriter, r *http.Request, s *stream, plugin int) (http.ResponseWriter, func()) {
	start := h.clock.Now()
	rec := &accessRecorder{rw: rw}
	return rec, func() {
		e := AccessLogEntry{
			Start: start, Duration: h.clock.Now().Sub(start), Plugin: plugin,
			Method: r.Method, Path: r.URL.RequestURI(), Authority: r.Host, Protocol: s.protocol, RemoteAddr: r.RemoteAddr,
			Status: rec.status, BodyBytes: rec.bytes,
		}
		e.FilterState, e.Details = s.rec.snapshot()
		h.opts.AccessLog(e)
	}
}

// exchangeLogged is Exchange's part for Options.AccessLog and Response.FilterState.
func (h *Host) exchangeLogged(ctx context.Context, s *stream, req *Request, upstream Upstream) (*Response, error) {
	start := h.clock.Now()
	resp, err := h.exchangeOn(ctx, s, req, upstream)
	state, details := s.rec.snapshot()
	if resp != nil {
		resp.FilterState = state
	}
	if h.opts.AccessLog == nil {
		return resp, err
	}
	e := AccessLogEntry{
		Start: start, Duration: h.clock.Now().Sub(start), Plugin: req.Plugin,
		Method: req.Method, Path: req.Path, Authority: req.Authority, Protocol: s.protocol, RemoteAddr: req.RemoteAddr,
		FilterState: state,
	}
	if e.Method == "" {
		e.Method = "GET"
	}
	if e.Path == "" {
		e.Path = "/"
	}
	if resp != nil {
		e.Status, e.BodyBytes = resp.Status, int64(len(resp.Body))
		if resp.Local {
			e.Details = resp.Details
		}
	} else {
		e.Details = details
	}
	h.opts.AccessLog(e)
	return resp, err
}
