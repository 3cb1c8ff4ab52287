package filtertest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

var (
	buildMu sync.Mutex
	built   = map[string][]byte{}
)

// Wasm returns BuildWasm(tags) for a test: under go test -short (the unit
// tier, which runs no subprocess) it skips tb; a failed build fails it.
func Wasm(tb testing.TB, tags string) []byte {
	tb.Helper()
	SkipShort(tb, "builds the wasm module")
	b, err := BuildWasm(tags)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// SkipShort skips tb under go test -short, saying what the test would run
// that the unit tier does not: a subprocess (go build, the sluice binary).
func SkipShort(tb testing.TB, what string) {
	tb.Helper()
	if testing.Short() {
		tb.Skip(what + " (a subprocess): not under -short")
	}
}

// BuildWasm compiles ./cmd/sluice-wasm with GOOS=wasip1 GOARCH=wasm
// -buildmode=c-shared and the given build tags (comma-separated, "" for
// none) and returns the module bytes. Tests call Wasm, which skips under
// -short; BuildWasm is for code without a testing.TB. It builds once per tag set per test
// binary, in a temporary directory it removes.
func BuildWasm(tags string) ([]byte, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := built[tags]; ok {
		return b, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-wasm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "sluice.wasm")
	args := []string{"build", "-buildmode=c-shared", "-trimpath", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "./cmd/sluice-wasm")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, errors.New("go build of the wasm module: " + err.Error() + "\n" + string(msg))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	// What the Makefile ships: the module answers poll_oneoff itself (internal/wasmpatch).
	if b, err = wasmpatch.PollOneoff(b); err != nil {
		return nil, err
	}
	built[tags] = b
	return b, nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the sluice module")
	}
	return filepath.Dir(mod), nil
}

// Export is one entry of a module's export section.
type Export struct {
	Name  string
	Kind  byte // 0 func, 1 table, 2 memory, 3 global
	Index uint32
}

// Exports parses the export section of a wasm binary.
func Exports(wasm []byte) ([]Export, error) {
	_, body, _, err := findSection(wasm, 7)
	if err != nil {
		return nil, err
	}
	if body == nil {
		return nil, nil
	}
	r := &reader{b: body}
	n := r.uleb()
	var out []Export
	for i := uint32(0); i < n && r.err == nil; i++ {
		name := r.bytes()
		kind := r.byte()
		idx := r.uleb()
		out = append(out, Export{Name: string(name), Kind: kind, Index: idx})
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// AddStartAlias returns a copy of wasm whose export section also exports
// the function exported as _initialize under the name _start. The proxytest
// emulator (wazero's default module config) runs _start, while a Go
// c-shared module initialises its runtime in _initialize. The input is not
// modified.
func AddStartAlias(wasm []byte) ([]byte, error) {
	start, body, end, err := findSection(wasm, 7)
	if err != nil {
		return nil, err
	}
	if body == nil {
		return nil, errors.New("module has no export section")
	}
	exps, err := Exports(wasm)
	if err != nil {
		return nil, err
	}
	idx, found := uint32(0), false
	for _, e := range exps {
		if e.Name == "_start" {
			return nil, errors.New("module already exports _start")
		}
		if e.Name == "_initialize" && e.Kind == 0 {
			idx, found = e.Index, true
		}
	}
	if !found {
		return nil, errors.New("module does not export _initialize")
	}
	var nb []byte
	nb = appendULEB(nb, uint32(len(exps)+1))
	r := &reader{b: body}
	r.uleb()
	nb = append(nb, body[r.off:]...)
	nb = appendULEB(nb, uint32(len("_start")))
	nb = append(nb, "_start"...)
	nb = append(nb, 0)
	nb = appendULEB(nb, idx)
	var out bytes.Buffer
	out.Write(wasm[:start])
	out.WriteByte(7)
	out.Write(appendULEB(nil, uint32(len(nb))))
	out.Write(nb)
	out.Write(wasm[end:])
	return out.Bytes(), nil
}

// findSection returns the offset of section id's id byte, its body, and
// the offset just past it (body nil when absent).
func findSection(wasm []byte, id byte) (start int, body []byte, end int, err error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return 0, nil, 0, errors.New("not a wasm binary")
	}
	r := &reader{b: wasm, off: 8}
	for r.off < len(wasm) && r.err == nil {
		s := r.off
		sid := r.byte()
		size := int(r.uleb())
		if r.err != nil || size < 0 || r.off+size > len(wasm) {
			return 0, nil, 0, errors.New("malformed section header")
		}
		if sid == id {
			return s, wasm[r.off : r.off+size], r.off + size, nil
		}
		r.off += size
	}
	return 0, nil, 0, r.err
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) byte() byte {
	if r.off >= len(r.b) {
		r.err = errors.New("unexpected end of wasm data")
		return 0
	}
	c := r.b[r.off]
	r.off++
	return c
}

func (r *reader) uleb() uint32 {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v
		}
	}
	r.err = errors.New("uleb128 too long")
	return 0
}

func (r *reader) bytes() []byte {
	n := int(r.uleb())
	if r.err != nil || n < 0 || r.off+n > len(r.b) {
		r.err = errors.New("unexpected end of wasm data")
		return nil
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b
}

func appendULEB(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}
