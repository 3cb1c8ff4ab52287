package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// envoyReport is the -envoy run's results block: a header line (date · commit · command),
// the setting, the goals against the medians of the per-round ratios, then the figures.
type envoyReport struct {
	date                          time.Time
	commit, command, envoy        string
	rounds, conns, cpus           int
	warmup, duration              time.Duration
	okKeys, deniedKeys, leaseKeys int
	lease                         int
	load0, load1                  string
	took                          time.Duration
	samples                       []envoySample
}

// goal is one performance goal: a ratio per round, its bound, and whether every run it
// rests on was clean (no error, the variant's outcome).
type goal struct {
	what   string
	ratios []float64
	atMost bool // the median must be ≤ bound (else ≥)
	bound  float64
	clean  bool
	why    string // when not clean
}

func (g goal) met() bool {
	if !g.clean || len(g.ratios) == 0 {
		return false
	}
	m := spreadOf(g.ratios).med
	if g.atMost {
		return m <= g.bound
	}
	return m >= g.bound
}

func (g goal) row() string {
	op := "≥"
	if g.atMost {
		op = "≤"
	}
	mark := "✓"
	if !g.met() {
		mark = "✗"
	}
	cell := "no ratio"
	if len(g.ratios) > 0 {
		cell = spreadOf(g.ratios).format("%.2f")
	}
	note := ""
	if !g.clean {
		note = " (" + g.why + ")"
	}
	return fmt.Sprintf("| %s %s %.2f× | %s | %s%s |", g.what, op, g.bound, cell, mark, note)
}

// pickCfg returns the samples of one configuration, in round order.
func pickCfg(ss []envoySample, name string) []envoySample {
	var out []envoySample
	for _, s := range ss {
		if s.cfg.name == name {
			out = append(out, s)
		}
	}
	return out
}

// perRoundRatio pairs a and b by round: get(a)/get(b) where b's is not zero.
func perRoundRatio(a, b []envoySample, get func(envoySample) float64) []float64 {
	var out []float64
	for _, x := range a {
		for _, y := range b {
			if x.round == y.round && get(y) != 0 {
				out = append(out, get(x)/get(y))
			}
		}
	}
	return out
}

func rpsOf(s envoySample) float64   { return s.rps }
func p99Of(s envoySample) float64   { return s.p99 }
func redisOf(s envoySample) float64 { return s.redisPerDecision() }

// outcomeOK says whether a sample's run did what its variant asks: no error, every request
// admitted (ok, wasm) or at least 90% denied (denied).
func outcomeOK(s envoySample) (bool, string) {
	switch {
	case s.errors > 0:
		return false, fmt.Sprintf("round %d %s: %d errors", s.round, s.cfg.name, s.errors)
	case s.cfg.variant == "denied" && s.admittedShare() > 0.10:
		return false, fmt.Sprintf("round %d %s: %.1f%% admitted", s.round, s.cfg.name, 100*s.admittedShare())
	case s.cfg.variant != "denied" && s.admittedShare() < 1:
		return false, fmt.Sprintf("round %d %s: %.1f%% admitted", s.round, s.cfg.name, 100*s.admittedShare())
	}
	return true, ""
}

func cleanRuns(runs ...[]envoySample) (bool, string) {
	for _, r := range runs {
		for _, s := range r {
			if ok, why := outcomeOK(s); !ok {
				return false, why
			}
		}
	}
	return true, ""
}

// goals are the goals: through Envoy's ratelimit filter, sluice serve against
// envoyproxy/ratelimit on each variant — req/s ≥ 1.0×, Redis CPU per decision ≤ 1.0×,
// p99 ≤ 1.0× — first with --charge-denied (the peer's counting: like for like), then as
// shipped (exact: a script per decision); and sluice.wasm rls+lease against local:
// req/s ≥ 0.8×.
func envoyGoals(ss []envoySample) []goal {
	var gs []goal
	for _, svc := range []struct{ cfg, label string }{{"charged", "sluice serve --charge-denied"}, {"sluice", "sluice serve"}} {
		for _, v := range []string{"ok", "denied"} {
			peer, sl := pickCfg(ss, "rl-peer-"+v), pickCfg(ss, "rl-"+svc.cfg+"-"+v)
			if len(sl) == 0 {
				continue
			}
			clean, why := cleanRuns(peer, sl)
			for _, g := range []struct {
				what   string
				get    func(envoySample) float64
				atMost bool
			}{{"req/s", rpsOf, false}, {"Redis CPU per decision", redisOf, true}, {"p99", p99Of, true}} {
				gs = append(gs, goal{what: v + ", " + g.what + ", " + svc.label + " / envoyproxy/ratelimit", ratios: perRoundRatio(sl, peer, g.get),
					atMost: g.atMost, bound: 1, clean: clean, why: why})
			}
		}
	}
	local, lease := pickCfg(ss, "wasm-local"), pickCfg(ss, "wasm-lease")
	clean, why := cleanRuns(local, lease)
	gs = append(gs, goal{what: "sluice.wasm req/s, rls + lease / local", ratios: perRoundRatio(lease, local, rpsOf),
		bound: 0.8, clean: clean, why: why})
	return gs
}

func thousandsF(x float64) string {
	s := fmt.Sprintf("%.0f", x)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func (r envoyReport) write(w io.Writer) {
	fmt.Fprintf(w, "# %s · %s · %s  (load average %s at start, %s at end; %v)\n",
		r.date.Format("2006-01-02 15:04 UTC"), r.commit, r.command, r.load0, r.load1, r.took.Round(time.Second))
	fmt.Fprintf(w, "Through Envoy %s --concurrency 2 (%d CPUs): sluice-load, %d connections, %v warm-up + %v measured per configuration,\n",
		r.envoy, r.cpus, r.conns, r.warmup, r.duration)
	fmt.Fprintf(w, "%d rounds, one Envoy per round, configurations in a rotated order. Redis CPU: utime+stime of the 3 masters\n", r.rounds)
	fmt.Fprintf(w, "(/proc) over the measured run / Envoy's ratelimit decisions (ok + over_limit). ok: %d values, %d/s each;\n", r.okKeys, okLimit)
	fmt.Fprintf(w, "denied: %d values, %d/min each; sluice.wasm: fixed_window %d per %s on %d values, local or rls with lease %d.\n",
		r.deniedKeys, deniedLimit, wasmLimit, wasmWindow, r.leaseKeys, r.lease)
	fmt.Fprintln(w, "Goals (median of the per-round ratios, min–max):")
	fmt.Fprintln(w, "| goal | ratio | |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, g := range envoyGoals(r.samples) {
		fmt.Fprintln(w, g.row())
	}
	fmt.Fprintln(w, "| configuration | req/s | p50 ms | p99 ms | 200s | Redis CPU per decision | Redis reads per decision | service CPU per decision | Envoy CPU per request | RLS calls per request | errors |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, c := range envoyConfigs {
		ss := pickCfg(r.samples, c.name)
		if len(ss) == 0 {
			continue
		}
		var errs int64
		for _, s := range ss {
			errs += s.errors
		}
		get := func(f func(envoySample) float64) spread {
			var v []float64
			for _, s := range ss {
				v = append(v, f(s))
			}
			return spreadOf(v)
		}
		rps := get(rpsOf)
		svc, calls := "–", "–"
		if c.kind == "ratelimit" || c.variant == "lease" {
			svc = fmt.Sprintf("%.1f µs", get(envoySample.svcPerDecision).med)
		}
		if c.kind == "wasm" {
			calls = fmt.Sprintf("%.3f", get(envoySample.callsPerRequest).med)
		}
		fmt.Fprintf(w, "| %s, %s | %s (%s–%s) | %.2f | %s | %.1f%% | %s | %.3f | %s | %.1f µs | %s | %d |\n",
			c.label(), c.variant, thousandsF(rps.med), thousandsF(rps.lo), thousandsF(rps.hi),
			get(func(s envoySample) float64 { return s.p50 }).med, get(p99Of).format("%.2f"),
			100*get(envoySample.admittedShare).med, get(redisOf).format("%.1f"), get(envoySample.readsPerDecision).med, svc,
			get(envoySample.envoyPerRequest).med, calls, errs)
	}
	fmt.Fprintln(w, "| ratio per round | req/s | p50 | p99 | Redis CPU per decision | service CPU per decision | Envoy CPU per request |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, p := range []struct{ label, a, b string }{
		{"ok, sluice serve --charge-denied / envoyproxy/ratelimit", "rl-charged-ok", "rl-peer-ok"},
		{"denied, sluice serve --charge-denied / envoyproxy/ratelimit", "rl-charged-denied", "rl-peer-denied"},
		{"ok, sluice serve / envoyproxy/ratelimit", "rl-sluice-ok", "rl-peer-ok"},
		{"denied, sluice serve / envoyproxy/ratelimit", "rl-sluice-denied", "rl-peer-denied"},
		{"sluice.wasm, rls + lease / local", "wasm-lease", "wasm-local"},
	} {
		a, b := pickCfg(r.samples, p.a), pickCfg(r.samples, p.b)
		if len(a) == 0 || len(b) == 0 {
			continue
		}
		cell := func(f func(envoySample) float64) string {
			v := perRoundRatio(a, b, f)
			if len(v) == 0 {
				return "–"
			}
			return spreadOf(v).format("%.2f")
		}
		redis, svc := cell(redisOf), cell(envoySample.svcPerDecision)
		if strings.HasPrefix(p.a, "wasm") {
			redis, svc = "–", "–" // the local rule uses neither
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", p.label, cell(rpsOf), cell(func(s envoySample) float64 { return s.p50 }),
			cell(p99Of), redis, svc, cell(envoySample.envoyPerRequest))
	}
}

// insertResults puts block at the top of a newest-first results file: before its first
// block (the first line starting with "# "), after the preamble; an empty file gets the
// block alone.
func insertResults(file, block string) string {
	block = strings.TrimRight(block, "\n") + "\n"
	if strings.HasPrefix(file, "# ") {
		return block + "\n" + file
	}
	if i := strings.Index(file, "\n# "); i >= 0 {
		return file[:i+1] + block + "\n" + file[i+1:]
	}
	if strings.TrimSpace(file) == "" {
		return block
	}
	return strings.TrimRight(file, "\n") + "\n\n" + block
}
