package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/config/configtest"
)

// jsonLooking reports whether `sluice check` must read data as a JSON
// configuration: after an optional UTF-8 byte-order mark and JSON
// whitespace it starts with '{' or '[', or the whole file is one JSON
// value (true, 0, "x") — unless it is a JSON manifest (a top-level
// apiVersion, kind, static_resources…), which the manifest reader takes.
func jsonLooking(data []byte) bool {
	data = bytes.TrimPrefix(data, []byte("\ufeff"))
	t := bytes.TrimLeft(data, " \t\r\n")
	if len(t) == 0 {
		return false
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) == nil && looksLikeManifest(top) {
		return false
	}
	return t[0] == '{' || t[0] == '[' || json.Valid(data)
}

// agreesWithConfig runs `sluice check [--redis] -` on data and returns
// what differs from config.ParseFor: on success "ok" and its rules; on
// failure exactly one line per error of the config package, "<stdin>: "
// and the error with its path (a syntax error may add where it breaks),
// never the manifest reader's messages nor an escaped newline the config
// package's error does not have.
func agreesWithConfig(t *testing.T, data []byte, build config.Build) (accepted bool, err error) {
	t.Helper()
	code, stdout, stderr := checkStdin(t, data, build == config.BuildRedis)
	for _, out := range []string{stdout, stderr} {
		if err := configtest.CheckText(out); err != nil {
			return false, err
		}
	}
	c, perr := config.ParseFor(data, build)
	if perr == nil {
		want := "ok\n"
		for _, r := range c.Rules {
			want += r.Summary() + "\n"
		}
		if code != 0 || stdout != want || stderr != "" {
			return true, fmt.Errorf("exit %d\nstdout:\n%s\nwant:\n%s\nstderr:\n%s", code, stdout, want, stderr)
		}
		return true, nil
	}
	var errs config.Errors
	if !errors.As(perr, &errs) {
		return false, fmt.Errorf("config: %T %v", perr, perr)
	}
	if strings.Contains(stderr, "no sluice configuration found") || strings.Contains(stderr, "yaml:") {
		return false, fmt.Errorf("the manifest reader answered:\n%s\nthe module says:\n%s", stderr, perr)
	}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	// Escaped newlines only where the module's error quotes input (or the
	// syntax hint, " (line L, column C: …)", names the character it stops at).
	n := 0
	for _, l := range lines {
		if i := strings.Index(l, "is not valid JSON (line "); i >= 0 {
			l = l[:i]
		}
		n += strings.Count(l, `\n`)
	}
	if want := strings.Count(perr.Error(), `\n`); n > want {
		return false, fmt.Errorf("%d escaped newlines, the module's error has %d:\n%s", n, want, stderr)
	}
	if code != 1 || stdout != "" || len(lines) < len(errs) || len(lines) > len(errs)+1 {
		return false, fmt.Errorf("exit %d, %d lines for %d errors\nstdout:\n%s\nstderr:\n%s", code, len(lines), len(errs), stdout, stderr)
	}
	for i, e := range errs {
		if want := "<stdin>: " + e.Error(); lines[i] != want && !(e.Msg == "is not valid JSON" && strings.HasPrefix(lines[i], want+" (line ")) {
			return false, fmt.Errorf("line %d is\n%s\nwant\n%s", i, lines[i], want)
		}
	}
	if len(lines) > len(errs) && !strings.HasPrefix(lines[len(errs)], "sluice check: checked for sluice.wasm; ") {
		return false, fmt.Errorf("extra line %q", lines[len(errs)])
	}
	return false, nil
}

// oneLinePerError checks `sluice check`'s output on any input: printable,
// whole lines, and no escaped newline outside input the module quotes (a
// manifest reader's error is split into lines, not escaped).
func oneLinePerError(t *testing.T, data []byte) error {
	t.Helper()
	_, stdout, stderr := checkStdin(t, data, false)
	for _, out := range []string{stdout, stderr} {
		if err := configtest.CheckText(out); err != nil {
			return err
		}
		if out != "" && !strings.HasSuffix(out, "\n") {
			return fmt.Errorf("output does not end a line: %q", out)
		}
	}
	if strings.Contains(stderr, `errors:\n`) || strings.Contains(stderr, `\n  line `) {
		return fmt.Errorf("an escaped multi-line error:\n%s", stderr)
	}
	return nil
}

// TestCheckReadsJSONAsJSON runs `sluice check` and `sluice check --redis`
// on 2,000 edits of the text of valid configurations (configtest.
// TextMutations, seed 1: bytes inserted, deleted, replaced, repeated, the
// text cut short, a byte-order mark before it, the whole file a JSON
// scalar): every file that looks like JSON gets exactly the config
// package's errors with their paths, never the manifest reader's; every
// other file one line per error.
func TestCheckReadsJSONAsJSON(t *testing.T) {
	var looking, other, accepted, refused int
	for _, tc := range configtest.TextMutations(1, 2000) {
		if !jsonLooking(tc.JSON) {
			other++
			if err := oneLinePerError(t, tc.JSON); err != nil {
				t.Errorf("%s %q: %v", tc.Name, tc.JSON, err)
			}
			continue
		}
		looking++
		for _, build := range []config.Build{config.BuildLocal, config.BuildRedis} {
			ok, err := agreesWithConfig(t, tc.JSON, build)
			if err != nil {
				t.Errorf("%s (%v) %q: %v", tc.Name, build, tc.JSON, err)
			}
			if ok {
				accepted++
			} else {
				refused++
			}
		}
	}
	t.Logf("2000 text mutations: %d look like JSON (%d verdicts ok, %d refused), %d do not", looking, accepted, refused, other)
	if looking < 1500 || accepted < 100 || refused < 2000 || other < 20 {
		t.Errorf("the corpus does not exercise every outcome: %d JSON (%d ok, %d refused), %d other", looking, accepted, refused, other)
	}
}

// TestCheckByteOrderMarkAndScalars pins the cases the manifest reader used
// to take: a byte-order mark before a configuration is read as the module
// reads it (accepted), and a file that is one JSON scalar gets the
// module's message.
func TestCheckByteOrderMarkAndScalars(t *testing.T) {
	valid := configtest.Valid()[0].JSON
	for _, tc := range []struct{ in, stdout, stderr string }{
		{"\ufeff" + `{"rules":[{"name":"a","key":[{"path":true}],"algorithm":"fixed_window","limit":5,"window":"1s"}]}`,
			"ok\na: fixed_window 5/1s key=path match=all local enforce\n", ""},
		{"\ufeff \n" + string(valid), "ok\napi-per-key: token_bucket 100/1m burst 20 key=header:x-api-key match=path_prefix:/api/ methods:GET,POST header:x-tenant=\"acme\" local enforce\n", ""},
		{"true", "", "<stdin>: configuration: true is not an object\n"},
		{"0\n", "", "<stdin>: configuration: 0 is not an object\n"},
		{"\ufeff" + "null", "", "<stdin>: configuration: null is not an object\n"},
		{`"rules"`, "", "<stdin>: configuration: \"rules\" is not an object\n"},
		{"\ufeff{", "", "<stdin>: configuration: is not valid JSON (line 1, column 1: unexpected end of JSON input)\n"},
	} {
		code, stdout, stderr := checkStdin(t, []byte(tc.in), false)
		if stdout != tc.stdout || stderr != tc.stderr || (code == 0) != (tc.stderr == "") {
			t.Errorf("%q: exit %d\nstdout %q\nwant   %q\nstderr %q\nwant   %q", tc.in, code, stdout, tc.stdout, stderr, tc.stderr)
		}
	}
}

// FuzzCheck asserts on any input what TestCheckReadsJSONAsJSON asserts on
// its corpus. Its seeds are the valid configurations, the text mutations
// of seed 2 and the cases of TestCheckByteOrderMarkAndScalars (see also
// testdata/fuzz/FuzzCheck).
func FuzzCheck(f *testing.F) {
	for _, c := range configtest.Valid() {
		f.Add(c.JSON)
		f.Add(append([]byte("\ufeff"), c.JSON...))
	}
	for _, c := range configtest.TextMutations(2, 200) {
		f.Add(c.JSON)
	}
	for _, s := range []string{"true", "0", "null", `"x"`, "[]", "\ufeff{", "\ufeff", "rules: []\n", "kind: x\n", "a\n: b"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := oneLinePerError(t, data); err != nil {
			t.Fatal(err)
		}
		if !jsonLooking(data) {
			return
		}
		for _, build := range []config.Build{config.BuildLocal, config.BuildRedis} {
			if _, err := agreesWithConfig(t, data, build); err != nil {
				t.Fatalf("%v: %v", build, err)
			}
		}
	})
}
