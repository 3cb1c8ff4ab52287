package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sluice check validates a bootstrap that loads libsluice.so as the module would: the
// dynamic-module filter's filter_config, for the build with the local backend only.
func TestCheckDynmodBootstrap(t *testing.T) {
	data, err := os.ReadFile("../../envoy/envoy-dynmod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := runCheck(args, &out, &errb)
		return code, out.String(), errb.String()
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, data, 0o644)
	if code, out, errs := run(good); code != 0 || !strings.Contains(out, "listener ingress, filter sluice: ok") {
		t.Fatalf("example bootstrap: %d\n%s%s", code, out, errs)
	}
	// An rls rule: sluice.wasm takes it, libsluice.so does not.
	bad := strings.Replace(string(data), `"algorithm": "token_bucket",`, `"algorithm": "token_bucket", "backend": "rls",`, 1)
	bad = strings.Replace(bad, `"failure_mode": "open",`, `"failure_mode": "open", "rls": {"cluster": "rls", "domain": "d"},`, 1)
	badPath := filepath.Join(dir, "bad.yaml")
	os.WriteFile(badPath, []byte(bad), 0o644)
	code, out, errs := run(badPath)
	if code != 1 || !strings.Contains(errs, `filter sluice: rules[0].backend: "rls" needs sluice.wasm`) || !strings.Contains(errs, "libsluice.so has the \"local\" backend only") {
		t.Fatalf("rls rule in the dynamic module: %d\n%s%s", code, out, errs)
	}
	// The same configuration alone: accepted for sluice.wasm, refused with --target dynmod.
	i, j := strings.Index(bad, "{\n                    \"rules\""), strings.Index(bad, "          - name: envoy.filters.http.router")
	cfg := filepath.Join(dir, "rls.json")
	os.WriteFile(cfg, []byte(bad[i:j]), 0o644)
	if code, out, errs := run(cfg); code != 0 {
		t.Fatalf("for sluice.wasm: %d\n%s%s", code, out, errs)
	}
	if code, _, errs := run("--target", "dynmod", cfg); code != 1 || !strings.Contains(errs, `"rls" needs sluice.wasm`) {
		t.Fatalf("--target dynmod: %d\n%s", code, errs)
	}
	if code, _, errs := run("--target", "nginx", cfg); code != 2 || !strings.Contains(errs, "want wasm, redis or dynmod") {
		t.Fatalf("--target nginx: %d %s", code, errs)
	}
}
