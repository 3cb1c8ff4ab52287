package startup

import (
	"os"
	"runtime"
	"syscall"
	"testing"
)

// ReadMem splits VmRSS and finds anonymous executable memory (what wazero's compiled code
// is): 4 MiB mapped, touched and made executable here must show in AnonExec.
func TestReadMem(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Fatalf("package startup reads /proc: Linux only (GOOS %s)", runtime.GOOS)
	}
	before, err := ReadMem(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	for i := 0; i < size; i += 4096 {
		b[i] = 1
	}
	if err := syscall.Mprotect(b, syscall.PROT_READ|syscall.PROT_EXEC); err != nil {
		t.Fatal(err)
	}
	after, err := ReadMem(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := after.AnonExec - before.AnonExec; got < size/1024 {
		t.Errorf("AnonExec grew by %d KiB, want at least %d (before %+v, after %+v)", got, size/1024, before, after)
	}
	if after.RSS < after.File+after.Anon || after.File <= 0 || after.Anon < size/1024 {
		t.Errorf("split %+v: want RSS >= File + Anon, both positive", after)
	}
}
