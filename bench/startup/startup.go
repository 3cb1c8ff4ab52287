// Package startup measures how fast `sluice run` answers its first request without a
// compilation cache, and how much memory it holds once idle (Linux: it reads /proc). The
// command bench/cmd/sluice-startup prints its figures; other benchmark commands call Measure.
//
// Each round starts `sluice run --workers N --cache-dir "" --listen 127.0.0.1:0` as a child
// process, polls GET / on the address it prints until an answer comes (any status), and
// records the time from the process start to that answer and the CPU time the process had
// used by then (a busy machine inflates it much less than the wall time). It then waits
// Idle with no traffic, reads VmRSS from /proc/PID/status and stops the child. Several
// configurations are measured in turn within each round, so that a busy machine slows them
// alike and their ratios hold.
package startup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
)

// Config is one configuration to measure: a sluice binary and the module it runs. With
// Floor, Sluice is instead an bench/cmd/sluice-floor binary: the minimal wazero host, whose
// time to its instances' initialization and idle memory are the floor under sluice run's.
type Config struct {
	Sluice, Wasm string
	Floor        bool
}

func (c Config) String() string {
	if c.Floor {
		return c.Sluice + " (floor) --wasm " + c.Wasm
	}
	return c.Sluice + " --wasm " + c.Wasm
}

// Options say how to measure.
type Options struct {
	Workers int           // --workers (default 2)
	Rounds  int           // rounds (default 3)
	Idle    time.Duration // idle time after the first answer before VmRSS is read (default 2 s)
	// Progress, when set, is called after each measurement.
	Progress func(round int, c Config, s Sample)
}

// Sample is one round's figures for one configuration.
type Sample struct {
	First time.Duration // wall time from the process start to the first answer
	CPU   time.Duration // CPU time (user + system) the process used until then
	RSSKB int           // VmRSS in KiB after the idle time
	Mem   Mem           // VmRSS and its split after the idle time
}

// Summary is a configuration's medians over the rounds, with the smallest and largest.
type Summary struct {
	Config                    Config
	First, FirstMin, FirstMax time.Duration
	CPU, CPUMin, CPUMax       time.Duration
	RSSKB, RSSMinKB, RSSMaxKB int
	Mem                       Mem // the median of each field
	Samples                   []Sample
}

func (s Summary) String() string {
	return fmt.Sprintf("first response %v (min %v, max %v), CPU until then %v (min %v, max %v), idle VmRSS %.1f MB (min %.1f, max %.1f; file %.1f, anon %.1f, of which executable %.1f)",
		s.First.Round(time.Millisecond), s.FirstMin.Round(time.Millisecond), s.FirstMax.Round(time.Millisecond),
		s.CPU, s.CPUMin, s.CPUMax, MB(s.RSSKB), MB(s.RSSMinKB), MB(s.RSSMaxKB), MB(s.Mem.File), MB(s.Mem.Anon), MB(s.Mem.AnonExec))
}

// MB converts KiB to MiB.
func MB(kb int) float64 { return float64(kb) / 1024 }

// Measure measures each configuration Rounds times, interleaved, and returns their summaries
// in the order given.
func Measure(configs []Config, o Options) ([]Summary, error) {
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Idle <= 0 {
		o.Idle = 2 * time.Second
	}
	samples := make([][]Sample, len(configs))
	for r := 1; r <= o.Rounds; r++ {
		for i, c := range configs {
			run := Run
			if c.Floor {
				run = RunFloor
			}
			s, err := run(c, o.Workers, o.Idle)
			if err != nil {
				return nil, fmt.Errorf("%s, round %d: %w", c, r, err)
			}
			if o.Progress != nil {
				o.Progress(r, c, s)
			}
			samples[i] = append(samples[i], s)
		}
	}
	out := make([]Summary, len(configs))
	for i, c := range configs {
		out[i] = summarize(c, samples[i])
	}
	return out, nil
}

func summarize(c Config, ss []Sample) Summary {
	var f, cpu []time.Duration
	var r, file, anon, exec []int
	for _, s := range ss {
		f, cpu, r = append(f, s.First), append(cpu, s.CPU), append(r, s.RSSKB)
		file, anon, exec = append(file, s.Mem.File), append(anon, s.Mem.Anon), append(exec, s.Mem.AnonExec)
	}
	slices.Sort(f)
	slices.Sort(cpu)
	m := len(ss) / 2
	for _, x := range [][]int{r, file, anon, exec} {
		slices.Sort(x)
	}
	return Summary{Config: c, Samples: ss,
		First: f[m], FirstMin: f[0], FirstMax: f[len(f)-1],
		CPU: cpu[m], CPUMin: cpu[0], CPUMax: cpu[len(cpu)-1],
		RSSKB: r[m], RSSMinKB: r[0], RSSMaxKB: r[len(r)-1],
		Mem: Mem{RSS: r[m], File: file[m], Anon: anon[m], AnonExec: exec[m]}}
}

// Run starts one `sluice run` child for c with the given workers and measures it.
func Run(c Config, workers int, idle time.Duration) (Sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Sluice, "run", "--wasm", c.Wasm, "--workers", strconv.Itoa(workers), "--cache-dir", "", "--listen", "127.0.0.1:0", "--log-level", "warn")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return Sample{}, err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Sample{}, err
	}
	defer Stop(cmd)
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "sluice: listening on http://"); ok {
				a, _, _ := strings.Cut(rest, " ")
				addr <- a
			}
		}
	}()
	var url string
	select {
	case a := <-addr:
		url = "http://" + a + "/"
	case <-ctx.Done():
		return Sample{}, errors.New("sluice run printed no listening line within 60s")
	}
	client := &http.Client{Timeout: 5 * time.Second}
	var s Sample
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			s.First = time.Since(start)
			if s.CPU, err = build.CPUTime(cmd.Process.Pid); err != nil {
				return Sample{}, err
			}
			break
		}
		if ctx.Err() != nil {
			return Sample{}, fmt.Errorf("no answer from %s: %v", url, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	client.CloseIdleConnections()
	time.Sleep(idle)
	s.Mem, err = ReadMem(cmd.Process.Pid)
	s.RSSKB = s.Mem.RSS
	return s, err
}

// Stop interrupts a started `sluice run` child (it drains and exits), kills it if it has not
// exited within 10 s, and waits for it.
func Stop(cmd *exec.Cmd) {
	cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// RunFloor starts one sluice-floor child for c (its instances' linear memories mmap-backed,
// as sluice run's) and measures it as Run measures sluice run: First and CPU when it says its
// instances are initialized, Mem after idle.
func RunFloor(c Config, workers int, idle time.Duration) (Sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.Sluice, "-child", "-mmap", "-wasm", c.Wasm, "-workers", strconv.Itoa(workers))
	in, err := cmd.StdinPipe() // the child idles until its standard input says something or ends
	if err != nil {
		return Sample{}, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return Sample{}, err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Sample{}, err
	}
	defer cmd.Wait()
	defer in.Close()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "ready ") {
		return Sample{}, fmt.Errorf("sluice-floor said %q, want its ready line", sc.Text())
	}
	s := Sample{First: time.Since(start)}
	if s.CPU, err = build.CPUTime(cmd.Process.Pid); err != nil {
		return Sample{}, err
	}
	time.Sleep(idle)
	s.Mem, err = ReadMem(cmd.Process.Pid)
	s.RSSKB = s.Mem.RSS
	go io.Copy(io.Discard, out)
	return s, err
}

// CPUTime reads the user and system CPU time a process has used so far (build.CPUTime, for
// the commands that measure through this package).
func CPUTime(pid int) (time.Duration, error) { return build.CPUTime(pid) }

// Mem is a process's resident memory as /proc reports it, in KiB: VmRSS and its split into
// file-backed pages (the binary, shared libraries) and anonymous ones (heap, stacks), and of
// the anonymous ones those in executable mappings (wazero's compiled machine code).
type Mem struct {
	RSS, File, Anon, AnonExec int
}

func (m Mem) String() string {
	return fmt.Sprintf("VmRSS %.1f MB (file %.1f, anon %.1f, of which executable %.1f)", MB(m.RSS), MB(m.File), MB(m.Anon), MB(m.AnonExec))
}

// ReadMem reads a process's Mem from /proc/PID/status and /proc/PID/smaps.
func ReadMem(pid int) (Mem, error) {
	var m Mem
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		switch k {
		case "VmRSS":
			m.RSS = n
		case "RssFile":
			m.File = n
		case "RssAnon":
			m.Anon = n
		}
	}
	if m.RSS == 0 {
		return m, errors.New("no VmRSS in /proc status")
	}
	sm, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return m, err
	}
	// A mapping's header line is "start-end perms offset dev inode [path]"; its Rss line follows.
	execAnon := false
	for _, line := range strings.Split(string(sm), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && len(f[1]) == 4 {
			execAnon = f[1][2] == 'x' && f[4] == "0" && (len(f) == 5 || strings.HasPrefix(f[5], "[anon"))
			continue
		}
		if execAnon && len(f) == 3 && f[0] == "Rss:" {
			n, _ := strconv.Atoi(f[1])
			m.AnonExec += n
		}
	}
	return m, nil
}
