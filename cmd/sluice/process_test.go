package main

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSluiceRunHelperProcess is the `sluice run` command, as main runs it, in a child
// process of the tests that start one (it does nothing in a normal run).
func TestSluiceRunHelperProcess(t *testing.T) {
	if os.Getenv("SLUICE_RUN_HELPER") != "1" {
		return
	}
	processLoggers = true
	os.Exit(dispatch(append([]string{"run"}, strings.Split(os.Getenv("SLUICE_RUN_ARGS"), "\n")...), os.Stdout, os.Stderr))
}

// runProcess is `sluice run` in a child process: its listening (and, with --admin, admin)
// address and its output lines.
type runProcess struct {
	cmd            *exec.Cmd
	addr, admin    string
	stdout, stderr *lineLog
	exited         chan error
}

// startSluiceRun starts `sluice run args...` in a child process (this test binary) and
// waits until it listens; the process is killed at the end of the test if still running.
func startSluiceRun(t *testing.T, args ...string) *runProcess {
	t.Helper()
	skipShort(t, "runs sluice run as a child process")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSluiceRunHelperProcess$")
	cmd.Env = append(os.Environ(), "SLUICE_RUN_HELPER=1", "SLUICE_RUN_ARGS="+strings.Join(args, "\n"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &runProcess{cmd: cmd, stdout: newLineLog(stdout), stderr: newLineLog(stderr), exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.exited
		}
	})
	p.addr = p.stdout.wait(t, regexp.MustCompile(`listening on http://(\S+)`), 90*time.Second)[1]
	if slices.Contains(args, "--admin") {
		p.admin = p.stdout.wait(t, regexp.MustCompile(`admin on http://(\S+)`), 5*time.Second)[1]
	}
	return p
}

// stop sends sig and waits for the process to exit.
func (p *runProcess) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("sluice run did not exit within 30 s of %v", sig)
		return nil
	}
}
