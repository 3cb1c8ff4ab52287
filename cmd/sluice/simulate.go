package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/sim"
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/svgchart"
	"github.com/sluice-proxy/sluice/config"
)

func init() {
	commands["simulate"] = command{summary: "replay traffic through the algorithms, write an HTML report", run: runSimulate}
}

const simulateUsage = `usage: sluice simulate [--config FILE [--rule NAME] | --algorithm A --limit N --window D]
                       [--delay D [--max-held N]] [--settle [--no-usage refund]] [--compare] [--traffic PATTERN [pattern flags] | --csv FILE]
                       --out REPORT.html

Replays traffic through rate-limiting rules in virtual time (no sleeping:
a day of traffic takes well under a second) with sluice's own algorithms,
prints a summary and writes one self-contained HTML report (inline SVG and
CSS, no scripts, no network) with, per rule, offered vs admitted requests,
the decisions' remaining quota, and the numbers: admitted, denied, the
largest number admitted in any window-length interval, state bytes per key.

Rules:
  --config FILE      simulate every rule of a plugin configuration (each rule
                     on its own, with the traffic's key as the rule's key;
                     matching is not simulated); --rule NAME picks one
  --algorithm A --limit N --window D [--burst N]
                     simulate one rule given on the command line
  --compare          run the same traffic through all five algorithms with the
                     same limit and window: from --limit/--window/--burst, or
                     from the first (or --rule) rule of --config

Shaping (rules[].delay; token_bucket and leaky_bucket):
  --delay D      hold a request that fits within D until its slot instead of
                 refusing it (delay.max; a --config rule's own delay applies
                 without this flag); the report shows the upstream arrivals
                 with shaping next to the same rule without a delay
  --max-held N   at most N requests held at once (delay.max_held, default
                 1000), modelled as one worker: beyond, a request is decided
                 without a queue

Token budgets (rules[].cost with "response"; token_bucket and leaky_bucket):
  --settle       reserve each request's cost, and settle it with its actual
                 cost when its response ends (the CSV's actual and duration
                 columns); a --config rule with cost.response settles without
                 this flag. The summary and the report show the budget with
                 settlement next to the same reservations never settled
  --no-usage M   how a response without an actual cost settles: reservation
                 (default: it stands) or refund (a --config rule: its own)

Traffic (default --traffic boundary-burst):
  --traffic steady          one request every 1/rate seconds
  --traffic boundary-burst  burst-size requests in the spread before and after
                            every window boundary
  --traffic poisson         random arrivals at rate per second (--seed)
  --traffic idle-burst      idle, then burst-size requests within spread, repeated
  --traffic flood           a key flood: attacker keys, innocent clients and heavy
                            hitters in one random order (--seed) within --duration
  --csv FILE                lines "timestamp,key[,cost[,actual[,duration]]]";
                            timestamp is RFC 3339
                            or an offset: seconds ("12.5") or a duration ("250ms");
                            '#' comments, a "timestamp,..." header and blank lines
                            are skipped; timestamps must not decrease; actual
                            (empty: no usage) and duration (in flight, default
                            0) are a token budget's

Pattern flags (defaults follow the rule's limit per window):
  --duration D   (10 windows)      --rate R       (2×limit/window; poisson 1.2×)
  --burst-size N (limit; idle-burst 2×limit)      --spread D  (window/20)
  --idle D       (3 windows)       --keys K (1)   --seed S (1)   --cost C (1)
  flood: --attackers N (20000) --attacker-requests N (1) --innocents N (100)
         --innocent-requests N (limit/2) --heavy N (5) --heavy-requests N (10×limit)
         --duration D (window/10)

Key table:
  --max-keys N   keep the keys' states in the filter's own table of N slots
                 (max_keys), which evicts the least-used key when full, and
                 report evictions and shared-data entries; a flood uses it
                 always (default: the rule's max_keys with --config, else 1000).
                 Without it every key keeps its state.

Leases (rules[].lease on a Redis or RLS rule; token_bucket and fixed_window):
  --lease N      model a fleet whose proxies reserve up to N admissions per
                 call (the rule's lease with --config) and spend them
                 locally; the report charts global admissions with and
                 without leases and what the pools hold (under-admission)
  --proxies P    proxies in the fleet, requests spread round-robin (3)

Output:
  --out FILE     the HTML report ("-" for standard output; required)
  --buckets N    at most N time buckets per chart (120); each a round width

Durations accept the configuration's units (500ms, 1m30s, 1h, 1d) and Go's
(1.5s, 100us). Exit status: 0 done, 1 bad input, 2 usage error.
`

// simFlags are the parsed command-line flags of `sluice simulate`.
type simFlags struct {
	configFile, rule, algorithm string
	limit, burst                int64
	window                      time.Duration
	compare                     bool
	traffic, csvFile            string
	duration, spread, idle      time.Duration
	rate                        float64
	burstSize, keys             int
	seed                        uint64
	cost                        int64
	flood                       [6]int // attackers, attacker-requests, innocents, innocent-requests, heavy, heavy-requests
	maxKeys                     int
	lease                       int64
	proxies                     int
	delay                       time.Duration
	maxHeld                     int
	settle                      bool
	noUsage                     string
	buckets                     int
	out                         string
	set                         map[string]bool // flags given explicitly
}

// durationFlag parses configuration durations ("1d") and Go's ("1.5s").
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := parseSimDuration(s)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

func parseSimDuration(s string) (time.Duration, error) {
	if d, ok := config.ParseDuration(s); ok {
		return d, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (500ms, 1m30s, 1h, 1d)", s)
	}
	return d, nil
}

func parseSimFlags(args []string, stderr io.Writer) (*simFlags, error) {
	f := &simFlags{set: map[string]bool{}}
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.configFile, "config", "", "")
	fs.StringVar(&f.rule, "rule", "", "")
	fs.StringVar(&f.algorithm, "algorithm", "", "")
	fs.Int64Var(&f.limit, "limit", 0, "")
	fs.Var(durationFlag{&f.window}, "window", "")
	fs.Int64Var(&f.burst, "burst", 0, "")
	fs.BoolVar(&f.compare, "compare", false, "")
	fs.StringVar(&f.traffic, "traffic", "", "")
	fs.StringVar(&f.csvFile, "csv", "", "")
	fs.Var(durationFlag{&f.duration}, "duration", "")
	fs.Float64Var(&f.rate, "rate", 0, "")
	fs.IntVar(&f.burstSize, "burst-size", 0, "")
	fs.Var(durationFlag{&f.spread}, "spread", "")
	fs.Var(durationFlag{&f.idle}, "idle", "")
	fs.IntVar(&f.keys, "keys", 1, "")
	fs.Uint64Var(&f.seed, "seed", 1, "")
	fs.Int64Var(&f.cost, "cost", 1, "")
	for i, name := range floodFlags {
		fs.IntVar(&f.flood[i], name, 0, "")
	}
	fs.IntVar(&f.maxKeys, "max-keys", 0, "")
	fs.Int64Var(&f.lease, "lease", 0, "")
	fs.IntVar(&f.proxies, "proxies", 3, "")
	fs.Var(durationFlag{&f.delay}, "delay", "")
	fs.IntVar(&f.maxHeld, "max-held", config.DefaultMaxHeld, "")
	fs.BoolVar(&f.settle, "settle", false, "")
	fs.StringVar(&f.noUsage, "no-usage", "reservation", "")
	fs.IntVar(&f.buckets, "buckets", sim.DefaultBuckets, "")
	fs.StringVar(&f.out, "out", "", "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(fl *flag.Flag) { f.set[fl.Name] = true })
	if err := f.check(); err != nil {
		return nil, err
	}
	if f.traffic == "" && f.csvFile == "" {
		f.traffic = sim.BoundaryBurst
	}
	return f, nil
}

// check refuses flags that exclude each other, lack what they need or are
// out of range.
func (f *simFlags) check() error {
	switch {
	case f.out == "":
		return errors.New("--out is required")
	case f.traffic != "" && f.csvFile != "":
		return errors.New("--traffic and --csv exclude each other")
	case f.configFile != "" && f.algorithm != "":
		return errors.New("--algorithm and --config exclude each other")
	case f.compare && f.algorithm != "":
		return errors.New("--compare runs every algorithm; drop --algorithm")
	case f.configFile == "" && f.rule != "":
		return errors.New("--rule needs --config")
	case f.configFile != "" && !f.compare && (f.set["limit"] || f.set["window"] || f.set["burst"]):
		return errors.New("--limit/--window/--burst apply with --compare or without --config")
	case f.configFile == "" && (!f.set["limit"] || !f.set["window"]):
		return errors.New("give --config FILE, or --limit and --window")
	case f.configFile == "" && !f.compare && f.algorithm == "":
		return errors.New("without --config, give --algorithm or --compare")
	}
	switch {
	case f.set["max-held"] && !f.set["delay"]:
		return errors.New("--max-held needs --delay")
	case f.set["delay"] && (f.configFile != "" || f.compare):
		return errors.New("--delay shapes a rule given with --algorithm; a --config rule has its own delay")
	case f.set["delay"] && (f.delay <= 0 || f.delay > config.MaxDelay):
		return fmt.Errorf("--delay %s: want more than 0, at most %s", fmtWindow(f.delay), fmtWindow(config.MaxDelay))
	case f.maxHeld < 1 || f.maxHeld > config.MaxMaxHeld:
		return fmt.Errorf("--max-held %d: want 1..%d", f.maxHeld, config.MaxMaxHeld)
	}
	switch {
	case f.set["no-usage"] && !f.settle:
		return errors.New("--no-usage needs --settle")
	case f.noUsage != "reservation" && f.noUsage != "refund":
		return fmt.Errorf("--no-usage %q: want reservation or refund", f.noUsage)
	case f.settle && (f.configFile != "" || f.compare):
		return errors.New("--settle settles a rule given with --algorithm; a --config rule settles when it has cost.response")
	case f.settle && f.set["delay"]:
		return errors.New("--settle and --delay exclude each other: a settlement would move the slots of the requests held behind it")
	case f.settle && f.set["max-keys"]:
		return errors.New("--settle keeps every key's state: the key table (--max-keys) has no settlement path in the simulator")
	case f.settle && (f.set["lease"] || f.set["proxies"]):
		return errors.New("--settle does not apply with --lease")
	}
	if f.set["max-keys"] && (f.maxKeys < 1 || f.maxKeys > 1_000_000) {
		return fmt.Errorf("--max-keys %d: want 1..1000000", f.maxKeys)
	}
	if f.traffic != sim.Flood {
		for _, name := range floodFlags {
			if f.set[name] {
				return fmt.Errorf("--%s applies to --traffic flood", name)
			}
		}
	}
	if f.csvFile != "" {
		for _, name := range []string{"duration", "rate", "burst-size", "spread", "idle", "keys", "seed", "cost"} {
			if f.set[name] {
				return fmt.Errorf("--%s applies to --traffic patterns, not to --csv", name)
			}
		}
	}
	return nil
}

// floodFlags are the flood pattern's flags, in simFlags.flood order.
var floodFlags = [6]string{"attackers", "attacker-requests", "innocents", "innocent-requests", "heavy", "heavy-requests"}

// target is one rule to simulate.
type target struct {
	name    string
	lim     algorithms.Limiter
	maxKeys int   // the rule's max_keys (--config), else 0
	lease   int64 // the rule's lease (--config), else 0
	delay   config.Delay
	// A token budget: settle (cost.response, or --settle), no_usage
	// "refund", a fixed cost.request (0: the traffic's cost).
	settle, refund bool
	reserve        int64
}

// tableSize is the key table a run of t uses: --max-keys, else for a flood
// the rule's max_keys (1000 without --config); 0: no table.
func (f *simFlags) tableSize(t target) int {
	switch {
	case f.set["max-keys"]:
		return f.maxKeys
	case f.traffic != sim.Flood:
		return 0
	case t.maxKeys > 0:
		return t.maxKeys
	}
	return 1000
}

// targets builds the limiters the flags ask for.
func (f *simFlags) targets() ([]target, error) {
	var base *config.Rule
	var rules []*config.Rule
	if f.configFile != "" {
		data, err := os.ReadFile(f.configFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read configuration: %w", err)
		}
		c, err := config.Parse(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.configFile, err)
		}
		for _, r := range c.Rules {
			if f.rule == "" || r.Name == f.rule {
				rules = append(rules, r)
			}
		}
		if len(rules) == 0 {
			return nil, fmt.Errorf("%s: no rule named %q", f.configFile, f.rule)
		}
		base = rules[0]
	}
	if !f.compare && base != nil {
		out := make([]target, len(rules))
		for i, r := range rules {
			out[i] = target{name: r.Name, lim: r.Limiter, maxKeys: r.MaxKeys, lease: r.Lease, delay: r.Delay}
			if c := r.Cost; c != nil {
				out[i].reserve = c.Request.Fixed
				out[i].settle = c.Response != nil
				out[i].refund = c.NoUsage == config.NoUsageRefund
			}
		}
		return out, nil
	}

	// --compare, or one rule from the command line.
	if base != nil && base.Concurrency != nil {
		return nil, fmt.Errorf("%s: rule %s is an in-flight limit (concurrency): --compare compares the rate algorithms, which need a window", f.configFile, base.Name)
	}
	p := algorithms.Params{Limit: f.limit, Window: f.window, Burst: f.burst}
	if base != nil {
		p = algorithms.Params{Limit: base.Limit, Window: base.Window}
		if base.Algorithm == algorithms.TokenBucket || base.Algorithm == algorithms.LeakyBucket {
			p.Burst = base.Burst
		}
		if f.set["limit"] {
			p.Limit = f.limit
		}
		if f.set["window"] {
			p.Window = f.window
		}
		if f.set["burst"] {
			p.Burst = f.burst
		}
	}
	kinds := algorithms.Kinds[:]
	if !f.compare {
		k, ok := algorithms.ParseKind(f.algorithm)
		if !ok {
			return nil, fmt.Errorf("unknown algorithm %q (want one of %s)", f.algorithm, kindNames())
		}
		kinds = []algorithms.Kind{k}
	}
	var out []target
	for _, k := range kinds {
		kp := p
		if k != algorithms.TokenBucket && k != algorithms.LeakyBucket {
			kp.Burst = 0 // the window algorithms have no burst
		}
		lim, err := algorithms.New(k, kp)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k, err)
		}
		mk := 0
		if base != nil {
			mk = base.MaxKeys
		}
		t := target{name: k.String(), lim: lim, maxKeys: mk}
		if f.set["delay"] {
			if ok, why := algorithms.Shapes(k); !ok {
				return nil, fmt.Errorf("--delay applies to token_bucket and leaky_bucket: %s", why)
			}
			t.delay = config.Delay{Max: f.delay, MaxHeld: f.maxHeld}
		}
		if f.settle {
			if ok, why := algorithms.SettlesWith(k, kp); !ok {
				return nil, fmt.Errorf("--settle applies to token_bucket and leaky_bucket: %s", why)
			}
			t.settle, t.refund = true, f.noUsage == "refund"
		}
		out = append(out, t)
	}
	return out, nil
}

func kindNames() string {
	var s []string
	for _, k := range algorithms.Kinds {
		s = append(s, k.String())
	}
	return strings.Join(s, ", ")
}

// traffic builds the traffic the flags ask for; p0 gives the defaults.
func (f *simFlags) trafficFor(p0 algorithms.Params) (*sim.Traffic, error) {
	if f.csvFile != "" {
		fh, err := os.Open(f.csvFile)
		if err != nil {
			return nil, fmt.Errorf("cannot read traffic: %w", err)
		}
		defer fh.Close()
		return sim.ReadCSV(fh, f.csvFile)
	}
	pat := sim.DefaultPattern(f.traffic, p0.Limit, p0.Window)
	if f.set["duration"] {
		pat.Duration = f.duration
	}
	if f.set["rate"] {
		pat.Rate = f.rate
	}
	if f.set["burst-size"] {
		pat.Burst = f.burstSize
	}
	if f.set["spread"] {
		pat.Spread = f.spread
	}
	if f.set["idle"] {
		pat.Idle = f.idle
	}
	pat.Keys, pat.Seed, pat.Cost = f.keys, f.seed, f.cost
	for i, v := range []*int{&pat.Attackers, &pat.AttackerRequests, &pat.Innocents, &pat.InnocentRequests, &pat.Heavy, &pat.HeavyRequests} {
		if f.set[floodFlags[i]] {
			*v = f.flood[i]
		}
	}
	return sim.Generate(pat)
}

// runSimulate implements `sluice simulate`.
func runSimulate(args []string, stdout, stderr io.Writer) int {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fmt.Fprint(stdout, simulateUsage)
			return 0
		}
	}
	f, err := parseSimFlags(args, stderr)
	if err != nil {
		return usageError(stderr, "simulate", err)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice simulate: %v\n", err)
		return 1
	}
	targets, err := f.targets()
	if err != nil {
		return fail(err)
	}
	tr, err := f.trafficFor(targets[0].lim.Params())
	if err != nil {
		return fail(err)
	}

	if f.lease > 0 || (f.set["lease"] || f.set["proxies"]) {
		return runLeaseSim(f, targets, tr, args, stdout, stderr)
	}
	start := time.Now()
	rep := &sim.Report{Command: "sluice simulate " + quoteArgs(args), Traffic: tr}
	for _, t := range targets {
		run := sim.Run
		if t.lim.Kind() == algorithms.Concurrency {
			run = runConcurrency // an in-flight limit: the requests' durations decide
		}
		res, err := run(tr, t.name, t.lim, sim.Options{Buckets: f.buckets, MaxKeys: f.tableSize(t),
			Delay: t.delay.Max, MaxHeld: t.delay.MaxHeld, Settle: t.settle, NoUsageRefund: t.refund, Reserve: t.reserve})
		if err != nil {
			return fail(fmt.Errorf("%s: %w", t.name, err))
		}
		rep.Results = append(rep.Results, res)
	}
	elapsed := time.Since(start)

	var page bytes.Buffer
	if err := sim.WriteReport(&page, rep); err != nil {
		return fail(err)
	}
	sw, err := writeSimPage(f.out, page.Bytes(), stdout, stderr)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(sw, "traffic: %s\n", tr.Description)
	fmt.Fprintf(sw, "%d requests from %d key(s) over %s\n\n", len(tr.Requests), len(tr.Keys), fmtWindow(time.Duration(tr.End-tr.Start)))
	tw := tabwriter.NewWriter(sw, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\talgorithm\tlimit/window\tadmitted\tdenied\tmax in any window\tguaranteed at most\tstate bytes/key")
	for _, r := range rep.Results {
		bound, _ := sim.WindowBound(r.Kind, r.Params)
		mark := ""
		switch {
		case r.MaxInWindow > bound && r.Budget != nil && r.Budget.Settles && r.Budget.Violations == 0:
			// Reservations: refunds gave capacity back (see the budget's guarantee).
			mark = " (refunds)"
		case r.MaxInWindow > bound:
			mark = " (over!)"
		}
		limit := strconv.FormatInt(r.Params.Limit, 10) + "/" + fmtWindow(r.Params.Window)
		if r.InFlight != nil {
			limit = strconv.FormatInt(r.Params.Limit, 10) + " in flight"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d%s\t%d\t%d\n", r.Name, r.Kind, limit,
			r.Admitted, r.Denied, r.MaxInWindow, mark, bound, r.StateBytesMax)
	}
	tw.Flush()
	printShaping(sw, rep.Results)
	printInFlight(sw, rep.Results) // simulate_concurrency.go
	printBudget(sw, rep.Results)
	printTable(sw, rep.Results)
	decisions := 0
	for _, r := range rep.Results {
		decisions += len(tr.Requests)
		if r.Shaping != nil {
			decisions += len(tr.Requests) // and its meter
		}
		if r.Budget != nil && r.Budget.Unsettled != nil {
			decisions += len(tr.Requests) // and its twin never settled
		}
	}
	fmt.Fprintf(sw, "\nsimulated %d decisions in %s", decisions, elapsed.Round(time.Microsecond))
	if f.out != "-" {
		fmt.Fprintf(sw, "; report written to %s", f.out)
	}
	fmt.Fprintln(sw)
	return 0
}

// printShaping prints, for each rule with a delay, what reached the
// upstream with shaping and without (the same rule as a meter).
func printShaping(w io.Writer, results []*sim.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, r := range results {
		s := r.Shaping
		if s == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w)
			fmt.Fprintln(tw, "rule\tupstream\tadmitted\tat once\theld\trefused\tdelay p50\tp99\tmax\tmax arrivals in any window\tmost held")
			header = true
		}
		d := func(d time.Duration) string { return fmtWindow(d.Round(time.Microsecond)) }
		fmt.Fprintf(tw, "%s\twith shaping (delay<=%s)\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t%d\n", r.Name, fmtWindow(s.Max),
			r.Admitted, s.AtOnce, s.Held, r.Denied, d(s.DelayP50), d(s.DelayP99), d(s.DelayMax), r.MaxArrivals, s.MostHeld)
		fmt.Fprintf(tw, "%s\twithout (meter)\t%d\t%d\t-\t%d\t-\t-\t-\t%d\t-\n", r.Name,
			s.Meter.Admitted, s.Meter.Admitted, s.Meter.Denied, s.Meter.MaxArrivals)
	}
	tw.Flush()
}

// printBudget prints, for each token budget, what it admitted and charged
// with settlement and without (the same reservations never settled), and
// the guarantee's check.
func printBudget(w io.Writer, results []*sim.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var notes []string
	header := false
	for _, r := range results {
		b := r.Budget
		if b == nil || b.Unsettled == nil {
			continue
		}
		if !header {
			fmt.Fprintln(w)
			fmt.Fprintln(tw, "rule	budget	admitted	refused	reserved	actual	refunded	excess	max debt	max actual in any window")
			header = true
		}
		u := b.Unsettled
		fmt.Fprintf(tw, "%s	with settlement	%d	%d	%d	%d	%d	%d	%d	%d\n", r.Name, r.Admitted, r.Denied, b.Reserved, b.Actual,
			b.Refunded, b.Excess, b.MaxDebt, b.MaxActualInWindow)
		fmt.Fprintf(tw, "%s	without (estimates)	%d	%d	%d	%d	-	-	-	%d\n", r.Name, u.Admitted, u.Denied, u.Budget.Reserved, u.Budget.Actual,
			u.Budget.MaxActualInWindow)
		verdict := "holds"
		if b.Violations > 0 {
			verdict = fmt.Sprintf("FAILS in %d (first: key %q at +%s)", b.Violations, b.ViolationKey, fmtWindow(time.Duration(b.ViolationAt-r.Start)))
		}
		note := fmt.Sprintf("%s: actual <= limit + burst (%d) + in-flight excess + late refunds %s in all %d windows (%d beyond %d); %d settled, %d without usage (%s)",
			r.Name, b.Bound, verdict, b.Windows, b.Beyond, b.Bound, b.Settled, b.NoUsage, map[bool]string{false: "reservation", true: "refund"}[b.NoUsageRefund])
		if b.Failed > 0 {
			note += fmt.Sprintf("; %d refused (debt too long)", b.Failed)
		}
		notes = append(notes, note)
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}

// printTable prints, for runs through the key table, what the flood's
// classes got and what the table held.
func printTable(w io.Writer, results []*sim.Result) {
	if results[0].MaxKeys == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\tmax_keys\tinnocent denied\theavy max admitted/limit\tentries\tbytes\tevicted\tevicted used")
	for _, r := range results {
		inn, heavy := "-", "-"
		for _, c := range r.Classes {
			switch c.Name {
			case "innocent":
				inn = fmt.Sprintf("%d/%d (%.1f%%)", c.Denied, c.Offered, 100*float64(c.Denied)/float64(max(c.Offered, 1)))
			case "heavy":
				heavy = fmt.Sprintf("%d/%d", c.MaxPerKey, r.Limit)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\n", r.Name, r.MaxKeys, inn, heavy, r.Entries, r.EntryBytes, r.Evicted, r.EvictedUsed)
	}
	tw.Flush()
}

// fmtWindow prints a window without Go's zero units ("1m", not "1m0s").
func fmtWindow(d time.Duration) string {
	return svgchart.FormatDuration(d.Seconds())
}

// quoteArgs joins args for display, quoting those a shell would split.
func quoteArgs(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`|&;<>()*?[]#~") {
			a = strconv.Quote(a)
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}

// writeSimPage writes the HTML page to out (a file, or "-": standard
// output) and returns where the text summary goes: stdout, or stderr when
// the page took standard output.
func writeSimPage(out string, page []byte, stdout, stderr io.Writer) (io.Writer, error) {
	var err error
	if out == "-" {
		_, err = stdout.Write(page)
	} else {
		err = os.WriteFile(out, page, 0o644)
	}
	if err != nil {
		return nil, fmt.Errorf("writing the report: %w", err)
	}
	if out == "-" {
		return stderr, nil
	}
	return stdout, nil
}

// runLeaseSim models leases over --proxies proxies for the first target
// (--lease, or the rule's lease with --config).
func runLeaseSim(f *simFlags, targets []target, tr *sim.Traffic, args []string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice simulate: %v\n", err)
		return 1
	}
	t := targets[0]
	lease := f.lease
	if lease <= 0 {
		lease = t.lease
	}
	if f.compare {
		return fail(errors.New("--lease models one rule: give --rule (or --algorithm), not --compare"))
	}
	if lease <= 0 {
		return fail(errors.New("--proxies needs --lease N (or a rule with lease)"))
	}
	res, err := sim.RunLeases(tr, t.lim.Kind(), t.lim.Params(), sim.LeaseOptions{Proxies: f.proxies, Lease: lease, Buckets: f.buckets})
	if err != nil {
		return fail(err)
	}
	var page bytes.Buffer
	if err := sim.WriteLeaseReport(&page, "sluice simulate "+quoteArgs(args), tr, res); err != nil {
		return fail(err)
	}
	sw, err := writeSimPage(f.out, page.Bytes(), stdout, stderr)
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(sw, "traffic: %s\n", tr.Description)
	fmt.Fprintf(sw, "%s %d/%s over %d proxies, lease %d\n\n", res.Kind, res.Params.Limit, fmtWindow(res.Params.Window), res.Proxies, res.Lease)
	tw := tabwriter.NewWriter(sw, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\toffered\tadmitted\tmax in any window\tremote calls\tcalls/request\tmost held in pools")
	fmt.Fprintf(tw, "without leases\t%d\t%d\t%d\t%d\t1.000\t-\n", res.Offered, res.Exact, res.ExactMaxInWindow, res.Offered)
	calls := res.Acquires + res.Returns
	fmt.Fprintf(tw, "with leases\t%d\t%d\t%d\t%d\t%.3f\t%d (bound %d)\n", res.Offered, res.Admitted, res.MaxInWindow, calls,
		float64(calls)/float64(max(res.Offered, 1)), res.MaxHeld, int64(res.Proxies)*res.Lease)
	tw.Flush()
	if f.out != "-" {
		fmt.Fprintf(sw, "\nreport written to %s\n", f.out)
	}
	return 0
}
