//go:build !sluice_panictest

package dynmod

// panicHook is a no-op outside the sluice_panictest build (panic_on.go).
func panicHook(c *filterConfig, f filterPtr) {}

func (h *host) panicValue(v []byte) {}
