package wasmpatch

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/tetratelabs/wazero"
)

// dataImage is the memory a module's data section writes: its active segments applied, in
// their order, to zeros.
func dataImage(t *testing.T, mod []byte) []byte {
	t.Helper()
	segs := dataOf(t, mod)
	var size uint32
	for _, s := range segs {
		size = max(size, s.offset+uint32(len(s.init)))
	}
	mem := make([]byte, size)
	for _, s := range segs {
		copy(mem[s.offset:], s.init)
	}
	return mem
}

func dataOf(t *testing.T, mod []byte) []dataSegment {
	t.Helper()
	for i := 8; i < len(mod); {
		id := mod[i]
		n, k, err := readU32(mod[i+1:])
		if err != nil {
			t.Fatal(err)
		}
		i += 1 + k
		if id == 11 {
			segs, err := readDataSegments(mod[i : i+int(n)])
			if err != nil {
				t.Fatal(err)
			}
			return segs
		}
		i += int(n)
	}
	return nil
}

// A module with a memory and four active segments: two 3 bytes apart, one 64 bytes after
// (joined), one 65 bytes after that (kept apart).
func dataModule(segs ...[]byte) []byte {
	mod := []byte{0, 'a', 's', 'm', 1, 0, 0, 0, 5, 3, 1, 0, 1} // memory section: min 1 page
	var sec []byte
	sec = appendU32(sec, uint32(len(segs)))
	for _, s := range segs {
		sec = append(sec, s...)
	}
	mod = append(mod, 11)
	mod = appendU32(mod, uint32(len(sec)))
	return append(mod, sec...)
}

func activeSeg(off int32, data ...byte) []byte {
	b := appendS32([]byte{0, 0x41}, off)
	b = append(b, 0x0b)
	b = appendU32(b, uint32(len(data)))
	return append(b, data...)
}

func TestJoinDataSegments(t *testing.T) {
	mod := dataModule(activeSeg(100, 1, 2), activeSeg(105, 3), activeSeg(170, 4, 5), activeSeg(237, 6))
	out, ok := JoinDataSegments(mod)
	if !ok {
		t.Fatal("not merged")
	}
	segs := dataOf(t, out)
	if len(segs) != 2 || segs[0].offset != 100 || len(segs[0].init) != 72 || segs[1].offset != 237 {
		t.Fatalf("merged into %+v", segs)
	}
	if !bytes.Equal(dataImage(t, mod), dataImage(t, out)) {
		t.Fatal("the merged module writes other bytes")
	}
	// wazero accepts both and instantiates them.
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	for _, m := range [][]byte{mod, out} {
		inst, err := rt.InstantiateWithConfig(ctx, m, wazero.NewModuleConfig().WithName(""))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := inst.Memory().Read(100, 140)
		if got[0] != 1 || got[5] != 3 || got[70] != 4 || got[137] != 6 || got[3] != 0 {
			t.Errorf("memory after instantiation: %v", got)
		}
		inst.Close(ctx)
	}
	// Out of address order (as Go writes them): joined in address order.
	unordered := dataModule(activeSeg(50, 1), activeSeg(10, 2), activeSeg(52, 3))
	if out, ok := JoinDataSegments(unordered); !ok || len(dataOf(t, out)) != 1 || !bytes.Equal(dataImage(t, unordered), dataImage(t, out)) {
		t.Errorf("unordered segments: ok %v", ok)
	}
	// Large offsets take multi-byte signed LEBs (bit 6 of the last byte set).
	big := dataModule(activeSeg(0x3000, 9), activeSeg(0x3010, 8))
	if out, ok := JoinDataSegments(big); !ok || len(dataOf(t, out)) != 1 || dataOf(t, out)[0].offset != 0x3000 {
		t.Errorf("large offsets: ok %v", ok)
	}
}

func TestJoinDataSegmentsLeavesOtherShapes(t *testing.T) {
	passive := append([]byte{1}, appendU32(nil, 2)...)
	passive = append(passive, 7, 7)
	for name, mod := range map[string][]byte{
		"passive":     dataModule(activeSeg(0, 1), passive),
		"overlapping": dataModule(activeSeg(10, 1, 2, 3), activeSeg(11, 4)),
		"one segment": dataModule(activeSeg(50, 1)),
		"not wasm":    []byte("not a module"),
	} {
		if out, ok := JoinDataSegments(mod); ok || !bytes.Equal(out, mod) {
			t.Errorf("%s: merged (ok %v)", name, ok)
		}
	}
	withCount := append(dataModule(activeSeg(0, 1), activeSeg(2, 2)), 12, 1, 2) // a data count section after
	if _, ok := JoinDataSegments(withCount); ok {
		t.Error("merged a module with a data count section")
	}
}

// A real Go module: the merged module writes the same memory with far fewer segments.
func TestJoinDataSegmentsGoModule(t *testing.T) {
	mod := BuildModule(t, "testdata/sleeper")
	out, ok := JoinDataSegments(mod)
	if !ok {
		t.Fatal("a Go module was not merged")
	}
	before, after := len(dataOf(t, mod)), len(dataOf(t, out))
	if after*100 > before {
		t.Errorf("%d segments became %d", before, after)
	}
	if !bytes.Equal(dataImage(t, mod), dataImage(t, out)) {
		t.Fatal("the merged module writes other bytes")
	}
	t.Logf("%d data segments -> %d; module %d -> %d bytes", before, after, len(mod), len(out))
}

// BuildModule builds the Go package in dir for wasip1 (-buildmode=c-shared) and returns the
// module; the external tests use it too.
func BuildModule(t *testing.T, dir string) []byte {
	t.Helper()
	if testing.Short() {
		t.Skip("builds " + dir + " (go build, GOOS=wasip1): not under -short")
	}
	out := filepath.Join(t.TempDir(), "m.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, msg)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
