package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// envoyProc is one Envoy process this command started (its own, not envoyproc.Start's: the
// CPU figures need the PID).
type envoyProc struct {
	cmd   *exec.Cmd
	admin string
	done  chan struct{}
	log   *capped
}

// startEnvoy runs bin with the bootstrap y (--concurrency 2) and waits for /ready.
func startEnvoy(bin, dir string, y []byte) (*envoyProc, error) {
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, y, 0o644); err != nil {
		return nil, err
	}
	adminFile := filepath.Join(dir, "admin-address")
	p := &envoyProc{done: make(chan struct{}), log: &capped{}}
	p.cmd = exec.Command(bin, "-c", cfg, "--concurrency", "2", "--admin-address-path", adminFile,
		"--use-dynamic-base-id", "--log-level", "warn")
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if p.admin == "" {
			if b, err := os.ReadFile(adminFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
				p.admin = "http://" + strings.TrimSpace(string(b))
			}
		}
		if p.admin != "" {
			if s, err := p.get("/ready"); err == nil && strings.TrimSpace(s) == "LIVE" {
				return p, nil
			}
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("envoy exited before it was ready; its log:\n%s", p.log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	p.stop()
	return nil, fmt.Errorf("envoy not ready within 2 minutes; its log:\n%s", p.log)
}

func (p *envoyProc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM to the process, SIGKILL after 10 s, and waits for it.
func (p *envoyProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu is the process's utime+stime so far.
func (p *envoyProc) cpu() (time.Duration, error) {
	s, err := readFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return 0, err
	}
	return parseCPU(s)
}

func (p *envoyProc) get(path string) (string, error) {
	resp, err := adminClient.Get(p.admin + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return string(b), nil
}

// url is http://127.0.0.1:PORT of a listener, from /listeners.
func (p *envoyProc) url(listener string) (string, error) {
	s, err := p.get("/listeners?format=json")
	if err != nil {
		return "", err
	}
	port, err := listenerPort(s, listener)
	if err != nil {
		return "", err
	}
	return "http://127.0.0.1:" + strconv.Itoa(port), nil
}

// listenerPort reads a listener's port from /listeners?format=json.
func listenerPort(doc, listener string) (int, error) {
	var d struct {
		ListenerStatuses []struct {
			Name         string `json:"name"`
			LocalAddress struct {
				SocketAddress struct {
					PortValue int `json:"port_value"`
				} `json:"socket_address"`
			} `json:"local_address"`
		} `json:"listener_statuses"`
	}
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		return 0, fmt.Errorf("/listeners: %v", err)
	}
	for _, l := range d.ListenerStatuses {
		if l.Name == listener && l.LocalAddress.SocketAddress.PortValue != 0 {
			return l.LocalAddress.SocketAddress.PortValue, nil
		}
	}
	return 0, fmt.Errorf("/listeners: no listener %q bound", listener)
}

// capped is a log buffer that stops growing at 4 MiB.
type capped struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.b.Len() < 4<<20 {
		c.b.Write(p)
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.b.String()
}
