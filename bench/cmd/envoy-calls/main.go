// Command envoy-calls measures what one Proxy-Wasm host call costs inside one real Envoy
// (V8): Envoy's CPU per request with a module that makes a host call n times per request,
// minus that of the same module making none, divided by n.
//
//	go run ./bench/cmd/envoy-calls [-rounds 5] [-d 3s] [-warmup 1s] [-n 8] [-c 32] [-keys 1000]
//	                               [-envoy PATH] [-envoy-version 1.40.0] [-out FILE|-]
//	make bench-envoy-calls          # the same, ENVOY_CALLS_FLAGS to pass flags, ENVOY=path
//
// The module (bench/cmd/envoy-calls/guest, standard Go, patched by internal/wasmpatch as
// sluice.wasm is) reads "<call> <n>" from its plugin configuration and makes that call n
// times in proxy_on_request_headers: none (no call: the module's own cost, the no-op
// module's), get_header (proxy_get_header_map_value of x-key, the value through
// proxy_on_memory_allocate), header_size (proxy_get_header_map_size, answered through a
// pointer), get_shared and set_shared (proxy_get_shared_data / proxy_set_shared_data of one
// 25-byte value, cas 0), now (proxy_get_current_time_nanoseconds) and metric
// (proxy_increment_metric). Its allocator is a bump over a fixed buffer.
//
// Setup: one Envoy (1.40.0 by default; -envoy or $ENVOY for another), --concurrency 2, for
// the whole run, with one listener per variant, each its own Wasm VM (vm_id), all routing to
// a direct response from a second listener of the same Envoy. Per round every variant runs
// alone in an order rotated from round to round (reversed in odd rounds): a closed loop
// (bench/cmd/sluice-load -c 32 over 1,000 x-key values) for -warmup, then -d measured.
// Envoy's CPU per request is its utime+stime (/proc/PID/stat) over the measured run divided
// by the requests served; per round and call, (CPU/request of the call − CPU/request of
// none) / n is the µs one call costs. The report gives, per call, the median over the
// rounds with the range, and none's CPU/request.
//
// Checks: every measured request must get a 200; after each round the guest's counters
// (envoy_calls.<call>.requests, .ok and .failed in Envoy's /stats) must show no failed call
// (a status other than OK, or an answer other than the one expected), n calls that
// succeeded per request counted, and a count of requests matching the listener's; Envoy
// must log nothing at error level or above.
//
// Results go to stdout and are appended to -out (bench/envoy-calls-results.txt), after a
// header line: date (UTC) · commit · Envoy version · command. Loopback only; every process
// it starts is stopped by its PID; Linux only (/proc).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/bench/internal/envoyconf"
	"github.com/sluice-proxy/sluice/bench/internal/loadgen"
	"github.com/sluice-proxy/sluice/bench/internal/rounds"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// calls are the variants, the baseline first; the guest knows the same names.
var calls = []string{"none", "get_header", "header_size", "get_shared", "set_shared", "now", "metric"}

// callWhat says what each call is, for the report.
var callWhat = map[string]string{
	"none":        "no host call (the module's base cost)",
	"get_header":  "proxy_get_header_map_value (x-key; value via proxy_on_memory_allocate)",
	"header_size": "proxy_get_header_map_size (request headers; pointer only)",
	"get_shared":  "proxy_get_shared_data (one key, 25 bytes; value via proxy_on_memory_allocate)",
	"set_shared":  "proxy_set_shared_data (one key, 25 bytes, cas 0)",
	"now":         "proxy_get_current_time_nanoseconds",
	"metric":      "proxy_increment_metric (a counter)",
}

const (
	keyHeader = "x-key"
	// flushEvery is the guest's: it adds its requests and ok counts to their counters every
	// flushEvery requests, so up to flushEvery-1 requests per worker VM are not counted yet.
	flushEvery = 256
	workers    = 2
	maxN       = 10_000
)

type options struct {
	rounds   int
	duration time.Duration
	warmup   time.Duration
	n        int
	conc     int
	keys     int
	envoy    string
	version  string
	out      string
}

// parseOptions reads the command line (without the program name).
func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("envoy-calls", flag.ContinueOnError)
	fs.IntVar(&o.rounds, "rounds", 5, "rounds; every figure is the median over them, with the range")
	fs.DurationVar(&o.duration, "d", 3*time.Second, "measured duration of one variant in one round")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each measurement")
	fs.IntVar(&o.n, "n", 8, "host calls per request in each call's variant")
	fs.IntVar(&o.conc, "c", 32, "connections of the load generator")
	fs.IntVar(&o.keys, "keys", 1000, "distinct x-key values, round-robin")
	fs.StringVar(&o.envoy, "envoy", "", "Envoy binary (default: $ENVOY, else the pinned -envoy-version, fetched when missing)")
	fs.StringVar(&o.version, "envoy-version", "1.40.0", "pinned Envoy version when neither -envoy nor $ENVOY is set")
	fs.StringVar(&o.out, "out", "", "results file to append to (default: bench/envoy-calls-results.txt in the repository; \"-\": none)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.rounds < 1 || o.duration <= 0 || o.warmup < 0 || o.conc < 1:
		return o, errors.New("-rounds, -d and -c must be positive, -warmup not negative")
	case o.n < 1 || o.n > maxN:
		return o, fmt.Errorf("-n must be in 1..%d", maxN)
	case o.keys < 1 || o.keys > 100_000:
		return o, errors.New("-keys must be in 1..100000")
	}
	return o, nil
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fail(err)
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "envoy-calls:", err)
	os.Exit(1)
}

// pluginConfig is the guest's configuration for a call: "<call> <n>" (n 0 for none).
func pluginConfig(call string, n int) string {
	if call == "none" {
		n = 0
	}
	return call + " " + strconv.Itoa(n)
}

// callsPerRequest is how many calls the variant's guest makes per request.
func callsPerRequest(call string, n int) int {
	if call == "none" {
		return 0
	}
	return n
}

func listenerName(call string) string { return "calls-" + call }
func vmID(call string) string         { return "envoy_calls_" + call }

// renderBootstrap is the run's Envoy: the upstream on upstreamPort and one listener per call,
// each with the guest (its own VM) configured for it.
func renderBootstrap(wasm string, n, upstreamPort int) ([]byte, error) {
	b := envoyconf.Bootstrap{Title: "bench/cmd/envoy-calls, one listener per call", UpstreamPort: upstreamPort}
	for _, c := range calls {
		cfg, err := json.Marshal(pluginConfig(c, n))
		if err != nil {
			return nil, err
		}
		b.Listeners = append(b.Listeners, envoyconf.Listener{Name: listenerName(c), Filters: envoyconf.Filters{
			StatPrefix: listenerName(c), VMID: vmID(c), WasmPath: wasm, Plugin: string(cfg)}})
	}
	return b.YAML()
}

// sample is one variant's measured run.
type sample struct {
	rps       float64
	cpuPerReq float64 // µs of Envoy CPU per request
}

// perCall is the µs one call costs in a round: (the call's CPU/request − none's) / n.
func perCall(call, none sample, n int) float64 {
	return (call.cpuPerReq - none.cpuPerReq) / float64(n)
}

// results are the samples per call, one per round.
type results map[string][]sample

// report writes the table: per call the µs per call (median over the rounds, min–max) and
// its CPU/request and req/s; none's CPU/request is the base.
func report(w io.Writer, res results, n int) {
	none := res["none"]
	fmt.Fprintf(w, "| call | µs per call (median, min–max) | Envoy CPU µs/request | req/s | what |\n|---|---:|---:|---:|---|\n")
	for _, c := range calls {
		ss := res[c]
		var cpu, rps, per []float64
		for i, s := range ss {
			cpu, rps = append(cpu, s.cpuPerReq), append(rps, s.rps)
			if c != "none" && i < len(none) {
				per = append(per, perCall(s, none[i], n))
			}
		}
		perCol := "(base)"
		if c != "none" {
			perCol = rounds.Summarize(per).Format("%.3f")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", c, perCol, rounds.Summarize(cpu).Format("%.2f"), rounds.Summarize(rps).Format("%.0f"), callWhat[c])
	}
}

// counts are one call's figures from Envoy's /stats: the guest's counters and the
// listener's requests.
type counts struct {
	requests, ok, failed, target int64 // the guest's (target: the metric call's counter)
	served                       int64 // the listener's downstream_rq_total
}

// callCounts picks each call's counts out of /stats.
func callCounts(stats map[string]int64) map[string]counts {
	m := map[string]counts{}
	for _, c := range calls {
		p := "wasmcustom.envoy_calls." + c + "."
		m[c] = counts{requests: stats[p+"requests"], ok: stats[p+"ok"], failed: stats[p+"failed"], target: stats[p+"target"],
			served: stats["http."+listenerName(c)+".downstream_rq_total"]}
	}
	return m
}

// check says what is wrong with a call's counts: a failed call, fewer or more calls than n
// per request counted, or a count of requests that does not match the listener's (the
// guest adds its counts every flushEvery requests per worker VM).
func (k counts) check(call string, n int) error {
	per := int64(callsPerRequest(call, n))
	switch {
	case k.failed != 0:
		return fmt.Errorf("%s: %d calls failed (status not OK or an unexpected answer)", call, k.failed)
	case k.served == 0:
		return fmt.Errorf("%s: its listener served no request", call)
	case k.requests > k.served || k.requests < k.served-workers*(flushEvery-1):
		return fmt.Errorf("%s: the guest counted %d requests, the listener served %d", call, k.requests, k.served)
	case k.ok != per*k.requests:
		return fmt.Errorf("%s: %d calls succeeded over %d requests, want %d per request", call, k.ok, k.requests, per)
	case call == "metric" && k.target < k.ok:
		return fmt.Errorf("metric: the counter is at %d, below the %d calls counted", k.target, k.ok)
	}
	return nil
}

// logProblems are the lines Envoy logged at error level or above.
func logProblems(log string) []string {
	var bad []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "][error][") || strings.Contains(line, "][critical][") {
			bad = append(bad, line)
		}
	}
	return bad
}

// env is what the run shares.
type env struct {
	o      options
	root   string
	dir    string
	guest  string
	load   string
	target envoyproc.Target
}

func run(o options) error {
	e := &env{o: o}
	var err error
	if e.root, e.dir, err = build.Workspace("envoy-calls"); err != nil {
		return err
	}
	defer os.RemoveAll(e.dir)
	e.guest, e.load = filepath.Join(e.dir, "guest.wasm"), filepath.Join(e.dir, "sluice-load")
	if err := build.Run(e.root, e.dir, "envoy-calls",
		build.Step{Dir: filepath.Join("bench", "cmd", "envoy-calls", "guest"), Env: []string{"GOOS=wasip1", "GOARCH=wasm"},
			Cmd: []string{"go", "build", "-buildmode=c-shared", "-trimpath", "-o", e.guest, "."}},
		build.Patch(e.guest),
		build.Command("./bench/cmd/sluice-load", e.load)); err != nil {
		return err
	}
	if err := e.resolveEnvoy(); err != nil {
		return err
	}
	load0, start := build.LoadAvg(), time.Now()
	res, err := e.measure()
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# %s · %s · Envoy %s · %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), build.Revision(e.root), e.target.Version, build.CommandLine("./bench/cmd/envoy-calls", "bench-envoy-calls"))
	fmt.Fprintf(&buf, "# %s --concurrency 2, one listener and Wasm VM per call · sluice-load -c %d over %d %s values, %v warm-up, %v measured per call per round · n = %d calls per request · %d rounds · load average %s at start, %s at end · %v\n",
		e.target.Bin, o.conc, o.keys, keyHeader, o.warmup, o.duration, o.n, o.rounds, load0, build.LoadAvg(), time.Since(start).Round(time.Second))
	fmt.Fprintf(&buf, "# µs per call = (Envoy CPU/request of the call − that of none, same round) / n\n\n")
	report(&buf, res, o.n)
	fmt.Fprintln(&buf)
	os.Stdout.Write(buf.Bytes())
	out := o.out
	if out == "" {
		out = filepath.Join(e.root, "bench", "envoy-calls-results.txt")
	}
	if out == "-" {
		return nil
	}
	return build.AppendResults("envoy-calls", out, buf.Bytes())
}

// resolveEnvoy picks the binary (-envoy, $ENVOY, else the pinned version) and checks it has V8.
func (e *env) resolveEnvoy() error {
	var err error
	if e.target, err = envoyproc.LocalTarget(e.o.envoy, e.o.version, "the CPU figures need the Envoy process's /proc entry"); err != nil {
		return err
	}
	chk := filepath.Join(e.dir, "v8check")
	if err := os.MkdirAll(chk, 0o755); err != nil {
		return err
	}
	return envoyproc.CheckV8(e.target, chk)
}

// measure starts the Envoy and runs the rounds, checking the guest's counters after each.
func (e *env) measure() (results, error) {
	port, err := build.FreePort()
	if err != nil {
		return nil, err
	}
	y, err := renderBootstrap(e.guest, e.o.n, port)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(e.dir, "envoy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, err := envoyproc.Start(context.Background(), e.target, envoyproc.Options{Bootstrap: y, Concurrency: workers, Dir: dir})
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	urls := map[string]string{}
	for _, c := range calls {
		if urls[c], err = p.URL(listenerName(c)); err != nil {
			return nil, err
		}
	}
	res := results{}
	for r := range e.o.rounds {
		for _, i := range rounds.Order(len(calls), r, e.o.rounds) {
			c := calls[i]
			s, err := e.run(p, urls[c])
			if err != nil {
				return nil, fmt.Errorf("round %d, %s: %v", r+1, c, err)
			}
			res[c] = append(res[c], s)
			fmt.Fprintf(os.Stderr, "round %d %-12s %8.0f req/s %7.2f µs Envoy CPU/request\n", r+1, c, s.rps, s.cpuPerReq)
		}
		line := fmt.Sprintf("round %d µs per call:", r+1)
		for _, c := range calls[1:] {
			line += fmt.Sprintf(" %s %.3f", c, perCall(res[c][r], res["none"][r], e.o.n))
		}
		fmt.Fprintln(os.Stderr, line)
		st, err := p.Stats(`^(wasmcustom\.envoy_calls\.|http\.calls-.*\.downstream_rq_total$)`)
		if err != nil {
			return nil, err
		}
		for c, k := range callCounts(st) {
			if err := k.check(c, e.o.n); err != nil {
				return nil, fmt.Errorf("round %d: %v", r+1, err)
			}
		}
	}
	if bad := logProblems(p.Log()); len(bad) > 0 {
		return nil, fmt.Errorf("the Envoy log has errors:\n%s", strings.Join(bad, "\n"))
	}
	st, err := p.Stats(`^wasmcustom\.envoy_calls\.`)
	if err != nil {
		return nil, err
	}
	var summary []string
	for _, c := range calls {
		k := callCounts(st)[c]
		summary = append(summary, fmt.Sprintf("%s %d requests/%d ok/%d failed", c, k.requests, k.ok, k.failed))
	}
	fmt.Fprintf(os.Stderr, "envoy-calls: guest counters: %s\n", strings.Join(summary, ", "))
	return res, nil
}

// run warms a listener up and measures one closed-loop run: Envoy's CPU over it per
// request served, and req/s; every measured request must get a 200.
func (e *env) run(p *envoyproc.Envoy, url string) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute+e.o.warmup+e.o.duration)
	defer cancel()
	if e.o.warmup > 0 {
		if _, err := e.loadRun(ctx, url, e.o.warmup, 0); err != nil {
			return sample{}, fmt.Errorf("warm-up: %v", err)
		}
	}
	cpu0, err := build.CPUTime(p.PID())
	if err != nil {
		return sample{}, err
	}
	rep, err := e.loadRun(ctx, url, e.o.duration, 200)
	if err != nil {
		return sample{}, err
	}
	cpu1, err := build.CPUTime(p.PID())
	if err != nil {
		return sample{}, err
	}
	if rep.Requests == 0 {
		return sample{}, errors.New("no request served")
	}
	return sample{rps: rep.RPS, cpuPerReq: float64((cpu1 - cpu0).Nanoseconds()) / 1000 / float64(rep.Requests)}, nil
}

// loadRun runs sluice-load once for d (want: the status every request must get; 0: any).
func (e *env) loadRun(ctx context.Context, url string, d time.Duration, want int) (loadgen.Report, error) {
	cmd := exec.CommandContext(ctx, e.load, "-url", url+"/", "-c", strconv.Itoa(e.o.conc), "-d", d.String(), "-warmup", "0",
		"-keys", strconv.Itoa(e.o.keys), "-key-header", keyHeader, "-json", "-want-status", strconv.Itoa(want))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return loadgen.Run(cmd)
}
