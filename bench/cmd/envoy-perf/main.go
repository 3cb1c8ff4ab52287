// Command envoy-perf profiles one real Envoy (V8) serving sluice and splits its CPU into
// sides: the guest's compiled wasm functions, V8's generated stubs, host calls (everything
// a guest frame called: the C API callback, proxy-wasm-cpp-host, Envoy's host functions,
// libc and the kernel under them), the machinery of Envoy's calls into the guest, the rest
// of Envoy, and the kernel; then the top functions of each side.
//
//	go run ./bench/cmd/envoy-perf [-config sluice|noop|native|none] [-headers both|none]
//	    [-deny] [-keys 1000] [-d 10s] [-warmup 3s] [-c 32] [-runs 1] [-F 999] [-envoy PATH] [-wasm FILE]
//
// Names for V8's generated code come from V8's perf map (/tmp/perf-PID.map, which perf
// reads): Envoy gives no way to pass V8 flags, so the command runs a copy of the Envoy
// binary with V8's perf_basic_prof flag set in its data (see enableV8Flag); the map names
// each compiled wasm function after the module's name section. Envoy's release binaries
// are stripped, so Envoy's own code is split by the call chains only: perf records frame
// pointer chains (Envoy and V8's generated code keep frame pointers), a sample with a
// guest frame above its leaf is a host call, and one inside the frames that enter the
// guest is part of the call into the guest.
//
// Setup: Envoy 1.40.0 (default; -envoy or $ENVOY for another), --concurrency 2, one
// listener with the configuration under test (sluice: token_bucket on x-key, limit far
// above the load, response headers -headers; noop: the no-op standard-Go module; native:
// Envoy's local_ratelimit with a token bucket per x-key value; none: only the router),
// upstream a direct response from a second listener of the same Envoy. With -deny the
// limit (sluice, native) is 1 per hour and the warm-up uses every key, so every sampled
// request is refused (429). sluice-load drives -c connections over -keys values of x-key:
// -warmup of load, then a second run during which perf samples the Envoy process (perf
// record -e cpu-clock -F F -g) for -d, every request required to get the expected status. Envoy's CPU per request is its
// utime+stime over the sampled interval divided by the requests its listener served then
// (perf's own cost included: compare runs of this command with each other only).
//
// The report goes to stdout and is appended to -out (bench/envoy-perf-results.txt), one
// header line per run: date · commit · command. Loopback only; every process it starts is
// stopped by its PID; Linux x86-64 only (perf, /proc).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"github.com/sluice-proxy/sluice/bench/internal/envoyconf"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

type options struct {
	config   string
	headers  string
	deny     bool
	keys     int
	duration time.Duration
	warmup   time.Duration
	conc     int
	runs     int
	freq     int
	top      int
	envoy    string
	version  string
	wasm     string
	out      string
	keep     bool
}

const keyHeader = "x-key"

func main() {
	var o options
	flag.StringVar(&o.config, "config", "sluice", "what the listener runs: sluice, noop, native or none")
	flag.StringVar(&o.headers, "headers", "both", "sluice's response headers: both or none")
	flag.BoolVar(&o.deny, "deny", false, "limit 1 per hour: every sampled request refused (sluice, native)")
	flag.IntVar(&o.keys, "keys", 1000, "distinct x-key values, round-robin")
	flag.DurationVar(&o.duration, "d", 10*time.Second, "sampled duration")
	flag.DurationVar(&o.warmup, "warmup", 3*time.Second, "load before sampling (V8 compiles the module's functions lazily)")
	flag.IntVar(&o.conc, "c", 32, "connections of the load generator")
	flag.IntVar(&o.runs, "runs", 1, "runs, one Envoy process each")
	flag.IntVar(&o.freq, "F", 999, "sampling frequency (Hz)")
	flag.IntVar(&o.top, "top", 25, "items listed per side")
	flag.StringVar(&o.envoy, "envoy", "", "Envoy binary (default: $ENVOY, else the pinned -envoy-version, fetched when missing)")
	flag.StringVar(&o.version, "envoy-version", "1.40.0", "pinned Envoy version when neither -envoy nor $ENVOY is set")
	flag.StringVar(&o.wasm, "wasm", "", "sluice.wasm to load (default: built and patched into a temporary directory)")
	flag.StringVar(&o.out, "out", "", "results file to append to (default: bench/envoy-perf-results.txt; \"-\": none)")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (perf.data and perf.txt, the perf script output, per run)")
	flag.Parse()
	switch {
	case o.config != "sluice" && o.config != "noop" && o.config != "native" && o.config != "none":
		fail(fmt.Errorf("-config %q: want sluice, noop, native or none", o.config))
	case o.headers != "both" && o.headers != "none":
		fail(fmt.Errorf("-headers %q: want both or none", o.headers))
	case o.keys < 1 || o.duration <= 0 || o.conc < 1 || o.runs < 1 || o.freq < 1 || o.warmup < 0:
		fail(errors.New("-keys, -d, -c, -runs and -F must be positive"))
	case o.deny && (o.config == "noop" || o.config == "none"):
		fail(errors.New("-deny needs -config sluice or native"))
	case o.deny && o.warmup == 0:
		fail(errors.New("-deny needs a warm-up (it uses every key once)"))
	}
	if err := run(o); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "envoy-perf:", err)
	os.Exit(1)
}

func run(o options) error {
	if _, err := exec.LookPath("perf"); err != nil {
		return errors.New("perf is not installed")
	}
	root, dir, err := build.Workspace("envoy-perf")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintf(os.Stderr, "envoy-perf: keeping %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	load := filepath.Join(dir, "sluice-load")
	steps := []build.Step{build.Command("./bench/cmd/sluice-load", load)}
	wasm := ""
	switch {
	case o.config == "sluice" && o.wasm != "":
		if wasm, err = filepath.Abs(o.wasm); err != nil {
			return err
		}
	case o.config == "sluice":
		wasm = filepath.Join(dir, "sluice.wasm")
		steps = append(steps, build.SluiceWasm(wasm), build.Patch(wasm))
	case o.config == "noop":
		wasm = filepath.Join(dir, "noop.wasm")
		steps = append(steps, build.NoopWasm(wasm), build.Patch(wasm))
	}
	if err := build.Run(root, dir, "envoy-perf", steps...); err != nil {
		return err
	}
	target, err := envoyproc.LocalTarget(o.envoy, o.version, "perf samples a local process")
	if err != nil {
		return err
	}
	bin, version := target.Bin, target.Version
	run, mapNote := filepath.Join(dir, "envoy"), "V8 perf map from perf_basic_prof set in a copy of the binary"
	if err := enableV8Flag(bin, run, "perf_basic_prof"); err != nil {
		fmt.Fprintf(os.Stderr, "envoy-perf: no V8 perf map (%v): V8's code stays unnamed\n", err)
		run, mapNote = bin, "no V8 perf map ("+err.Error()+")"
	}
	var report bytes.Buffer
	fmt.Fprintf(&report, "# %s · %s · %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), build.Revision(root), build.CommandLine("./bench/cmd/envoy-perf", ""))
	fmt.Fprintf(&report, "# Envoy %s (%s) --concurrency 2, %s · %s · load average %s\n", version, bin, mapNote, describe(o), build.LoadAvg())
	for r := 1; r <= o.runs; r++ {
		if err := runOnce(o, r, dir, run, wasm, load, &report); err != nil {
			return fmt.Errorf("run %d: %v", r, err)
		}
	}
	fmt.Fprintln(&report)
	os.Stdout.Write(report.Bytes())
	out := o.out
	if out == "" {
		out = filepath.Join(root, "bench", "envoy-perf-results.txt")
	}
	if out == "-" {
		return nil
	}
	return build.AppendResults("envoy-perf", out, report.Bytes())
}

func describe(o options) string {
	outcome := "admitted"
	if o.deny {
		outcome = "denied (1 per hour)"
	}
	what := map[string]string{
		"sluice": "sluice token_bucket on " + keyHeader + ", " + outcome + ", response headers " + o.headers,
		"noop":   "the no-op standard-Go module",
		"native": "Envoy's local_ratelimit, a token bucket per " + keyHeader + " value, " + outcome,
		"none":   "no filter but the router",
	}[o.config]
	return fmt.Sprintf("%s · sluice-load -c %d over %d keys · perf record -e cpu-clock -F %d -g for %v after %v of load",
		what, o.conc, o.keys, o.freq, o.duration, o.warmup)
}

// runOnce starts one Envoy, loads it, samples it and writes the breakdown.
func runOnce(o options, r int, dir, bin, wasm, load string, w *bytes.Buffer) error {
	port, err := build.FreePort()
	if err != nil {
		return err
	}
	y, err := renderBootstrap(o, wasm, port)
	if err != nil {
		return err
	}
	rdir := filepath.Join(dir, fmt.Sprintf("run-%d", r))
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return err
	}
	// V8 writes a small isolate-*-v8.log per isolate when it logs code: in the run's directory.
	if err := os.Chdir(rdir); err != nil {
		return err
	}
	e, err := envoyproc.Start(context.Background(), envoyproc.Target{Version: filepath.Base(bin), Bin: bin},
		envoyproc.Options{Bootstrap: y, Concurrency: 2, Dir: rdir})
	if err != nil {
		return err
	}
	pid := e.PID()
	mapFile := fmt.Sprintf("/tmp/perf-%d.map", pid)
	defer os.Remove(mapFile)
	defer e.Stop()
	url, err := e.URL("front")
	if err != nil {
		return err
	}
	// The warm-up (which also uses every key once: the denied setup's keys are exhausted
	// after it), then one load run covering the sampled interval and a second on either side.
	total := o.duration + 2*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), o.warmup+total+time.Minute)
	defer cancel()
	l, err := startLoad(ctx, o, load, url, total)
	if err != nil {
		return err
	}
	data := filepath.Join(rdir, "perf.data")
	m, err := sampleEnvoy(ctx, o, e, data)
	if err != nil {
		return err
	}
	rps, err := l.wait()
	if err != nil {
		return err
	}
	return writeRun(w, o, r, rdir, data, bin, m, rps)
}

// loadRun is a sluice-load run in progress.
type loadRun struct {
	done      chan error
	out, errs bytes.Buffer
}

// startLoad runs the warm-up, then starts the load of total duration and
// returns once it has run for a second.
func startLoad(ctx context.Context, o options, load, url string, total time.Duration) (*loadRun, error) {
	loadArgs := func(d time.Duration, want int) []string {
		return []string{"-url", url + "/", "-c", strconv.Itoa(o.conc), "-d", d.String(), "-warmup", "0",
			"-keys", strconv.Itoa(o.keys), "-key-header", keyHeader, "-json", "-want-status", strconv.Itoa(want)}
	}
	if o.warmup > 0 {
		wcmd := exec.CommandContext(ctx, load, loadArgs(o.warmup, 0)...)
		wcmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if msg, err := wcmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("warm-up: %v: %s", err, msg)
		}
	}
	want := 200
	if o.deny {
		want = 429
	}
	l := &loadRun{done: make(chan error, 1)}
	lcmd := exec.CommandContext(ctx, load, loadArgs(total, want)...)
	lcmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	lcmd.Stdout, lcmd.Stderr = &l.out, &l.errs
	if err := lcmd.Start(); err != nil {
		return nil, err
	}
	go func() { l.done <- lcmd.Wait() }()
	select {
	case err := <-l.done:
		return nil, fmt.Errorf("sluice-load ended early: %v: %s%s", err, l.errs.String(), l.out.String())
	case <-time.After(time.Second):
	}
	return l, nil
}

// wait waits for the load to end: its req/s over the whole run.
func (l *loadRun) wait() (float64, error) {
	if err := <-l.done; err != nil {
		return 0, fmt.Errorf("sluice-load: %v: %s%s", err, l.errs.String(), l.out.String())
	}
	var rep struct {
		Requests int     `json:"requests"`
		RPS      float64 `json:"rps"`
	}
	if err := json.Unmarshal(l.out.Bytes(), &rep); err != nil {
		return 0, fmt.Errorf("sluice-load output: %v", err)
	}
	return rep.RPS, nil
}

// sampled is what one perf record interval measured of Envoy.
type sampled struct {
	served  int64
	cpu     time.Duration
	elapsed time.Duration
}

// sampleEnvoy records Envoy e with perf for o.duration into data, counting the
// requests it served and the CPU it used meanwhile.
func sampleEnvoy(ctx context.Context, o options, e *envoyproc.Envoy, data string) (sampled, error) {
	pid := e.PID()
	rq0, err := requests(e)
	if err != nil {
		return sampled{}, err
	}
	cpu0, err := build.CPUTime(pid)
	if err != nil {
		return sampled{}, err
	}
	t0 := time.Now()
	pcmd := exec.CommandContext(ctx, "perf", "record", "-q", "-e", "cpu-clock", "-F", strconv.Itoa(o.freq), "-g",
		"-p", strconv.Itoa(pid), "-o", data, "--", "sleep", strconv.FormatFloat(o.duration.Seconds(), 'f', 3, 64))
	pcmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if msg, err := pcmd.CombinedOutput(); err != nil {
		return sampled{}, fmt.Errorf("perf record: %v\n%s", err, msg)
	}
	elapsed := time.Since(t0)
	cpu1, err := build.CPUTime(pid)
	if err != nil {
		return sampled{}, err
	}
	rq1, err := requests(e)
	if err != nil {
		return sampled{}, err
	}
	if rq1 <= rq0 {
		return sampled{}, errors.New("no request served while sampled")
	}
	return sampled{served: rq1 - rq0, cpu: cpu1 - cpu0, elapsed: elapsed}, nil
}

// writeRun writes run r's breakdown of the samples in data to w (rps: the
// load's req/s over its whole run).
func writeRun(w *bytes.Buffer, o options, r int, rdir, data, bin string, m sampled, rps float64) error {
	// perf script reads the map while the process's map file is still there.
	scmd := exec.Command("perf", "script", "-i", data, "-F", "comm,tid,ip,sym,dso")
	var sout, serr bytes.Buffer
	scmd.Stdout, scmd.Stderr = &sout, &serr
	if err := scmd.Run(); err != nil {
		return fmt.Errorf("perf script: %v\n%s", err, serr.String())
	}
	if o.keep {
		if err := os.WriteFile(filepath.Join(rdir, "perf.txt"), sout.Bytes(), 0o644); err != nil {
			return err
		}
	}
	ss, err := parseScript(&sout)
	if err != nil {
		return err
	}
	if len(ss) == 0 {
		return errors.New("perf recorded no samples")
	}
	us := float64(m.cpu.Microseconds()) / float64(m.served)
	c := &classifier{envoy: bin}
	b := c.sort(ss)
	fmt.Fprintf(w, "\n## run %d: %.0f req/s while sampled (%.0f over the whole load), Envoy CPU %.2f cores, %.1f µs/request\n",
		r, float64(m.served)/m.elapsed.Seconds(), rps, m.cpu.Seconds()/m.elapsed.Seconds(), us)
	if !b.named {
		fmt.Fprintln(w, "(V8's code unnamed: guest functions and V8's stubs are not told apart)")
	}
	b.write(w, us, o.top)
	fmt.Fprintf(os.Stderr, "envoy-perf: run %d: %.0f req/s, %.1f µs/request, guest %.1f%%, host calls %.1f%%\n", r,
		float64(m.served)/m.elapsed.Seconds(), us, 100*float64(b.side[sideGuest])/float64(b.total), 100*float64(b.side[sideHost])/float64(b.total))
	return nil
}

// requests is how many requests the measured listener has served (its downstream_rq_total).
func requests(e *envoyproc.Envoy) (int64, error) {
	s, err := e.Get("/stats?filter=^http\\.front\\.downstream_rq_total$")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(s, "\n") {
		name, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if ok && name == "http.front.downstream_rq_total" {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no http.front.downstream_rq_total in %q", s)
}

func renderBootstrap(o options, wasm string, upstreamPort int) ([]byte, error) {
	fc := envoyconf.Filters{StatPrefix: "front", WasmPath: wasm, Tokens: 1_000_000_000, FillSecs: 1}
	if o.deny {
		fc.Tokens, fc.FillSecs = 1, 3600
	}
	switch o.config {
	case "native":
		fc.Native = true
	case "sluice":
		limit, window := "1000000000", "1s"
		if o.deny {
			limit, window = "1", "1h"
		}
		cfg := fmt.Sprintf(`{"rules":[{"name":"perf","key":[{"header":%q}],"algorithm":"token_bucket","limit":%s,"window":%q}],"response":{"headers":%q}}`,
			keyHeader, limit, window, o.headers)
		b, _ := json.Marshal(cfg)
		fc.VMID, fc.Plugin = "sluice", string(b)
	case "noop":
		fc.VMID, fc.Plugin = "noop", `""`
	}
	return envoyconf.Bootstrap{Title: "envoy-perf, " + o.config, UpstreamPort: upstreamPort,
		Listeners: []envoyconf.Listener{{Name: "front", Filters: fc}}}.YAML()
}
