package host

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Upstream failures, as Envoy's router answers them (see doc.go, "Upstream failures").
//
// Envoy answers a request whose upstream cannot be reached, or resets before its response
// headers, with a local reply of 503 and the body "upstream connect error or
// disconnect/reset before headers. reset reason: <reason>" (Router::Filter::onUpstreamReset,
// source/common/router/router.cc; StreamResetReasonToString in source/common/http/utility.cc:
// "remote connection failure" for a refused connection, "connection timeout" for a connect
// timeout, "connection termination" for a peer that closes first). Measured with Envoy 1.40.0
// (1.36.4 adds ", transport failure reason: delayed connect error: Connection refused").
// Like every local reply, a gRPC request gets it trailers-only: status 200, grpc-status 14
// (UNAVAILABLE, httpToGRPCStatus(503)) and the body as grpc-message.

// UpstreamErrorHandler returns an error handler for an httputil.ReverseProxy in front of
// upstream (the name the log gives): it answers as Envoy's router does when the upstream
// cannot be reached (503, or a trailers-only UNAVAILABLE to a gRPC request) and logs the
// cause at warning level, at most one line per every (default 10 s) for this upstream, the
// next line saying how many failures went unlogged since. A request whose client went away
// is neither answered nor logged. logger nil: slog.Default().
func UpstreamErrorHandler(logger *slog.Logger, upstream string, every time.Duration) func(http.ResponseWriter, *http.Request, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if every <= 0 {
		every = 10 * time.Second
	}
	u := &upstreamLog{log: logger, upstream: upstream, every: every, now: time.Now}
	return u.handle
}

// upstreamLog rate-limits the failure lines of one upstream.
type upstreamLog struct {
	log      *slog.Logger
	upstream string
	every    time.Duration
	now      func() time.Time // time.Now; tests step it

	mu   sync.Mutex
	next time.Time // when the next line may be written
	held int       // failures not logged since the last line
}

func (u *upstreamLog) handle(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client went away: nobody to answer, nothing the upstream did
	}
	reason := UpstreamResetReason(err)
	u.logFailure(r, reason, err)
	WriteUpstreamFailure(w, r, reason)
}

func (u *upstreamLog) logFailure(r *http.Request, reason string, err error) {
	u.mu.Lock()
	now := u.now()
	if now.Before(u.next) {
		u.held++
		u.mu.Unlock()
		return
	}
	held := u.held
	u.next, u.held = now.Add(u.every), 0
	u.mu.Unlock()
	attrs := []any{"upstream", u.upstream, "reason", reason, "error", err.Error(), "method", r.Method}
	if held > 0 {
		attrs = append(attrs, "held_back", held)
	}
	u.log.Warn("host: upstream request failed; answered 503 upstream connect error", attrs...)
}

// UpstreamResetReason names, as Envoy's StreamResetReasonToString does, why a request to
// the upstream failed before its response headers: "connection timeout" (the dial timed
// out), "remote connection failure" (the dial failed: refused, unreachable, no such host),
// "connection termination" (anything else: the upstream closed or reset the connection).
func UpstreamResetReason(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		if op.Timeout() {
			return "connection timeout"
		}
		return "remote connection failure"
	}
	var dns *net.DNSError
	if errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) {
		return "remote connection failure"
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return "connection timeout"
	}
	return "connection termination"
}

// upstreamFailurePrefix begins Envoy's body for an upstream reset before headers.
const upstreamFailurePrefix = "upstream connect error or disconnect/reset before headers. reset reason: "

// WriteUpstreamFailure writes Envoy's local reply for an upstream that failed before its
// response headers with reason (UpstreamResetReason): 503 text/plain with Envoy's body, or,
// to a gRPC request (content-type application/grpc…), a trailers-only response — status
// 200, grpc-status 14 (UNAVAILABLE), the body as grpc-message, no body. HEAD gets no body.
func WriteUpstreamFailure(w http.ResponseWriter, r *http.Request, reason string) {
	body := upstreamFailurePrefix + reason
	hdr := w.Header()
	if r.URL.Path != "" && isGRPCContentType(r.Header.Get("Content-Type")) {
		lr := grpcLocalReply(&localReply{status: http.StatusServiceUnavailable, body: []byte(body), grpcStatus: -1}, r.Method == http.MethodHead)
		for _, p := range lr.headers {
			hdr.Set(p[0], p[1])
		}
		if r.ProtoMajor == 2 {
			hdr["Content-Length"] = nil // one HEADERS frame with end of stream (see writeLocalHeaders)
		} else {
			hdr.Set("Content-Length", "0")
		}
		w.WriteHeader(lr.status)
		return
	}
	hdr.Set("Content-Type", "text/plain")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusServiceUnavailable)
	if r.Method != http.MethodHead {
		w.Write([]byte(body))
	}
}
