// Package build builds what the benchmark commands measure — the sluice module as `make build`
// ships it, the no-op module, the sluice binary and the load generator — from the repository
// the command runs in, and names the machine's load for their reports.
package build

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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

// NoopWasm builds the Proxy-Wasm module that does nothing (host/testdata/guests/minimal).
func NoopWasm(out string) Step {
	return Step{filepath.Join("host", "testdata", "guests", "minimal"), wasip1,
		[]string{"go", "build", "-buildmode=c-shared", "-trimpath", "-o", out, "."}}
}

// DenierWasm builds the Proxy-Wasm module that refuses every request
// (host/testdata/guests/denier).
func DenierWasm(out string) Step {
	return Step{filepath.Join("host", "testdata", "guests", "denier"), wasip1,
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
