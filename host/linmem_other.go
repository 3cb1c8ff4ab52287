//go:build !linux

package host

// reserveMemory: no reservation here; linear memories are Go slices (linmem.go).
func reserveMemory(uint64) ([]byte, bool) { return nil, false }

func releaseMemory([]byte) {}
