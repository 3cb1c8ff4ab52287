package build

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseCPU(t *testing.T) {
	// A name with a space and a ')' in it: fields count from the last ')'.
	stat := "4242 (envoy (wrk) x) S 1 4242 4242 0 -1 4194560 8000 0 0 0 1234 567 0 0 20 0 9 0 100 1000000 5000 18446744073709551615\n"
	got, err := ParseCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := (1234 + 567) * 10 * time.Millisecond; got != want {
		t.Errorf("ParseCPU = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "4242 envoy S 1", "4242 (envoy) S 1 2 3", "4242 (envoy) S 1 4242 4242 0 -1 4194560 8000 0 0 0 x 567 0"} {
		if _, err := ParseCPU(bad); err == nil {
			t.Errorf("ParseCPU(%q): no error", bad)
		}
	}
}

func TestCPUTime(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/PID/stat is Linux's")
	}
	d, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d < 0 {
		t.Errorf("CPUTime = %v", d)
	}
	if _, err := CPUTime(-1); err == nil {
		t.Error("CPUTime(-1): no error")
	}
}

// Revision: the short hash, "+dirty" once a tracked file changes (an untracked one does not
// count), "?" outside git.
func TestRevision(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	t.Setenv("GIT_CEILING_DIRECTORIES", filepath.Dir(dir)) // outside git even under a checkout
	git := func(args ...string) string {
		t.Helper()
		c := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"}, args...)...)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := Revision(dir); got != "?" {
		t.Errorf("outside git: Revision = %q, want ?", got)
	}
	git("init", "-q")
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "f")
	git("commit", "-q", "-m", "f")
	head := git("rev-parse", "--short", "HEAD")
	if got := Revision(dir); got != head {
		t.Errorf("clean: Revision = %q, want %q", got, head)
	}
	if err := os.WriteFile(filepath.Join(dir, "untracked"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Revision(dir); got != head {
		t.Errorf("an untracked file: Revision = %q, want %q", got, head)
	}
	if err := os.WriteFile(file, []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Revision(dir); got != head+"+dirty" {
		t.Errorf("modified: Revision = %q, want %q", got, head+"+dirty")
	}
}

func TestCommandLine(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		target string
		args   []string
		env    map[string]string
		want   string
	}{
		{"", nil, nil, "go run ./bench/x"},
		{"bench-x", []string{"-rounds", "5"}, nil, "go run ./bench/x -rounds 5"},
		{"bench-x", nil, map[string]string{"ENVOY": "/opt/envoy"}, "ENVOY=/opt/envoy go run ./bench/x"},
		{"bench-x", []string{"-d", "3s"}, map[string]string{"ENVOY": "/opt/envoy", "MAKELEVEL": "1"}, "make bench-x (ENVOY=/opt/envoy go run ./bench/x -d 3s)"},
		{"bench-x", nil, map[string]string{"MAKELEVEL": "1"}, "make bench-x (go run ./bench/x)"},
		{"", []string{"-deny"}, map[string]string{"ENVOY": "/opt/envoy", "MAKELEVEL": "1"}, "ENVOY=/opt/envoy go run ./bench/x -deny"},
	} {
		if got := commandLine("./bench/x", c.target, c.args, env(c.env)); got != c.want {
			t.Errorf("commandLine(%q, %q, %v) = %q, want %q", c.target, c.args, c.env, got, c.want)
		}
	}
}

func TestFreePort(t *testing.T) {
	p, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	if p <= 0 || p > 65535 {
		t.Fatalf("FreePort = %d", p)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		t.Fatalf("port %d not free: %v", p, err)
	}
	l.Close()
}

// AppendResults creates the file, then appends to it.
func TestAppendResults(t *testing.T) {
	p := filepath.Join(t.TempDir(), "results.txt")
	for _, s := range []string{"# run 1\n", "# run 2\n"} {
		if err := AppendResults("test", p, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "# run 1\n# run 2\n" {
		t.Errorf("file %q (%v), want both runs in order", b, err)
	}
	if err := AppendResults("test", filepath.Join(t.TempDir(), "no", "dir"), nil); err == nil {
		t.Error("a file in a missing directory: no error")
	}
}
