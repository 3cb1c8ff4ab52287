package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestGoalsRender renders both goals tables from synthetic results of every family.
func TestGoalsRender(t *testing.T) {
	res := &results{tput: map[string][]sample{}, lat: map[string][]latSample{}, mem: map[string]memSample{}, start: map[string][]startSample{}}
	for k, f := range families {
		for _, v := range []string{admitVariant, admitVariant1, denyVariant1, denyVariantK, baselineVariant} {
			res.tput[f.name+" "+v] = []sample{{rps: 1000 + float64(k), cpuPerReq: 10 + float64(k)}, {rps: 1100, cpuPerReq: 11}}
		}
		res.lat[f.name] = []latSample{{rate: 100, p50: 1 + float64(k)/10, p99: 2}}
		res.mem[f.name] = memSample{rssMB: []float64{30, 31 + float64(k), 32, 33, 34, 35}}
		res.start[f.name] = []startSample{{ready: time.Duration(k+1) * time.Millisecond, max: 3, workers: map[int]int64{0: 1, 1: 1}}}
	}
	e := &env{o: options{memRequests: 1000, memKeys: 1000}}
	ph := map[string]bool{"throughput": true, "latency": true, "startup": true, "memory": true}
	var w bytes.Buffer
	e.goals(&w, families, ph, res)
	e.dynmodGoals(&w, families, ph, res)
	out := w.String()
	for _, want := range []string{"Goals, medians over the rounds", "The dynamic module's goals (issue 37)",
		"req/s, 1,000 keys admitted, vs native: ≥", "p99 at half native's saturation", "time to /ready vs noop",
		"VmRSS growth over 1,000 distinct keys", "the Go runtime: dm-noop-go's VmRSS over dm-noop-c's"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the goals:\n%s", want, out)
		}
	}
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| goal |") {
			continue
		}
		rows++
		if cells := strings.Count(line, " |"); cells != len(families)+1 {
			t.Errorf("%d cells, want %d: %s", cells, len(families)+1, line)
		}
	}
	// 17 goals rows (8 throughput, 2 latency, 2 startup, 3 memory, and 2 for -wasm-b only when
	// set), 21 of the dynamic module (11, 2, 3, 5).
	if rows != 15+21 {
		t.Errorf("%d goal rows, want %d:\n%s", rows, 15+21, out)
	}
}
