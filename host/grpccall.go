package host

import (
	"context"
	"crypto/tls"
	"errors"
	"net/url"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-proxy/sluice/proxywasm"
)

// gRPC calls (proxy_grpc_call and its callbacks), as Envoy serves them (host/doc.go cites
// the sources): the call belongs to the root of the effective context; tokens are cpp-host's
// call ids (1 + 4n: the low two bits say "gRPC call"); the reply arrives on the calling VM's
// worker as proxy_on_grpc_receive(root, token, size) with the message readable as
// BufferGrpcReceive, or, when the call fails, as proxy_on_grpc_close(root, token, status) —
// never both, and no metadata callbacks for a unary call (Envoy's GrpcCallClientHandler has
// only onSuccessRaw and onFailure). Streams (proxy_grpc_stream, proxy_grpc_send) are not
// implemented: UNIMPLEMENTED, as cpp-host's base context answers.

const bufferGrpcReceive = uint32(proxywasm.BufferGrpcReceive)

// cpp-host's callout ids (include/proxy-wasm/wasm.h): the low two bits are the type.
const (
	calloutTypeMask   = 0x3
	calloutGrpcCall   = 1
	calloutGrpcStream = 2
	calloutIncrement  = 4
)

// grpcCall is one call in flight: the root context that made it and how to abandon it.
type grpcCall struct {
	root   uint32
	cancel context.CancelFunc
}

// grpcResult is what a call returned: the reply message, or a non-OK status.
type grpcResult struct {
	msg  []byte
	code codes.Code
	text string
}

// grpcClients holds one grpc-go ClientConn per cluster, made on first use and closed with
// the Host.
type grpcClients struct {
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// rawCodec sends and receives messages as the guest encoded them: proxy_grpc_call carries
// the serialized message, and proxy_on_grpc_receive hands back the serialized reply.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, errors.New("host: raw codec: not *[]byte")
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return errors.New("host: raw codec: not *[]byte")
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" } // the content-subtype a gRPC server expects

// grpcTarget resolves proxy_grpc_call's first argument as Envoy does (Context::grpcCall):
// a serialized envoy.config.core.v3.GrpcService if it parses as one, else a cluster name.
// It returns the cluster's base URL, or the status the call returns.
func (h *Host) grpcTarget(service []byte) (cluster, base string, st Status) {
	var gs corev3.GrpcService
	if err := proto.Unmarshal(service, &gs); err == nil {
		eg := gs.GetEnvoyGrpc()
		if eg == nil {
			// Envoy would build a Google gRPC client; this host has none.
			return "", "", StatusBadArgument
		}
		cluster = eg.GetClusterName()
	} else {
		cluster = string(service)
		if _, ok := h.opts.Clusters[cluster]; !ok {
			// Envoy: no thread-local cluster of that name → ParseFailure.
			return cluster, "", StatusParseFailure
		}
	}
	return cluster, h.opts.Clusters[cluster], StatusOK // base "" (an unknown envoy_grpc cluster): the call fails
}

// conn returns the ClientConn of cluster (base: "http://HOST:PORT", HTTP/2 cleartext, or
// "https://HOST:PORT").
func (h *Host) grpcConn(cluster, base string) (*grpc.ClientConn, error) {
	c := &h.grpcClients
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[cluster]; cc != nil {
		return cc, nil
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return nil, errors.New("cluster " + cluster + ": not a URL: " + base)
	}
	var creds credentials.TransportCredentials
	switch u.Scheme {
	case "http", "h2c":
		creds = insecure.NewCredentials()
	case "https":
		creds = credentials.NewTLS(&tls.Config{ServerName: u.Hostname()})
	default:
		return nil, errors.New("cluster " + cluster + ": scheme " + u.Scheme + " (want http or https)")
	}
	cc, err := grpc.NewClient("passthrough:///"+u.Host, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		return nil, err
	}
	if c.conns == nil {
		c.conns = map[string]*grpc.ClientConn{}
		go func() {
			<-h.closed
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, cc := range c.conns {
				cc.Close()
			}
			clear(c.conns)
		}()
	}
	c.conns[cluster] = cc
	return cc, nil
}

func hcGrpcCall(v *vm, s []uint64) Status {
	service, ok1 := v.read(u32(s[0]), u32(s[1]))
	svcName, ok2 := v.read(u32(s[2]), u32(s[3]))
	method, ok3 := v.read(u32(s[4]), u32(s[5]))
	md, ok4 := v.read(u32(s[6]), u32(s[7]))
	msg, ok5 := v.read(u32(s[8]), u32(s[9]))
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return StatusInvalidMemoryAccess
	}
	var pairs [][2]string
	if len(md) > 0 {
		var ok bool
		if pairs, ok = proxywasm.ParsePairs(md); !ok {
			return StatusBadArgument
		}
	}
	cluster, base, st := v.h.grpcTarget(service)
	if st != StatusOK {
		v.log.Warn("host: proxy_grpc_call to an unknown cluster", "cluster", cluster, "status", st.String())
		return st
	}
	root := v.curRoot
	if root == nil {
		return StatusBadArgument
	}
	token := v.nextGrpcCall + calloutIncrement
	if !v.writeU32(u32(s[11]), token) {
		return StatusInvalidMemoryAccess
	}
	v.nextGrpcCall = token
	fullMethod := "/" + string(svcName) + "/" + string(method)
	req := append([]byte(nil), msg...)
	timeout := time.Duration(u32(s[10])) * time.Millisecond // 0: none
	ctx, cancel := context.WithCancel(context.Background())
	if timeout > 0 {
		ctx, cancel = v.h.withTimeout(context.Background(), timeout) // on the host's clock
	}
	if len(pairs) > 0 {
		kv := make([]string, 0, 2*len(pairs))
		for _, p := range pairs {
			if !strings.HasPrefix(p[0], ":") {
				kv = append(kv, strings.ToLower(p[0]), p[1])
			}
		}
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	v.grpcCalls[token] = grpcCall{root: root.id, cancel: cancel}
	h, w := v.h, v.w
	go func() {
		res := h.doGrpcCall(ctx, cluster, base, fullMethod, req)
		cancel()
		w.postAsync(job{fn: func(w *worker) { w.deliverGrpcCall(v, token, res) }})
	}()
	return StatusOK
}

func (h *Host) doGrpcCall(ctx context.Context, cluster, base, method string, req []byte) *grpcResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-h.closed: // the host is closing: abandon the call
			cancel()
		case <-done:
		}
	}()
	if base == "" {
		return &grpcResult{code: codes.Unavailable, text: "cluster " + cluster + " is unknown"}
	}
	cc, err := h.grpcConn(cluster, base)
	if err != nil {
		return &grpcResult{code: codes.Unavailable, text: err.Error()}
	}
	var out []byte
	if err := cc.Invoke(ctx, method, &req, &out); err != nil {
		st := status.Convert(err)
		code, text := st.Code(), st.Message()
		if code == codes.OK { // never for a failed call; keep the callback's contract
			code = codes.Unknown
		}
		if code == codes.Canceled && timedOut(ctx) {
			// The timeout passed on a clock other than the wall clock (withTimeout): what
			// gRPC answers when a deadline passes.
			code, text = codes.DeadlineExceeded, context.DeadlineExceeded.Error()
		}
		h.log.Debug("host: grpc call failed", "cluster", cluster, "method", method, "code", code.String(), "message", text)
		return &grpcResult{code: code, text: text}
	}
	return &grpcResult{msg: out}
}

// deliverGrpcCall calls proxy_on_grpc_receive (a reply) or proxy_on_grpc_close (a failure)
// on the VM that made the call, with the calling root as the effective context. A call
// cancelled or closed by the guest meanwhile gets no callback; the reply is dropped if the
// VM was replaced or the root has been deleted.
func (w *worker) deliverGrpcCall(v *vm, token uint32, res *grpcResult) {
	if w.vm != v || v.dead {
		return
	}
	c, ok := v.grpcCalls[token]
	if !ok {
		return // cancelled
	}
	delete(v.grpcCalls, token)
	f, name := v.onGrpcReceive, "proxy_on_grpc_receive"
	arg := uint64(len(res.msg))
	if res.code != codes.OK {
		f, name, arg = v.onGrpcClose, "proxy_on_grpc_close", uint64(res.code)
	}
	if f == nil {
		return
	}
	if !v.setCurrent(c.root) {
		v.log.Debug("host: grpc call reply dropped: its root context has been deleted", "root", c.root, "token", token)
		return
	}
	prev := v.extBuffers
	if res.code == codes.OK {
		v.extBuffers = map[uint32][]byte{bufferGrpcReceive: res.msg}
		for k, b := range prev {
			if k != bufferGrpcReceive {
				v.extBuffers[k] = b
			}
		}
	}
	_, err := v.call(f, uint64(c.root), uint64(token), arg)
	v.extBuffers = prev
	if err != nil {
		w.trap(v, name, err)
	}
}

// hcGrpcCancel abandons a call (Envoy's Context::grpcCancel): no callback follows. An id
// of a call that is not in flight is NOT_FOUND; a stream id is NOT_FOUND (this host opens
// no streams); any other id is BAD_ARGUMENT.
func hcGrpcCancel(v *vm, s []uint64) Status { return v.grpcEnd(u32(s[0])) }

// hcGrpcClose is Context::grpcClose: for a call, the same as cancel.
func hcGrpcClose(v *vm, s []uint64) Status { return v.grpcEnd(u32(s[0])) }

func (v *vm) grpcEnd(token uint32) Status {
	switch token & calloutTypeMask {
	case calloutGrpcCall:
		c, ok := v.grpcCalls[token]
		if !ok {
			return StatusNotFound
		}
		c.cancel()
		delete(v.grpcCalls, token)
		return StatusOK
	case calloutGrpcStream:
		return StatusNotFound
	}
	return StatusBadArgument
}

// hcGrpcSend is Context::grpcSend: only for stream ids (BAD_ARGUMENT otherwise); this host
// opens no streams (NOT_FOUND).
func hcGrpcSend(v *vm, s []uint64) Status {
	if u32(s[0])&calloutTypeMask != calloutGrpcStream {
		return StatusBadArgument
	}
	return StatusNotFound
}

// hcGrpcStream: streaming calls are not implemented (UNIMPLEMENTED, as cpp-host's
// ContextBase answers).
func hcGrpcStream(v *vm, s []uint64) Status {
	v.h.unimplemented("proxy_grpc_stream")
	return StatusUnimplemented
}
