package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const (
	embedLocalConfig = `{"rules": [{"name": "per-ip", "key": [{"remote_ip": true}], "algorithm": "fixed_window", "limit": 5, "window": "10s"}]}`
	embedRedisConfig = `{"rules": [{"name": "per-ip", "key": [{"remote_ip": true}], "algorithm": "fixed_window", "limit": 5, "window": "10s", "backend": "redis"}],
	  "redis": {"cluster": "redis"}}`
)

// Without --wasm, `sluice run` takes the built-in module that fits the configuration, and
// says what to do when it has none.
func TestEmbedDefaultWasm(t *testing.T) {
	saved := builtinModules
	t.Cleanup(func() { builtinModules = saved })
	dir := t.TempDir()
	local, redis := filepath.Join(dir, "local.json"), filepath.Join(dir, "redis.json")
	os.WriteFile(local, []byte(embedLocalConfig), 0o644)
	os.WriteFile(redis, []byte(embedRedisConfig), 0o644)

	builtinModules.local, builtinModules.redis = []byte("local module"), []byte("redis module")
	for _, c := range []struct{ config, want string }{
		{"", builtinLocal},
		{local, builtinLocal},
		{redis, builtinRedis},
		{filepath.Join(dir, "missing.json"), builtinLocal}, // readRunInputs reports it
	} {
		got := defaultWasm(c.config)
		if got != c.want {
			t.Errorf("defaultWasm(%q) = %q, want %q", c.config, got, c.want)
			continue
		}
		b, err := readWasm(got)
		if err != nil || (got == builtinRedis) != (string(b) == "redis module") {
			t.Errorf("readWasm(%q) = %q, %v", got, b, err)
		}
	}

	builtinModules.local, builtinModules.redis = nil, nil
	if got := defaultWasm(local); got != "" {
		t.Fatalf("without built-in modules (and none beside the test binary or in ./dist): %q", got)
	}
	_, err := readWasm("")
	if err == nil || !strings.Contains(err.Error(), "make build") || !strings.Contains(err.Error(), "--wasm") {
		t.Errorf("readWasm(\"\") = %v, want a hint at make build and --wasm", err)
	}
	if _, err := readWasm(filepath.Join(dir, "nope.wasm")); err == nil || !strings.HasPrefix(err.Error(), "reading --wasm: ") {
		t.Errorf("a missing --wasm file: %v", err)
	}
}

// buildEmbedSluice builds cmd/sluice into dir; with modules (name → file) it builds them in as
// `make build` does (-tags embedwasm), the files given through an overlay so that nothing is
// written into the source tree.
func buildEmbedSluice(t *testing.T, dir string, modules map[string]string) string {
	t.Helper()
	skipShort(t, "builds the sluice binary (go build)")
	exe := filepath.Join(dir, "sluice")
	args := []string{"build", "-trimpath", "-o", exe}
	if modules != nil {
		wd, _ := os.Getwd()
		replace := map[string]string{}
		for name, file := range modules {
			replace[filepath.Join(wd, "embedded", name)] = file
		}
		js, _ := json.Marshal(map[string]any{"Replace": replace})
		overlay := filepath.Join(dir, "overlay.json")
		if err := os.WriteFile(overlay, js, 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "-tags", "embedwasm", "-overlay", overlay)
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return exe
}

// startEmbedSluice runs exe run … in cwd and returns its first line and its listen address.
func startEmbedSluice(t *testing.T, exe, cwd string, args ...string) (first, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, exe, append([]string{"run", "--listen", "127.0.0.1:0", "--workers", "1", "--cache-dir", ""}, args...)...)
	cmd.Dir = cwd
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	listening := regexp.MustCompile(`listening on http://(\S+)`)
	for sc.Scan() {
		line := sc.Text()
		if first == "" {
			first = line
		}
		if m := listening.FindStringSubmatch(line); m != nil {
			go func() {
				for sc.Scan() {
				}
			}()
			return first, m[1]
		}
	}
	t.Fatalf("sluice run did not start; stdout %q, stderr:\n%s", first, stderr.String())
	return "", ""
}

// dist/sluice as `make build` makes it runs from any directory: the modules are in the
// binary, --wasm still overrides them, and a binary without them says how to get them.
func TestEmbedRunFromAnotherDirectory(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice twice")
	}
	wasm := buildWasm(t, "../sluice-wasm")
	redisWasm := buildRedisWasm(t)
	bin := t.TempDir()
	exe := buildEmbedSluice(t, bin, map[string]string{"sluice.wasm": wasm, "sluice-redis.wasm": redisWasm})
	elsewhere := t.TempDir() // no dist/ here, nor beside the binary

	first, addr := startEmbedSluice(t, exe, elsewhere)
	if !strings.Contains(first, "filter "+builtinLocal) {
		t.Errorf("start-up line %q, want the built-in sluice.wasm", first)
	}
	for i := 0; i < 6; i++ {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusOK
		if i == 5 {
			want = http.StatusTooManyRequests // the embedded default: 5 per 10 s per client
		}
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
	}

	// --wasm overrides the built-in module.
	out, err := exec.Command(exe, "run", "--wasm", filepath.Join(elsewhere, "other.wasm"), "--listen", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "reading --wasm: ") || !strings.Contains(string(out), "other.wasm") {
		t.Errorf("--wasm with a missing file: %v\n%s", err, out)
	}

	// Built without the modules (go build): the error says what to do.
	plainDir := t.TempDir()
	plain := buildEmbedSluice(t, plainDir, nil)
	cmd := exec.Command(plain, "run", "--listen", "127.0.0.1:0")
	cmd.Dir = elsewhere
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "make build") || !strings.Contains(string(out), "--wasm") {
		t.Errorf("without built-in modules: %v\n%s", err, out)
	}
	// … and takes the module beside it, as dist/sluice beside dist/sluice.wasm.
	b, _ := os.ReadFile(wasm)
	if err := os.WriteFile(filepath.Join(plainDir, "sluice.wasm"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	first, _ = startEmbedSluice(t, plain, elsewhere)
	if !strings.Contains(first, "filter "+filepath.Join(plainDir, "sluice.wasm")) {
		t.Errorf("start-up line %q, want the sluice.wasm beside the binary", first)
	}
}
