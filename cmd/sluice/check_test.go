package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/config"
)

// TestCheckFixtures runs `sluice check` on every testdata/check/*.json: a
// fixture with a .out file must be valid and print exactly that; one with a
// .err file must fail with exit status 1 and print exactly that on stderr.
func TestCheckFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/check/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			base := strings.TrimSuffix(file, ".json")
			wantOut, errOut := os.ReadFile(base + ".out")
			wantErr, errErr := os.ReadFile(base + ".err")
			if (errOut == nil) == (errErr == nil) {
				t.Fatalf("%s needs exactly one of .out and .err", base)
			}
			var stdout, stderr bytes.Buffer
			code := dispatch([]string{"check", file}, &stdout, &stderr)
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

func TestCheckUsage(t *testing.T) {
	for _, args := range [][]string{{"check"}, {"check", "a.json", "b.json"}, {"check", "--strict"}, {"check", ""}} {
		var stdout, stderr bytes.Buffer
		if code := dispatch(args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if !strings.HasPrefix(stderr.String(), "usage: sluice check FILE\n") || stdout.Len() != 0 {
			t.Errorf("%q: stdout %q stderr %q", args, stdout.String(), stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := dispatch([]string{"check", "-h"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "usage: sluice check FILE\n") {
		t.Errorf("-h: exit %d stdout %q", code, stdout.String())
	}
	stdout.Reset()
	stderr.Reset()
	dispatch([]string{"help"}, &stdout, &stderr)
	if !strings.Contains(stdout.String(), "check      validate a plugin configuration") {
		t.Errorf("check is not listed in the usage:\n%s", stdout.String())
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
