// Command sluice-startup measures how fast `sluice run` answers its first request without a
// compilation cache, and how much memory it holds once idle:
//
//	sluice-startup [-sluice dist/sluice[,other/sluice...]] [-wasm dist/sluice.wasm] [-workers 2] [-rounds 3] [-idle 2s]
//
// Each round starts `sluice run --workers N --cache-dir "" --listen 127.0.0.1:0` as a child
// process, polls GET / on the address it prints until an answer comes (any status), and
// reports the time from the process start to that answer and the CPU time the process had
// used by then (a busy machine inflates it much less than the wall time). It then waits
// -idle with no traffic, reads VmRSS from /proc/PID/status (Linux only) and stops the
// child. The last lines are the medians of the rounds. Several binaries are measured in
// turn within each round, so that a busy machine slows them alike and their ratio holds.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	bins := flag.String("sluice", "dist/sluice", "the sluice binary; several, comma-separated: measured in turn within each round (interleaved)")
	wasm := flag.String("wasm", "dist/sluice.wasm", "the module `sluice run` loads")
	workers := flag.Int("workers", 2, "--workers for sluice run")
	rounds := flag.Int("rounds", 3, "rounds; the summary is their median")
	idle := flag.Duration("idle", 2*time.Second, "idle time after the first answer before RSS is read")
	flag.Parse()
	names := strings.Split(*bins, ",")
	samples := make([][]sample, len(names))
	for i := 0; i < *rounds; i++ {
		for j, bin := range names {
			sm, err := round(bin, *wasm, *workers, *idle)
			if err != nil {
				fmt.Fprintf(os.Stderr, "sluice-startup: %s, round %d: %v\n", bin, i+1, err)
				os.Exit(1)
			}
			fmt.Printf("%s round %d: first response %v (CPU %v), idle VmRSS %.1f MB\n", bin, i+1, sm.first.Round(time.Millisecond), sm.cpu, mb(sm.kb))
			samples[j] = append(samples[j], sm)
		}
	}
	for j, bin := range names {
		var f, c []time.Duration
		var r []int
		for _, sm := range samples[j] {
			f, c, r = append(f, sm.first), append(c, sm.cpu), append(r, sm.kb)
		}
		slices.Sort(f)
		slices.Sort(c)
		slices.Sort(r)
		fmt.Printf("%s: median of %d: first response %v (min %v, max %v), CPU until then %v (min %v, max %v), idle VmRSS %.1f MB (min %.1f, max %.1f), %d workers, no compilation cache\n",
			bin, *rounds, f[len(f)/2].Round(time.Millisecond), f[0].Round(time.Millisecond), f[len(f)-1].Round(time.Millisecond),
			c[len(c)/2], c[0], c[len(c)-1], mb(r[len(r)/2]), mb(r[0]), mb(r[len(r)-1]), *workers)
	}
}

func mb(kb int) float64 { return float64(kb) / 1024 }

// sample is one round's figures.
type sample struct {
	first time.Duration // wall time from the process start to the first answer
	cpu   time.Duration // CPU time (user + system) the process used until then
	kb    int           // VmRSS in KiB after the idle time
}

// round runs one child and measures it.
func round(bin, wasm string, workers int, idle time.Duration) (sample, error) {
	var cpu time.Duration
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "run", "--wasm", wasm, "--workers", strconv.Itoa(workers), "--cache-dir", "", "--listen", "127.0.0.1:0", "--log-level", "warn")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return sample{}, err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return sample{}, err
	}
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}()
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
		return sample{}, errors.New("sluice run printed no listening line within 60s")
	}
	client := &http.Client{Timeout: 5 * time.Second}
	var first time.Duration
	for {
		resp, err := client.Get(url)
		if err == nil {
			resp.Body.Close()
			first = time.Since(start)
			cpu, err = cpuTime(cmd.Process.Pid)
			if err != nil {
				return sample{}, err
			}
			break
		}
		if ctx.Err() != nil {
			return sample{}, fmt.Errorf("no answer from %s: %v", url, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	client.CloseIdleConnections()
	time.Sleep(idle)
	kb, err := vmRSS(cmd.Process.Pid)
	return sample{first, cpu, kb}, err
}

// cpuTime reads the user and system CPU time a process has used so far from
// /proc/PID/stat (fields 14 and 15, in clock ticks of 1/100 s).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := strings.LastIndexByte(string(b), ')') // the command name may hold spaces
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	utime, err1 := strconv.Atoi(f[11])
	stime, err2 := strconv.Atoi(f[12])
	if err1 != nil || err2 != nil {
		return 0, errors.New("bad /proc stat")
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// vmRSS reads VmRSS (KiB) from /proc/PID/status.
func vmRSS(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, errors.New("no VmRSS in /proc status")
}
