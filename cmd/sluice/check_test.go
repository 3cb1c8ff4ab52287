package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/config/configtest"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
	hostredis "github.com/sluice-proxy/sluice/host/redis"
	"github.com/sluice-proxy/sluice/internal/redisclient"
)

// TestCheckFixtures runs `sluice check` and `sluice check --redis` on every
// testdata/check/*.json: for each, BASE.out (BASE.redis.out with --redis)
// means the fixture must be valid and print exactly that, BASE.err
// (BASE.redis.err) that it must fail with exit status 1 and print exactly
// that on stderr.
func TestCheckFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/check/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		for _, mode := range []struct {
			suffix string
			args   []string
		}{{"", nil}, {".redis", []string{"--redis"}}} {
			t.Run(filepath.Base(file)+mode.suffix, func(t *testing.T) {
				base := strings.TrimSuffix(file, ".json") + mode.suffix
				wantOut, errOut := os.ReadFile(base + ".out")
				wantErr, errErr := os.ReadFile(base + ".err")
				if (errOut == nil) == (errErr == nil) {
					t.Fatalf("%s needs exactly one of .out and .err", base)
				}
				var stdout, stderr bytes.Buffer
				code := dispatch(append(append([]string{"check"}, mode.args...), file), &stdout, &stderr)
				if errOut == nil {
					if code != 0 || stdout.String() != string(wantOut) || stderr.Len() != 0 {
						t.Errorf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", code, stdout.String(), wantOut, stderr.String())
					}
					return
				}
				if code != 1 || stderr.String() != string(wantErr) || stdout.Len() != 0 {
					t.Errorf("exit %d\nstderr:\n%s\nwant:\n%s\nstdout:\n%s", code, stderr.String(), wantErr, stdout.String())
				}
			})
		}
	}
}

func TestCheckUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check"}, "no FILE"},
		{[]string{"check", "-", "a.json", "-"}, `"-" (standard input) given twice`},
		{[]string{"check", "--strict"}, "unknown flag --strict"},
		{[]string{"check", "-\nx"}, `unknown flag "-\nx"`},
		{[]string{"check", ""}, "empty FILE"},
		{[]string{"check", "--redis"}, "no FILE"},
		{[]string{"check", "--redis", "a", "b", "--strict"}, "unknown flag --strict"},
	} {
		var stdout, stderr bytes.Buffer
		if code := dispatch(tc.args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", tc.args, code)
		}
		if want := "sluice check: " + tc.want + "; see 'sluice check --help'\n"; stderr.String() != want || stdout.Len() != 0 {
			t.Errorf("%q: stdout %q stderr %q, want %q", tc.args, stdout.String(), stderr.String(), want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"check", "-h"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "usage: sluice check [--redis | --target wasm|redis|dynmod] [--explain KIND=VALUE]... FILE...\n") {
		t.Errorf("-h: exit %d stdout %q", code, stdout.String())
	}
	stdout.Reset()
	stderr.Reset()
	dispatch([]string{"help"}, &stdout, &stderr)
	if !strings.Contains(stdout.String(), "check      validate a plugin configuration") {
		t.Errorf("check is not listed in the usage:\n%s", stdout.String())
	}
}

// Several files: each is checked and reported under its name, valid ones on stdout
// ("NAME: ok" and their rules indented), errors on stderr; the exit status is 1 when any
// file fails, and the --redis hint comes once, at the end.
func TestCheckSeveralFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.json", `{"rules":[{"name":"a","key":[{"header":"x-api-key"}],"missing_key":"deny","algorithm":"fixed_window","limit":5,"window":"1s"}]}`)
	scoped := write("scoped.json", `{"_rules_":[{"_match_route_":["r"],"rules":[{"name":"b","key":[{"path":true}],"algorithm":"fixed_window","limit":1,"window":"1s"}]}]}`)
	bad := write("bad.json", `{"rules":[{"name":"c","key":[{"path":true}],"algorithm":"sliding_log","limit":20000,"burst":5,"window":"1s"}]}`)
	redis := write("redis.json", `{"rules":[{"name":"d","key":[{"path":true}],"algorithm":"fixed_window","limit":1,"window":"1s","backend":"redis"}],"redis":{"cluster":"c"}}`)
	missing := filepath.Join(dir, "missing.json")

	var stdout, stderr bytes.Buffer
	code := dispatch([]string{"check", good, bad, scoped, missing, redis}, &stdout, &stderr)
	wantOut := good + ": ok\n" +
		"  a: fixed_window 5/1s key=header:x-api-key missing_key=deny match=all local enforce\n" +
		scoped + ": ok\n" +
		"  scope rules_0 (_rules_[0]): route r\n" +
		"    b: fixed_window 1/1s key=path match=all local enforce\n"
	wantErr := bad + ": rules[0].limit: must be at most 10000 for sliding_log\n" +
		bad + ": rules[0].burst: applies only to token_bucket and leaky_bucket, not sliding_log\n" +
		"sluice check: cannot read configuration: open " + missing + ": no such file or directory\n" +
		redis + `: rules[0].backend: "redis" needs sluice-redis.wasm (a host with Higress's Redis calls); sluice.wasm has the "local" and "rls" backends only` + "\n" +
		"sluice check: checked for sluice.wasm; `sluice check --redis` checks for sluice-redis.wasm\n"
	if code != 1 || stdout.String() != wantOut || stderr.String() != wantErr {
		t.Errorf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s\nwant:\n%s", code, stdout.String(), wantOut, stderr.String(), wantErr)
	}

	stdout.Reset()
	stderr.Reset()
	if code := dispatch([]string{"check", "--redis", good, redis}, &stdout, &stderr); code != 0 || stderr.Len() != 0 ||
		stdout.String() != good+": ok\n  a: fixed_window 5/1s key=header:x-api-key missing_key=deny match=all local enforce\n"+
			redis+": ok\n  d: fixed_window 1/1s key=path match=all redis enforce\n" {
		t.Errorf("all valid: exit %d stdout %q stderr %q", code, stdout.String(), stderr.String())
	}
}

func TestCheckUnreadable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	missing := filepath.Join(t.TempDir(), "missing.json")
	code := dispatch([]string{"check", missing}, &stdout, &stderr)
	want := "sluice check: cannot read configuration: open " + missing + ": no such file or directory\n"
	if code != 1 || stderr.String() != want || stdout.Len() != 0 {
		t.Errorf("exit %d stderr %q, want 1 %q", code, stderr.String(), want)
	}
	code = dispatch([]string{"check", t.TempDir()}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("a directory: exit %d, want 1", code)
	}
}

func TestCheckStdin(t *testing.T) {
	defer func(r any) { stdin = r.(*os.File) }(stdin)
	stdin = strings.NewReader(`{"rules":[{"name":"a","key":[{"path":true}],"algorithm":"fixed_window","limit":5,"window":"1s"}]}`)
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"check", "-"}, &stdout, &stderr); code != 0 || stdout.String() != "ok\na: fixed_window 5/1s key=path match=all local enforce\n" {
		t.Errorf("exit %d stdout %q stderr %q", code, stdout.String(), stderr.String())
	}
	stdin = strings.NewReader(`{"rules":[]}`)
	stdout.Reset()
	if code := dispatch([]string{"check", "-"}, &stdout, &stderr); code != 1 || stderr.String() != "<stdin>: rules: must contain at least one rule\n" {
		t.Errorf("exit %d stderr %q", code, stderr.String())
	}
	stdin = strings.NewReader(strings.Repeat(" ", config.MaxConfigSize+10))
	stderr.Reset()
	if code := dispatch([]string{"check", "-"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "bytes is more than the limit") {
		t.Errorf("exit %d stderr %q", code, stderr.String())
	}
}

func TestSyntaxHint(t *testing.T) {
	for in, want := range map[string]string{
		"{\n  \"a\": 1,\n}":   " (line 3, column 1: invalid character '}' looking for beginning of object key string)",
		`{"a": tru}`:          " (line 1, column 10: invalid character '}' in literal true (expecting 'e'))",
		`{"a": 1}`:            "",
		"{\"a\":\n\n  [1 2]}": " (line 3, column 6: invalid character '2' after array element)",
	} {
		if got := syntaxHint([]byte(in)); got != want {
			t.Errorf("syntaxHint(%q) = %q, want %q", in, got, want)
		}
	}
}

// corpus is what the end-to-end tests of check judge: the valid
// configurations, every bound at its boundary and one past it, and
// hostile mutations of the valid ones (config/configtest).
func corpus(mutations int) []configtest.Case {
	return append(append(configtest.Valid(), configtest.Boundaries()...), configtest.Mutations(1, mutations)...)
}

// checkStdin runs `sluice check [--redis] -` on data.
func checkStdin(t *testing.T, data []byte, redis bool) (code int, stdout, stderr string) {
	t.Helper()
	defer func(r io.Reader) { stdin = r }(stdin)
	stdin = bytes.NewReader(data)
	args := []string{"check", "-"}
	if redis {
		args = []string{"check", "--redis", "-"}
	}
	var out, errOut bytes.Buffer
	code = dispatch(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCheckHostileConfigurations runs `sluice check` and `sluice check
// --redis` on 2,000 hostile mutations of valid configurations (control
// characters, newlines, quotes, backslashes, non-printing runes and invalid
// UTF-8 in member names and values, raw or escaped), the valid ones and the
// boundaries: the output never holds a byte below 0x20 other than the
// newline ending each line, no DEL, no invalid UTF-8 and no non-printing
// rune; it has one line per error (so no input forges a line), each the
// file name and an error of config.ParseFor for that build, or "ok" and one
// line per rule; and the verdict is ParseFor's.
func TestCheckHostileConfigurations(t *testing.T) {
	var ok, refused int
	for _, tc := range corpus(2000) {
		for _, build := range []config.Build{config.BuildLocal, config.BuildRedis} {
			code, stdout, stderr := checkStdin(t, tc.JSON, build == config.BuildRedis)
			for _, out := range []string{stdout, stderr} {
				if err := configtest.CheckText(out); err != nil {
					t.Fatalf("%s (%v): %v", tc.Name, build, err)
				}
				if out != "" && !strings.HasSuffix(out, "\n") {
					t.Fatalf("%s (%v): output does not end a line: %q", tc.Name, build, out)
				}
			}
			c, err := config.ParseFor(tc.JSON, build)
			if err == nil {
				ok++
				want := "ok\n"
				for _, r := range c.Rules {
					want += r.Summary() + "\n"
				}
				if code != 0 || stdout != want || stderr != "" {
					t.Fatalf("%s (%v): exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", tc.Name, build, code, stdout, want, stderr)
				}
				continue
			}
			refused++
			var errs config.Errors
			if !errors.As(err, &errs) {
				t.Fatalf("%s: %T %v", tc.Name, err, err)
			}
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			if code != 1 || stdout != "" || len(lines) < len(errs) || len(lines) > len(errs)+1 {
				t.Fatalf("%s (%v): exit %d, %d lines for %d errors\nstdout:\n%s\nstderr:\n%s", tc.Name, build, code, len(lines), len(errs), stdout, stderr)
			}
			for i, e := range errs {
				if want := "<stdin>: " + e.Error(); lines[i] != want && !(e.Msg == "is not valid JSON" && strings.HasPrefix(lines[i], want+" (line ")) {
					t.Fatalf("%s (%v): line %d is\n%s\nwant\n%s", tc.Name, build, i, lines[i], want)
				}
			}
			if len(lines) > len(errs) && !strings.HasPrefix(lines[len(errs)], "sluice check: checked for sluice.wasm; ") {
				t.Fatalf("%s (%v): extra line %q", tc.Name, build, lines[len(errs)])
			}
		}
	}
	t.Logf("%d verdicts ok, %d refused", ok, refused)
	if ok < 50 || refused < 3000 {
		t.Errorf("the corpus does not exercise both verdicts: %d ok, %d refused", ok, refused)
	}
}

// moduleVerdicts loads each configuration into the compiled module of the
// given build tags ("" is sluice.wasm, "redis" sluice-redis.wasm) in the
// embedded host, one VM reused for all (Host.Reconfigure: a new root
// context, whose proxy_on_configure answers), and returns, per
// configuration, "" when the module loaded it or the module's log line
// saying why not.
func moduleVerdicts(t *testing.T, tags string, cases []configtest.Case) []string {
	t.Helper()
	wasm := filtertest.Wasm(t, tags)
	logs := &logRecorder{}
	opts := host.Options{
		Wasm:         wasm,
		PluginConfig: configtest.Valid()[0].JSON,
		Workers:      1,
		Logger:       slog.New(logs),
	}
	if tags == "redis" {
		// Higress's Redis calls, on no cluster: proxy_redis_init fails,
		// which the filter logs and survives (Redis rules follow
		// failure_mode); it is not a configuration verdict.
		c := redisclient.New(map[string][]string{}, redisclient.Options{})
		defer c.Close()
		opts.Extensions = []host.Extension{hostredis.NewExtension(c, nil)}
	}
	ctx := context.Background()
	h, err := host.New(ctx, opts)
	if err != nil {
		t.Fatalf("%s: %v\n%s", tags, err, logs.text())
	}
	defer h.Close(ctx)
	verdicts := make([]string, len(cases))
	for i, tc := range cases {
		logs.reset()
		restarts := h.Stats().VMRestarts
		err := h.Reconfigure(ctx, 0, tc.JSON)
		if h.Stats().VMRestarts != restarts {
			t.Fatalf("%s: the module trapped on %s: %v\n%s", tags, tc.Name, err, logs.text())
		}
		if err == nil {
			continue
		}
		verdicts[i] = logs.critical()
		if verdicts[i] == "" {
			t.Fatalf("%s: %s refused without a critical log line: %v\n%s", tags, tc.Name, err, logs.text())
		}
	}
	return verdicts
}

// TestCheckAgreesWithModule: for the valid configurations, each bound at
// its boundary and one past it, and 300 hostile mutations, `sluice check`
// says ok exactly when sluice.wasm loads the configuration (its
// proxy_on_configure returns true in the embedded host), and `sluice check
// --redis` exactly when sluice-redis.wasm does; when they refuse, the
// module logs the very errors check prints.
func TestCheckAgreesWithModule(t *testing.T) {
	cases := corpus(300)
	for _, b := range []struct {
		tags  string
		redis bool
	}{{"", false}, {"redis", true}} {
		verdicts := moduleVerdicts(t, b.tags, cases)
		ok := 0
		for i, tc := range cases {
			code, _, stderr := checkStdin(t, tc.JSON, b.redis)
			loaded := verdicts[i] == ""
			if (code == 0) != loaded {
				t.Errorf("%s --redis=%v: check exit %d, module loaded %v\ncheck:\n%s\nmodule:\n%s", tc.Name, b.redis, code, loaded, stderr, verdicts[i])
				continue
			}
			if loaded {
				ok++
				continue
			}
			// The module logs "sluice: invalid plugin configuration:" and
			// the errors, one per line; check prints each after the file
			// name (a syntax error with a location the guest does not
			// compute, and a hint line after the errors).
			if err := configtest.CheckText(verdicts[i]); err != nil {
				t.Errorf("%s: module log: %v", tc.Name, err)
			}
			logged := strings.Split(verdicts[i], "\n")
			if logged[0] != "sluice: invalid plugin configuration:" {
				t.Errorf("%s: module log %q", tc.Name, verdicts[i])
				continue
			}
			printed := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			for j, l := range logged[1:] {
				if j >= len(printed) || printed[j] != "<stdin>: "+l && !strings.HasPrefix(printed[j], "<stdin>: "+l+" (line ") {
					t.Errorf("%s: module logged\n%s\ncheck printed\n%s", tc.Name, verdicts[i], stderr)
					break
				}
			}
		}
		t.Logf("build %q: %d configurations, %d loaded", b.tags, len(cases), ok)
		if ok < 20 || len(cases)-ok < 200 {
			t.Errorf("build %q: the corpus does not exercise both verdicts (%d of %d loaded)", b.tags, ok, len(cases))
		}
	}
}

// logRecorder is a slog.Handler that keeps the messages of the host's log.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = nil
}

// critical returns the guest's critical-level messages (proxy_log level 5,
// slog level 12), one after the other.
func (l *logRecorder) critical() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var msgs []string
	for _, r := range l.recs {
		if r.Level >= slog.Level(12) {
			msgs = append(msgs, r.Message)
		}
	}
	return strings.Join(msgs, "\n")
}

func (l *logRecorder) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs {
		b.WriteString(r.Level.String() + " " + r.Message + "\n")
	}
	return b.String()
}

// TestRunLogsEscapedConfigErrors: `sluice run` with a configuration whose
// member names and values hold a forged error line, terminal escapes and
// non-printing runes exits 1, and its output — run's own error, printed
// once (the module's critical log line, one per worker, is not repeated) —
// escapes all of it: no control character, no line that starts where the
// forged one would.
func TestRunLogsEscapedConfigErrors(t *testing.T) {
	wasm := filtertest.Wasm(t, "")
	dir := t.TempDir()
	wasmPath := filepath.Join(dir, "sluice.wasm")
	if err := os.WriteFile(wasmPath, wasm, 0o644); err != nil {
		t.Fatal(err)
	}
	hostile, err := os.ReadFile("testdata/check/hostile.json")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "hostile.json")
	if err := os.WriteFile(cfgPath, hostile, 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := dispatch([]string{"run", "--wasm", wasmPath, "--config", cfgPath, "--listen", "127.0.0.1:0", "--workers", "1", "--cache-dir", ""}, &stdout, &stderr)
	out := stdout.String() + stderr.String()
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	if err := configtest.CheckText(out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`rules[0].key[0]["ok\nrules[0].limit: 0 is out of range 1..1000000000"]: unknown field`,
		`rules[0].match.headers[1]["x\x1b[2Jy"]: unknown field`,
		`["fail\x7fure_mode"]: unknown field`,
		"proxy_on_configure returned false",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "is not a duration"); n != 1 {
		t.Errorf("the errors printed %d times, want once:\n%s", n, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "rules[") || strings.HasPrefix(line, "ok") {
			t.Errorf("forged line %q in\n%s", line, out)
		}
	}
}

// TestCheckManifests checks the plugin configurations inside the manifests
// of envoy/ — each must be ok, reported with where it was found — and that
// the manifests without one are refused.
func TestCheckManifests(t *testing.T) {
	valid := map[string][]string{
		"../../envoy/envoy.yaml":                {"listener ingress, filter sluice"},
		"../../envoy/istio-wasmplugin.yaml":     {"WasmPlugin istio-system/sluice"},
		"../../envoy/istio-wasmplugin-rls.yaml": {"WasmPlugin istio-system/sluice-rls"},
		"../../envoy/istio-routes.yaml":         {"document 2, WasmPlugin istio-system/sluice-shop"},
		"../../envoy/higress-wasmplugin.yaml":   {"WasmPlugin higress-system/sluice"},
		"testdata/check/lds.yaml":               {"listener public, filter chain tls, filter sluice", "listener public, filter chain plain, filter limits"},
		"testdata/check/bootstrap.json":         {"listener edge, filter sluice"},
		"testdata/check/envoyfilter.yaml":       {"EnvoyFilter istio-system/sluice, configPatches[0], filter sluice"},
	}
	var all []string
	for file, wheres := range valid {
		all = append(all, file)
		var stdout, stderr bytes.Buffer
		if code := dispatch([]string{"check", file}, &stdout, &stderr); code != 0 || stderr.Len() != 0 {
			t.Errorf("%s: exit %d, stderr:\n%s", file, code, stderr.String())
		}
		for _, w := range wheres {
			if !strings.Contains(stdout.String(), file+": "+w+": ok\n  ") {
				t.Errorf("%s: no %q: ok and its rules in\n%s", file, w, stdout.String())
			}
		}
	}
	// All at once, the plain JSON configurations of envoy/ with them.
	var stdout, stderr bytes.Buffer
	if code := dispatch(append([]string{"check", "../../envoy/grpc.json", "../../envoy/rls.json"}, all...), &stdout, &stderr); code != 0 || stderr.Len() != 0 {
		t.Errorf("all at once: exit %d, stderr:\n%s", code, stderr.String())
	}
	// The Higress plugin loads sluice-redis.wasm: its Redis rules are checked
	// for that build, and its scopes are named as matchRules.
	stdout.Reset()
	dispatch([]string{"check", "../../envoy/higress-wasmplugin.yaml"}, &stdout, &stderr)
	for _, want := range []string{"  api-per-key: sliding_window 1000/1m key=header:x-api-key match=path_prefix:/api/ redis enforce\n",
		"  scope shop (matchRules[0]): route shop/checkout,shop/cart\n    per-client: token_bucket 20/1m burst 5"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("higress: no %q in\n%s", want, stdout.String())
		}
	}
	// A Wasm filter that is not sluice is named and skipped.
	stdout.Reset()
	dispatch([]string{"check", "testdata/check/lds.yaml"}, &stdout, &stderr)
	if want := "testdata/check/lds.yaml: listener internal, filter auth: skipped: not sluice (module /etc/envoy/auth.wasm)\n"; !strings.Contains(stdout.String(), want) {
		t.Errorf("lds.yaml: no %q in\n%s", want, stdout.String())
	}

	for _, file := range []string{"../../envoy/istio-mesh-config.yaml", "../../envoy/istio-ratelimit-service.yaml", "../../envoy/ratelimit-service.yaml", "../../envoy/ratelimit-service-config.yaml"} {
		var stdout, stderr bytes.Buffer
		code := dispatch([]string{"check", file}, &stdout, &stderr)
		if code != 1 || !strings.HasPrefix(stderr.String(), file+": no sluice configuration found in ") {
			t.Errorf("%s: exit %d, stderr %q", file, code, stderr.String())
		}
	}
}

// TestCheckManifestErrors breaks the manifests and checks that every error
// names where it is: the filter or the WasmPlugin, and the path in the
// manifest's own terms.
func TestCheckManifestErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		file     string
		old, new []string // replaced in turn, each exactly once
		args     []string
		want     []string // stderr lines after "FILE: "
	}{
		{file: "../../envoy/envoy.yaml",
			old:  []string{`"limit": 100, "window": "1m", "burst": 20`, `"limit": 600`},
			new:  []string{`"limit": 100, "window": "1x", "burst": 20`, `"limit": 0`},
			want: []string{`listener ingress, filter sluice: rules[0].window: "1x" is not a duration`, `listener ingress, filter sluice: rules[1].limit: 0 is out of range 1..1000000000`}},
		{file: "../../envoy/envoy.yaml",
			old:  []string{`"@type": type.googleapis.com/google.protobuf.StringValue`},
			new:  []string{`"@type": type.googleapis.com/google.protobuf.BytesValue`},
			want: []string{`listener ingress, filter sluice: configuration: the @type is "type.googleapis.com/google.protobuf.BytesValue", not type.googleapis.com/google.protobuf.StringValue: sluice reads its configuration as JSON text`}},
		{file: "../../envoy/envoy.yaml",
			old:  []string{`"failure_mode": "open",`},
			new:  []string{`"failure_mode": "open"`},
			want: []string{`listener ingress, filter sluice: configuration.value: is not valid JSON (line 20, column 3: invalid character '"' after object key:value pair)`}},
		{file: "../../envoy/istio-wasmplugin.yaml",
			old:  []string{"      window: 1m\n    response:", "      status: 429"},
			new:  []string{"      window: 1x\n    response:", "      status: 99"},
			want: []string{`WasmPlugin istio-system/sluice: pluginConfig.rules[1].window: "1x" is not a duration`, `WasmPlugin istio-system/sluice: pluginConfig.response.status: 99 is out of range 200..599`}},
		{file: "../../envoy/higress-wasmplugin.yaml",
			old: []string{"    - shop/cart", "        limit: 20\n", "      window: 1m\n      backend: redis\n    - name: login"},
			new: []string{"    - \"\"", "        limit: 0\n", "      window: 1m\n      backend: redsi\n    - name: login"},
			want: []string{`WasmPlugin higress-system/sluice: defaultConfig.rules[0].backend: "redsi" is not one of local, redis, rls`,
				`WasmPlugin higress-system/sluice: matchRules[0].config.rules[0].limit: 0 is out of range 1..1000000000`,
				`WasmPlugin higress-system/sluice: matchRules[0].ingress[1]: "" is empty`}},
		// sluice.wasm named by the plugin: its Redis rules are refused.
		{file: "../../envoy/higress-wasmplugin.yaml",
			old:  []string{"sluice-redis:0.1.0", "      scope: partners"},
			new:  []string{"sluice:0.1.0", "      scope: part.ners"},
			want: []string{`WasmPlugin higress-system/sluice: defaultConfig.rules[0].backend: "redis" needs sluice-redis.wasm`}},
		{file: "testdata/check/ecds.yaml",
			want: []string{`filter sluice-ecds: rules[0].window: "1x" is not a duration`, `filter sluice-ecds: rules[0].burst: applies only to token_bucket and leaky_bucket, not sliding_log`}},
		{file: "../../envoy/envoy.yaml",
			old:  []string{"  listeners:\n"},
			new:  []string{"  listeners:\n   x: [\n"},
			want: []string{`yaml: line 16: did not find expected node content`}},
	} {
		data, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		s := string(data)
		for i := range tc.old {
			if strings.Count(s, tc.old[i]) != 1 {
				t.Fatalf("%s: %q is not there exactly once", tc.file, tc.old[i])
			}
			s = strings.Replace(s, tc.old[i], tc.new[i], 1)
		}
		name := filepath.Join(dir, filepath.Base(tc.file))
		if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code := dispatch(append(append([]string{"check"}, tc.args...), name), &stdout, &stderr)
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		if code != 1 {
			t.Errorf("%s %v: exit %d, want 1; stderr:\n%s", tc.file, tc.old, code, stderr.String())
		}
		for _, w := range tc.want {
			found := false
			for _, l := range lines {
				found = found || strings.HasPrefix(l, name+": "+w)
			}
			if !found {
				t.Errorf("%s %v: no line %q in\n%s", tc.file, tc.old, name+": "+w, stderr.String())
			}
		}
	}
}
