package host

import (
	"context"
	"runtime"
	"testing"
	"unsafe"
)

func TestLinearMemoryReservation(t *testing.T) {
	m := &linearMemory{}
	lm := m.Allocate(64<<10, 40<<20)
	if got, want := m.mapped, runtime.GOOS == "linux"; got != want {
		t.Fatalf("mapped = %v, want %v on %s", got, want, runtime.GOOS)
	}
	b := lm.Reallocate(64 << 10)
	if len(b) != 64<<10 {
		t.Fatalf("len = %d", len(b))
	}
	b[0], b[len(b)-1] = 1, 2
	b2 := lm.Reallocate(1 << 20)
	if len(b2) != 1<<20 || b2[0] != 1 || b2[64<<10-1] != 2 || b2[64<<10] != 0 || b2[len(b2)-1] != 0 {
		t.Fatalf("grown memory lost its contents or is not zero past them")
	}
	if m.mapped && unsafe.SliceData(b2) != unsafe.SliceData(b) {
		t.Errorf("a reserved memory moved when it grew")
	}
	if lm.Reallocate(40<<20+1) != nil && m.mapped {
		t.Errorf("grew past the reservation")
	}
	if b3 := lm.Reallocate(40 << 20); len(b3) != 40<<20 || b3[0] != 1 {
		t.Fatalf("could not grow to the maximum")
	}
	// Free may come from another goroutine while the guest still runs: the memory stays.
	lm.Free()
	b2[5] = 7
	if b2[5] != 7 {
		t.Fatal("memory unusable after Free")
	}
	m.release()
	m.release() // idempotent
	if lm.Reallocate(64<<10) != nil {
		t.Errorf("a released memory grew")
	}
	if !m.mapped {
		return
	}
	// A reservation is emptied, not unmapped: a view kept past the end reads zeros, and the
	// next memory of the same size reuses it.
	if b2[0] != 0 || b2[5] != 0 {
		t.Errorf("a released reservation still holds its bytes")
	}
	n := &linearMemory{}
	n.Allocate(64<<10, 40<<20).Reallocate(64 << 10)
	if unsafe.SliceData(n.buf) != unsafe.SliceData(b2) || n.buf[0] != 0 {
		t.Errorf("the released reservation was not reused, zeroed")
	}
	n.release()
}

// When the kernel does not give a reservation (here: larger than the 4 GiB a wasm32 memory
// can reach), the memory is a Go slice that keeps its contents as it grows.
func TestLinearMemoryFallback(t *testing.T) {
	m := &linearMemory{}
	lm := m.Allocate(64<<10, 1<<33)
	if m.mapped {
		t.Fatal("reserved 8 GiB")
	}
	b := lm.Reallocate(64 << 10)
	b[100] = 9
	b = lm.Reallocate(3 << 20)
	if len(b) != 3<<20 || b[100] != 9 || b[len(b)-1] != 0 {
		t.Fatalf("fallback growth: len %d, b[100] %d", len(b), b[100])
	}
	m.release()
	if m.buf != nil {
		t.Error("release kept the slice")
	}
}

// A VM's linear memory is the reservation (outside the Go heap on Linux), and it is released
// when the host closes.
func TestVMLinearMemory(t *testing.T) {
	h, _ := newHost(t, "minimal", Options{Workers: 1})
	v := h.workers[0].vm
	if v.linmem == nil || v.linmem.mapped != (runtime.GOOS == "linux") {
		t.Fatalf("linmem = %+v", v.linmem)
	}
	view, ok := v.mem.Read(0, v.mem.Size())
	if !ok || len(view) == 0 || unsafe.SliceData(view) != unsafe.SliceData(v.linmem.buf) || len(view) != len(v.linmem.buf) {
		t.Fatalf("the module's memory (%d bytes) is not the allocator's (%d bytes)", len(view), len(v.linmem.buf))
	}
	if err := h.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !v.linmem.released {
		t.Error("the memory was not released when the host closed")
	}
}
