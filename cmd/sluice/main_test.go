package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// The command-line conventions of the tool: help on stdout with status 0, the version from
// build information, and a usage error as one line with a pointer to --help.
func TestCommandLineConventions(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		stdout     string // a substring of stdout ("" : stdout must be empty)
		stderrLine string // the single line stderr must hold ("" : stderr must be empty)
	}{
		{[]string{"--help"}, 0, "usage: sluice <command>", ""},
		{[]string{"-h"}, 0, "usage: sluice <command>", ""},
		{[]string{"help"}, 0, "  version    print the version", ""},
		{[]string{"help", "simulate"}, 0, "usage: sluice simulate", ""},
		{[]string{"simulate", "--help"}, 0, "usage: sluice simulate", ""},
		{[]string{"--version"}, 0, "sluice ", ""},
		{[]string{"version"}, 0, runtime.Version(), ""},
		{[]string{"bogus"}, 2, "", `sluice: unknown command "bogus"; see 'sluice --help'`},
		{[]string{"simulate", "--limit", "x"}, 2, "", `sluice simulate: invalid value "x" for flag --limit: parse error; see 'sluice simulate --help'`},
	} {
		var out, errOut bytes.Buffer
		code := dispatch(tc.args, &out, &errOut)
		if code != tc.code {
			t.Errorf("sluice %q: status %d, want %d", tc.args, code, tc.code)
		}
		if tc.stdout == "" && out.Len() != 0 || !strings.Contains(out.String(), tc.stdout) {
			t.Errorf("sluice %q: stdout %q, want it to contain %q", tc.args, out.String(), tc.stdout)
		}
		if got := strings.TrimSuffix(errOut.String(), "\n"); got != tc.stderrLine {
			t.Errorf("sluice %q: stderr %q, want the one line %q", tc.args, errOut.String(), tc.stderrLine)
		}
	}
}
