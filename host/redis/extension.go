// Package redis gives the embedded Proxy-Wasm host (package host) Higress's Redis
// extension to the ABI, on real Redis Clusters (redisclient.Clusters):
//
//	proxy_redis_init(service_ptr, service_size, username_ptr, username_size,
//	                 password_ptr, password_size, timeout_ms) -> status
//	proxy_redis_call(service_ptr, service_size, query_ptr, query_size, token_ptr) -> status
//	export proxy_on_redis_call_response(context_id, token, status, response_size)
//
// proxy_redis_init binds the service (a cluster name given to New, e.g. from
// `sluice run --redis-cluster NAME=ADDR,...`) to credentials and a per-call timeout; it does
// not connect. proxy_redis_call takes one command as a RESP array of bulk strings, writes a
// token to token_ptr and returns at once; the reply is delivered later, on the worker of the
// VM that made the call, as proxy_on_redis_call_response with the reply readable through
// proxy_get_buffer_bytes as buffer type proxywasm.BufferRedisCallResponse (9; raw RESP2) during that callback.
//
// Like Higress's Envoy (and Envoy's proxy_http_call), a call belongs to a root context —
// the root of the context effective when the call was made (a stream's parent: its
// plugin's root): the callback's context_id is that root's id, and the guest maps the
// token back to the stream that made the call and makes it the effective context
// (proxy_set_effective_context) before it resumes or answers that stream. The reply is
// delivered whether or not that stream still exists; the guest drops tokens it no longer
// knows. It is dropped when the root context is gone (a replaced plugin configuration whose
// streams have all ended; counted in Stats.Undelivered) or the VM was replaced.
//
// Results of the host calls: OK; NOT_FOUND for a service that is not configured, or a call
// before the service's init; BAD_ARGUMENT for a query that is not a RESP array of bulk
// strings; INVALID_MEMORY_ACCESS for pointers outside guest memory. Callback status
// (proxywasm.RedisStatus, which redisclient.Status takes its values from): RedisStatusOK with
// Redis's reply (which may be an error reply such as NOSCRIPT), RedisStatusNetworkError,
// RedisStatusTimeout; with a nonzero status the reply is empty.
package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"

	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/proxywasm"
)

// Names of the host calls and the callback.
const (
	InitName     = "proxy_redis_init"
	CallName     = "proxy_redis_call"
	CallbackName = "proxy_on_redis_call_response"
	// ReplyBuffer is the proxy_get_buffer_bytes buffer type of the reply.
	ReplyBuffer = uint32(proxywasm.BufferRedisCallResponse)
)

// Stats counts the extension's activity. Safe for concurrent use.
type Stats struct {
	Calls       atomic.Int64 // proxy_redis_call accepted
	Refused     atomic.Int64 // proxy_redis_call answered with an error status
	Replies     atomic.Int64 // callbacks delivered with status 0
	Failures    atomic.Int64 // callbacks delivered with a nonzero status
	Undelivered atomic.Int64 // replies dropped: the VM does not export the callback, or the root context is gone
}

// New returns the extension serving the clusters of c. st may be nil.
func NewExtension(c *redisclient.Clusters, st *Stats) host.Extension {
	if st == nil {
		st = new(Stats)
	}
	x := &ext{c: c, st: st}
	i32 := api.ValueTypeI32
	return host.Extension{Name: "redis", Funcs: []host.HostFunc{
		{Name: InitName, Params: []api.ValueType{i32, i32, i32, i32, i32, i32, i32}, Results: []api.ValueType{i32}, Func: x.init},
		{Name: CallName, Params: []api.ValueType{i32, i32, i32, i32, i32}, Results: []api.ValueType{i32}, Func: x.call},
	}}
}

type ext struct {
	c     *redisclient.Clusters
	st    *Stats
	token atomic.Uint32
}

func status(stack []uint64, s host.Status) { stack[0] = uint64(s) }

func mapErr(err error) host.Status {
	switch {
	case errors.Is(err, redisclient.ErrUnknownCluster), errors.Is(err, redisclient.ErrNotInitialized):
		return host.StatusNotFound
	case errors.Is(err, redisclient.ErrBadCommand):
		return host.StatusBadArgument
	}
	return host.StatusInternalFailure
}

func (x *ext) init(g *host.Guest, stack []uint64) {
	var s [3]string
	for i := range s {
		b, ok := g.Read(uint32(stack[2*i]), uint32(stack[2*i+1]))
		if !ok {
			status(stack, host.StatusInvalidMemoryAccess)
			return
		}
		s[i] = string(b)
	}
	timeout := time.Duration(uint32(stack[6])) * time.Millisecond
	if err := x.c.Init(s[0], s[1], s[2], timeout); err != nil {
		g.Logger().Warn("proxy_redis_init failed", "service", s[0], "error", err)
		status(stack, mapErr(err))
		return
	}
	status(stack, host.StatusOK)
}

func (x *ext) call(g *host.Guest, stack []uint64) {
	name, ok := g.Read(uint32(stack[0]), uint32(stack[1]))
	if !ok {
		status(stack, host.StatusInvalidMemoryAccess)
		return
	}
	query, ok := g.Read(uint32(stack[2]), uint32(stack[3]))
	if !ok {
		status(stack, host.StatusInvalidMemoryAccess)
		return
	}
	tokenPtr := uint32(stack[4])
	if _, ok := g.Read(tokenPtr, 4); !ok {
		status(stack, host.StatusInvalidMemoryAccess)
		return
	}
	token := x.token.Add(1)
	if token == 0 { // wrapped: 0 is never a token
		token = x.token.Add(1)
	}
	root := g.RootContextID() // calls belong to the caller's root context, as in Higress's Envoy
	// The host waits for started calls when it closes (a return sent from proxy_on_done
	// reaches Redis before the VM goes).
	deliver := g.Start()
	// Call copies query before returning, so the view of guest memory may go stale.
	err := x.c.Call(context.Background(), string(name), query, func(st redisclient.Status, reply []byte) {
		deliver(func(g *host.Guest) { x.deliver(g, root, token, st, reply) })
	})
	if err != nil {
		deliver(nil)
		x.st.Refused.Add(1)
		status(stack, mapErr(err))
		return
	}
	x.st.Calls.Add(1)
	g.WriteUint32(tokenPtr, token)
	status(stack, host.StatusOK)
}

func (x *ext) deliver(g *host.Guest, root, token uint32, st redisclient.Status, reply []byte) {
	if !g.HasExport(CallbackName) || !g.ContextExists(root) {
		x.st.Undelivered.Add(1)
		return
	}
	if st == redisclient.StatusOK {
		x.st.Replies.Add(1)
	} else {
		x.st.Failures.Add(1)
		reply = nil
	}
	if _, err := g.Callback(CallbackName, root, map[uint32][]byte{ReplyBuffer: reply}, uint64(root), uint64(token), uint64(uint32(st)), uint64(len(reply))); err != nil {
		g.Logger().Error(CallbackName+" failed", "token", token, "error", err)
	}
}
