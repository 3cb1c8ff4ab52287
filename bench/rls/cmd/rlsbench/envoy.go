package main

// rlsbench -envoy: the rate-limit services where users run them, behind a real Envoy.
//
// One Envoy (--concurrency 2) per round holds eight listeners (envoy_bootstrap.go): Envoy's
// own envoy.filters.http.ratelimit calling envoyproxy/ratelimit, sluice serve, or sluice
// serve --charge-denied (all on one Redis Cluster, all reading the peer's configuration
// file) on an ok and a denied variant, and sluice.wasm with one fixed_window rule, local or backend "rls" with a lease.
// The configurations run one after the other in an order rotated from round to round
// (reversed every other round), each a closed loop of bench/cmd/sluice-load for -warmup
// (unmeasured: it also spends the denied variant's limits) then -duration. Over the
// measured run the harness reads the Redis masters' utime+stime (/proc/PID/stat; the
// PIDs from INFO server), each service's and Envoy's, and Envoy's counters: decisions
// are the ratelimit filter's ok + over_limit calls (cluster.upstream.ratelimit.*), or
// for sluice.wasm the listener's completed requests. Ratios are taken per round.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	benchbuild "github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// envoySample is one configuration's figures in one round.
type envoySample struct {
	cfg      envoyConfig
	round    int
	rps      float64 // sluice-load's measured requests per second
	p50, p99 float64 // ms
	requests int     // sluice-load's measured requests
	statuses map[string]int
	errors   int64 // sluice-load's transport errors plus statuses other than 200 and 429
	// Over the measured run (the harness's reads bracket the sluice-load process):
	served    int64 // Envoy: the listener's completed requests
	decisions int64 // ratelimit: the filter's calls answered ok or over_limit; wasm: served
	rlsCalls  int64 // wasm: sluice.rls.calls (decisions, lease acquires and returns)
	reads     int64 // Redis's socket reads (INFO stats; the harness's own end reads included: a few)
	commands  map[string]cmdStat
	redisCPU  float64 // seconds, the masters' utime+stime
	svcCPU    float64 // seconds, the service's (ratelimit configurations; sluice serve for the lease)
	envoyCPU  float64 // seconds
}

func (s envoySample) admittedShare() float64 {
	if s.requests == 0 {
		return 0
	}
	return float64(s.statuses["200"]) / float64(s.requests)
}

func perDecision(sec float64, n int64) float64 {
	if n <= 0 {
		return 0
	}
	return sec / float64(n) * 1e6
}

func (s envoySample) redisPerDecision() float64 { return perDecision(s.redisCPU, s.decisions) }
func (s envoySample) svcPerDecision() float64   { return perDecision(s.svcCPU, s.decisions) }
func (s envoySample) envoyPerRequest() float64  { return perDecision(s.envoyCPU, s.served) }
func (s envoySample) readsPerDecision() float64 {
	if s.decisions == 0 {
		return 0
	}
	return float64(s.reads) / float64(s.decisions)
}

func (s envoySample) callsPerRequest() float64 {
	if s.served == 0 {
		return 0
	}
	return float64(s.rlsCalls) / float64(s.served)
}

// loadReport is sluice-load's -json report (the fields read here).
type loadReport struct {
	Requests   int            `json:"requests"`
	Errors     int64          `json:"errors"`
	RPS        float64        `json:"rps"`
	P50        float64        `json:"p50_ms"`
	P99        float64        `json:"p99_ms"`
	Statuses   map[string]int `json:"statuses"`
	FirstError string         `json:"first_error,omitempty"`
}

// envoyBench is what the run shares.
type envoyBench struct {
	o                                 options
	root, dir                         string
	wasm, load                        string
	target                            envoyproc.Target
	cluster                           *redistest.Cluster
	redisPIDs                         []int
	peer, sluice, charged             *proc
	peerPort, sluicePort, chargedPort int
}

func runEnvoy(o options) error {
	t0, load0 := time.Now(), benchbuild.LoadAvg()
	benchDir, err := benchModuleDir()
	if err != nil {
		return err
	}
	b := &envoyBench{o: o, root: filepath.Clean(filepath.Join(benchDir, "..", ".."))}
	if b.dir, err = os.MkdirTemp("", "rlsbench-envoy-"); err != nil {
		return err
	}
	if o.keep {
		fmt.Println("work directory:", b.dir)
	} else {
		defer os.RemoveAll(b.dir)
	}
	if err := b.setup(benchDir); err != nil {
		return err
	}
	defer b.cluster.Close()
	defer func() {
		for _, p := range b.services() {
			if p != nil {
				p.stop()
			}
		}
	}()
	if err := b.startServices(); err != nil {
		return err
	}

	fmt.Printf("\n%d rounds × %d configurations; %v warm-up + %v measured each; sluice-load -c %d; Envoy %s --concurrency 2\n",
		o.rounds, len(envoyConfigs), o.warmup, o.duration, o.concurrency, b.target.Version)
	var ss []envoySample
	for r := 0; r < o.rounds; r++ {
		got, err := b.round(r)
		if err != nil {
			return err
		}
		ss = append(ss, got...)
	}
	rep := envoyReport{
		date: time.Now().UTC(), commit: revision(b.root), command: envoyCommandLine(),
		envoy: b.target.Version, rounds: o.rounds, conns: o.concurrency, warmup: o.warmup, duration: o.duration,
		okKeys: o.okKeys, deniedKeys: o.deniedKeys, leaseKeys: o.leaseKeys, lease: o.lease, cpus: runtime.NumCPU(),
		load0: load0, load1: benchbuild.LoadAvg(), took: time.Since(t0), samples: ss,
	}
	var out bytes.Buffer
	rep.write(&out)
	fmt.Println()
	os.Stdout.Write(out.Bytes())
	if o.out != "-" {
		path := o.out
		if !filepath.IsAbs(path) {
			path = filepath.Join(benchDir, path)
		}
		old, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.WriteFile(path, []byte(insertResults(string(old), out.String())), 0o644); err != nil {
			return err
		}
		fmt.Println("rlsbench: results added to", path)
	}
	return nil
}

// setup builds what the run needs (envoyproxy/ratelimit, sluice, sluice.wasm, sluice-load),
// resolves the Envoy binary and starts the Redis Cluster.
func (b *envoyBench) setup(benchDir string) error {
	o := &b.o
	if o.peerBin == "" || o.sluiceBin == "" {
		fmt.Println("building envoyproxy/ratelimit and sluice…")
		peerBin, sluiceBin, err := build(benchDir, b.dir)
		if err != nil {
			return err
		}
		o.peerBin = orDefault(o.peerBin, peerBin)
		o.sluiceBin = orDefault(o.sluiceBin, sluiceBin)
	}
	b.load = filepath.Join(b.dir, "sluice-load")
	steps := []benchbuild.Step{benchbuild.Command("./bench/cmd/sluice-load", b.load)}
	if o.wasm != "" {
		var err error
		if b.wasm, err = filepath.Abs(o.wasm); err != nil {
			return err
		}
	} else {
		// As make build ships it: patched (poll_oneoff answered in the guest).
		b.wasm = filepath.Join(b.dir, "sluice.wasm")
		steps = append(steps, benchbuild.SluiceWasm(b.wasm), benchbuild.Patch(b.wasm))
	}
	if err := benchbuild.Run(b.root, b.dir, "rlsbench", steps...); err != nil {
		return err
	}
	bin := o.envoyBin
	if bin == "" {
		bin = os.Getenv("ENVOY")
	}
	if strings.HasPrefix(bin, "docker:") {
		return errors.New("ENVOY=docker:… is not supported: the CPU figures need the Envoy process's /proc entry")
	}
	var err error
	if bin == "" {
		if bin, err = envoyproc.Binary(o.envoyVersion); err != nil {
			return err
		}
	}
	v, err := envoyproc.Version(bin)
	if err != nil {
		return err
	}
	b.target = envoyproc.Target{Version: v, Bin: bin}
	chk := filepath.Join(b.dir, "v8check")
	if err := os.MkdirAll(chk, 0o755); err != nil {
		return err
	}
	if err := envoyproc.CheckV8(b.target, chk); err != nil {
		return err
	}
	if b.cluster, err = redistest.Start(filepath.Join(b.dir, "redis"), 3); err != nil {
		return err
	}
	fmt.Println("redis cluster:", strings.Join(b.cluster.Addrs, " "))
	for i := range b.cluster.Addrs {
		cl := b.cluster.Client(i)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := cl.Info(ctx, "server").Result()
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Errorf("INFO server %s: %w", b.cluster.Addrs[i], err)
		}
		pid, err := redisPID(info)
		if err != nil {
			return err
		}
		b.redisPIDs = append(b.redisPIDs, pid)
	}
	return nil
}

func orDefault(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// services are the three rate-limit services (nil before they start).
func (b *envoyBench) services() []*proc { return []*proc{b.peer, b.sluice, b.charged} }

// service is the process of an envoyConfig's service ("peer", "charged", else sluice serve).
func (b *envoyBench) service(name string) *proc {
	switch name {
	case "peer":
		return b.peer
	case "charged":
		return b.charged
	}
	return b.sluice
}

// startServices starts the three services on the cluster with the peer's file (sluice
// serve also accepting sluice.wasm's inline descriptors of wasmDomain; the second sluice
// serve with --charge-denied) and waits until each answers with a limit.
func (b *envoyBench) startServices() error {
	peerCfg, _ := configs(domain)
	var err error
	var peerAddr, sluiceAddr, chargedAddr string
	if b.peer, peerAddr, err = startPeer(b.o.peerBin, b.dir, b.cluster.Addrs, peerCfg); err != nil {
		return err
	}
	if b.sluice, sluiceAddr, err = startSluice(b.o.sluiceBin, b.dir, b.cluster.Addrs, peerCfg, append([]string{"--inline-domains", wasmDomain}, b.o.sluiceFlags...)...); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(b.dir, "charged"), 0o755); err != nil {
		return err
	}
	if b.charged, chargedAddr, err = startSluice(b.o.sluiceBin, filepath.Join(b.dir, "charged"), b.cluster.Addrs, peerCfg, append([]string{"--charge-denied"}, b.o.sluiceFlags...)...); err != nil {
		return err
	}
	b.charged.name += " --charge-denied"
	for _, s := range []struct {
		p    *proc
		addr string
		port *int
	}{{b.peer, peerAddr, &b.peerPort}, {b.sluice, sluiceAddr, &b.sluicePort}, {b.charged, chargedAddr, &b.chargedPort}} {
		_, port, _ := strings.Cut(s.addr, ":")
		if *s.port, err = strconv.Atoi(port); err != nil {
			return fmt.Errorf("%s: address %q", s.p.name, s.addr)
		}
		c, err := dial(s.addr, 1)
		if err != nil {
			return err
		}
		err = ready(c, domain, "ok", time.Now().Add(30*time.Second))
		c.close()
		if err != nil {
			return fmt.Errorf("%s: %w\n%s", s.p.name, err, s.p.tail())
		}
		fmt.Printf("%s ready on %s (pid %d)\n", s.p.name, s.addr, s.p.cmd.Process.Pid)
	}
	return nil
}

// round starts round r's Envoy, measures every configuration in the round's order and
// stops it.
func (b *envoyBench) round(r int) ([]envoySample, error) {
	up, err := freePort()
	if err != nil {
		return nil, err
	}
	y, err := renderEnvoy(envoySpec{round: r + 1, upstreamPort: up, peerPort: b.peerPort, sluicePort: b.sluicePort, chargedPort: b.chargedPort,
		wasm: b.wasm, lease: b.o.lease, configs: envoyConfigs})
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(b.dir, fmt.Sprintf("envoy-%d", r+1))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	e, err := envoyproc.Start(context.Background(), b.target, envoyproc.Options{Bootstrap: y, Concurrency: 2, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer e.Stop()
	var out []envoySample
	for _, c := range roundOrder(envoyConfigs, r) {
		if err := flush(b.cluster); err != nil {
			return nil, err
		}
		s, err := b.measure(e, c)
		if err != nil {
			return nil, fmt.Errorf("round %d, %s: %w", r+1, c.name, err)
		}
		s.round = r + 1
		out = append(out, s)
		fmt.Printf("  round %d %-17s %7.0f req/s  p50 %6.2f ms  p99 %6.2f ms  200 %5.1f%%  redis %5.1f µs/decision %.3f reads  service %5.1f µs/decision  envoy %5.1f µs/request  rls calls/request %.3f  errors %d\n",
			r+1, c.name, s.rps, s.p50, s.p99, 100*s.admittedShare(), s.redisPerDecision(), s.readsPerDecision(), s.svcPerDecision(), s.envoyPerRequest(),
			s.callsPerRequest(), s.errors)
		fmt.Printf("    redis commands per decision × time per call: %s\n", (measurement{commands: s.commands, res: &result{ok: s.decisions}}).commandProfile())
		for _, p := range b.services() {
			if !p.running() {
				return nil, fmt.Errorf("%s exited:\n%s", p.name, p.tail())
			}
		}
	}
	return out, nil
}

// counters are what the harness reads before and after a measured run.
type counters struct {
	redis, svc, envoy int64 // clock ticks
	reads             int64 // Redis's socket reads
	stats             map[string]int64
	commands          map[string]cmdStat // at the end: INFO commandstats since the start's reset
}

// read reads the counters: at the start (first) the admin and Redis INFO calls before
// the CPU, at the end after it, so that their own CPU stays out of the span.
func (b *envoyBench) read(e *envoyproc.Envoy, svc *proc, first bool) (counters, error) {
	var c counters
	var err error
	others := func() error {
		if c.reads, _, err = clusterIO(b.cluster); err != nil {
			return err
		}
		if c.stats, err = e.Stats(""); err != nil {
			return err
		}
		if !first {
			c.commands, err = clusterCommands(b.cluster)
		}
		return err
	}
	if first {
		if err := resetStats(b.cluster); err != nil {
			return c, err
		}
		if err := others(); err != nil {
			return c, err
		}
	}
	for _, pid := range b.redisPIDs {
		t, err := pidCPU(pid)
		if err != nil {
			return c, fmt.Errorf("redis pid %d: %w", pid, err)
		}
		c.redis += t
	}
	if c.svc, err = svc.cpuTicks(); err != nil {
		return c, err
	}
	if c.envoy, err = pidCPU(e.PID()); err != nil {
		return c, err
	}
	if !first {
		if err := others(); err != nil {
			return c, err
		}
	}
	return c, nil
}

func pidCPU(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return procCPU(string(b))
}

// measure runs the warm-up, then the measured load, with the counters read around it.
func (b *envoyBench) measure(e *envoyproc.Envoy, c envoyConfig) (envoySample, error) {
	url, err := e.URL(c.name)
	if err != nil {
		return envoySample{}, err
	}
	svc := b.service(c.service)
	if b.o.warmup > 0 {
		if _, err := b.loadRun(url, c, b.o.warmup); err != nil {
			return envoySample{}, fmt.Errorf("warm-up: %w", err)
		}
	}
	// Stats before the CPU at the start and after it at the end: the admin calls stay out
	// of the span.
	c0, err := b.read(e, svc, true)
	if err != nil {
		return envoySample{}, err
	}
	rep, err := b.loadRun(url, c, b.o.duration)
	if err != nil {
		return envoySample{}, err
	}
	c1, err := b.read(e, svc, false)
	if err != nil {
		return envoySample{}, err
	}
	d := func(name string) int64 { return c1.stats[name] - c0.stats[name] }
	s := envoySample{cfg: c, rps: rep.RPS, p50: rep.P50, p99: rep.P99, requests: rep.Requests, statuses: rep.Statuses,
		errors: rep.Errors + int64(rep.Requests-rep.Statuses["200"]-rep.Statuses["429"]),
		served: d("http." + c.name + ".downstream_rq_completed"), reads: c1.reads - c0.reads, commands: c1.commands,
		redisCPU: float64(c1.redis-c0.redis) / clockTicks, envoyCPU: float64(c1.envoy-c0.envoy) / clockTicks}
	switch c.kind {
	case "ratelimit":
		s.decisions = d("cluster.upstream.ratelimit.ok") + d("cluster.upstream.ratelimit.over_limit")
		s.errors += d("cluster.upstream.ratelimit.error") + d("cluster.upstream.ratelimit.failure_mode_allowed")
		s.svcCPU = float64(c1.svc-c0.svc) / clockTicks
	case "wasm":
		s.decisions = s.served
		if c.variant == "lease" {
			// The VMs of one process share the metric's name: only the lease's VM calls.
			s.rlsCalls = d("wasmcustom.sluice.rls.calls")
			s.svcCPU = float64(c1.svc-c0.svc) / clockTicks
		}
	}
	if s.served == 0 || s.decisions == 0 {
		return s, fmt.Errorf("no request served or decided (served %d, decided %d; sluice-load: %d requests, first error %q)",
			s.served, s.decisions, rep.Requests, rep.FirstError)
	}
	return s, nil
}

// loadRun runs sluice-load on url for d (no warm-up of its own) with the configuration's
// keys in the x-key header.
func (b *envoyBench) loadRun(url string, c envoyConfig, d time.Duration) (loadReport, error) {
	cmd := exec.Command(b.load, "-url", url, "-c", strconv.Itoa(b.o.concurrency), "-d", d.String(), "-warmup", "0",
		"-keys", strconv.Itoa(c.keys(b.o)), "-key-header", keyHeader, "-json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return loadReport{}, fmt.Errorf("sluice-load: %v: %s%s", err, stderr.String(), stdout.String())
	}
	var rep loadReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		return loadReport{}, fmt.Errorf("sluice-load output: %v", err)
	}
	return rep, nil
}

// redisPID reads process_id from INFO server.
func redisPID(info string) (int, error) {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == "process_id" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("INFO server process_id %q", v)
			}
			return n, nil
		}
	}
	return 0, errors.New("INFO server: no process_id")
}

// revision is the checkout's commit, "+dirty" with uncommitted changes ("?" outside git).
func revision(root string) string {
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

// envoyCommandLine is how the results were produced.
func envoyCommandLine() string {
	s := "go run ./cmd/rlsbench " + strings.Join(os.Args[1:], " ")
	if v := os.Getenv("ENVOY"); v != "" {
		s = "ENVOY=" + v + " " + s
	}
	if os.Getenv("MAKELEVEL") != "" {
		s = "make bench-rls-envoy (" + s + ")"
	}
	return strings.TrimSpace(s)
}
