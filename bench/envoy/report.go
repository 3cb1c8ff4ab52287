package main

import (
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/bench/internal/build"
	"github.com/sluice-proxy/sluice/bench/internal/rounds"
)

// Issue 25's goals, the bounds the goals table checks the medians against.
const (
	goalRPS       = 0.90 // req/s vs native, admit-1k, at least
	goalCPU       = 1.15 // CPU/request vs native, admit-1k, at most
	goalDenyCPU   = 1.00 // CPU/request of a denial vs native's, at most
	goalReady     = 1.20 // time to /ready vs noop, at most
	goalFirstMS   = 100  // slowest request in the first second after ready, ms, at most
	goalRSSMB     = 40   // VmRSS above native's, MB, at most
	goalLatency   = 1.10 // p50 and p99 vs native at half saturation, at most
	goalFlatMB    = 5    // growth the goals table calls flat, MB, at most
	nativeFamily  = "native"
	noopFamily    = "noop"
	denyFloor     = "deny-floor"
	admitFloor    = "admit-floor"
	admitVariant  = baselineVariant
	denyVariant1  = "deny-1"
	denyVariantK  = "deny-1k"
	admitVariant1 = "admit-1"
)

// Issue 37's goals for the dynamic module, libsluice.so, against native local_ratelimit.
const (
	goalDMRSSMB = 10   // VmRSS above native's, MB, at most
	goalDMReady = 1.20 // time to /ready vs native, at most
	goalDMCPU   = 1.15 // CPU/request admitted vs native, at most
	goalDMRPS   = 0.90 // req/s admitted vs native, at least
	dmNoopC     = "dm-noop-c"
	dmNoopGo    = "dm-noop-go"
	noneFamily  = "none"
)

// perRound is f(a[i]) / f(b[i]) for every round both have.
func perRound[T any](a, b []T, f func(T) float64) []float64 {
	var v []float64
	for i := range min(len(a), len(b)) {
		v = append(v, f(a[i])/f(b[i]))
	}
	return v
}

func ratioCell(v []float64) string {
	if len(v) == 0 {
		return "–"
	}
	return rounds.Summarize(v).Ratio()
}

// mark is ✓ when the goal is met, ✗ when not.
func mark(ok bool) string {
	if ok {
		return " ✓"
	}
	return " ✗"
}

func rpsOf(s sample) float64 { return s.rps }
func cpuOf(s sample) float64 { return s.cpuPerReq }

// report writes the results: the header line, the setting, the goals, then one table per
// phase run and the legend.
func (e *env) report(w io.Writer, fams []family, ph map[string]bool, res *results, took time.Duration, load0 string) {
	fmt.Fprintf(w, "# %s · %s · %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), build.Revision(e.root), build.CommandLine("./bench/envoy", "bench-envoy"))
	fmt.Fprintf(w, "Envoy %s (%s) --concurrency 2 · %d CPUs · load average %s at start, %s at end · %v.\n\n",
		e.target.Version, e.target.Bin, runtime.NumCPU(), load0, build.LoadAvg(), took.Round(time.Second))
	if e.dmDir != "" {
		fmt.Fprintf(w, "Dynamic modules (search path %s): libsluice.so %s, loaded once per process (one Go runtime for every dm-* configuration in it); the C no-op %s built with gcc -shared -fPIC -O2.\n\n",
			e.dmDir, e.dmFrom, noopDynmodSource)
	}
	var sf, df []family
	for _, f := range fams {
		switch {
		case f.kind == "sluice":
			sf = append(sf, f)
		case f.limiter():
			df = append(df, f)
		}
	}
	e.goals(w, sf, ph, res)
	e.dynmodGoals(w, df, ph, res)
	if ph["throughput"] {
		e.throughputTable(w, fams, res)
	}
	if ph["latency"] {
		e.latencyTable(w, fams, res)
	}
	if ph["memory"] {
		e.memoryTable(w, fams, res)
	}
	if ph["startup"] {
		e.startupTable(w, fams, res)
	}
	fmt.Fprintln(w)
	for _, f := range fams {
		fmt.Fprintf(w, "- %s: %s\n", f.name, f.what)
	}
	fmt.Fprintln(w, "- variants: admit-1 / admit-1k: x-key with 1 / 1,000 values round-robin, limit 1,000,000,000/s (every request 200); deny-1 / deny-1k: limit 1 per hour, every key used by the warm-up (every measured request 429)")
	fmt.Fprintln(w, "- upstream: direct_response 200 from a listener of the same Envoy")
	fmt.Fprintln(w, "- median (min–max) over the rounds; a ratio is taken per round (both figures from the same process, seconds apart) before the median")
}

// goals are the performance goals (docs/performance.md), one row each, against the medians (✓ met, ✗ not).
func (e *env) goals(w io.Writer, sf []family, ph map[string]bool, res *results) {
	if len(sf) == 0 {
		return
	}
	var rows []goalRow
	if ph["throughput"] {
		rows = append(rows, e.throughputGoals(res)...)
	}
	if ph["latency"] {
		rows = append(rows, latencyGoals(res)...)
	}
	if ph["startup"] {
		rows = append(rows, startupGoals(res)...)
	}
	if ph["memory"] {
		rows = append(rows, e.memoryGoals(res)...)
	}
	writeGoals(w, "Goals, medians over the rounds (min–max); ✓ met, ✗ not:", sf, rows)
}

// throughputGoals are the goals of one phase (see goals).
func (e *env) throughputGoals(res *results) []goalRow {
	type row = goalRow
	var rows []row
	tput := func(variant string, of func(sample) float64, bound float64, atLeast bool) func(family) string {
		return func(f family) string {
			v := perRound(res.tput[f.name+" "+variant], res.tput[nativeFamily+" "+variant], of)
			if len(v) == 0 {
				return "–"
			}
			m := rounds.Summarize(v).Med
			return ratioCell(v) + mark(atLeast && m >= bound || !atLeast && m <= bound)
		}
	}
	rows = append(rows,
		row{fmt.Sprintf("req/s, 1,000 keys admitted, vs native: ≥ %.2f×", goalRPS), tput(admitVariant, rpsOf, goalRPS, true)},
		row{fmt.Sprintf("Envoy CPU/request, 1,000 keys admitted, vs native: ≤ %.2f×", goalCPU), tput(admitVariant, cpuOf, goalCPU, false)},
		row{fmt.Sprintf("CPU/request of a denial vs native's, 1 key: ≤ %.2f×", goalDenyCPU), tput(denyVariant1, cpuOf, goalDenyCPU, false)},
		row{fmt.Sprintf("CPU/request of a denial vs native's, 1,000 keys: ≤ %.2f×", goalDenyCPU), tput(denyVariantK, cpuOf, goalDenyCPU, false)},
		row{"(no goal) the admit floor's admission vs native's, 1,000 keys: what any exact shared-data limiter in standard-Go Proxy-Wasm costs", func(family) string {
			return ratioCell(perRound(res.tput[admitFloor+" "+admitVariant], res.tput[nativeFamily+" "+admitVariant], cpuOf))
		}},
		row{"(no goal) CPU/request admitted vs the admit floor's, 1,000 keys: what sluice adds to it", func(f family) string {
			return ratioCell(perRound(res.tput[f.name+" "+admitVariant], res.tput[admitFloor+" "+admitVariant], cpuOf))
		}},
		row{"(no goal) the deny floor's denial vs native's, 1,000 keys: what any standard-Go Proxy-Wasm denial costs", func(family) string {
			return ratioCell(perRound(res.tput[denyFloor+" "+denyVariantK], res.tput[nativeFamily+" "+denyVariantK], cpuOf))
		}},
		row{"(no goal) CPU/request of a denial vs the deny floor's, 1,000 keys: what sluice adds to it", func(f family) string {
			return ratioCell(perRound(res.tput[f.name+" "+denyVariantK], res.tput[denyFloor+" "+denyVariantK], cpuOf))
		}},
	)
	if e.wasmB != "" {
		// Each -b family against the family it copies: the module's change, side by side.
		vsA := func(variant string) func(family) string {
			return func(f family) string {
				if f.b == "" {
					return "–"
				}
				a := strings.TrimSuffix(f.name, "-b")
				return ratioCell(perRound(res.tput[f.name+" "+variant], res.tput[a+" "+variant], cpuOf))
			}
		}
		return append(rows,
			row{"(no goal) -wasm-b module: CPU/request vs the same family on -wasm, 1,000 keys admitted", vsA(admitVariant)},
			row{"(no goal) -wasm-b module: CPU/request vs the same family on -wasm, 1,000 keys denied", vsA(denyVariantK)},
		)
	}
	return rows
}

// latencyGoals are the goals of one phase (see goals).
func latencyGoals(res *results) []goalRow {
	type row = goalRow
	var rows []row
	lat := func(of func(latSample) float64) func(family) string {
		return func(f family) string {
			v := perRound(res.lat[f.name], res.lat[nativeFamily], of)
			if len(v) == 0 {
				return "–"
			}
			return ratioCell(v) + mark(rounds.Summarize(v).Med <= goalLatency)
		}
	}
	rows = append(rows,
		row{fmt.Sprintf("p50 at half native's saturation, vs native: ≤ %.2f×", goalLatency), lat(func(s latSample) float64 { return s.p50 })},
		row{fmt.Sprintf("p99 at half native's saturation, vs native: ≤ %.2f×", goalLatency), lat(func(s latSample) float64 { return s.p99 })},
	)
	return rows
}

// startupGoals are the goals of one phase (see goals).
func startupGoals(res *results) []goalRow {
	type row = goalRow
	var rows []row
	rows = append(rows,
		row{fmt.Sprintf("time to /ready vs noop: ≤ %.1f×", goalReady), func(f family) string {
			v := perRound(res.start[f.name], res.start[noopFamily], func(s startSample) float64 { return float64(s.ready) })
			if len(v) == 0 {
				return "–"
			}
			return ratioCell(v) + mark(rounds.Summarize(v).Med <= goalReady)
		}},
		row{fmt.Sprintf("slowest request in the first second after ready, both workers, ms: ≤ %d (worst round)", goalFirstMS), func(f family) string {
			ss := res.start[f.name]
			if len(ss) == 0 {
				return "–"
			}
			worst, both := 0.0, true
			for _, s := range ss {
				worst = max(worst, s.max)
				both = both && s.workers[0] > 0 && s.workers[1] > 0
			}
			c := fmt.Sprintf("%.1f", worst)
			if !both {
				c += " (not both workers)"
			}
			return c + mark(worst <= goalFirstMS && both)
		}},
	)
	return rows
}

// memoryGoals are the goals of one phase (see goals).
func (e *env) memoryGoals(res *results) []goalRow {
	type row = goalRow
	var rows []row
	mem := func(of func(ms memSample, nat memSample) (string, bool)) func(family) string {
		return func(f family) string {
			ms, ok1 := res.mem[f.name]
			nat, ok2 := res.mem[nativeFamily]
			if !ok1 || !ok2 || len(ms.rssMB) == 0 || len(nat.rssMB) == 0 {
				return "–"
			}
			s, ok := of(ms, nat)
			return s + mark(ok)
		}
	}
	rows = append(rows,
		row{fmt.Sprintf("VmRSS, 2 workers, vs native's (the largest reading of each): ≤ +%d MB", goalRSSMB), mem(func(ms, nat memSample) (string, bool) {
			d := maxOf(ms.rssMB) - maxOf(nat.rssMB)
			return fmt.Sprintf("%+.1f MB", d), d <= goalRSSMB
		})},
		row{fmt.Sprintf("VmRSS growth over the last ⅔ of %s requests: flat (≤ %d MB)", thousands(e.o.memRequests), goalFlatMB), mem(func(ms, _ memSample) (string, bool) {
			d := ms.requestGrowth()
			return fmt.Sprintf("%+.1f MB", d), d <= goalFlatMB
		})},
		row{fmt.Sprintf("VmRSS growth over %s distinct keys: flat (≤ %d MB)", thousands(e.o.memKeys), goalFlatMB), mem(func(ms, _ memSample) (string, bool) {
			d, ok := ms.keyGrowth()
			if !ok {
				return "–", false
			}
			return fmt.Sprintf("%+.1f MB", d), d <= goalFlatMB
		})},
	)
	return rows
}

// goalRow is one row of a goals table: the goal, and its cell for a family.
type goalRow struct {
	goal string
	cell func(f family) string
}

// writeGoals writes a goals table: a row per goal, a column per family.
func writeGoals(w io.Writer, heading string, fams []family, rows []goalRow) {
	if len(rows) == 0 || len(fams) == 0 {
		return
	}
	fmt.Fprintln(w, heading)
	fmt.Fprintln(w)
	fmt.Fprint(w, "| goal |")
	for _, f := range fams {
		fmt.Fprintf(w, " %s |", f.name)
	}
	fmt.Fprint(w, "\n|---|")
	for range fams {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |", r.goal)
		for _, f := range fams {
			fmt.Fprintf(w, " %s |", r.cell(f))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// ratioGoal is the cell of a ratio goal: the per-round ratios' median and range, marked
// against bound (at least, or at most).
func ratioGoal(v []float64, bound float64, atLeast bool) string {
	if len(v) == 0 {
		return "–"
	}
	m := rounds.Summarize(v).Med
	return ratioCell(v) + mark(atLeast && m >= bound || !atLeast && m <= bound)
}

// dynmodGoals are the dynamic module's goals (issue 37) against the medians, a column per
// libsluice.so rate-limiting family, and beside them what the Go runtime costs: the Go floor
// (dm-noop-go) against the C no-op (dm-noop-c), and the C no-op against native and none.
func (e *env) dynmodGoals(w io.Writer, df []family, ph map[string]bool, res *results) {
	if len(df) == 0 {
		return
	}
	tput := func(of func(sample) float64, a, b string) []float64 { return perRound(res.tput[a], res.tput[b], of) }
	vsNative := func(variant string, of func(sample) float64, bound float64, atLeast bool) func(family) string {
		return func(f family) string {
			return ratioGoal(tput(of, f.name+" "+variant, nativeFamily+" "+variant), bound, atLeast)
		}
	}
	same := func(v []float64) func(family) string { return func(family) string { return ratioCell(v) } }
	var rows []goalRow
	if ph["throughput"] {
		rows = append(rows,
			goalRow{fmt.Sprintf("req/s, 1,000 keys admitted, vs native: ≥ %.2f×", goalDMRPS), vsNative(admitVariant, rpsOf, goalDMRPS, true)},
			goalRow{fmt.Sprintf("req/s, 1 key admitted, vs native: ≥ %.2f×", goalDMRPS), vsNative(admitVariant1, rpsOf, goalDMRPS, true)},
			goalRow{fmt.Sprintf("Envoy CPU/request, 1,000 keys admitted, vs native: ≤ %.2f×", goalDMCPU), vsNative(admitVariant, cpuOf, goalDMCPU, false)},
			goalRow{fmt.Sprintf("Envoy CPU/request, 1 key admitted, vs native: ≤ %.2f×", goalDMCPU), vsNative(admitVariant1, cpuOf, goalDMCPU, false)},
			goalRow{"(no goal) CPU/request of a denial vs native's, 1,000 keys", func(f family) string {
				return ratioCell(tput(cpuOf, f.name+" "+denyVariantK, nativeFamily+" "+denyVariantK))
			}},
			goalRow{"(no goal) CPU/request of a denial vs native's, 1 key", func(f family) string {
				return ratioCell(tput(cpuOf, f.name+" "+denyVariant1, nativeFamily+" "+denyVariant1))
			}},
			goalRow{"(no goal) CPU/request admitted vs dm-noop-go's, 1,000 keys: what sluice adds to the Go runtime's floor", func(f family) string {
				return ratioCell(tput(cpuOf, f.name+" "+admitVariant, dmNoopGo+" "+admitVariant))
			}},
			goalRow{"(no goal) the Go runtime: dm-noop-go's CPU/request vs dm-noop-c's, 1,000 keys admitted (every column the same)",
				same(tput(cpuOf, dmNoopGo+" "+admitVariant, dmNoopC+" "+admitVariant))},
			goalRow{"(no goal) the Go runtime: dm-noop-go's req/s vs dm-noop-c's, 1,000 keys admitted (every column the same)",
				same(tput(rpsOf, dmNoopGo+" "+admitVariant, dmNoopC+" "+admitVariant))},
			goalRow{"(no goal) any dynamic module: dm-noop-c's CPU/request vs none's, 1,000 keys admitted (every column the same)",
				same(tput(cpuOf, dmNoopC+" "+admitVariant, noneFamily+" "+admitVariant))},
			goalRow{"(no goal) any dynamic module: dm-noop-c's CPU/request vs native's, 1,000 keys admitted (every column the same)",
				same(tput(cpuOf, dmNoopC+" "+admitVariant, nativeFamily+" "+admitVariant))},
		)
	}
	if ph["latency"] {
		lat := func(of func(latSample) float64) func(family) string {
			return func(f family) string { return ratioCell(perRound(res.lat[f.name], res.lat[nativeFamily], of)) }
		}
		rows = append(rows,
			goalRow{"(no goal) p50 at half native's saturation, vs native", lat(func(s latSample) float64 { return s.p50 })},
			goalRow{"(no goal) p99 at half native's saturation, vs native", lat(func(s latSample) float64 { return s.p99 })},
		)
	}
	if ph["startup"] {
		ready := func(a, b string) []float64 {
			return perRound(res.start[a], res.start[b], func(s startSample) float64 { return float64(s.ready) })
		}
		rows = append(rows,
			goalRow{fmt.Sprintf("time to /ready vs native: ≤ %.1f×", goalDMReady), func(f family) string {
				return ratioGoal(ready(f.name, nativeFamily), goalDMReady, false)
			}},
			goalRow{"(no goal) the Go runtime: dm-noop-go's time to /ready vs dm-noop-c's (every column the same)", same(ready(dmNoopGo, dmNoopC))},
			goalRow{"(no goal) slowest request in the first second after ready, ms (worst round)", func(f family) string {
				worst := -1.0
				for _, s := range res.start[f.name] {
					worst = max(worst, s.max)
				}
				if worst < 0 {
					return "–"
				}
				return fmt.Sprintf("%.1f", worst)
			}},
		)
	}
	if ph["memory"] {
		rows = append(rows, e.dynmodMemoryGoals(res)...)
	}
	writeGoals(w, "The dynamic module's goals (issue 37), medians over the rounds (min–max); ✓ met, ✗ not:", df, rows)
}

// dynmodMemoryGoals are dynmodGoals' memory rows.
func (e *env) dynmodMemoryGoals(res *results) []goalRow {
	var rows []goalRow
	over := func(a, b string) (float64, bool) {
		ma, ok1 := res.mem[a]
		mb, ok2 := res.mem[b]
		if !ok1 || !ok2 || len(ma.rssMB) == 0 || len(mb.rssMB) == 0 {
			return 0, false
		}
		return maxOf(ma.rssMB) - maxOf(mb.rssMB), true
	}
	mb := func(d float64, ok bool) string {
		if !ok {
			return "–"
		}
		return fmt.Sprintf("%+.1f MB", d)
	}
	rows = append(rows,
		goalRow{fmt.Sprintf("VmRSS, 2 workers, vs native's (the largest reading of each): ≤ +%d MB", goalDMRSSMB), func(f family) string {
			d, ok := over(f.name, nativeFamily)
			if !ok {
				return "–"
			}
			return mb(d, ok) + mark(d <= goalDMRSSMB)
		}},
		goalRow{fmt.Sprintf("(no goal) VmRSS growth over the last ⅔ of %s requests", thousands(e.o.memRequests)), func(f family) string {
			ms, ok := res.mem[f.name]
			return mb(ms.requestGrowth(), ok && len(ms.rssMB) > 0)
		}},
		goalRow{fmt.Sprintf("(no goal) VmRSS growth over %s distinct keys", thousands(e.o.memKeys)), func(f family) string {
			return mb(res.mem[f.name].keyGrowth())
		}},
		goalRow{"(no goal) the Go runtime: dm-noop-go's VmRSS over dm-noop-c's (every column the same)", func(family) string { return mb(over(dmNoopGo, dmNoopC)) }},
		goalRow{"(no goal) any dynamic module: dm-noop-c's VmRSS over native's (every column the same)", func(family) string { return mb(over(dmNoopC, nativeFamily)) }},
	)
	return rows
}

func (e *env) throughputTable(w io.Writer, fams []family, res *results) {
	fmt.Fprintf(w, "Throughput and CPU: %d rounds, one Envoy process per round holding every configuration on a listener of its own (one Wasm VM per family and worker; the dm-* families a filter configuration each, all served by one libsluice.so); the configurations run one at a time, in an order rotated from round to round (reversed every other round). sluice-load -c %d closed loop, %v measured after %v of warm-up per configuration. CPU: utime+stime of the Envoy process over the measured run per request served (only the measured listener takes load).\n\n",
		e.o.rounds, e.o.conc, e.o.duration, e.o.warmup)
	fmt.Fprintln(w, "| configuration | req/s | Envoy CPU µs/request | req/s vs native | CPU/request vs native | req/s vs none | CPU/request vs none |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	none := res.tput["none "+baselineVariant]
	for _, f := range fams {
		for _, v := range f.variants() {
			c := setup{f, v}
			ss := res.tput[c.name()]
			native := res.tput[nativeFamily+" "+v.name]
			var r, u []float64
			for _, s := range ss {
				r, u = append(r, s.rps), append(u, s.cpuPerReq)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", c.name(), rounds.Summarize(r).Format("%.0f"), rounds.Summarize(u).Format("%.1f"),
				ratioCell(perRound(ss, native, rpsOf)), ratioCell(perRound(ss, native, cpuOf)),
				ratioCell(perRound(ss, none, rpsOf)), ratioCell(perRound(ss, none, cpuOf)))
		}
	}
	fmt.Fprintln(w, "\nBaselines (none, noop, dm-noop-c, dm-noop-go) are measured on admit-1k only, their ratios to native are to native admit-1k; the deny floor on deny-1k only, the admit floor on admit-1k.")
	fmt.Fprintln(w)
}

func (e *env) latencyTable(w io.Writer, fams []family, res *results) {
	fmt.Fprintf(w, "Latency at a fixed offered load, admit-1k: in each round's process, after its throughput runs, an open loop (sluice-load -rate, -c %d) at half the req/s native admit-1k reached in that round; %v measured after %v at the same rate. Latency from each request's due time (queueing included). CPU: per request sent over the whole run.\n\n",
		e.o.conc, e.o.duration, e.o.warmup)
	fmt.Fprintln(w, "| family | offered req/s | p50 ms | p99 ms | p50 vs native | p99 vs native | Envoy CPU µs/request | CPU/request vs native | sent > 1 ms late |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	nat := res.lat[nativeFamily]
	for _, f := range latencyFamilies(fams) {
		ss := res.lat[f.name]
		var rate, p50, p99, cpu, late []float64
		for _, s := range ss {
			rate, p50, p99 = append(rate, s.rate), append(p50, s.p50), append(p99, s.p99)
			cpu, late = append(cpu, s.cpuPerReq), append(late, float64(s.late))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f.name, rounds.Summarize(rate).Format("%.0f"),
			rounds.Summarize(p50).Format("%.3f"), rounds.Summarize(p99).Format("%.3f"),
			ratioCell(perRound(ss, nat, func(s latSample) float64 { return s.p50 })),
			ratioCell(perRound(ss, nat, func(s latSample) float64 { return s.p99 })),
			rounds.Summarize(cpu).Format("%.1f"), ratioCell(perRound(ss, nat, func(s latSample) float64 { return s.cpuPerReq })),
			rounds.Summarize(late).Format("%.0f"))
	}
	fmt.Fprintln(w)
}

// requestGrowth is the RSS growth over the last two thirds of the requests (the first
// third warms the process up).
func (ms memSample) requestGrowth() float64 {
	if len(ms.rssMB) < 4 {
		return 0
	}
	return ms.rssMB[3] - ms.rssMB[1]
}

// keyGrowth is the RSS growth over the distinct keys, when they were sent.
func (ms memSample) keyGrowth() (float64, bool) {
	if len(ms.rssMB) < 5 {
		return 0, false
	}
	return ms.rssMB[4] - ms.rssMB[3], true
}

func maxOf(v []float64) float64 {
	m := v[0]
	for _, x := range v[1:] {
		m = max(m, x)
	}
	return m
}

func (e *env) memoryTable(w io.Writer, fams []family, res *results) {
	third := e.o.memRequests / 3
	fmt.Fprintf(w, "Memory: per family one Envoy process of its own (--concurrency 2) with its admit-1k listener alone; VmRSS in MB after start, after %s, %s and %s requests (closed loop, -c %d, 1,000 keys) and, for the rate-limiting families, after %s more requests each with a key of its own. vs native: the largest reading of each. The wasm stats at the end: what Envoy exposes (it has no per-VM memory_size stat in this binary unless listed) and sluice's guest metrics (heap_bytes sums the deltas every VM reports, so it is the heap of all the family's VMs).\n\n",
		thousands(third), thousands(2*third), thousands(e.o.memRequests), e.o.conc, thousands(e.o.memKeys))
	fmt.Fprintln(w, "| family | start | ⅓ requests | ⅔ requests | all requests | distinct keys | growth, last ⅔ of requests | growth, keys | vs native | wasm stats |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	nat := res.mem[nativeFamily]
	for _, f := range fams {
		ms, ok := res.mem[f.name]
		if !ok {
			continue
		}
		cells := make([]string, len(memPoints))
		for i := range cells {
			cells[i] = "–"
			if i < len(ms.rssMB) {
				cells[i] = fmt.Sprintf("%.1f", ms.rssMB[i])
			}
		}
		kg := "–"
		if d, ok := ms.keyGrowth(); ok {
			kg = fmt.Sprintf("%+.1f", d)
		}
		vs := "–"
		if len(nat.rssMB) > 0 {
			vs = fmt.Sprintf("%+.1f MB", maxOf(ms.rssMB)-maxOf(nat.rssMB))
		}
		fmt.Fprintf(w, "| %s | %s | %+.1f | %s | %s | %s |\n", f.name, strings.Join(cells, " | "), ms.requestGrowth(), kg, vs, wasmStats(ms.wasm))
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Where each family's resident memory is at the end, MB: from /proc/PID/smaps, pages backed by a file (Envoy's binary and libraries, V8's compilers among them), anonymous executable pages (V8's compiled Wasm code) and the other anonymous pages (Envoy's C++ heap, V8's heaps, the Wasm linear memories, stacks); and Envoy's C++ heap as its allocator reports it: in use (server.memory_allocated), and held from the system but free (server.memory_heap_size minus that; the allocator keeps what V8's compilation freed).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| family | VmRSS | file-backed | anonymous executable | other anonymous | heap in use | heap held, free |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
	for _, f := range fams {
		ms, ok := res.mem[f.name]
		if !ok || len(ms.rssMB) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", f.name, ms.rssMB[len(ms.rssMB)-1],
			ms.split.fileMB, ms.split.execMB, ms.split.anonMB, ms.heapUsedMB, max(ms.heapMB-ms.heapUsedMB, 0))
	}
	fmt.Fprintln(w)
}

func (e *env) startupTable(w io.Writer, fams []family, res *results) {
	fmt.Fprintf(w, "Start-up: per family %d fresh Envoy processes (--concurrency 2, its admit-1k listener alone, exact connection balance), rotated: the time from starting the process to /ready answering LIVE (polled every %v), then sluice-load -c %d closed loop for the first second after ready (it starts a few ms after): the requests served, p99 and the slowest, and the connections each worker accepted (fewest over the rounds).\n\n",
		e.o.startupRounds, readyPoll, e.o.firstConc)
	fmt.Fprintln(w, "| family | time to ready ms | vs noop | first-second requests | p99 ms | slowest ms | connections per worker |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---|")
	noop := res.start[noopFamily]
	for _, f := range fams {
		ss := res.start[f.name]
		if len(ss) == 0 {
			continue
		}
		var ready, reqs, p99, mx []float64
		fewest := map[int]int64{}
		for i, s := range ss {
			ready, reqs = append(ready, float64(s.ready)/float64(time.Millisecond)), append(reqs, float64(s.requests))
			p99, mx = append(p99, s.p99), append(mx, s.max)
			for wk := range 2 {
				if n := s.workers[wk]; i == 0 || n < fewest[wk] {
					fewest[wk] = n
				}
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %d / %d |\n", f.name, rounds.Summarize(ready).Format("%.0f"),
			ratioCell(perRound(ss, noop, func(s startSample) float64 { return float64(s.ready) })),
			rounds.Summarize(reqs).Format("%.0f"), rounds.Summarize(p99).Format("%.1f"), rounds.Summarize(mx).Format("%.1f"), fewest[0], fewest[1])
	}
	fmt.Fprintln(w)
}

// wasmStats are a process's kept wasm stats, "name=value" joined.
func wasmStats(m map[string]int64) string {
	var keys []string
	for n := range m {
		keys = append(keys, n)
	}
	sort.Strings(keys)
	var parts []string
	for _, n := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", strings.TrimPrefix(n, "wasm.envoy.wasm.runtime."), m[n]))
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, " ")
}

// thousands formats n with commas: 300,000.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
