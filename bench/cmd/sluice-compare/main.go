// Command sluice-compare prints the embedded host's figures as ratios measured in one run: the
// configurations of each comparison are interleaved within every round, the ratio is taken
// per round, and the median and range over the rounds are printed (absolute times on a
// shared machine swing; ratios measured side by side hold).
//
//	go run ./bench/cmd/sluice-compare [-rounds 3] [-sections guest,cycle,sliding,startup]
//	make bench-compare                  # the same, BENCH_COMPARE_FLAGS to pass flags
//
// Sections (each a function taking *env, so other figures can be added beside them):
//
//	guest    `sluice run` under one load generator (sluice-load, a separate process): CPU
//	         time of the sluice run process per request (utime+stime from /proc/PID/stat
//	         over the measured run, divided by the requests served) and requests/s, for a
//	         no-op standard-Go module and for sluice.wasm allowing on one key, allowing over
//	         1,000 keys and denying every request; ratios to the no-op module
//	cycle    one request cycle in process (BenchmarkCycle, host.Exchange, no HTTP): CPU per
//	         request as a ratio to the no-op module
//	sliding  sliding_log with a full log against token_bucket (bench/sliding-log.sh)
//	startup  sluice run's first answer without a compilation cache and its idle RSS
//	         (bench/cmd/sluice-startup), beside the minimal wazero host's (bench/cmd/sluice-floor)
//	redis    Redis against the local backend through sluice run, and Redis CPU per decision
//	         against envoyproxy/ratelimit: need a Redis Cluster, so only their commands are
//	         printed unless the section is named explicitly
//
// It builds what it needs (sluice, sluice.wasm patched, the no-op module, sluice-load) into
// a temporary directory. Linux only (/proc). Only loopback addresses are used.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/bench/internal/loadgen"
	"github.com/sluice-proxy/sluice/bench/startup"
)

// env is what every section gets: the built artifacts and the common options.
type env struct {
	root     string // repository root
	dir      string // build directory
	sluice   string // sluice binary
	wasm     string // patched sluice.wasm
	noop     string // the no-op module
	load     string // sluice-load
	floor    string // sluice-floor (the startup section's minimal wazero host)
	rounds   int
	duration time.Duration
	warmup   time.Duration
	conc     int
	workers  int
	pin      bool
	wasmB    string // guest: a second module measured beside sluice.wasm (-guest-wasm-b)
	out      io.Writer
}

type section struct {
	name string
	run  func(*env) error
	// byDefault: run when -sections is not given; otherwise only its commands are printed.
	byDefault bool
}

var sections = []section{
	{"guest", Guest, true},
	{"cycle", Cycle, true},
	{"sliding", SlidingLog, true},
	{"startup", Startup, true},
	{"redis", Redis, false},
}

func main() {
	var e env
	names := flag.String("sections", "", "comma-separated sections to run (default: guest,cycle,sliding,startup)")
	flag.IntVar(&e.rounds, "rounds", 3, "rounds; every figure is the median over them, with the range")
	flag.DurationVar(&e.duration, "d", 5*time.Second, "guest: measured duration of one configuration in one round")
	flag.DurationVar(&e.warmup, "warmup", time.Second, "guest: unmeasured load before each measurement")
	flag.IntVar(&e.conc, "c", 32, "guest: connections of the load generator")
	flag.IntVar(&e.workers, "workers", runtime.NumCPU(), "guest: sluice run --workers")
	flag.BoolVar(&e.pin, "pin", false, "guest: sluice run on CPU 0 and the load generator on CPU 1 (taskset)")
	flag.StringVar(&e.wasmB, "guest-wasm-b", "", "guest: also run every sluice configuration with this module (say, built before a change), in the same rotation; its rows end in \" (b)\"")
	flag.Parse()
	e.out = os.Stdout
	if e.rounds < 1 {
		fail(errors.New("-rounds must be at least 1"))
	}
	want := map[string]bool{}
	for _, s := range sections {
		want[s.name] = s.byDefault
	}
	if *names != "" {
		clear(want)
		for _, n := range strings.Split(*names, ",") {
			if !slices.ContainsFunc(sections, func(s section) bool { return s.name == n }) {
				fail(fmt.Errorf("unknown section %q", n))
			}
			want[n] = true
		}
	}
	if err := e.build(); err != nil {
		fail(err)
	}
	defer os.RemoveAll(e.dir)
	start := time.Now()
	fmt.Fprintf(e.out, "sluice-compare: %d rounds, %d CPUs, load average at start %s\n", e.rounds, runtime.NumCPU(), build.LoadAvg())
	failed := false
	for _, s := range sections {
		fmt.Fprintf(e.out, "\n## %s\n\n", s.name)
		if !want[s.name] {
			fmt.Fprintf(e.out, "(not run; -sections %s runs it)\n", s.name)
			if s.name == "redis" {
				printRedisCommands(e.out)
			}
			continue
		}
		if err := s.run(&e); err != nil {
			fmt.Fprintf(e.out, "%s: %v\n", s.name, err)
			failed = true
		}
	}
	fmt.Fprintf(e.out, "\nsluice-compare: done in %v, load average at end %s\n", time.Since(start).Round(time.Second), build.LoadAvg())
	if failed {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sluice-compare:", err)
	os.Exit(2)
}

// build builds the artifacts into a new temporary directory.
func (e *env) build() error {
	var err error
	if e.root, e.dir, err = build.Workspace("sluice-compare"); err != nil {
		return err
	}
	e.sluice, e.wasm = filepath.Join(e.dir, "sluice"), filepath.Join(e.dir, "sluice.wasm")
	e.noop, e.load = filepath.Join(e.dir, "noop.wasm"), filepath.Join(e.dir, "sluice-load")
	e.floor = filepath.Join(e.dir, "sluice-floor")
	return build.Run(e.root, e.dir, "sluice-compare",
		build.SluiceWasm(e.wasm), build.Patch(e.wasm), build.NoopWasm(e.noop),
		build.Command("./cmd/sluice", e.sluice), build.Command("./bench/cmd/sluice-load", e.load),
		build.Command("./bench/cmd/sluice-floor", e.floor))
}

// stats are the median and range of one figure over the rounds.
type stats struct{ med, lo, hi float64 }

func summarize(v []float64) stats {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return stats{}
	}
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return stats{m, s[0], s[n-1]}
}

func (s stats) String() string { return fmt.Sprintf("%.2f× (%.2f–%.2f)", s.med, s.lo, s.hi) }

// guestConfig is one configuration of the guest section.
type guestConfig struct {
	name   string
	what   string
	config string // "" for the no-op module
	keys   int    // -keys of the load generator
	status int    // every measured request must get it
	wasm   string // the module, when not sluice.wasm (-guest-wasm-b)
}

// GuestConfigs are the guest section's configurations; the first is the baseline.
var GuestConfigs = []guestConfig{
	{"noop", "no-op standard-Go module", "", 0, 200, ""},
	{"allow", "sluice, token_bucket on the client IP (one hot key), every request admitted, headers both",
		`{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}],"response":{"headers":"both"}}`, 0, 200, ""},
	{"allow-1k", "sluice, token_bucket on x-key, 1,000 keys, every request admitted, headers both",
		`{"rules":[{"name":"per-key","key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}],"response":{"headers":"both"}}`, 1000, 200, ""},
	{"allow-1k-none", "as allow-1k with headers none",
		`{"rules":[{"name":"per-key","key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}],"response":{"headers":"none"}}`, 1000, 200, ""},
	{"deny", "sluice, token_bucket on the client IP, limit 1 per hour: every request denied (429), headers both",
		`{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1,"window":"1h"}],"response":{"headers":"both"}}`, 0, 429, ""},
}

// guestSample is one configuration's figures in one round.
type guestSample struct {
	cpuPerReq float64 // µs of sluice run CPU per request
	rps       float64
}

// Guest measures the guest section: every configuration once per round, in a rotated order.
func Guest(e *env) error {
	cache := filepath.Join(e.dir, "cache")
	configs := slices.Clone(GuestConfigs)
	if e.wasmB != "" {
		for _, gc := range GuestConfigs[1:] {
			gc.name, gc.wasm = gc.name+" (b)", e.wasmB
			configs = append(configs, gc)
		}
	}
	samples := make([][]guestSample, len(configs))
	for r := 0; r < e.rounds; r++ {
		for k := range configs {
			i := (k + r) % len(configs) // rotate: no configuration always runs first
			gc := configs[i]
			s, err := e.guestRun(gc, cache)
			if err != nil {
				return fmt.Errorf("%s, round %d: %v", gc.name, r+1, err)
			}
			fmt.Fprintf(os.Stderr, "guest round %d %-14s %7.1f µs CPU/request %8.0f req/s\n", r+1, gc.name, s.cpuPerReq, s.rps)
			samples[i] = append(samples[i], s)
		}
	}
	fmt.Fprintf(e.out, "`sluice run --workers %d` and sluice-load -c %d (%v measured after %v of warm-up per configuration and round), %d rounds interleaved; ratios to the no-op module taken per round, median (min–max):\n\n",
		e.workers, e.conc, e.duration, e.warmup, e.rounds)
	fmt.Fprintln(e.out, "| configuration | CPU per request vs no-op | req/s vs no-op | CPU µs/request | req/s |")
	fmt.Fprintln(e.out, "|---|---:|---:|---:|---:|")
	base := samples[0]
	for i, gc := range configs {
		var cpuR, rpsR, cpu, rps []float64
		for r, s := range samples[i] {
			cpuR = append(cpuR, s.cpuPerReq/base[r].cpuPerReq)
			rpsR = append(rpsR, s.rps/base[r].rps)
			cpu, rps = append(cpu, s.cpuPerReq), append(rps, s.rps)
		}
		c, q := summarize(cpu), summarize(rps)
		fmt.Fprintf(e.out, "| %s | %s | %s | %.1f (%.1f–%.1f) | %.0f (%.0f–%.0f) |\n", gc.name, summarize(cpuR), summarize(rpsR), c.med, c.lo, c.hi, q.med, q.lo, q.hi)
	}
	// The denial against the admission, per round.
	idx := func(n string) int {
		return slices.IndexFunc(GuestConfigs, func(g guestConfig) bool { return g.name == n })
	}
	if d, a := idx("deny"), idx("allow"); d >= 0 && a >= 0 {
		var v []float64
		for r := range samples[d] {
			v = append(v, samples[d][r].cpuPerReq/samples[a][r].cpuPerReq)
		}
		fmt.Fprintf(e.out, "\ndeny vs allow, CPU per request: %s\n", summarize(v))
	}
	fmt.Fprintln(e.out)
	for _, gc := range GuestConfigs {
		fmt.Fprintf(e.out, "- %s: %s\n", gc.name, gc.what)
	}
	if e.wasmB != "" {
		fmt.Fprintf(e.out, "- (b): the same configuration with %s\n", e.wasmB)
	}
	return nil
}

// guestRun starts sluice run with gc, warms it up, and measures one run of the load
// generator: the server's CPU time over it per request served, and the generator's req/s.
func (e *env) guestRun(gc guestConfig, cache string) (guestSample, error) {
	args := []string{e.sluice, "run", "--listen", "127.0.0.1:0", "--workers", strconv.Itoa(e.workers), "--cache-dir", cache, "--log-level", "error"}
	if gc.config == "" {
		args = append(args, "--wasm", e.noop)
	} else {
		cfg := filepath.Join(e.dir, strings.TrimSuffix(gc.name, " (b)")+".json")
		if err := os.WriteFile(cfg, []byte(gc.config), 0o644); err != nil {
			return guestSample{}, err
		}
		wasm := e.wasm
		if gc.wasm != "" {
			wasm = gc.wasm
		}
		args = append(args, "--wasm", wasm, "--config", cfg)
	}
	if e.pin {
		args = append([]string{"taskset", "-c", "0"}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := exec.CommandContext(ctx, args[0], args[1:]...)
	stdout, err := srv.StdoutPipe()
	if err != nil {
		return guestSample{}, err
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		return guestSample{}, err
	}
	defer startup.Stop(srv)
	addr, err := listenAddr(ctx, stdout)
	if err != nil {
		return guestSample{}, err
	}
	url := "http://" + addr + "/load"
	if err := waitReady(ctx, url); err != nil {
		return guestSample{}, err
	}
	if _, err := e.loadRun(ctx, url, gc, e.warmup, 0); err != nil {
		return guestSample{}, fmt.Errorf("warm-up: %v", err)
	}
	cpu0, err := startup.CPUTime(srv.Process.Pid)
	if err != nil {
		return guestSample{}, err
	}
	rep, err := e.loadRun(ctx, url, gc, e.duration, gc.status)
	if err != nil {
		return guestSample{}, err
	}
	cpu1, err := startup.CPUTime(srv.Process.Pid)
	if err != nil {
		return guestSample{}, err
	}
	if rep.Requests == 0 {
		return guestSample{}, errors.New("no request served")
	}
	return guestSample{cpuPerReq: float64((cpu1 - cpu0).Nanoseconds()) / 1000 / float64(rep.Requests), rps: rep.RPS}, nil
}

type loadReport = loadgen.Report

// loadRun runs sluice-load once against url; want != 0 requires every request to get it.
func (e *env) loadRun(ctx context.Context, url string, gc guestConfig, d time.Duration, want int) (loadReport, error) {
	args := []string{e.load, "-url", url, "-c", strconv.Itoa(e.conc), "-d", d.String(), "-warmup", "0", "-keys", strconv.Itoa(gc.keys), "-json", "-want-status", strconv.Itoa(want)}
	if e.pin {
		args = append([]string{"taskset", "-c", "1"}, args...)
	}
	c := exec.CommandContext(ctx, args[0], args[1:]...)
	return loadgen.Run(c)
}

func listenAddr(ctx context.Context, r io.Reader) (string, error) {
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "sluice: listening on http://"); ok {
				a, _, _ := strings.Cut(rest, " ")
				select {
				case addr <- a:
				default:
				}
			}
		}
	}()
	select {
	case a := <-addr:
		return a, nil
	case <-ctx.Done():
		return "", errors.New("sluice run printed no listening line")
	}
}

// waitReady polls url until it answers (any status), with a deadline.
func waitReady(ctx context.Context, url string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("sluice run did not answer within a minute")
}

// Cycle runs BenchmarkCycle once per round (its configurations in turn within the round) and
// prints each one's CPU per request as a ratio to the no-op module's in that round.
func Cycle(e *env) error {
	bin := filepath.Join(e.dir, "cycle.test")
	c := exec.Command("go", "test", "-c", "-o", bin, "./bench/cycle")
	c.Dir = e.root
	if msg, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("go test -c ./bench/cycle: %v\n%s", err, msg)
	}
	ratios := map[string][]float64{}
	var names []string
	for r := 0; r < e.rounds; r++ {
		c := exec.Command(bin, "-test.run", "^$", "-test.bench", "^BenchmarkCycle$", "-test.benchtime", "3000x", "-test.count", "1")
		c.Dir = filepath.Join(e.root, "bench", "cycle")
		c.Env = append(os.Environ(), "SLUICE_BENCH_WASM="+e.wasm)
		out, err := c.CombinedOutput()
		if err != nil {
			return fmt.Errorf("BenchmarkCycle: %v\n%s", err, out)
		}
		cpu := map[string]float64{}
		var order []string
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 || !strings.HasPrefix(f[0], "BenchmarkCycle/") || f[5] != "cpu-ns/op" {
				continue
			}
			name := strings.TrimPrefix(f[0], "BenchmarkCycle/")
			if i := strings.LastIndexByte(name, '-'); i > 0 {
				name = name[:i]
			}
			v, err := strconv.ParseFloat(f[4], 64)
			if err != nil {
				continue
			}
			cpu[name] = v
			order = append(order, name)
		}
		base := cpu["noop-module"]
		if base == 0 {
			return fmt.Errorf("BenchmarkCycle printed no noop-module figure:\n%s", out)
		}
		if names == nil {
			names = order
		}
		fmt.Fprintf(os.Stderr, "cycle round %d: no-op module %.0f cpu-ns/request\n", r+1, base)
		for n, v := range cpu {
			ratios[n] = append(ratios[n], v/base)
			ratios[n+"\x00abs"] = append(ratios[n+"\x00abs"], v/1000)
		}
	}
	fmt.Fprintf(e.out, "one request cycle in process (BenchmarkCycle, 3000 requests per configuration, %d rounds): process CPU per request as a ratio to the no-op module, median (min–max):\n\n", e.rounds)
	fmt.Fprintln(e.out, "| configuration | CPU vs no-op | CPU µs/request |")
	fmt.Fprintln(e.out, "|---|---:|---:|")
	for _, n := range names {
		a := summarize(ratios[n+"\x00abs"])
		fmt.Fprintf(e.out, "| %s | %s | %.1f (%.1f–%.1f) |\n", n, summarize(ratios[n]), a.med, a.lo, a.hi)
	}
	return nil
}

// SlidingLog runs bench/sliding-log.sh (natively) with -rounds rounds.
func SlidingLog(e *env) error {
	fmt.Fprintf(e.out, "ROUNDS=%d bench/sliding-log.sh (WASM=1 adds full cycles through the module):\n\n", e.rounds)
	c := exec.Command("sh", "bench/sliding-log.sh")
	c.Dir = e.root
	c.Env = append(os.Environ(), "ROUNDS="+strconv.Itoa(e.rounds))
	c.Stdout, c.Stderr = e.out, os.Stderr
	return c.Run()
}

// Startup runs bench/cmd/sluice-startup on the binary and module built here, with the minimal
// wazero host (bench/cmd/sluice-floor) on both modules in the same rounds.
func Startup(e *env) error {
	fmt.Fprintf(e.out, "go run ./bench/cmd/sluice-startup -sluice SLUICE -wasm SLUICE.WASM,NOOP.WASM -floor SLUICE-FLOOR -rounds %d (the no-op module, and the minimal wazero host: the floors):\n\n", e.rounds)
	c := exec.Command("go", "run", "./bench/cmd/sluice-startup", "-sluice", e.sluice, "-wasm", e.wasm+","+e.noop, "-floor", e.floor, "-rounds", strconv.Itoa(e.rounds))
	c.Dir = e.root
	c.Stdout, c.Stderr = e.out, os.Stderr
	return c.Run()
}

// redisCommands are the Redis figures' own commands (they need a Redis Cluster).
var redisCommands = []string{
	"go test ./cmd/sluice -run '^$' -bench '^BenchmarkRunRedisVsLocalThroughput$' -benchtime 3x   # Redis vs local backend through sluice run",
	"make bench-rls                                                  # Redis CPU per decision vs envoyproxy/ratelimit, many keys",
	"make bench-rls RLSBENCH_FLAGS='-ok-keys 2 -denied-keys 1'       # the same on a hot key (coalesced calls)",
}

func printRedisCommands(w io.Writer) {
	for _, c := range redisCommands {
		fmt.Fprintln(w, "  "+c)
	}
}

// Redis runs the Redis figures' commands.
func Redis(e *env) error {
	for _, cmd := range [][]string{
		{"go", "test", "-count=1", "./cmd/sluice", "-run", "^$", "-bench", "^BenchmarkRunRedisVsLocalThroughput$", "-benchtime", "3x"},
		{"make", "bench-rls"},
		{"make", "bench-rls", "RLSBENCH_FLAGS=-ok-keys 2 -denied-keys 1"},
	} {
		fmt.Fprintf(e.out, "$ %s\n", strings.Join(cmd, " "))
		c := exec.Command(cmd[0], cmd[1:]...)
		c.Dir = e.root
		c.Stdout, c.Stderr = e.out, os.Stderr
		if err := c.Run(); err != nil {
			return err
		}
	}
	return nil
}
