package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// envoyProc is one Envoy process this command started (e2e/envoyproc), with its CPU read
// from /proc.
type envoyProc struct{ *envoyproc.Envoy }

// startEnvoy runs bin with the bootstrap y (--concurrency 2) and more environment env
// ("NAME=value") and waits for /ready.
func startEnvoy(bin, dir string, y []byte, env []string) (*envoyProc, error) {
	e, err := envoyproc.Start(context.Background(), envoyproc.Target{Version: filepath.Base(bin), Bin: bin},
		envoyproc.Options{Bootstrap: y, Concurrency: 2, Dir: dir, Env: env})
	if err != nil {
		return nil, err
	}
	return &envoyProc{e}, nil
}

func (p *envoyProc) pid() int { return p.PID() }

// stop sends SIGTERM to the process, SIGKILL after 10 s, and waits for it.
func (p *envoyProc) stop() { p.Stop() }

// cpu is the process's utime+stime so far.
func (p *envoyProc) cpu() (time.Duration, error) { return build.CPUTime(p.pid()) }

func (p *envoyProc) get(path string) (string, error) { return p.Get(path) }

// url is http://127.0.0.1:PORT of a listener, from /listeners.
func (p *envoyProc) url(listener string) (string, error) { return p.URL(listener) }

// rss is the process's VmRSS in MB.
func (p *envoyProc) rss() (float64, error) {
	st, err := readFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0, err
	}
	kb, err := parseRSS(st)
	return float64(kb) / 1024, err
}

// timedProc is an Envoy started for the start-up phase, which times it to /ready more
// finely than envoyproc's 50 ms polling.
type timedProc struct {
	cmd   *exec.Cmd
	admin string
	done  chan struct{}
	log   *os.File
}

// readyPoll is how often startTimed asks whether Envoy is ready.
const readyPoll = 2 * time.Millisecond

// startTimed runs bin with the bootstrap y (--concurrency 2) and more environment env, and
// returns once /ready says LIVE, with the time from just before the process started to the
// LIVE answer.
func startTimed(bin, dir string, y []byte, env []string) (*timedProc, time.Duration, error) {
	cfg, adminFile := filepath.Join(dir, "envoy.yaml"), filepath.Join(dir, "admin-address")
	if err := os.WriteFile(cfg, y, 0o644); err != nil {
		return nil, 0, err
	}
	log, err := os.Create(filepath.Join(dir, "envoy.log"))
	if err != nil {
		return nil, 0, err
	}
	p := &timedProc{done: make(chan struct{}), log: log}
	p.cmd = exec.Command(bin, "-c", cfg, "--concurrency", "2", "--admin-address-path", adminFile,
		"--use-dynamic-base-id", "--log-level", "warn")
	if len(env) > 0 {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	t0 := time.Now()
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return nil, 0, err
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	deadline := time.After(2 * time.Minute)
	client := &http.Client{Timeout: time.Second}
	for {
		if p.admin == "" {
			if b, err := os.ReadFile(adminFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
				p.admin = "http://" + strings.TrimSpace(string(b))
			}
		}
		if p.admin != "" {
			if resp, err := client.Get(p.admin + "/ready"); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.TrimSpace(string(b)) == "LIVE" {
					return p, time.Since(t0), nil
				}
			}
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(log.Name())
			log.Close()
			return nil, 0, fmt.Errorf("envoy exited before it was ready; its log:\n%s", b)
		case <-deadline:
			p.stop()
			return nil, 0, errors.New("envoy not ready within 2 minutes")
		case <-time.After(readyPoll):
		}
	}
}

// get returns the body of an admin GET.
func (p *timedProc) get(path string) (string, error) {
	resp, err := http.Get(p.admin + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return string(b), err
}

// stop sends SIGTERM to the process, SIGKILL after 10 s, and waits for it.
func (p *timedProc) stop() {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	p.log.Close()
}
