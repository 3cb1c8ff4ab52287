package host

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero/api"
)

// testAsyncExtension mimics the shape of Higress's Redis calls: a host call that starts
// asynchronous work and returns a token, and a callback export that receives the reply as
// buffer type 9.
func testAsyncExtension(calls *int) Extension {
	return Extension{Name: "test-async", Funcs: []HostFunc{{
		Name:    "proxy_test_async",
		Params:  []api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32},
		Results: []api.ValueType{api.ValueTypeI32},
		Func: func(g *Guest, stack []uint64) {
			*calls++
			arg, ok := g.Read(uint32(stack[0]), uint32(stack[1]))
			if !ok {
				stack[0] = uint64(StatusInvalidMemoryAccess)
				return
			}
			if string(arg) == "refuse" {
				stack[0] = uint64(StatusBadArgument)
				return
			}
			reply := []byte(strings.ToUpper(string(arg)))
			if string(arg) == "root" {
				reply = []byte("root=" + strconv.Itoa(int(g.RootContextID())))
			}
			const token = 42
			g.WriteUint32(uint32(stack[2]), token)
			ctxID := g.ContextID()
			go func() { // the asynchronous work, off the worker
				g.Post(func(g *Guest) {
					if !g.ContextExists(ctxID) {
						return
					}
					if _, err := g.Callback("proxy_on_test_async_response", ctxID, map[uint32][]byte{9: reply}, uint64(ctxID), token, uint64(len(reply))); err != nil {
						g.Logger().Error("callback failed", "error", err)
					}
				})
			}()
			stack[0] = uint64(StatusOK)
		},
	}}}
}

func TestExtension(t *testing.T) {
	calls := 0
	h, _ := newHost(t, "kitchen", Options{Workers: 2, Extensions: []Extension{testAsyncExtension(&calls)}})
	var seen *Request
	resp := mustExchange(t, h, &Request{Path: "/ext?arg=hello"}, func(r *Request) *Response { seen = r; return nil })
	if resp.Status != 200 || seen == nil {
		t.Fatalf("resp = %+v", resp)
	}
	if v, _ := header(seen.Headers, "x-ext-token"); v != "42" {
		t.Errorf("token = %q", v)
	}
	if v, _ := header(seen.Headers, "x-ext-reply"); v != "HELLO/0" {
		t.Errorf("reply = %q", v)
	}
	resp = mustExchange(t, h, &Request{Path: "/ext?arg=refuse"}, nil)
	if string(resp.Body) != "ext status=2" {
		t.Errorf("refused call: %q", resp.Body)
	}
	if calls != 2 {
		t.Errorf("extension called %d times", calls)
	}
}

func TestExtensionAbsentIsUnimplemented(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 1})
	resp := mustExchange(t, h, &Request{Path: "/ext?arg=x"}, nil)
	if string(resp.Body) != "ext status=12" {
		t.Errorf("without the extension: %q, want UNIMPLEMENTED", resp.Body)
	}
}

func TestExtensionCannotShadowBuiltins(t *testing.T) {
	_, err := New(testCtx(t), Options{Wasm: guest(t, "minimal"), Workers: 1, Extensions: []Extension{{Name: "x", Funcs: []HostFunc{{Name: "proxy_log"}}}}})
	if err == nil || !strings.Contains(err.Error(), "proxy_log is built in") {
		t.Fatalf("New = %v", err)
	}
}
