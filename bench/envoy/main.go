// Command bench-envoy measures sluice where users run it: inside one real Envoy, as
// sluice.wasm (V8) and as the dynamic module libsluice.so, against Envoy's own
// local_ratelimit filter, no-op modules and no filter at all. Every comparison is a ratio
// taken per round between runs seconds apart in the same process, median and range over the
// rounds printed: absolute figures on a shared machine swing, ratios measured side by side
// hold.
//
//	go run ./bench/envoy [-rounds 5] [-d 3s] [-warmup 1s] [-c 32] [-envoy PATH] [-wasm FILE]
//	                     [-dynmod libsluice.so] [-families tb-none,…]
//	                     [-phases throughput,latency,memory,startup]
//	make bench-envoy                # the same, BENCH_ENVOY_FLAGS to pass flags, ENVOY=path
//
// Families: none, noop, native (local_ratelimit, a token bucket per x-key value through a
// dynamic descriptor), tb-none and tb-both (sluice token_bucket, response headers none /
// both), sw-none (sluice sliding_window); on the dynamic module, dm-tb-none, dm-tb-both and
// dm-sw-none (the same configurations in libsluice.so), dm-noop-go (libsluice.so whose only
// rule never matches: one entry into the Go runtime per request, the Go runtime's floor)
// and dm-noop-c (a C module with every required hook that reads x-key and continues,
// testdata/noop_dynmod.c built with gcc). Variants: 1 key and 1,000 keys, admitted (limits
// far above the load) and denied (1 per hour; the warm-up uses every key first). The
// baselines (none, noop, dm-noop-c, dm-noop-go) are measured on admit-1k only. Upstream: a
// direct_response from a listener of the same Envoy, so nothing outside Envoy is measured.
// Envoy runs with --concurrency 2, and with ENVOY_DYNAMIC_MODULES_SEARCH_PATH naming one
// directory that holds libsluice.so (built from the checkout, or -dynmod) and the C no-op.
// An Envoy older than 1.38 cannot load libsluice.so: the dm-* families are then left out.
//
// Phases:
//   - throughput: per round one Envoy process with every configuration on a listener of its
//     own (one Wasm VM per family; one libsluice.so, one Go runtime, with a filter
//     configuration per dm-* listener); the configurations run one after the other in an
//     order rotated from round to round (reversed every other round), each a closed-loop
//     load (bench/cmd/sluice-load) for -warmup then -d: req/s, and Envoy's CPU per request
//     (utime+stime of the process from /proc/PID/stat over the measured run, divided by the
//     requests served; only one listener takes load at a time).
//   - latency: in the same process, after the round's throughput runs, an open loop at half
//     the req/s native admit-1k reached in that round, on native's and every sluice family's
//     (either artifact) admit-1k listener in a rotated order: p50 and p99 measured from each
//     request's due time.
//   - memory: per family an Envoy process of its own with its admit-1k listener (a dm-*
//     family's loads its dynamic module and no Wasm): VmRSS after start, after every third of
//     -mem-requests requests, after -mem-keys distinct keys (not for the baselines), and the
//     wasm stats Envoy exposes with sluice's guest metrics.
//   - startup: per family and -startup-rounds round a fresh Envoy process: the time from
//     starting it to /ready saying LIVE, then a closed loop on -first-c connections (exact
//     connection balance: both workers take half) for the first second after ready: its
//     slowest request and p99, and the connections each worker took.
//
// Results go to stdout and to -out (bench/envoy/results.txt): a header line (date, commit,
// command), the setting, the performance goals against the figures (sluice.wasm's, then the
// dynamic module's of issue 37 with what the Go runtime costs), then the tables.
//
// Bounds: loopback only; every process it starts is stopped by its PID; Linux only (/proc).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/bench/internal/loadgen"
	"github.com/sluice-proxy/sluice/bench/internal/rounds"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

type options struct {
	rounds        int
	duration      time.Duration
	warmup        time.Duration
	conc          int
	envoy         string
	version       string
	wasm          string
	wasmB         string
	dynmod        string
	out           string
	only          string
	phases        string
	memRequests   int
	memKeys       int
	startupRounds int
	firstConc     int
}

// env is what the run shares: the built artifacts and the Envoy binary.
type env struct {
	o       options
	root    string
	dir     string
	wasm    string
	wasmB   string // -wasm-b, absolute
	fams    []family
	dmDir   string // the dynamic modules' search path, "" when no family loads one
	dmFrom  string // where libsluice.so came from, for the report
	noop    string
	denier  string
	counter string
	load    string
	target  envoyproc.Target
}

var allPhases = []string{"throughput", "latency", "memory", "startup"}

func main() {
	var o options
	flag.IntVar(&o.rounds, "rounds", 5, "throughput and latency rounds; every figure is the median over them, with the range")
	flag.DurationVar(&o.duration, "d", 3*time.Second, "measured duration of one configuration in one round")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each measurement (it also exhausts the denied variants' keys)")
	flag.IntVar(&o.conc, "c", 32, "connections of the load generator")
	flag.StringVar(&o.envoy, "envoy", "", "Envoy binary (default: $ENVOY, else the pinned -envoy-version, fetched when missing)")
	flag.StringVar(&o.version, "envoy-version", "1.40.0", "pinned Envoy version when neither -envoy nor $ENVOY is set")
	flag.StringVar(&o.wasm, "wasm", "", "sluice.wasm to load (default: built and patched into a temporary directory)")
	flag.StringVar(&o.wasmB, "wasm-b", "", "a second sluice.wasm (say, built before a change): every sluice family selected is also run on it as FAMILY-b, in the same rounds, and the goals table adds each -b family against its own")
	flag.StringVar(&o.dynmod, "dynmod", "", "libsluice.so to load (default: built from this checkout into a temporary directory)")
	flag.StringVar(&o.out, "out", "", "results file (default: bench/envoy/results.txt in the repository; \"-\": none)")
	flag.StringVar(&o.only, "families", "", "comma-separated families to run (default all but tb-alog, tb-top, dm-tb-alog, dm-tb-top; none and native are always run, noop and the floors unless only dm-* families are named, dm-noop-c and dm-noop-go with any dm-* family: the ratios need them)")
	flag.StringVar(&o.phases, "phases", strings.Join(allPhases, ","), "comma-separated phases to run (latency needs throughput)")
	flag.IntVar(&o.memRequests, "mem-requests", 300_000, "memory: requests before the RSS readings (in three parts)")
	flag.IntVar(&o.memKeys, "mem-keys", 200_000, "memory: distinct keys sent after the requests (rate-limiting families)")
	flag.IntVar(&o.startupRounds, "startup-rounds", 5, "start-up: fresh processes per family")
	flag.IntVar(&o.firstConc, "first-c", 16, "start-up: connections of the load in the first second after ready")
	flag.Parse()
	if o.rounds < 1 || o.duration <= 0 || o.conc < 1 || o.memRequests < 3 || o.memKeys < 1 || o.startupRounds < 1 || o.firstConc < 2 {
		fail(errors.New("-rounds, -d, -c, -mem-requests (≥ 3), -mem-keys, -startup-rounds and -first-c (≥ 2) must be positive"))
	}
	ph, err := parsePhases(o.phases)
	if err != nil {
		fail(err)
	}
	e := &env{o: o}
	if err := e.setup(); err != nil {
		fail(err)
	}
	defer os.RemoveAll(e.dir)
	if err := e.run(ph); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench-envoy:", err)
	os.Exit(1)
}

// parsePhases reads -phases into a set.
func parsePhases(s string) (map[string]bool, error) {
	ph := map[string]bool{}
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		ok := false
		for _, a := range allPhases {
			ok = ok || a == n
		}
		if !ok {
			return nil, fmt.Errorf("-phases: unknown phase %q (have %s)", n, strings.Join(allPhases, ", "))
		}
		ph[n] = true
	}
	if len(ph) == 0 {
		return nil, errors.New("-phases: none given")
	}
	if ph["latency"] && !ph["throughput"] {
		return nil, errors.New("-phases: latency needs throughput (its rate is half of native's throughput in the same round)")
	}
	return ph, nil
}

// setup finds the repository, resolves and checks the Envoy binary, chooses the families,
// and builds the modules and the load generator.
func (e *env) setup() error {
	var err error
	if e.target, err = envoyproc.LocalTarget(e.o.envoy, e.o.version, "the CPU figures need the Envoy process's /proc entry"); err != nil {
		return err
	}
	if e.o.wasmB != "" {
		if e.wasmB, err = filepath.Abs(e.o.wasmB); err != nil {
			return err
		}
		if _, err := os.Stat(e.wasmB); err != nil {
			return fmt.Errorf("-wasm-b: %w", err)
		}
	}
	dm := dynmodSpoken(e.target.Version)
	if !dm && e.o.only == "" {
		fmt.Fprintf(os.Stderr, "bench-envoy: Envoy %s cannot load libsluice.so (%s or later): the dm-* families are left out\n", e.target.Version, dynmodMinVersion)
	}
	if e.fams, err = selectFamilies(e.o.only, dm, e.wasmB); err != nil {
		return err
	}
	if e.root, e.dir, err = build.Workspace("bench-envoy"); err != nil {
		return err
	}
	e.noop, e.denier, e.counter = filepath.Join(e.dir, "noop.wasm"), filepath.Join(e.dir, "denier.wasm"), filepath.Join(e.dir, "counter.wasm")
	e.load = filepath.Join(e.dir, "sluice-load")
	var steps []build.Step
	// Every module as make build ships sluice.wasm: patched (poll_oneoff answered in the guest).
	patch := []string{e.noop, e.denier, e.counter}
	if e.o.wasm != "" {
		if e.wasm, err = filepath.Abs(e.o.wasm); err != nil {
			return err
		}
	} else {
		e.wasm = filepath.Join(e.dir, "sluice.wasm")
		steps = append(steps, build.SluiceWasm(e.wasm))
		patch = append(patch, e.wasm)
	}
	steps = append(steps, build.NoopWasm(e.noop), build.DenierWasm(e.denier), build.CounterWasm(e.counter), build.Command("./bench/cmd/sluice-load", e.load), build.Patch(patch...))
	if slices.ContainsFunc(e.fams, family.dynmod) {
		// One directory is the dynamic modules' search path: libsluice.so and the C no-op.
		e.dmDir = filepath.Join(e.dir, "dynmod")
		if err := os.MkdirAll(e.dmDir, 0o755); err != nil {
			return err
		}
		lib := filepath.Join(e.dmDir, dynmodLib(dynmodSluice))
		if e.o.dynmod != "" {
			// A copy: the file given may be rebuilt while the run lasts.
			src, err := filepath.Abs(e.o.dynmod)
			if err != nil {
				return err
			}
			if err := copyFile(src, lib); err != nil {
				return fmt.Errorf("-dynmod: %w", err)
			}
			e.dmFrom = "copied from " + src
		} else {
			e.dmFrom = "built from this checkout"
			steps = append(steps, build.SluiceDynmod(lib))
		}
		steps = append(steps, build.CShared(noopDynmodSource, filepath.Join(e.dmDir, dynmodLib(dynmodNoop))))
	}
	if err := build.Run(e.root, e.dir, "bench-envoy", steps...); err != nil {
		return err
	}
	chk := filepath.Join(e.dir, "v8check")
	if err := os.MkdirAll(chk, 0o755); err != nil {
		return err
	}
	return envoyproc.CheckV8(e.target, chk)
}

// noopDynmodSource is the C no-op dynamic module's source (family dm-noop-c), from the root.
const noopDynmodSource = "bench/envoy/testdata/noop_dynmod.c"

// copyFile copies the file src to dst.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o755)
}

// envoyEnv is the environment Envoy needs besides ours: the dynamic modules' search path.
func (e *env) envoyEnv() []string {
	if e.dmDir == "" {
		return nil
	}
	return []string{"ENVOY_DYNAMIC_MODULES_SEARCH_PATH=" + e.dmDir}
}

// sample is one configuration's throughput figures in one round.
type sample struct {
	rps       float64
	cpuPerReq float64 // µs of Envoy CPU per request
}

// latSample is one family's open-loop figures in one round (admit-1k).
type latSample struct {
	rate      float64 // offered req/s
	p50, p99  float64 // ms, from the due time
	late      int     // requests sent more than 1 ms after due
	cpuPerReq float64 // µs of Envoy CPU per request at that load
}

// memSample is one family's process figures: VmRSS at each point (memPoints), and the wasm
// stats at the end.
type memSample struct {
	rssMB []float64
	wasm  map[string]int64
	// At the end: where the resident memory is (smaps), and Envoy's C++ heap as its
	// allocator reports it (server.memory_allocated: in use; server.memory_heap_size: held
	// from the system, in use or free), MB.
	split      memSplit
	heapUsedMB float64
	heapMB     float64
}

// startSample is one fresh process of a family: time to ready and its first second.
type startSample struct {
	ready    time.Duration
	p99, max float64 // ms
	requests int
	workers  map[int]int64 // connections accepted per worker
}

// results are every phase's figures, by configuration or family name, one entry per round.
type results struct {
	tput  map[string][]sample
	lat   map[string][]latSample
	mem   map[string]memSample
	start map[string][]startSample
}

// selectFamilies is the families a run measures: every family, or those -families names
// (only) with the baselines their ratios need — none and native always, the Wasm baselines
// (noop, the floors) unless only dynamic-module families are named, the dynamic-module
// baselines (dm-noop-c, dm-noop-go) with any dynamic-module family. Without dm (an Envoy
// that cannot load libsluice.so) the dynamic-module families are left out, and naming one
// is an error. Then each sluice.wasm family's copy on module b (withB).
func selectFamilies(only string, dm bool, b string) ([]family, error) {
	want := map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	all := append(families[:len(families):len(families)], observeFamilies...)
	var names []string
	for _, f := range all {
		names = append(names, f.name)
	}
	dmNamed, wasmNamed := false, false
	for n := range want {
		if !slices.Contains(names, n) {
			return nil, fmt.Errorf("-families: unknown family %q (have %s)", n, strings.Join(names, ", "))
		}
		f := all[slices.Index(names, n)]
		if f.dynmod() && !dm {
			return nil, fmt.Errorf("-families: %s needs an Envoy that loads libsluice.so (%s or later)", n, dynmodMinVersion)
		}
		dmNamed = dmNamed || f.dynmod()
		wasmNamed = wasmNamed || !f.dynmod() && f.kind != "none" && f.kind != "native"
	}
	var fs []family
	for _, f := range all {
		var in bool
		switch {
		case f.dynmod() && !dm:
			in = false
		case f.observe != "":
			in = want[f.name]
		case len(want) == 0, want[f.name], f.kind == "none", f.kind == "native": // the ratios need them
			in = true
		case f.baseline && f.dynmod():
			in = dmNamed
		case f.baseline:
			in = wasmNamed || !dmNamed
		}
		if in {
			fs = append(fs, f)
		}
	}
	return withB(fs, b), nil
}

// dynmodMinVersion is the oldest Envoy whose dynamic-module ABI libsluice.so speaks.
const dynmodMinVersion = "1.38"

// dynmodSpoken reports whether Envoy version v (1.40.0, say) loads libsluice.so: from
// dynmodMinVersion on; a version it cannot read is taken to.
func dynmodSpoken(v string) bool {
	var major, minor int
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil {
		return true
	}
	return major > 1 || major == 1 && minor >= 38
}

// withB adds, after each sluice family of fs, its copy on module b (none when b is empty).
func withB(fs []family, b string) []family {
	if b == "" {
		return fs
	}
	var out []family
	for _, f := range fs {
		out = append(out, f)
		if f.kind == "sluice" {
			fb := f
			fb.name, fb.what, fb.b = f.name+"-b", f.what+", on the -wasm-b module "+b, b
			out = append(out, fb)
		}
	}
	return out
}

func (f family) variants() []variant {
	if !f.baseline {
		return variants
	}
	return []variant{variantNamed(f.variantName())}
}

// configurations are the measured configurations of the families, variant by variant (so
// that the configurations of one variant are neighbours in the rotated orders).
func configurations(fams []family) []setup {
	var cs []setup
	for _, v := range variants {
		for _, f := range fams {
			for _, fv := range f.variants() {
				if fv.name == v.name {
					cs = append(cs, setup{f, v})
				}
			}
		}
	}
	return cs
}

// latencyFamilies are the families measured at a fixed load: native and sluice's (on
// either artifact).
func latencyFamilies(fams []family) []family {
	var out []family
	for _, f := range fams {
		if f.kind == "native" || f.limiter() && f.observe == "" {
			out = append(out, f)
		}
	}
	return out
}

func (e *env) run(ph map[string]bool) error {
	fams := e.fams
	res := &results{tput: map[string][]sample{}, lat: map[string][]latSample{}, mem: map[string]memSample{}, start: map[string][]startSample{}}
	start := time.Now()
	load0 := build.LoadAvg()
	if ph["throughput"] {
		for r := range e.o.rounds {
			if err := e.throughputRound(fams, r, ph["latency"], res); err != nil {
				return fmt.Errorf("round %d: %v", r+1, err)
			}
		}
	}
	// The floors are throughput figures only: the deny floor answers every request 429, and
	// the memory and start-up phases load their listener with admitted requests; the admit
	// floor's memory and start-up are the no-op module's.
	var whole []family
	for _, f := range fams {
		if !f.floor() {
			whole = append(whole, f)
		}
	}
	if ph["memory"] {
		for _, f := range whole {
			ms, err := e.memory(f)
			if err != nil {
				return fmt.Errorf("memory, %s: %v", f.name, err)
			}
			res.mem[f.name] = ms
		}
	}
	if ph["startup"] {
		for r := range e.o.startupRounds {
			for _, i := range rounds.Order(len(whole), r, e.o.startupRounds) {
				f := whole[i]
				s, err := e.startup(f, r)
				if err != nil {
					return fmt.Errorf("start-up, %s, round %d: %v", f.name, r+1, err)
				}
				fmt.Fprintf(os.Stderr, "start-up %d %-10s ready after %v, first second: %d requests, p99 %.1f ms, max %.1f ms, connections per worker %v\n",
					r+1, f.name, s.ready.Round(time.Millisecond), s.requests, s.p99, s.max, s.workers)
				res.start[f.name] = append(res.start[f.name], s)
			}
		}
	}
	var buf bytes.Buffer
	e.report(&buf, fams, ph, res, time.Since(start), load0)
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

// procDir is a new directory for one Envoy process's bootstrap and files.
func (e *env) procDir(name string) (string, error) {
	dir := filepath.Join(e.dir, name)
	return dir, os.MkdirAll(dir, 0o755)
}

// throughputRound starts the round's Envoy with every configuration, measures them in the
// round's order, then (with lat) the latency at half native's saturation, and stops it.
func (e *env) throughputRound(fams []family, r int, lat bool, res *results) error {
	port, err := build.FreePort()
	if err != nil {
		return err
	}
	y, err := renderBootstrap(sharedSpec(fams, e.wasm, e.noop, e.denier, e.counter, port))
	if err != nil {
		return err
	}
	dir, err := e.procDir(fmt.Sprintf("round-%d", r+1))
	if err != nil {
		return err
	}
	p, err := startEnvoy(e.target.Bin, dir, y, e.envoyEnv())
	if err != nil {
		return err
	}
	defer p.stop()
	cs := configurations(fams)
	for _, i := range rounds.Order(len(cs), r, e.o.rounds) {
		c := cs[i]
		s, err := e.measure(p, c)
		if err != nil {
			return fmt.Errorf("%s: %v", c.name(), err)
		}
		fmt.Fprintf(os.Stderr, "round %d %-19s %8.0f req/s %7.1f µs Envoy CPU/request\n", r+1, c.name(), s.rps, s.cpuPerReq)
		res.tput[c.name()] = append(res.tput[c.name()], s)
	}
	if !lat {
		return nil
	}
	nat := res.tput["native "+baselineVariant]
	rate := nat[len(nat)-1].rps / 2
	lf := latencyFamilies(fams)
	for _, i := range rounds.Order(len(lf), r, e.o.rounds) {
		c := setup{lf[i], variantNamed(baselineVariant)}
		s, err := e.measureLatency(p, c, rate)
		if err != nil {
			return fmt.Errorf("latency, %s: %v", c.name(), err)
		}
		fmt.Fprintf(os.Stderr, "round %d %-19s at %6.0f req/s: p50 %.3f ms p99 %.3f ms (%d sent late) %7.1f µs Envoy CPU/request\n",
			r+1, c.name(), s.rate, s.p50, s.p99, s.late, s.cpuPerReq)
		res.lat[c.f.name] = append(res.lat[c.f.name], s)
	}
	return nil
}

// measure warms a configuration's listener up (which also exhausts a denied variant's keys)
// and measures one closed-loop run: Envoy's CPU over it per request served, and req/s.
func (e *env) measure(p *envoyProc, c setup) (sample, error) {
	url, err := p.url(listenerName(c))
	if err != nil {
		return sample{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+e.o.warmup+e.o.duration)
	defer cancel()
	if e.o.warmup > 0 {
		if _, err := e.loadRun(ctx, loadArgs{url: url, keys: c.v.keys, d: e.o.warmup}); err != nil {
			return sample{}, fmt.Errorf("warm-up: %v", err)
		}
	}
	cpu0, err := p.cpu()
	if err != nil {
		return sample{}, err
	}
	rep, err := e.loadRun(ctx, loadArgs{url: url, keys: c.v.keys, d: e.o.duration, want: c.v.wantStatus()})
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

// measureLatency runs the open loop at rate on a configuration's listener, -warmup then -d:
// p50 and p99 of the measured part, and Envoy's CPU over the whole run per request sent.
func (e *env) measureLatency(p *envoyProc, c setup, rate float64) (latSample, error) {
	url, err := p.url(listenerName(c))
	if err != nil {
		return latSample{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+e.o.warmup+e.o.duration)
	defer cancel()
	cpu0, err := p.cpu()
	if err != nil {
		return latSample{}, err
	}
	rep, err := e.loadRun(ctx, loadArgs{url: url, keys: c.v.keys, d: e.o.duration, warmup: e.o.warmup, rate: rate, want: c.v.wantStatus()})
	if err != nil {
		return latSample{}, err
	}
	cpu1, err := p.cpu()
	if err != nil {
		return latSample{}, err
	}
	if rep.Sent == 0 {
		return latSample{}, errors.New("no request sent")
	}
	return latSample{rate: rep.Rate, p50: rep.P50, p99: rep.P99, late: rep.Late,
		cpuPerReq: float64((cpu1 - cpu0).Nanoseconds()) / 1000 / float64(rep.Sent)}, nil
}

// memPoints name the RSS readings of the memory phase.
var memPoints = []string{"start", "⅓ requests", "⅔ requests", "all requests", "distinct keys"}

// memory starts an Envoy with the family's admit-1k listener alone and reads its RSS after
// start, after each third of the requests and (rate-limiting families) after the distinct
// keys, each key once; the wasm stats at the end.
func (e *env) memory(f family) (memSample, error) {
	port, err := build.FreePort()
	if err != nil {
		return memSample{}, err
	}
	c := setup{f, variantNamed(baselineVariant)}
	y, err := renderBootstrap(familySpec(f, e.wasm, e.noop, port, 0))
	if err != nil {
		return memSample{}, err
	}
	dir, err := e.procDir("memory-" + f.name)
	if err != nil {
		return memSample{}, err
	}
	p, err := startEnvoy(e.target.Bin, dir, y, e.envoyEnv())
	if err != nil {
		return memSample{}, err
	}
	defer p.stop()
	url, err := p.url(listenerName(c))
	if err != nil {
		return memSample{}, err
	}
	var ms memSample
	read := func(what string) error {
		rss, err := p.rss()
		if err != nil {
			return err
		}
		ms.rssMB = append(ms.rssMB, rss)
		fmt.Fprintf(os.Stderr, "memory %-10s %-14s VmRSS %.1f MB\n", f.name, what, rss)
		return nil
	}
	if err := read(memPoints[0]); err != nil {
		return ms, err
	}
	third := e.o.memRequests / 3
	for i := range 3 {
		n := third
		if i == 2 {
			n = e.o.memRequests - 2*third
		}
		if err := e.bulk(url, c.v.keys, n); err != nil {
			return ms, err
		}
		if err := read(memPoints[1+i]); err != nil {
			return ms, err
		}
	}
	if !f.baseline {
		if err := e.bulk(url, e.o.memKeys, e.o.memKeys); err != nil {
			return ms, err
		}
		if err := read(memPoints[4]); err != nil {
			return ms, err
		}
	}
	sm, err := readFile(fmt.Sprintf("/proc/%d/smaps", p.pid()))
	if err != nil {
		return ms, err
	}
	if ms.split, err = parseSmaps(sm); err != nil {
		return ms, err
	}
	heap, err := p.get("/stats?filter=server.memory_")
	if err != nil {
		return ms, err
	}
	hs := envoyproc.ParseStats(heap)
	ms.heapUsedMB, ms.heapMB = float64(hs["server.memory_allocated"])/(1<<20), float64(hs["server.memory_heap_size"])/(1<<20)
	body, err := p.get("/stats?filter=^wasm")
	if err != nil {
		return ms, err
	}
	ms.wasm = map[string]int64{}
	for n, v := range envoyproc.ParseStats(body) {
		if keepWasmStat(n) {
			ms.wasm[n] = v
		}
	}
	return ms, nil
}

// bulk sends n requests (closed loop, -c connections) over keys values, each 200.
func (e *env) bulk(url string, keys, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := e.loadRun(ctx, loadArgs{url: url, keys: keys, d: 2 * time.Minute, n: n, want: 200})
	return err
}

// startup starts a fresh Envoy with the family's admit-1k listener (exact connection
// balance), times it to /ready, and loads it for the first second after ready.
func (e *env) startup(f family, r int) (startSample, error) {
	up, err := build.FreePort()
	if err != nil {
		return startSample{}, err
	}
	port, err := build.FreePort()
	if err != nil {
		return startSample{}, err
	}
	c := setup{f, variantNamed(baselineVariant)}
	y, err := renderBootstrap(familySpec(f, e.wasm, e.noop, up, port))
	if err != nil {
		return startSample{}, err
	}
	dir, err := e.procDir(fmt.Sprintf("startup-%s-%d", f.name, r+1))
	if err != nil {
		return startSample{}, err
	}
	p, ready, err := startTimed(e.target.Bin, dir, y, e.envoyEnv())
	if err != nil {
		return startSample{}, err
	}
	defer p.stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := e.loadRun(ctx, loadArgs{url: "http://127.0.0.1:" + strconv.Itoa(port), keys: c.v.keys, d: time.Second, conc: e.o.firstConc, want: 200})
	if err != nil {
		return startSample{}, err
	}
	body, err := p.get("/stats?filter=" + workerStatFilter)
	if err != nil {
		return startSample{}, err
	}
	return startSample{ready: ready, p99: rep.P99, max: rep.Max, requests: rep.Requests,
		workers: workerConnections(envoyproc.ParseStats(body), port)}, nil
}

type loadReport = loadgen.Report

// loadArgs are one run of sluice-load.
type loadArgs struct {
	url    string
	keys   int
	d      time.Duration
	warmup time.Duration
	conc   int     // 0: -c
	n      int     // stop after n measured requests; 0: its default
	rate   float64 // open loop; 0: closed
	want   int     // every measured request must get this status; 0: any
}

func (a loadArgs) args(defConc int) []string {
	conc := a.conc
	if conc == 0 {
		conc = defConc
	}
	args := []string{"-url", a.url + "/", "-c", strconv.Itoa(conc), "-d", a.d.String(), "-warmup", a.warmup.String(),
		"-keys", strconv.Itoa(a.keys), "-key-header", keyHeader, "-json", "-want-status", strconv.Itoa(a.want)}
	if a.n > 0 {
		args = append(args, "-n", strconv.Itoa(a.n))
	}
	if a.rate > 0 {
		args = append(args, "-rate", strconv.FormatFloat(a.rate, 'f', 1, 64))
	}
	return args
}

// loadRun runs sluice-load once.
func (e *env) loadRun(ctx context.Context, a loadArgs) (loadReport, error) {
	cmd := exec.CommandContext(ctx, e.load, a.args(e.o.conc)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return loadgen.Run(cmd)
}

// keepWasmStat: the VM counts and any memory figure Envoy exposes, and sluice's own guest
// metrics (heap gauge, collections); not the remote-load, reload and per-rule counters.
func keepWasmStat(n string) bool {
	switch {
	case strings.HasPrefix(n, "wasm.envoy.wasm.runtime."), strings.HasSuffix(n, ".wasm_vm_count"),
		strings.Contains(n, "memory"), strings.Contains(n, ".sluice.guest."):
		return true
	}
	return false
}

func readFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}
