package host

import "github.com/tetratelabs/wazero/experimental"

// linearMemory backs one VM's linear memory (wazero's experimental.MemoryAllocator). Where
// the platform allows (linmem_linux.go), it reserves the memory's maximum size (the
// --memory-limit-mb cap) as one anonymous mapping that the kernel backs page by page as the
// guest touches it, so the memory is not a Go heap object: growing never copies or
// zeroes, untouched capacity is never resident, and the Go collector neither scans nor
// counts it towards its next target. Elsewhere, or when the reservation fails, it is a Go
// slice grown like wazero's own.
//
// wazero calls Free when the module closes — possibly from another goroutine while the guest
// still runs (the call-timeout watchdog closes a module under a running call) — so Free
// does nothing; release, which the VM's worker calls once no guest call can be running on
// it (vm.close, newVM's failure paths), gives the pages back to the kernel. A reservation is
// never unmapped, only emptied and kept for the next VM (linmem_linux.go): a view of guest
// memory that someone kept past the VM's end reads zeros instead of crashing the process.
type linearMemory struct {
	buf      []byte // the memory: [:len] in use, [:cap] reserved when mapped
	mapped   bool   // buf is a reservation from reserveMemory
	released bool
}

// Allocate implements experimental.MemoryAllocator. A Go module has one memory; a second
// request (not made by wazero for a single-memory module) gets a plain slice-backed one.
func (m *linearMemory) Allocate(capBytes, maxBytes uint64) experimental.LinearMemory {
	if m.buf != nil || m.mapped {
		return &linearMemory{buf: make([]byte, 0, capBytes)}
	}
	if b, ok := reserveMemory(maxBytes); ok {
		m.buf, m.mapped = b[:0], true
		return m
	}
	m.buf = make([]byte, 0, capBytes)
	return m
}

// Reallocate implements experimental.LinearMemory: the memory grows to size bytes (it never
// shrinks); nil when it cannot (past the reservation, or released).
func (m *linearMemory) Reallocate(size uint64) []byte {
	switch {
	case m.released:
		return nil
	case size <= uint64(cap(m.buf)):
		m.buf = m.buf[:size]
	case m.mapped:
		return nil
	default:
		m.buf = append(m.buf, make([]byte, size-uint64(len(m.buf)))...)
	}
	return m.buf
}

// Free implements experimental.LinearMemory; see linearMemory for why it only marks.
func (m *linearMemory) Free() {}

// release gives the memory back: a reservation's pages to the kernel (the reservation is
// kept for another VM), a slice to the collector. Only the VM's worker calls it, when no
// guest call runs on the VM.
func (m *linearMemory) release() {
	if m == nil || m.released {
		return
	}
	m.released = true
	if m.mapped {
		releaseMemory(m.buf[:cap(m.buf)])
	}
	m.buf = nil
}
