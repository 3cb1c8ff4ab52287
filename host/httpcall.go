package host

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/proxywasm"
)

// callout is one proxy_http_call in flight: the root context it belongs to and how to
// abandon it (its root was deleted: Envoy cancels a deleted context's requests).
type callout struct {
	root   uint32
	cancel context.CancelFunc
}

type httpCallResult struct {
	headers, trailers headerMap
	body              []byte
}

// maxHTTPCallBody bounds the body of an http call response kept for the guest.
const maxHTTPCallBody = 16 << 20

func hcHTTPCall(v *vm, s []uint64) Status {
	cluster, ok1 := v.read(u32(s[0]), u32(s[1]))
	hdrs, ok2 := v.read(u32(s[2]), u32(s[3]))
	body, ok3 := v.read(u32(s[4]), u32(s[5]))
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	kv, ok := proxywasm.ParsePairs(hdrs)
	if !ok {
		return StatusBadArgument
	}
	base, ok := v.h.opts.Clusters[string(cluster)]
	if !ok {
		v.log.Warn("host: proxy_http_call to an unknown cluster", "cluster", string(cluster))
		return StatusBadArgument
	}
	m := headerMap{kv: kv}
	method, ok1 := m.get(":method")
	path, ok2 := m.get(":path")
	authority, ok3 := m.get(":authority")
	if !ok1 || !ok2 || !ok3 || method == "" || path == "" {
		return StatusBadArgument
	}
	timeout := time.Duration(u32(s[8])) * time.Millisecond
	if timeout <= 0 {
		timeout = time.Minute
	}
	root := v.curRoot
	if root == nil {
		return StatusBadArgument
	}
	v.nextCallout++
	id := v.nextCallout
	if !v.writeU32(u32(s[9]), id) {
		return StatusInvalidMemoryAccess
	}
	req, err := http.NewRequest(method, strings.TrimSuffix(base, "/")+path, bytes.NewReader(append([]byte(nil), body...)))
	if err != nil {
		return StatusBadArgument
	}
	req.Host = authority
	for _, p := range kv {
		if !strings.HasPrefix(p[0], ":") {
			req.Header.Add(p[0], p[1])
		}
	}
	// The timeout passes on the host's clock; the reply goes to the root of the calling
	// context.
	ctx, cancel := v.h.withTimeout(context.Background(), timeout)
	v.callouts[id] = callout{root: root.id, cancel: cancel}
	h, w := v.h, v.w
	go func() {
		res := h.doHTTPCall(ctx, req)
		cancel()
		w.postAsync(job{fn: func(w *worker) { w.deliverHTTPCall(v, id, res) }})
	}()
	return StatusOK
}

func (h *Host) doHTTPCall(ctx context.Context, req *http.Request) *httpCallResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-h.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	resp, err := h.client.Do(req.WithContext(ctx))
	if err != nil {
		h.log.Debug("host: http call failed", "url", req.URL.String(), "error", err)
		return &httpCallResult{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxHTTPCallBody))
	if err != nil {
		return &httpCallResult{}
	}
	r := &httpCallResult{body: body}
	r.headers.kv = append(r.headers.kv, [2]string{":status", strconv.Itoa(resp.StatusCode)})
	for k, vs := range resp.Header {
		for _, val := range vs {
			r.headers.add(k, val)
		}
	}
	for k, vs := range resp.Trailer {
		for _, val := range vs {
			r.trailers.add(k, val)
		}
	}
	return r
}

// deliverHTTPCall calls proxy_on_http_call_response on the VM that made the call. As in
// Envoy, the call belongs to a root context — the root of the context that was effective
// when the call was made: the callback gets that root's id (and runs with it as the
// effective context) and the guest makes the calling stream effective with
// proxy_set_effective_context. The reply is delivered even if that stream has ended
// meanwhile (the guest must check); it is dropped if the VM was replaced or the root has
// been deleted (a replaced configuration's root whose streams all ended).
func (w *worker) deliverHTTPCall(v *vm, id uint32, res *httpCallResult) {
	if w.vm != v || v.dead {
		return
	}
	c, ok := v.callouts[id]
	if !ok {
		return
	}
	rootID := c.root
	delete(v.callouts, id)
	if v.onHTTPCallResponse == nil {
		return
	}
	if !v.setCurrent(rootID) {
		v.log.Debug("host: http call reply dropped: its root context has been deleted", "root", rootID, "callout", id)
		return
	}
	v.callResp = res
	_, err := v.call(v.onHTTPCallResponse, uint64(rootID), uint64(id), uint64(len(res.headers.kv)), uint64(len(res.body)), uint64(len(res.trailers.kv)))
	v.callResp = nil
	if err != nil {
		w.trap(v, "proxy_on_http_call_response", err)
	}
}

// callsInFlight counts the VM's host calls whose outcome has not been delivered yet: HTTP
// and gRPC calls, and extension calls (Guest.Start).
func (v *vm) callsInFlight() int {
	return len(v.callouts) + len(v.grpcCalls) + v.extCalls
}

// cancelCalls abandons the HTTP and gRPC calls of a deleted root context, as Envoy's Context
// destructor cancels its outstanding requests (no callback follows).
func (v *vm) cancelCalls(root uint32) {
	for id, c := range v.callouts {
		if c.root == root {
			c.cancel()
			delete(v.callouts, id)
		}
	}
	for token, c := range v.grpcCalls {
		if c.root == root {
			c.cancel()
			delete(v.grpcCalls, token)
		}
	}
}
