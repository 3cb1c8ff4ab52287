// Command bench-envoy measures sluice.wasm where users run it: inside one real Envoy (V8),
// against Envoy's own local_ratelimit filter, a no-op standard-Go module and no filter at
// all. Every figure is a ratio taken per round, configurations
// interleaved within each round, median and range over the rounds printed: absolute figures
// on a shared machine swing, ratios measured side by side hold.
//
//	go run ./bench/envoy [-rounds 5] [-d 3s] [-warmup 1s] [-c 32] [-envoy PATH] [-wasm FILE]
//	make bench-envoy                # the same, BENCH_ENVOY_FLAGS to pass flags, ENVOY=path
//
// Families (one Envoy process per family and round, --concurrency 2; one listener per
// variant; upstream: a direct_response from a second listener of the same Envoy, so nothing
// outside Envoy is measured): none, noop, native (local_ratelimit, a token bucket per x-key
// value through a dynamic descriptor), tb-none and tb-both (sluice token_bucket, response
// headers none / both), sw-none (sluice sliding_window). Variants: 1 key and 1,000 keys,
// admitted (limits far above the load) and denied (1 per hour; the warm-up uses every key
// first). The baselines are measured on admit-1k only.
//
// Per configuration: req/s of a closed-loop load (bench/cmd/sluice-load, fixed connections and
// duration) and Envoy's CPU per request (utime+stime of the Envoy process from /proc/PID/stat
// over the measured interval, divided by the requests served); ratios to native (same
// variant) and to none; per family Envoy's VmRSS after its round and the wasm.* stats.
// Results go to stdout and to -out (bench/envoy/results.txt), the command line at the top.
//
// Bounds: loopback only; every process it starts is stopped by its PID; Linux only (/proc).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

type options struct {
	rounds   int
	duration time.Duration
	warmup   time.Duration
	conc     int
	envoy    string
	version  string
	wasm     string
	out      string
	only     string
}

// env is what the run shares: the built artifacts and the Envoy binary.
type env struct {
	o      options
	root   string
	dir    string
	wasm   string
	noop   string
	load   string
	target envoyproc.Target
}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; every figure is the median over them, with the range")
	flag.DurationVar(&o.duration, "d", 3*time.Second, "measured duration of one configuration in one round")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each measurement (it also exhausts the denied variants' keys)")
	flag.IntVar(&o.conc, "c", 32, "connections of the load generator")
	flag.StringVar(&o.envoy, "envoy", "", "Envoy binary (default: $ENVOY, else the pinned -envoy-version, fetched when missing)")
	flag.StringVar(&o.version, "envoy-version", "1.40.0", "pinned Envoy version when neither -envoy nor $ENVOY is set")
	flag.StringVar(&o.wasm, "wasm", "", "sluice.wasm to load (default: built and patched into a temporary directory)")
	flag.StringVar(&o.out, "out", "", "results file (default: bench/envoy/results.txt in the repository; \"-\": none)")
	flag.StringVar(&o.only, "families", "", "comma-separated families to run (default all; none and native are always run: the ratios need them)")
	flag.Parse()
	if o.rounds < 1 || o.duration <= 0 || o.conc < 1 {
		fail(errors.New("-rounds, -d and -c must be positive"))
	}
	e := &env{o: o}
	if err := e.setup(); err != nil {
		fail(err)
	}
	defer os.RemoveAll(e.dir)
	if err := e.run(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-envoy:", err)
	os.Exit(1)
}

// setup finds the repository, builds the modules and the load generator, and resolves and
// checks the Envoy binary.
func (e *env) setup() error {
	var err error
	if e.root, e.dir, err = build.Workspace("bench-envoy"); err != nil {
		return err
	}
	e.noop, e.load = filepath.Join(e.dir, "noop.wasm"), filepath.Join(e.dir, "sluice-load")
	var steps []build.Step
	// Both modules as make build ships sluice.wasm: patched (poll_oneoff answered in the guest).
	patch := []string{e.noop}
	if e.o.wasm != "" {
		if e.wasm, err = filepath.Abs(e.o.wasm); err != nil {
			return err
		}
	} else {
		e.wasm = filepath.Join(e.dir, "sluice.wasm")
		steps = append(steps, build.SluiceWasm(e.wasm))
		patch = append(patch, e.wasm)
	}
	steps = append(steps, build.NoopWasm(e.noop), build.Command("./bench/cmd/sluice-load", e.load), build.Patch(patch...))
	if err := build.Run(e.root, e.dir, "bench-envoy", steps...); err != nil {
		return err
	}
	bin := e.o.envoy
	if bin == "" {
		bin = os.Getenv("ENVOY")
	}
	if strings.HasPrefix(bin, "docker:") {
		return errors.New("ENVOY=docker:… is not supported here: the CPU figures need the Envoy process's /proc entry")
	}
	if bin == "" {
		if bin, err = envoyproc.Binary(e.o.version); err != nil {
			return err
		}
	}
	v, err := envoyproc.Version(bin)
	if err != nil {
		return err
	}
	e.target = envoyproc.Target{Version: v, Bin: bin}
	chk := filepath.Join(e.dir, "v8check")
	if err := os.MkdirAll(chk, 0o755); err != nil {
		return err
	}
	return envoyproc.CheckV8(e.target, chk)
}

// setup is one measured configuration: a family on a variant.
type setup struct {
	f family
	v variant
}

func (c setup) name() string { return c.f.name + " " + c.v.name }

// sample is one configuration's figures in one round.
type sample struct {
	rps       float64
	cpuPerReq float64 // µs of Envoy CPU per request
}

// famSample is one family's process figures in one round.
type famSample struct {
	rssMB float64
	wasm  map[string]int64
}

func (e *env) selected() []family {
	if e.o.only == "" {
		return families
	}
	want := map[string]bool{"none": true, "native": true}
	for _, n := range strings.Split(e.o.only, ",") {
		want[strings.TrimSpace(n)] = true
	}
	var fs []family
	for _, f := range families {
		if want[f.name] {
			fs = append(fs, f)
		}
	}
	return fs
}

func (f family) variants() []variant {
	if !f.baseline {
		return variants
	}
	for _, v := range variants {
		if v.name == baselineVariant {
			return []variant{v}
		}
	}
	panic("no baseline variant")
}

func (e *env) run() error {
	fams := e.selected()
	samples := map[string][]sample{}
	famSamples := map[string][]famSample{}
	start := time.Now()
	load0 := build.LoadAvg()
	for r := 0; r < e.o.rounds; r++ {
		for k := range fams {
			f := fams[(k+r)%len(fams)] // rotate: no family always runs first
			fs, ss, err := e.runFamily(f, r)
			if err != nil {
				return fmt.Errorf("%s, round %d: %v", f.name, r+1, err)
			}
			famSamples[f.name] = append(famSamples[f.name], fs)
			for n, s := range ss {
				samples[n] = append(samples[n], s)
			}
		}
	}
	var buf bytes.Buffer
	e.report(&buf, fams, samples, famSamples, time.Since(start), load0)
	os.Stdout.Write(buf.Bytes())
	out := e.o.out
	if out == "" {
		out = filepath.Join(e.root, "bench", "envoy", "results.txt")
	}
	if out != "-" {
		if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench-envoy: results written to %s\n", out)
	}
	return nil
}

// runFamily starts one Envoy for f, measures its variants in a rotated order, reads its RSS
// and wasm stats, and stops it.
func (e *env) runFamily(f family, round int) (famSample, map[string]sample, error) {
	wasm := e.wasm
	if f.kind == "noop" {
		wasm = e.noop
	}
	port, err := freePort()
	if err != nil {
		return famSample{}, nil, err
	}
	y, err := renderBootstrap(f, wasm, port)
	if err != nil {
		return famSample{}, nil, err
	}
	dir := filepath.Join(e.dir, fmt.Sprintf("%s-%d", f.name, round+1))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return famSample{}, nil, err
	}
	p, err := startEnvoy(e.target.Bin, dir, y)
	if err != nil {
		return famSample{}, nil, err
	}
	defer p.stop()
	vs := f.variants()
	out := map[string]sample{}
	for k := range vs {
		v := vs[(k+round)%len(vs)]
		c := setup{f, v}
		s, err := e.measure(p, c)
		if err != nil {
			return famSample{}, nil, fmt.Errorf("%s: %v", c.name(), err)
		}
		fmt.Fprintf(os.Stderr, "round %d %-18s %8.0f req/s %7.1f µs Envoy CPU/request\n", round+1, c.name(), s.rps, s.cpuPerReq)
		out[c.name()] = s
	}
	var fs famSample
	st, err := readFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return fs, nil, err
	}
	rss, err := parseRSS(st)
	if err != nil {
		return fs, nil, err
	}
	fs.rssMB = float64(rss) / 1024
	body, err := p.get("/stats?filter=^wasm")
	if err != nil {
		return fs, nil, err
	}
	fs.wasm = map[string]int64{}
	for n, v := range parseStats(body) {
		if keepWasmStat(n) {
			fs.wasm[n] = v
		}
	}
	return fs, out, nil
}

// measure warms a configuration's listener up (which also exhausts a denied variant's keys)
// and measures one closed-loop run: Envoy's CPU over it per request served, and req/s.
func (e *env) measure(p *envoyProc, c setup) (sample, error) {
	url, err := p.url(listenerName(c.v))
	if err != nil {
		return sample{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+e.o.warmup+e.o.duration)
	defer cancel()
	if _, err := e.loadRun(ctx, url, c.v.keys, e.o.warmup, 0); err != nil {
		return sample{}, fmt.Errorf("warm-up: %v", err)
	}
	cpu0, err := p.cpu()
	if err != nil {
		return sample{}, err
	}
	rep, err := e.loadRun(ctx, url, c.v.keys, e.o.duration, c.v.wantStatus())
	if err != nil {
		return sample{}, err
	}
	cpu1, err := p.cpu()
	if err != nil {
		return sample{}, err
	}
	if rep.Requests == 0 {
		return sample{}, errors.New("no request served")
	}
	return sample{rps: rep.RPS, cpuPerReq: float64((cpu1 - cpu0).Nanoseconds()) / 1000 / float64(rep.Requests)}, nil
}

type loadReport struct {
	Requests int     `json:"requests"`
	RPS      float64 `json:"rps"`
}

// loadRun runs sluice-load once; want != 0 requires every request to get that status.
func (e *env) loadRun(ctx context.Context, url string, keys int, d time.Duration, want int) (loadReport, error) {
	if d <= 0 {
		return loadReport{}, nil
	}
	args := []string{"-url", url + "/", "-c", strconv.Itoa(e.o.conc), "-d", d.String(), "-warmup", "0",
		"-keys", strconv.Itoa(keys), "-key-header", keyHeader, "-json", "-want-status", strconv.Itoa(want)}
	cmd := exec.CommandContext(ctx, e.load, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return loadReport{}, fmt.Errorf("sluice-load: %v: %s%s", err, errb.String(), out.String())
	}
	var rep loadReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		return loadReport{}, fmt.Errorf("sluice-load output: %v", err)
	}
	return rep, nil
}

// report writes the results: the command line and the setting, one table of configurations,
// one of the families' processes.
func (e *env) report(w io.Writer, fams []family, samples map[string][]sample, famSamples map[string][]famSample, took time.Duration, load0 string) {
	fmt.Fprintf(w, "# %s\n", commandLine())
	fmt.Fprintf(w, "# %s · sluice %s · Envoy %s (%s) --concurrency 2 · %d CPUs · load average %s at start, %s at end · %v\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), e.revision(), e.target.Version, e.target.Bin, runtime.NumCPU(), load0, build.LoadAvg(), took.Round(time.Second))
	fmt.Fprintf(w, "%d rounds, families interleaved (rotated) within each round, one Envoy process per family and round; sluice-load -c %d, %v measured after %v of warm-up per configuration. Ratios taken per round, median (min–max) over the rounds. CPU: utime+stime of the Envoy process over the measured run per request served.\n\n",
		e.o.rounds, e.o.conc, e.o.duration, e.o.warmup)
	ratio := func(a, b []sample, f func(sample) float64) string {
		var v []float64
		for i := range min(len(a), len(b)) {
			v = append(v, f(a[i])/f(b[i]))
		}
		if len(v) == 0 {
			return "–"
		}
		return summarize(v).ratio()
	}
	rps := func(s sample) float64 { return s.rps }
	cpu := func(s sample) float64 { return s.cpuPerReq }
	fmt.Fprintln(w, "| configuration | req/s | Envoy CPU µs/request | req/s vs native | CPU/request vs native | req/s vs none | CPU/request vs none |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	none := samples["none "+baselineVariant]
	for _, f := range fams {
		for _, v := range variants {
			if !slices.ContainsFunc(f.variants(), func(x variant) bool { return x.name == v.name }) {
				continue
			}
			c := setup{f, v}
			ss := samples[c.name()]
			nv := v.name
			native := samples["native "+nv]
			var r, u []float64
			for _, s := range ss {
				r, u = append(r, s.rps), append(u, s.cpuPerReq)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", c.name(), summarize(r).format("%.0f"), summarize(u).format("%.1f"),
				ratio(ss, native, rps), ratio(ss, native, cpu), ratio(ss, none, rps), ratio(ss, none, cpu))
		}
	}
	fmt.Fprintln(w, "\nBaselines (none, noop) are measured on admit-1k only; their ratios to native are to native admit-1k.")
	fmt.Fprintln(w, "\nPer family, after its round (every variant run): Envoy VmRSS, the wasm VM stats Envoy exposes (it has no per-VM memory_size stat in this binary unless listed) and sluice's guest heap gauge (median over rounds):")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| family | VmRSS MB | RSS vs native | wasm.* stats |")
	fmt.Fprintln(w, "|---|---:|---:|---|")
	nat := famSamples["native"]
	for _, f := range fams {
		fs := famSamples[f.name]
		var rss, rr []float64
		for i, s := range fs {
			rss = append(rss, s.rssMB)
			if i < len(nat) {
				rr = append(rr, s.rssMB/nat[i].rssMB)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", f.name, summarize(rss).format("%.1f"), summarize(rr).ratio(), wasmStats(fs))
	}
	fmt.Fprintln(w)
	for _, f := range fams {
		fmt.Fprintf(w, "- %s: %s\n", f.name, f.what)
	}
	fmt.Fprintln(w, "- variants: admit-1 / admit-1k: x-key with 1 / 1,000 values round-robin, limit 1,000,000,000/s (every request 200); deny-1 / deny-1k: limit 1 per hour, every key used by the warm-up (every measured request 429)")
	fmt.Fprintln(w, "- upstream: direct_response 200 from a second listener of the same Envoy")
}

// keepWasmStat: the VM counts and any memory figure Envoy exposes, and sluice's own heap
// gauge; not the remote-load, reload and per-rule counters.
func keepWasmStat(n string) bool {
	switch {
	case strings.HasPrefix(n, "wasm.envoy.wasm.runtime."), strings.HasSuffix(n, ".wasm_vm_count"),
		strings.Contains(n, "memory"), strings.HasSuffix(n, ".guest.heap_bytes"):
		return true
	}
	return false
}

// wasmStats are the medians of the wasm.* stats of a family, "name=value" joined.
func wasmStats(fs []famSample) string {
	names := map[string]bool{}
	for _, s := range fs {
		for n := range s.wasm {
			names[n] = true
		}
	}
	var keys []string
	for n := range names {
		keys = append(keys, n)
	}
	sort.Strings(keys)
	var parts []string
	for _, n := range keys {
		var v []float64
		for _, s := range fs {
			v = append(v, float64(s.wasm[n]))
		}
		parts = append(parts, fmt.Sprintf("%s=%.0f", strings.TrimPrefix(n, "wasm.envoy.wasm.runtime."), summarize(v).med))
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}

// revision is the checkout's commit, "+dirty" with uncommitted changes ("?" outside git).
func (e *env) revision() string {
	out, err := exec.Command("git", "-C", e.root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "?"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", e.root, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += "+dirty"
	}
	return rev
}

// commandLine is how the results were produced, for the top of the file.
func commandLine() string {
	args := os.Args[1:]
	s := "go run ./bench/envoy"
	if len(args) > 0 {
		s += " " + strings.Join(args, " ")
	}
	if v := os.Getenv("ENVOY"); v != "" {
		s = "ENVOY=" + v + " " + s
	}
	return s
}

func readFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}

// freePort returns a loopback port that was free a moment ago (for the upstream listener,
// which the cluster must name before Envoy starts).
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
