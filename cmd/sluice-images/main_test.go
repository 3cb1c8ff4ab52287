package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/internal/images"
)

// The command writes the three images and prints each reference with its digest; the
// images themselves are checked in internal/images.
func TestImagesCommand(t *testing.T) {
	dir := t.TempDir()
	wasm, redis, bin := filepath.Join(dir, "a.wasm"), filepath.Join(dir, "b.wasm"), filepath.Join(dir, "sluice")
	os.WriteFile(wasm, []byte("\x00asm\x01\x00\x00\x00a"), 0o644)
	os.WriteFile(redis, []byte("\x00asm\x01\x00\x00\x00b"), 0o644)
	os.WriteFile(bin, []byte("\x7fELF fake"), 0o755)
	out := filepath.Join(dir, "images")
	var stdout, stderr bytes.Buffer
	code := run([]string{"-out", out, "-wasm", wasm, "-redis-wasm", redis, "-serve", "linux/amd64=" + bin, "-tag", "1.2.3"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, name := range []string{images.NameWasm, images.NameRedisWasm, images.NameServe} {
		if !strings.Contains(stdout.String(), images.Registry+"/"+name+":1.2.3  "+images.Registry+"/"+name+"@sha256:") {
			t.Errorf("no digest line for %s:\n%s", name, stdout.String())
		}
		if _, err := os.Stat(filepath.Join(out, name, "index.json")); err != nil {
			t.Error(err)
		}
	}
	for _, args := range [][]string{
		{"-serve", "linux/amd64"},
		{"extra"},
	} {
		stderr.Reset()
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if code := run([]string{"-out", out, "-wasm", bin, "-redis-wasm", redis, "-serve", "linux/amd64=" + bin}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "not a WebAssembly module") {
		t.Errorf("a non-Wasm module: exit %d, %s", code, stderr.String())
	}
}
