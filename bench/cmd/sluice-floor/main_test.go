package main

import (
	"context"
	"testing"

	"github.com/tetratelabs/wazero"
)

// codeSectionSize finds the code section past the others, and wazero accepts the module.
func TestCodeSectionSize(t *testing.T) {
	mod := []byte{0, 'a', 's', 'm', 1, 0, 0, 0,
		1, 4, 1, 0x60, 0, 0, // type section: one func type () -> ()
		3, 2, 1, 0, // function section: one function of type 0
		10, 4, 1, 2, 0, 0x0b, // code section, 4 bytes: one body of 2 bytes (no locals, end)
	}
	if got := codeSectionSize(mod); got != 4 {
		t.Errorf("codeSectionSize = %d, want 4", got)
	}
	if got := codeSectionSize(mod[:14]); got != 0 {
		t.Errorf("without a code section: %d, want 0", got)
	}
	rt := wazero.NewRuntime(context.Background())
	defer rt.Close(context.Background())
	if _, err := rt.CompileModule(context.Background(), mod); err != nil {
		t.Fatalf("the test module is not valid: %v", err)
	}
}

// An mmap-backed memory grows in place up to its reservation and no further.
func TestMmapMemory(t *testing.T) {
	m := newMmapMemory(0, 1<<20)
	b := m.Reallocate(64 << 10)
	b[0] = 1
	if b2 := m.Reallocate(1 << 20); len(b2) != 1<<20 || b2[0] != 1 || &b2[0] != &b[0] {
		t.Fatal("did not grow in place")
	}
	if m.Reallocate(1<<20+1) != nil {
		t.Error("grew past the reservation")
	}
	m.Free()
}
