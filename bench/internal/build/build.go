// Package build builds what the benchmark commands measure — the sluice module as `make build`
// ships it, the no-op module, the dynamic module libsluice.so and a C no-op beside it, the
// sluice binary and the load generator — from the repository
// the command runs in, and holds the plumbing the commands share: the machine's load, the
// checkout's revision and the command line for their reports, a process's CPU time from
// /proc, and a free loopback port.
package build

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Root is the directory of the sluice module the command runs in.
func Root() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run it inside the sluice module")
	}
	return filepath.Dir(mod), nil
}

// Workspace is the repository root and a new temporary directory named after the command,
// to build into (the caller removes it).
func Workspace(name string) (root, dir string, err error) {
	if root, err = Root(); err != nil {
		return "", "", err
	}
	dir, err = os.MkdirTemp("", name+"-")
	return root, dir, err
}

// A Step is one command of a build, run in a directory of the repository.
type Step struct {
	Dir string   // relative to the root
	Env []string // added to the environment
	Cmd []string
}

var wasip1 = []string{"GOOS=wasip1", "GOARCH=wasm"}

// SluiceWasm builds ./cmd/sluice-wasm to out (unpatched: follow with Patch).
func SluiceWasm(out string) Step {
	return Step{".", wasip1, []string{"go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./cmd/sluice-wasm"}}
}

// SluiceDynmod builds ./cmd/sluice-dynmod, the Envoy dynamic module, to out as `make build`
// builds dist/libsluice.so (cgo, -buildmode=c-shared).
func SluiceDynmod(out string) Step {
	return Step{".", []string{"CGO_ENABLED=1"}, []string{"go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "./cmd/sluice-dynmod"}}
}

// CShared builds the C source src (relative to the root) into the shared library out with
// the system's gcc, as a dynamic module is built: gcc -shared -fPIC -O2.
func CShared(src, out string) Step {
	return Step{".", nil, []string{"gcc", "-shared", "-fPIC", "-O2", "-o", out, src}}
}

// NoopWasm builds the Proxy-Wasm module that does nothing (host/testdata/guests/minimal).
func NoopWasm(out string) Step { return guestWasm("minimal", out) }

// DenierWasm builds the Proxy-Wasm module that refuses every request
// (host/testdata/guests/denier).
func DenierWasm(out string) Step { return guestWasm("denier", out) }

// CounterWasm builds the count-every-key module (host/testdata/guests/counter), bench/envoy's
// floor under an exact shared-data admission.
func CounterWasm(out string) Step { return guestWasm("counter", out) }

// guestWasm builds the test guest host/testdata/guests/<name> to out (unpatched).
func guestWasm(name, out string) Step {
	return Step{filepath.Join("host", "testdata", "guests", name), wasip1,
		[]string{"go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "."}}
}

// Patch patches modules as `make build` does (internal/wasmpatch: poll_oneoff answered in
// the guest).
func Patch(modules ...string) Step {
	return Step{".", nil, append([]string{"go", "run", "./internal/wasmpatch/cmd/wasmpatch"}, modules...)}
}

// Command builds the main package pkg (e.g. "./cmd/sluice") to out, statically linked as
// `make build` links dist/sluice.
func Command(pkg, out string) Step {
	return Step{".", []string{"CGO_ENABLED=0"}, []string{"go", "build", "-trimpath", "-o", out, pkg}}
}

// Run runs the steps in order in the repository at root, saying on standard error, after
// the command's name, where it builds (dir).
func Run(root, dir, name string, steps ...Step) error {
	fmt.Fprintf(os.Stderr, "%s: building into %s\n", name, dir)
	for _, s := range steps {
		c := exec.Command(s.Cmd[0], s.Cmd[1:]...)
		c.Dir = filepath.Join(root, s.Dir)
		if s.Env != nil {
			c.Env = append(os.Environ(), s.Env...)
		}
		if msg, err := c.CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v\n%s", strings.Join(s.Cmd, " "), err, msg)
		}
	}
	return nil
}

// LoadAvg is the machine's 1, 5 and 15 minute load averages ("?" where /proc has none).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times (100 on every Linux sluice runs on).
const clockTick = 10 * time.Millisecond

// CPUTime is the process's utime+stime so far, from /proc/PID/stat (Linux only). For the
// whole process: the kernel sums every thread's time into them.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return ParseCPU(string(b))
}

// ParseCPU returns utime+stime of a /proc/PID/stat line (fields 14 and 15; the process name
// in parentheses may hold spaces and parentheses, so fields count from the last ')').
func ParseCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc stat: no ')'")
	}
	f := strings.Fields(stat[i+1:])
	// after the name: state(3) ppid(4) ... utime(14) stime(15)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the name, want at least 13", len(f))
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc stat: utime %q stime %q", f[11], f[12])
	}
	return time.Duration(u+s) * clockTick, nil
}

// Revision is the commit checked out at root (git's short hash), with "+dirty" when tracked
// files have uncommitted changes; "?" outside git.
func Revision(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "?"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "+dirty"
	}
	return rev
}

// CommandLine is how a command's results were produced, for the header line of its results:
// "go run PKG ARGS" (pkg as given, e.g. "./bench/envoy"; the arguments os.Args[1:]),
// prefixed "ENVOY=… " when $ENVOY is set and, with a makeTarget while $MAKELEVEL is set (run
// by make), wrapped as "make TARGET (…)". makeTarget "" never wraps.
func CommandLine(pkg, makeTarget string) string {
	return commandLine(pkg, makeTarget, os.Args[1:], os.Getenv)
}

func commandLine(pkg, makeTarget string, args []string, getenv func(string) string) string {
	s := "go run " + pkg
	if len(args) > 0 {
		s += " " + strings.Join(args, " ")
	}
	if v := getenv("ENVOY"); v != "" {
		s = "ENVOY=" + v + " " + s
	}
	if makeTarget != "" && getenv("MAKELEVEL") != "" {
		s = "make " + makeTarget + " (" + s + ")"
	}
	return s
}

// FreePort is a loopback TCP port that was free a moment ago (for a listener that another
// configuration must name before its process starts, e.g. the upstream Envoy's cluster
// routes to).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// AppendResults appends b to the results file path (created if missing) and says so on
// stderr under the command's name.
func AppendResults(name, path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	fmt.Fprintf(os.Stderr, "%s: appended to %s\n", name, path)
	return f.Close()
}
