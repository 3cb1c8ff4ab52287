//go:build linux

package host

import (
	"sync"
	"syscall"
)

// reservations are released linear memories, by size, for the next VM: a reservation is
// never unmapped (see linearMemory), so a stale view of a closed VM's memory reads zeros or
// a newer VM's bytes — as it would read a dead VM's Go slice — instead of faulting. Their
// number is bounded by the most VMs alive at once in the process.
var reservations struct {
	sync.Mutex
	free map[uint64][][]byte
}

// reserveMemory returns size bytes of zeroed anonymous memory, backed only where it is
// touched and not charged against the commit limit (MAP_NORESERVE): a released reservation
// of that size, or a new mapping. ok is false when the kernel refuses (the caller falls back
// to a Go slice).
func reserveMemory(size uint64) ([]byte, bool) {
	if size == 0 || size > 1<<32 {
		return nil, false
	}
	reservations.Lock()
	if l := reservations.free[size]; len(l) > 0 {
		b := l[len(l)-1]
		reservations.free[size] = l[:len(l)-1]
		reservations.Unlock()
		return b, true
	}
	reservations.Unlock()
	b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return nil, false
	}
	return b, true
}

// releaseMemory gives the reservation's pages back to the kernel (MADV_DONTNEED: a private
// anonymous mapping reads as zeros afterwards) and keeps the reservation for the next VM.
// Should the kernel refuse, the reservation is left as it is (held, never unmapped).
func releaseMemory(b []byte) {
	if err := syscall.Madvise(b, syscall.MADV_DONTNEED); err != nil {
		return
	}
	reservations.Lock()
	if reservations.free == nil {
		reservations.free = map[uint64][][]byte{}
	}
	reservations.free[uint64(len(b))] = append(reservations.free[uint64(len(b))], b)
	reservations.Unlock()
}
