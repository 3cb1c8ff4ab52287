//go:build wasip1

package abi

// The calls that resume a paused stream from a later callback (a remote
// backend's reply or its guard's tick), imported by both artifacts: the
// Redis backend (sluice-redis.wasm) and the rls backend use them. Envoy and
// the proxytest emulator provide all three.

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(streamType uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(ms uint32) uint32

// SetEffectiveContext makes id the context later host calls act on
// (proxy_set_effective_context).
func (*Imports) SetEffectiveContext(id uint32) Status {
	return Status(proxySetEffectiveContext(id))
}

// ContinueStream resumes the paused request of the effective context
// (proxy_continue_stream(0)).
func (*Imports) ContinueStream() Status { return Status(proxyContinueStream(0)) }

// SetTickPeriod sets the period of proxy_on_tick for the root context
// (proxy_set_tick_period_milliseconds).
func (*Imports) SetTickPeriod(ms uint32) Status { return Status(proxySetTickPeriodMilliseconds(ms)) }
