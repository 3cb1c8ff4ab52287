package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Source supplies the two documents the dashboard reads: the Prometheus text of /metrics
// and the JSON of /status, exactly as the host's admin server serves them.
type Source interface {
	Fetch(ctx context.Context) (metrics, status []byte, err error)
}

// ErrSourceClosed is returned by a Source whose host has shut down; Run stops on it.
var ErrSourceClosed = errors.New("dashboard: the host is closed")

// AdminSource reads /metrics and /status (and /healthz, to notice shutdown) from admin — the
// host's admin handler — in process, through its ServeHTTP, without a network round trip.
// The dashboard therefore sees the same bytes a Prometheus scraper would.
func AdminSource(admin http.Handler) Source { return adminSource{admin} }

type adminSource struct{ h http.Handler }

func (a adminSource) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://admin"+path, nil)
	if err != nil {
		return 0, nil, err
	}
	w := &recorder{header: http.Header{}}
	a.h.ServeHTTP(w, req)
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.code, w.body.Bytes(), nil
}

func (a adminSource) Fetch(ctx context.Context) (metrics, status []byte, err error) {
	if code, body, err := a.get(ctx, "/healthz"); err == nil && code == http.StatusServiceUnavailable && bytes.HasPrefix(body, []byte("closed")) {
		return nil, nil, ErrSourceClosed
	}
	code, metrics, err := a.get(ctx, "/metrics")
	if err != nil {
		return nil, nil, err
	}
	if code != http.StatusOK {
		return nil, nil, fmt.Errorf("/metrics answered %d", code)
	}
	code, status, err = a.get(ctx, "/status")
	if err != nil {
		return nil, nil, err
	}
	if code != http.StatusOK {
		return nil, nil, fmt.Errorf("/status answered %d", code)
	}
	return metrics, status, nil
}

// recorder is the minimal http.ResponseWriter AdminSource needs.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }
func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return r.body.Write(p)
}
