package main

import (
	"context"
	"fmt"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"path/filepath"
	"time"
)

// envoyProc is one Envoy process this command started (e2e/envoyproc), with its CPU read
// from /proc.
type envoyProc struct{ *envoyproc.Envoy }

// startEnvoy runs bin with the bootstrap y (--concurrency 2) and waits for /ready.
func startEnvoy(bin, dir string, y []byte) (*envoyProc, error) {
	e, err := envoyproc.Start(context.Background(), envoyproc.Target{Version: filepath.Base(bin), Bin: bin},
		envoyproc.Options{Bootstrap: y, Concurrency: 2, Dir: dir})
	if err != nil {
		return nil, err
	}
	return &envoyProc{e}, nil
}

func (p *envoyProc) pid() int { return p.PID() }

// stop sends SIGTERM to the process, SIGKILL after 10 s, and waits for it.
func (p *envoyProc) stop() { p.Stop() }

// cpu is the process's utime+stime so far.
func (p *envoyProc) cpu() (time.Duration, error) {
	s, err := readFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return 0, err
	}
	return parseCPU(s)
}

func (p *envoyProc) get(path string) (string, error) { return p.Get(path) }

// url is http://127.0.0.1:PORT of a listener, from /listeners.
func (p *envoyProc) url(listener string) (string, error) { return p.URL(listener) }
