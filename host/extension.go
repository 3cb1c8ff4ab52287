package host

import (
	"errors"
	"log/slog"
	"sync/atomic"

	"github.com/tetratelabs/wazero/api"
)

// Extension adds host calls to the "env" module, for ABI extensions such as Higress's
// proxy_redis_init / proxy_redis_call. Its calls run on the worker goroutine of the calling
// VM; asynchronous work is handed back to that worker with Guest.Post, and the reply is
// delivered with Guest.Callback (which can expose extra buffer types, e.g. 9 for a Redis
// reply, to proxy_get_buffer_bytes during the callback).
type Extension struct {
	Name  string
	Funcs []HostFunc
}

// HostFunc is one host call. Params and Results are wasm value types; Func reads its
// arguments from stack and writes its results to stack[0:len(Results)].
type HostFunc struct {
	Name            string
	Params, Results []api.ValueType
	Func            func(g *Guest, stack []uint64)
}

// Guest is the calling VM, as seen by an extension. Except for Post, its methods may be used
// only during the host call or Post callback that received it.
type Guest struct{ vm *vm }

// ErrNoContext is returned by Guest.Callback when the context no longer exists.
var ErrNoContext = errors.New("host: context does not exist")

// Read returns a view of guest memory (valid until the next call into the guest).
func (g *Guest) Read(ptr, size uint32) ([]byte, bool) { return g.vm.read(ptr, size) }

// WriteUint32 writes a little-endian u32 into guest memory.
func (g *Guest) WriteUint32(ptr, v uint32) bool { return g.vm.writeU32(ptr, v) }

// ReturnBytes copies data into memory allocated by the guest and writes the pointer and size
// to the two out-slots, like every Proxy-Wasm call that returns a buffer.
func (g *Guest) ReturnBytes(data []byte, ptrPtr, sizePtr uint32) Status {
	return g.vm.returnBytes(data, ptrPtr, sizePtr)
}

// ContextID is the effective context id: a stream's, or a root context's.
func (g *Guest) ContextID() uint32 { return g.vm.curID }

// RootContextID is the root context of the effective context: the stream's parent, or the
// effective root context itself (0 before the VM has one, during _initialize). Calls that
// belong to a root context, as Higress's Redis calls do, deliver their reply to it.
func (g *Guest) RootContextID() uint32 {
	if r := g.vm.curRoot; r != nil {
		return r.id
	}
	return 0
}

// Worker is the index of the VM's worker.
func (g *Guest) Worker() int { return g.vm.w.id }

// Logger logs with the worker's attributes.
func (g *Guest) Logger() *slog.Logger { return g.vm.log }

// Host is the Host the VM belongs to.
func (g *Guest) Host() *Host { return g.vm.h }

// HasExport reports whether the module exports a function.
func (g *Guest) HasExport(name string) bool { return g.vm.h.exports[name] }

// Post runs fn later on this VM's worker goroutine. Safe from any goroutine. fn is not run
// if the VM has been replaced (after a trap) or the Host closed in the meantime.
func (g *Guest) Post(fn func(g *Guest)) {
	v := g.vm
	v.w.postAsync(job{fn: func(w *worker) {
		if w.vm != v || v.dead {
			return
		}
		fn(&Guest{vm: v})
	}})
}

// Start registers a call the extension makes for this VM — one whose outcome comes back
// later — and returns the function that hands the outcome to the VM's worker: deliver(fn)
// runs fn there as Post does (fn nil: the call ended without anything to deliver, e.g. it
// was refused). Call Start during the host call that makes the call, and deliver exactly
// once, from any goroutine (later calls are ignored). Close waits, up to its deadline,
// until every started call has been delivered before it tears the VM down: a call made
// from proxy_on_done reaches its server, and its reply reaches a root context that answered
// false and waits for it to call proxy_done.
func (g *Guest) Start() (deliver func(fn func(g *Guest))) {
	v := g.vm
	v.extCalls++
	var once atomic.Bool
	return func(fn func(g *Guest)) {
		if !once.CompareAndSwap(false, true) {
			return
		}
		v.w.postReply(job{fn: func(w *worker) {
			v.extCalls--
			if fn == nil || w.vm != v || v.dead {
				return
			}
			fn(&Guest{vm: v})
		}})
	}
}

// Callback calls the guest export name with params, with contextID as the effective context
// and buffers readable through proxy_get_buffer_bytes (by buffer type) during the call. Use
// it only from a Post callback, never inside a host call. A trap replaces the VM (the
// context's request fails like any trapped request) and is returned as the error.
func (g *Guest) Callback(name string, contextID uint32, buffers map[uint32][]byte, params ...uint64) (uint64, error) {
	v := g.vm
	if v.dead {
		return 0, errVMDead
	}
	f := v.mod.ExportedFunction(name)
	if f == nil {
		return 0, errors.New("host: module does not export " + name)
	}
	if !v.setCurrent(contextID) {
		return 0, ErrNoContext
	}
	v.extBuffers = buffers
	r, err := v.call(f, params...)
	v.extBuffers = nil
	if err != nil {
		v.w.trap(v, name, err)
		return 0, err
	}
	return r, nil
}

// ContextExists reports whether a context id is live on this VM: a root context (active or
// draining) or a stream.
func (g *Guest) ContextExists(id uint32) bool {
	if g.vm.root(id) != nil {
		return true
	}
	_, ok := g.vm.streams[id]
	return ok
}
