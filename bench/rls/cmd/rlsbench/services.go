package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The peer's module and main package, pinned by this module's go.mod (a
// tool directive, so go mod tidy keeps it).
const peerPackage = "github.com/envoyproxy/ratelimit/src/service_cmd"

// build compiles envoyproxy/ratelimit from this module and sluice from the
// main module (benchDir/../..) into dir.
func build(benchDir, dir string) (peerBin, sluiceBin string, err error) {
	peerBin = filepath.Join(dir, "ratelimit")
	sluiceBin = filepath.Join(dir, "sluice")
	for _, b := range []struct{ dir, out, pkg string }{
		{benchDir, peerBin, peerPackage},
		{filepath.Join(benchDir, "..", ".."), sluiceBin, "./cmd/sluice"},
	} {
		cmd := exec.Command("go", "build", "-trimpath", "-o", b.out, b.pkg)
		cmd.Dir = b.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go build %s (in %s): %v\n%s", b.pkg, b.dir, err, out)
		}
	}
	return peerBin, sluiceBin, nil
}

// benchModuleDir returns the directory of this module (the go.mod the go
// command finds from the working directory).
func benchModuleDir() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if filepath.Base(filepath.Dir(gomod)) != "rls" {
		return "", fmt.Errorf("run from bench/rls (go env GOMOD is %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// proc is a service process started by the harness.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs bin with args and extra environment, logging to dir/name.log;
// the kernel kills it if the harness dies.
func start(name, dir, bin string, args, env []string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// stop sends SIGTERM, then SIGKILL after a grace period, and waits.
func (p *proc) stop() {
	if !p.running() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpuTicks is the process's utime+stime in clock ticks.
func (p *proc) cpuTicks() (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return procCPU(string(b))
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's utime and stime: 100
// on every Linux architecture Go supports.
const clockTicks = 100

// startPeer runs envoyproxy/ratelimit on the cluster with config (its YAML)
// as RUNTIME_ROOT/ratelimit/config/bench.yaml, the gRPC server on grpcAddr.
// The settings are its documented defaults except where a bench needs
// otherwise: stats to its logging sink (no statsd here), loopback
// listeners, Redis Cluster over TCP.
func startPeer(bin, dir string, redisAddrs []string, config []byte) (*proc, string, error) {
	root := filepath.Join(dir, "runtime")
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return nil, "", err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), config, 0o644); err != nil {
		return nil, "", err
	}
	var ports [3]int
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return nil, "", err
		}
		ports[i] = p
	}
	grpcAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	env := []string{
		"USE_STATSD=false",
		"LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_TYPE=cluster",
		"REDIS_URL=" + strings.Join(redisAddrs, ","),
		"RUNTIME_ROOT=" + root,
		"RUNTIME_SUBDIRECTORY=ratelimit",
		"RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[1]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(ports[2]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[0]),
	}
	p, err := start("ratelimit", dir, bin, nil, env)
	return p, grpcAddr, err
}

// startSluice runs `sluice serve` on the cluster with config (the same
// format, plus rate_limit.algorithm) and any extra flags.
func startSluice(bin, dir string, redisAddrs []string, config []byte, extra ...string) (*proc, string, error) {
	cfg := filepath.Join(dir, "sluice-serve.yaml")
	if err := os.WriteFile(cfg, config, 0o644); err != nil {
		return nil, "", err
	}
	listen, err := freePort()
	if err != nil {
		return nil, "", err
	}
	admin, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(listen)
	args := append([]string{"serve",
		"--listen", addr,
		"--redis-cluster", strings.Join(redisAddrs, ","),
		"--config", cfg,
		"--admin", "127.0.0.1:" + strconv.Itoa(admin),
	}, extra...)
	p, err := start("sluice-serve", dir, bin, args, nil)
	return p, addr, err
}

// The algorithms sluice serve decides with, fixed_window first (the one
// envoyproxy/ratelimit has).
var algorithmNames = []string{"fixed_window", "sliding_window", "sliding_log", "token_bucket", "leaky_bucket"}

// Limits of the two variants and the exactness probe. "ok": 10,000 per
// second per value (the largest sliding_log accepts), which the load never
// reaches on one value; "denied": 10 per minute per value over few values,
// so after the warm-up nearly every call is denied; "exact": 100 per day,
// checked with 3 × 100 concurrent calls on a fresh value.
const (
	okLimit     = 10000
	deniedLimit = 10
	exactLimit  = 100
)

// configs returns the two services' configurations: one domain, the same
// descriptors and limits. sluice's is the peer's, unchanged (fixed windows,
// the default algorithm), followed by each descriptor again per other
// algorithm, keyed <key>_<algorithm>.
func configs(domain string) (peer, sluice []byte) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	desc := func(key, unit string, limit int, algorithm string) {
		fmt.Fprintf(&b, "  - key: %s\n    rate_limit:\n      unit: %s\n      requests_per_unit: %d\n", key, unit, limit)
		if algorithm != "" {
			fmt.Fprintf(&b, "      algorithm: %s\n", algorithm)
		}
	}
	for _, v := range variants {
		desc(v.key, v.unit, v.limit, "")
	}
	peer = bytes.Clone(b.Bytes())
	for _, v := range variants {
		for _, a := range algorithmNames[1:] {
			desc(descriptorKey(v.key, a), v.unit, v.limit, a)
		}
	}
	return peer, b.Bytes()
}

// descriptorKey is the descriptor key of variant key under algorithm in
// sluice's configuration.
func descriptorKey(key, algorithm string) string {
	if algorithm == algorithmNames[0] {
		return key
	}
	return key + "_" + algorithm
}

// variants are the descriptors both services are configured with.
var variants = []struct {
	key, unit string
	limit     int
}{{"ok", "second", okLimit}, {"denied", "minute", deniedLimit}, {"exact", "day", exactLimit}}
