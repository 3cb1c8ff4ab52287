//go:build sluice_debug

package filter

import (
	"os"
	"runtime/metrics"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// The sluice_debug build reports the guest's own heap allocations as the
// counter DebugAllocsMetric, so tests can measure allocations per request
// inside the compiled module. Never in a shipped build.
const debugAllocs = true

var allocSample = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}

func (vm *VM) reportAllocs() {
	vm.debugTrap()
	metrics.Read(allocSample)
	n := allocSample[0].Value.Uint64()
	if vm.debugID == 0 {
		id, st := vm.host.DefineMetric(abi.MetricCounter, DebugAllocsMetric)
		if st != abi.StatusOK {
			return
		}
		vm.debugID, vm.debugLast = uint64(id)+1, n
		return
	}
	vm.host.IncrementMetric(uint32(vm.debugID-1), int64(n-vm.debugLast))
	vm.debugLast = n
}

// DebugTrapHeader, on a request to a sluice_debug build, makes the VM exit
// (proc_exit, which a host handles as a trap) in its request headers: tests
// kill a VM that holds state this way. Never in a shipped build.
const DebugTrapHeader = "x-sluice-debug-trap"

func (vm *VM) debugTrap() {
	if _, st := vm.host.GetHeader(abi.MapRequestHeaders, DebugTrapHeader); st == abi.StatusOK {
		os.Exit(3)
	}
}
