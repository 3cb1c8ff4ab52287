package dynmod

import (
	"fmt"
	"strings"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// A Go panic that reached Envoy would abort the whole process: every export recovers it
// (cgo.go). The VM recovers its own (failure_mode, sluice.errors); these are the shell's,
// outside the VM, handled the same way.

// The local reply of a request whose hook panicked under failure_mode "closed": the filter's
// own failure reply.
const (
	panicStatus  = 503
	panicBody    = "rate limiter unavailable\n"
	panicDetails = "sluice_internal_error"
)

// panicked handles a panic recovered in a hook of configuration c (f: the stream of the hook,
// or nil; request: the hook was deciding its request): one log line with where it happened,
// sluice.errors counted, and for a request, the configuration's failure_mode: "closed"
// answers 503, any other lets the request through. It returns the hook's status (0
// Continue, 1 StopIteration).
func (c *filterConfig) panicked(f filterPtr, request bool, r any, stack []byte) int {
	c.m.panicked(c, r, stack)
	if id, ok := c.byName[metricKey{metricCounter, filter.ErrorsMetric}]; ok {
		if m, ok := metricAt(c.metrics, id); ok {
			c.m.env.addMetric(c.ptr, f, m.kind, m.id, 1)
		}
	}
	if f == nil || !request || c.failure != config.FailClosed {
		return 0
	}
	var packed []byte
	c.m.env.sendResponse(f, panicStatus, packed, 0, []byte(panicBody), panicDetails)
	return 1
}

// panicked logs a recovered panic: its value and the frame it came from.
func (m *module) panicked(c *filterConfig, r any, stack []byte) {
	name := ""
	if c != nil {
		name = " (filter " + c.name + ")"
	}
	m.env.log(abi.LogCritical, fmt.Sprintf("sluice: recovered from a panic in the dynamic module%s: %v at %s", name, r, panicSite(stack)))
}

// panicSite is the frame that panicked, as "func file:line": the one right below the
// runtime's panic frame in stack (debug.Stack's text, taken in a deferred recover, whichever
// frames of ours run the recover).
func panicSite(stack []byte) string {
	lines := strings.Split(string(stack), "\n")
	for i := 1; i+3 < len(lines); i += 2 {
		if !strings.HasPrefix(strings.TrimSpace(lines[i]), "panic(") {
			continue
		}
		fn := strings.TrimSpace(lines[i+2])
		if j := strings.LastIndexByte(fn, '('); j > 0 {
			fn = fn[:j]
		}
		file := strings.TrimSpace(lines[i+3])
		if j := strings.LastIndexByte(file, ' '); j > 0 {
			file = file[:j]
		}
		return fn + " " + file
	}
	return "unknown"
}

func metricAt(ms []metric, id uint32) (metric, bool) {
	if id == 0 || int(id) > len(ms) {
		return metric{}, false
	}
	return ms[id-1], true
}
