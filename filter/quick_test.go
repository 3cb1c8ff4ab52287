package filter_test

import (
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

var _ abi.QuickHandler = (*filter.VM)(nil)

// The quick paths take exactly the callbacks that need no work: a stream with response
// headers to add declines QuickResponseHeaders, one billed from its body declines
// QuickResponseBody and QuickDone (OnDone then settles it); root contexts are never
// taken; a stream ended at proxy_on_done is deleted quietly, once.
func TestQuickCallbacks(t *testing.T) {
	const rule = `"name":"r","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h"`
	for _, c := range []struct {
		name, cfg                   string
		respHeaders, respBody, done bool // what the quick paths take
	}{
		{"headers none", `{"rules":[{` + rule + `}],"response":{"headers":"none"}}`, true, true, true},
		{"headers both", `{"rules":[{` + rule + `}],"response":{"headers":"both"}}`, false, true, true},
		{"budget from the body", budgetCfg, false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &costHost{Host: filtertest.NewHost()}
			h.Now_ = t0
			h.Config = []byte(c.cfg)
			vm := filter.NewVM(h)
			if vm.QuickContextCreate(1, 0) {
				t.Fatal("QuickContextCreate took a root context")
			}
			vm.OnContextCreate(1, 0)
			if !vm.OnVMStart(1, 0) || !vm.OnConfigure(1, len(c.cfg)) {
				t.Fatalf("plugin refused to start: %v", h.Logs)
			}
			if !vm.QuickContextCreate(77, 9) || vm.Streams() != 0 {
				t.Errorf("a stream of an unknown root: not answered, or created (%d streams)", vm.Streams())
			}
			if !vm.QuickContextCreate(10, 1) || vm.Streams() != 1 {
				t.Fatalf("stream not created: %d streams", vm.Streams())
			}
			h.ReqHeaders = [][2]string{{":method", "POST"}, {":path", "/"}, {":authority", "x"}, {"x-api-key", "k"}, {"x-max-tokens", "100"}}
			if act := vm.OnRequestHeaders(10, len(h.ReqHeaders), false); act != abi.ActionContinue || h.Local != nil {
				t.Fatalf("request not admitted: %v %+v", act, h.Local)
			}
			h.RespHeaders = [][2]string{{":status", "200"}, {"content-type", "application/json"}}
			if got := vm.QuickResponseHeaders(10); got != c.respHeaders {
				t.Errorf("QuickResponseHeaders %v, want %v", got, c.respHeaders)
			}
			if !c.respHeaders {
				vm.OnResponseHeaders(10, len(h.RespHeaders), false)
			}
			h.body = []byte(openAIBody(40))
			if got := vm.QuickResponseBody(10); got != c.respBody {
				t.Errorf("QuickResponseBody %v, want %v", got, c.respBody)
			}
			if !c.respBody {
				vm.OnResponseBody(10, len(h.body), true)
			}
			if got := vm.QuickDone(10); got != c.done {
				t.Errorf("QuickDone %v, want %v", got, c.done)
			}
			if !c.done {
				if !vm.OnDone(10) {
					t.Error("OnDone of a stream answered false")
				}
			}
			if vm.Streams() != 0 {
				t.Errorf("%d streams after proxy_on_done", vm.Streams())
			}
			if !vm.QuickDelete(10) {
				t.Error("QuickDelete of the stream ended at proxy_on_done: declined")
			}
			if vm.QuickDelete(10) || vm.QuickDone(1) || vm.QuickDelete(1) {
				t.Error("a second delete, or a root context's done or delete, taken quickly")
			}
			if c.cfg == budgetCfg {
				// Settled at proxy_on_done with the body's usage: 100 reserved, 40 used.
				if got, _ := h.Metrics.Get("sluice.llm.settled"); got != 1 {
					t.Errorf("settled %d, want 1", got)
				}
				if got, _ := h.Metrics.Get("sluice.llm.refunded"); got != 60 {
					t.Errorf("refunded %d, want 60", got)
				}
			}
			// Callbacks for unknown contexts are answered quickly and harmlessly.
			if !vm.QuickResponseHeaders(999) || !vm.QuickResponseBody(999) || vm.QuickDone(999) || vm.QuickDelete(999) {
				t.Error("unknown context: quick answers differ")
			}
		})
	}
}
