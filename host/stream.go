package host

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
)

// Steps of a stream, run in this order by worker.advance.
const (
	stepReqHeaders uint8 = 1 << iota
	stepReqBody
	stepUpstream // Exchange only: call the Upstream func on the worker
	stepRespHeaders
	stepRespBody
	stepFinish

	requestSteps = stepReqHeaders | stepReqBody
)

// localReply is what proxy_send_local_response asked for, or, for a gRPC
// request, the trailers-only response Envoy makes of it (grpc.go).
type localReply struct {
	status  int
	details string
	body    []byte
	headers [][2]string

	grpcStatus   int32 // the grpc_status the guest gave (-1: none)
	trailersOnly bool  // a gRPC reply: headers with end of stream, no body
}

// stream is one HTTP request/response through the filter. The worker owns its fields while
// the caller waits (waiting is true: a job is running, or the stream is paused); between
// phases the caller's goroutine owns them, and the worker refuses to make the stream the
// effective context (proxy_set_effective_context answers BAD_ARGUMENT).
type stream struct {
	h    *Host
	w    *worker
	done chan struct{}

	// worker side
	vm      *vm
	id      uint32
	plugin  int32       // the plugin (index) the request goes through
	root    *rootCtx    // parent: the plugin's active root when the context was created
	waiting atomic.Bool // the caller waits: the worker owns the stream
	steps   uint8
	paused  bool
	// held: proxy_on_request_headers paused a request with a body under
	// Options.AllowOnHeadersStopIteration, and the body still flows to proxy_on_request_body
	// (paused is true too) until the guest continues (held.go).
	held    bool
	pauseOn int // streamHTTPRequest or streamHTTPResponse
	local   *localReply
	grpc    bool // a gRPC request, decided from the request headers as they came (grpc.go)
	head    bool // a HEAD request
	failed  bool
	bypass  bool // failed because the worker had no VM, and the policy skips the filter (FailOpen)
	created bool
	ended   bool // log/done/delete ran, or the context died with its VM
	aborted bool

	remoteAddr, localAddr, protocol string
	routeName, clusterName          string   // "": no route / no cluster (routes.go)
	metadata                        Metadata // dynamic metadata (metadata.go)

	reqHeaders, reqTrailers   headerMap
	respHeaders, respTrailers headerMap
	reqBody, respBody         []byte
	reqHeadersEOS             bool
	reqBodyEOS, respBodyEOS   bool
	respHeadersEOS            bool
	respPhase                 bool
	bodyAction                uint64

	rec streamRecord // filter state and local reply details, for after the request (filterstate.go)

	// Exchange only
	req            *Request
	upstream       Upstream
	upstreamResp   *Response // what the upstream (or the local reply) answered
	upstreamCalled bool
}

func (h *Host) newStream(plugin int) *stream {
	w := h.pick()
	return &stream{h: h, w: w, plugin: int32(plugin), done: make(chan struct{}, 1)}
}

// checkPlugin returns an error for a plugin index the Host does not have.
func (h *Host) checkPlugin(p int) error {
	if p < 0 || p >= h.plugins {
		return fmt.Errorf("host: plugin %d does not exist: the Host has %d plugin(s) (0: Options.PluginConfig, 1..%d: Options.MorePlugins)", p, h.plugins, h.plugins-1)
	}
	return nil
}

// run asks the worker to execute steps and waits until they are done, failed, or paused
// and then resumed to completion.
func (s *stream) run(ctx context.Context, steps uint8) error {
	s.steps = steps
	s.waiting.Store(true)
	if err := s.w.post(ctx, job{s: s}); err != nil {
		s.waiting.Store(false)
		return err
	}
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		s.w.postAsync(job{s: s, abort: true})
		return ctx.Err()
	case <-s.h.closed:
		return ErrClosed
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// Request is one HTTP request for Exchange. Header names are matched case-insensitively and
// passed to the guest lower-cased.
type Request struct {
	Method    string // default "GET"
	Path      string // with the query, default "/"
	Authority string // the Host header
	Scheme    string // default "http"
	Headers   [][2]string
	Body      []byte
	// RemoteAddr is the peer, "ip:port" (the source.address property); LocalAddr the
	// listener (destination.address). Empty: the property is NOT_FOUND.
	RemoteAddr, LocalAddr string
	// Plugin is the plugin the request goes through: 0 (default) is Options.PluginConfig's,
	// i > 0 is Options.MorePlugins[i-1]'s. Out of range: Exchange returns an error.
	Plugin int
	// RouteName and ClusterName are the route the request takes and its upstream cluster
	// (the xds.route_name / xds.cluster_name properties, and route_name / cluster_name in
	// profiles with LegacyWasmAttributes). Empty RouteName: the route is chosen from
	// Options.Routes by the path (ClusterName then comes from there too, unless given);
	// no route and no cluster: the properties are NOT_FOUND.
	RouteName, ClusterName string
	// Metadata is the stream's dynamic metadata (metadata.go); nil: none.
	Metadata Metadata
}

// Response is the result of Exchange.
type Response struct {
	Status  int
	Headers [][2]string // lower-case names, in order
	Body    []byte
	// Local is true when the response is not the upstream's: the filter sent a local
	// response, or the host answered 503 wasm_fail_stream because the VM failed (then Failed is true too).
	Local   bool
	Details string // status details given to proxy_send_local_response
	// GRPCStatus is, for a local response, the grpc_status given to
	// proxy_send_local_response (-1: none). A local response to a gRPC request is
	// the trailers-only gRPC response Envoy makes of it: Status 200, grpc-status and
	// grpc-message among the Headers, no Body (grpc.go).
	GRPCStatus int32
	// Failed is true when the guest trapped while handling this request. With FailOpen the
	// request still went to the upstream and Local is false.
	Failed bool
	// FilterState is what the filter set with proxy_set_property while it handled the
	// request, in the order first set (nil: nothing; filterstate.go).
	FilterState []FilterState
}

// Header returns the first value of the named header, or "".
func (r *Response) Header(name string) string {
	m := headerMap{kv: r.Headers}
	v, _ := m.get(name)
	return v
}

// Upstream serves a request that the filter let through. Exchange runs it on the worker's
// goroutine, between the request and the response phase, so it must be quick and must not
// block, call back into the Host, or call t.Fatal (a panic becomes a 502). Use Handler for a
// real upstream.
type Upstream func(*Request) *Response

// Exchange sends req through the filter on one worker: request headers (and body), then
// upstream with the request as the filter left it, then the response phase, then log, done
// and delete, all before it returns; one hand-off to the worker when the filter does not
// pause. A nil upstream answers 200 with no body. The error is non-nil only when
// req.Plugin does not exist, ctx ends or the Host is closed; a trapping guest gives a 503
// Response with Failed set (or, with FailOpen, the upstream's response with Failed set).
func (h *Host) Exchange(ctx context.Context, req *Request, upstream Upstream) (*Response, error) {
	if !h.enter() {
		return nil, ErrClosed
	}
	defer h.leave()
	if err := h.checkPlugin(req.Plugin); err != nil {
		return nil, err
	}
	return h.exchangeLogged(ctx, h.newStream(req.Plugin), req, upstream)
}

func (h *Host) exchangeOn(ctx context.Context, s *stream, req *Request, upstream Upstream) (*Response, error) {
	s.remoteAddr, s.localAddr, s.protocol = req.RemoteAddr, req.LocalAddr, "HTTP/1.1"
	s.metadata = req.Metadata
	method, path, scheme := req.Method, req.Path, req.Scheme
	s.routeName, s.clusterName = req.RouteName, req.ClusterName
	if s.routeName == "" {
		rn, cn := h.route(path)
		s.routeName = rn
		if s.clusterName == "" {
			s.clusterName = cn
		}
	}
	if method == "" {
		method = "GET"
	}
	if path == "" {
		path = "/"
	}
	if scheme == "" {
		scheme = "http"
	}
	kv := make([][2]string, 0, len(req.Headers)+4)
	kv = append(kv, [2]string{":authority", req.Authority}, [2]string{":path", path},
		[2]string{":method", method}, [2]string{":scheme", scheme})
	for _, p := range req.Headers {
		k, v := lower(p[0]), p[1]
		if k == "te" {
			var keep bool
			if v, keep = sanitizeTE(v); !keep {
				continue
			}
		}
		kv = append(kv, [2]string{k, v})
	}
	s.reqHeaders.kv = joinInline(kv, false, false)
	s.grpc, s.head = isGRPCRequest(&s.reqHeaders), method == "HEAD"
	s.req, s.upstream = req, upstream
	hasBody := len(req.Body) > 0
	s.reqHeadersEOS = !hasBody
	steps := stepReqHeaders | stepUpstream | stepRespHeaders | stepRespBody | stepFinish
	if hasBody {
		s.reqBody = append([]byte(nil), req.Body...)
		s.reqBodyEOS = true
		steps |= stepReqBody
	}
	if err := s.run(ctx, steps); err != nil {
		return nil, err
	}
	if s.failed {
		s.w.failed.Add(1)
		if !s.passes() {
			lr := s.failReply()
			return &Response{Status: lr.status, Headers: lr.headers, Body: lr.body, Local: true, Failed: true, Details: lr.details, GRPCStatus: lr.grpcStatus}, nil
		}
		// Fail-open: the VM is gone; the upstream's answer goes back unfiltered.
		if !s.upstreamCalled {
			s.upstreamResp = callUpstream(upstream, s.forwarded())
		}
		resp := s.upstreamResp
		resp.Failed = true
		return resp, nil
	}
	if s.local != nil { // sent in the response phase: replaces the upstream's response
		return &Response{Status: s.local.status, Headers: s.local.headers, Body: s.local.body, Local: true, Details: s.local.details, GRPCStatus: s.local.grpcStatus}, nil
	}
	up := s.upstreamResp
	out := &Response{Local: up.Local, Details: up.Details, Status: up.Status, GRPCStatus: up.GRPCStatus}
	if st, ok := s.respHeaders.get(":status"); ok {
		if n, err := strconv.Atoi(st); err == nil {
			out.Status = n
		}
	}
	out.Headers = s.respHeaders.regular()
	out.Body = s.respBody
	return out, nil
}

// forwarded is the request as the filter left it.
func (s *stream) forwarded() *Request {
	req := s.req
	return &Request{
		Method:      s.reqHeaders.getOr(":method", req.Method),
		Path:        s.reqHeaders.getOr(":path", req.Path),
		Authority:   s.reqHeaders.getOr(":authority", req.Authority),
		Scheme:      s.reqHeaders.getOr(":scheme", req.Scheme),
		Headers:     s.reqHeaders.regular(),
		Body:        s.reqBody,
		RemoteAddr:  req.RemoteAddr,
		LocalAddr:   req.LocalAddr,
		Plugin:      req.Plugin,
		RouteName:   req.RouteName,
		ClusterName: req.ClusterName,
	}
}

func callUpstream(up Upstream, req *Request) (resp *Response) {
	defer func() {
		if r := recover(); r != nil {
			resp = &Response{Status: 502, Body: []byte(fmt.Sprintf("upstream panicked: %v\n", r))}
		}
	}()
	if up != nil {
		resp = up(req)
	}
	if resp == nil {
		resp = &Response{Status: 200}
	}
	if resp.Status == 0 {
		resp.Status = 200
	}
	return resp
}

// callUpstream is the upstream step of Exchange, on the worker: the upstream's response, or
// the local reply sent in the request phase, becomes the input of the response phase.
func (s *stream) callUpstream() {
	var resp *Response
	if lr := s.local; lr != nil {
		resp = &Response{Status: lr.status, Headers: lr.headers, Body: lr.body, Local: true, Details: lr.details, GRPCStatus: lr.grpcStatus}
		s.local = nil // the filter's own local reply passes its response phase, as in Envoy
	} else {
		s.upstreamCalled = true
		resp = callUpstream(s.upstream, s.forwarded())
	}
	s.upstreamResp = resp
	rk := make([][2]string, 0, len(resp.Headers)+1+addedHeadersRoom)
	rk = append(rk, [2]string{":status", strconv.Itoa(resp.Status)})
	for _, p := range resp.Headers {
		rk = append(rk, [2]string{lower(p[0]), p[1]})
	}
	s.respHeaders.kv = joinInline(rk, true, false)
	s.respHeadersEOS = len(resp.Body) == 0
	s.respBody = resp.Body
	if len(resp.Body) > 0 {
		s.respBody = append([]byte(nil), resp.Body...)
		s.respBodyEOS = true
	} else {
		s.steps &^= stepRespBody
	}
}

// signal wakes the goroutine waiting on s, if any.
func (s *stream) signal() {
	if s.waiting.Load() {
		s.waiting.Store(false)
		s.done <- struct{}{}
	}
}
