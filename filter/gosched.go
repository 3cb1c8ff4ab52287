//go:build !sluice_nogosched

package filter

// GoschedEvery is how many request callbacks pass between two calls to
// runtime.Gosched. A standard-Go guest that never yields can stop finishing
// GC cycles under sustained load (its linear memory then grows without
// bound); yielding every 64 requests keeps it flat (see the soak test).
// The build tag sluice_nogosched disables it, for that experiment only.
const GoschedEvery = 64
