//go:build sluice_panictest

package dynmod

// The sluice_panictest build panics on purpose, to prove in real Envoy that a panic never
// takes Envoy down (e2e's dynamic-module suite): a request with the header
// x-sluice-panic: shell panics in the shell, before the VM; a header value "panic-in-filter"
// read by a rule's key panics inside the VM, whose own guard applies failure_mode.
// Never in a shipped build.

const panicHeader = "x-sluice-panic"

func panicHook(c *filterConfig, f filterPtr) {
	var buf [16]byte
	if v, ok := c.m.env.header(f, requestHeaders, panicHeader, buf[:0]); ok && string(v) == "shell" {
		panic("deliberate panic in the shell (sluice_panictest)")
	}
}

func (h *host) panicValue(v []byte) {
	if string(v) == "panic-in-filter" {
		panic("deliberate panic in the filter (sluice_panictest)")
	}
}
