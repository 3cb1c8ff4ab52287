package main

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
)

// TestEnableV8Flag sets perf_basic_prof in a copy of a cached Envoy release binary (skipped
// when none is cached) and checks that exactly one byte changed, from 0 to 1.
func TestEnableV8Flag(t *testing.T) {
	if testing.Short() {
		t.Skip("copies an Envoy binary")
	}
	home, _ := os.UserHomeDir()
	src := filepath.Join(home, ".cache", "sluice", "envoy", "1.40.0", "envoy")
	if _, err := os.Stat(src); err != nil {
		t.Skip("no cached Envoy 1.40.0")
	}
	dst := filepath.Join(t.TempDir(), "envoy")
	if err := enableV8Flag(src, dst, "perf_basic_prof"); err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != len(b) {
		t.Fatalf("sizes %d and %d", len(a), len(b))
	}
	var diff []int
	for i := range a {
		if a[i] != b[i] {
			diff = append(diff, i)
		}
	}
	if len(diff) != 1 || a[diff[0]] != 0 || b[diff[0]] != 1 {
		t.Fatalf("changed bytes at %v", diff)
	}
	f, err := elf.Open(dst)
	if err != nil {
		t.Fatalf("the copy is no longer an ELF file: %v", err)
	}
	f.Close()
	if err := enableV8Flag(src, dst, "no_such_v8_flag_name"); err == nil {
		t.Error("an unknown flag was found")
	}
}
