package dynmod

import (
	"os"
	"runtime"
	"sync"
	"syscall"
)

// keeperNap is how long the keeper stays in one system call: under the 10 ms after which
// the runtime takes a P back from a thread in a system call even when other Ps are idle.
const keeperNap = 5_000_000 // ns

var keeperOnce sync.Once

// startKeeper starts the keeper: a goroutine that spends its life in nanosleep system
// calls, holding a P in the system-call state and leaving it only for an instant every
// keeperNap.
//
// Why: every Envoy worker enters Go through cgo and, between two requests, leaves its P in
// the system-call state while it runs Envoy's code. When every P is idle the runtime's
// monitor thread (sysmon) goes to deep sleep, and the next worker to enter Go wakes it
// (a futex wake, then sysmon polls every 20 µs until it is idle again); measured, that was
// most of what Go added to an admitted request. A P that is never idle keeps sysmon in its
// light sleep (at most 10 ms apart, and nothing to wake), and costs one short system call
// per keeperNap.
//
// SLUICE_DYNMOD_KEEPER=0 in Envoy's environment leaves it out (to measure what it saves).
func startKeeper() {
	if os.Getenv("SLUICE_DYNMOD_KEEPER") == "0" {
		return
	}
	keeperOnce.Do(func() {
		go func() {
			runtime.LockOSThread()
			ts := syscall.NsecToTimespec(keeperNap)
			for {
				syscall.Nanosleep(&ts, nil)
			}
		}()
	})
}
