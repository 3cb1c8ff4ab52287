package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// Every subcommand words a command-line mistake the same way, and `sluice version --help`
// is help, not the version.
func TestFlagErrorsWordedOneWay(t *testing.T) {
	for _, cmd := range []string{"run", "serve", "check", "simulate", "version"} {
		var out, errOut bytes.Buffer
		code := dispatch([]string{cmd, "--nope"}, &out, &errOut)
		want := "sluice " + cmd + ": unknown flag --nope; see 'sluice " + cmd + " --help'\n"
		if code != 2 || out.Len() != 0 || errOut.String() != want {
			t.Errorf("sluice %s --nope: %d, stdout %q, stderr %q, want %q", cmd, code, out.String(), errOut.String(), want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--call-timeout"}, "sluice run: flag --call-timeout needs an argument; see 'sluice run --help'\n"},
		{[]string{"run", "--fail-open=maybe"}, `sluice run: invalid boolean value "maybe" for flag --fail-open: parse error; see 'sluice run --help'` + "\n"},
		{[]string{"serve", "--redis-timeout", "x"}, `sluice serve: invalid value "x" for flag --redis-timeout: parse error; see 'sluice serve --help'` + "\n"},
		{[]string{"version", "extra"}, `sluice version: unexpected argument "extra"; see 'sluice version --help'` + "\n"},
	} {
		var out, errOut bytes.Buffer
		if code := dispatch(tc.args, &out, &errOut); code != 2 || errOut.String() != tc.want {
			t.Errorf("sluice %q: %d %q, want %q", tc.args, code, errOut.String(), tc.want)
		}
	}
}

func TestVersionHelp(t *testing.T) {
	for _, args := range [][]string{{"version", "--help"}, {"version", "-h"}, {"help", "version"}, {"--version", "--help"}} {
		var out, errOut bytes.Buffer
		code := dispatch(args, &out, &errOut)
		if code != 0 || !strings.HasPrefix(out.String(), "usage: sluice version\n") || strings.Contains(out.String(), versionLine()) || errOut.Len() != 0 {
			t.Errorf("sluice %q: %d\nstdout %q\nstderr %q", args, code, out.String(), errOut.String())
		}
	}
	var out bytes.Buffer
	if code := dispatch([]string{"version"}, &out, io.Discard); code != 0 || out.String() != versionLine()+"\n" {
		t.Errorf("sluice version: %d %q", code, out.String())
	}
}
