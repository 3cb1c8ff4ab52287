// Package dashboard is the live dashboard of `sluice run --admin`: per-rule allowed, denied
// and shadow-denied rates over the last minutes, the active configuration, and the host's
// health (workers, VM restarts, memory per worker, uptime).
//
// It reads the host's state as Go values, in process: once per Interval a Dashboard takes a
// host.Snapshot from its Source (in `sluice run`, the *host.Host itself) — the same
// snapshot the admin server's /metrics and /status render — and keeps the counters it
// needs in a ring buffer covering History. The rules come from plugin 0's configuration
// in force, parsed by package config; a rule's counters are the metrics the filter defines
// for it, found by their guest names ("sluice.RULE.allowed", ".denied", ".shadow_denied",
// ".store_errors"; for a rule with "delay" also ".delayed", ".delay_refused",
// ".delay_abandoned", the gauge ".held" and the histogram ".delay_ms", of which the count
// and sum are kept; for a rule with "cost" ".reserved", ".settled", ".refunded", ".excess"
// and ".no_usage"). The host knows nothing of rules: it only keeps its metrics. When the
// snapshot says the host is closed, Run stops.
//
// Rates are computed here, in Go: the increase of a counter between consecutive samples
// (a decrease is taken as a counter reset) divided by the time between them. The browser
// polls api/state once a second and gets numbers and charts ready to show; the charts are
// plain SVG rendered by package svgchart. The page, its script and its style sheet are
// embedded (go:embed) and fetch nothing else, so the dashboard works offline.
//
// Time is an argument: Scrape(now) and State(now); only Run and the HTTP handler read the
// clock. A Dashboard is safe for concurrent use.
package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/svgchart"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/host"
)

// Source gives the host's state; *host.Host is one.
type Source interface {
	Snapshot() host.Snapshot
}

// ErrHostClosed is returned by Scrape when the snapshot says the host is closed; Run stops
// on it.
var ErrHostClosed = errors.New("the host is closed")

// Options tune a Dashboard; zero fields take the defaults.
type Options struct {
	// Interval between scrapes (default 1s).
	Interval time.Duration
	// History kept in the ring buffer (default 10m); the ring holds History/Interval samples.
	History time.Duration
	// RateWindow is the span the "current" rates average over (default 10s).
	RateWindow time.Duration
	// ChartSpan is the span the charts show (default 5m).
	ChartSpan time.Duration
	// MaxSeries bounds the guest metrics kept per sample (default 2000); of more, the
	// first ones by name are kept, and State reports the truncation.
	MaxSeries int
}

func (o Options) withDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.History <= 0 {
		o.History = 10 * time.Minute
	}
	if o.RateWindow <= 0 {
		o.RateWindow = 10 * time.Second
	}
	if o.ChartSpan <= 0 {
		o.ChartSpan = 5 * time.Minute
	}
	if o.ChartSpan > o.History {
		o.ChartSpan = o.History
	}
	if o.MaxSeries <= 0 {
		o.MaxSeries = 2000
	}
	return o
}

// Decisions are the per-rule counters the dashboard reads, in display order; the metric of
// decision D for rule R is the guest metric filter.RuleMetric(R, D).
var Decisions = []string{"allowed", "denied", "shadow_denied", "store_errors"}

// chartDecisions are drawn, with their colours.
var chartDecisions = []struct{ name, color string }{
	{"allowed", "#54a24b"},
	{"denied", "#e45756"},
	{"shadow_denied", "#f58518"},
}

// The metrics of a rule with "delay", filter.DelayMetrics: DelayCounters (delayed,
// delay_refused, delay_abandoned) are read as rates and totals, like Decisions; the gauge
// heldMetric is the requests held now (summed over workers); the histogram delayHistogram
// the time each was held, in ms.
var (
	DelayCounters  = filter.DelayMetrics[:3]
	heldMetric     = filter.DelayMetrics[3]
	delayHistogram = filter.DelayMetrics[4]
)

// delayDecisions are drawn, for a rule with delay, on its chart with the decisions:
// held requests are among the allowed, delay-refused among the denied.
var delayDecisions = []struct{ name, color, dash string }{
	{"delayed", "#2f7ed8", "5 4"},
	{"delay_refused", "#9467bd", "2 3"},
}

// The metrics of a rule with "cost", filter.CostMetrics, read as rates and totals: cost
// units reserved, refunded and excess (charged beyond the reservations), and requests
// settled and settled by no_usage.
var CostCounters = filter.CostMetrics[:]

// costUnits are drawn, for a rule with cost, on its cost chart: units per second.
var costUnits = []struct{ name, color, dash string }{
	{"reserved", "#2f7ed8", ""},
	{"refunded", "#54a24b", "5 4"},
	{"excess", "#e45756", "2 3"},
}

// Series keys of a sample: guest metrics by name, and the host's own values.
const (
	guestKey    = "guest:"
	requestsKey = "host:requests"
	memoryKey   = "host:memory:" // + worker id
	// A histogram's observations and their sum: guestKey + name + one of these.
	histCount = "#count"
	histSum   = "#sum"
)

// point is one sample.
type point struct {
	t      time.Time
	values map[string]float64 // series key -> value
}

// parsedConfig is a configuration and what the dashboard made of it.
type parsedConfig struct {
	raw    []byte
	pretty Config
	rules  []Rule // nil: not a sluice configuration (pretty.Error says why)
}

// Dashboard collects samples and serves the page. Make one with New.
type Dashboard struct {
	src  Source
	opts Options

	mu        sync.Mutex
	ring      *Ring[point]
	snap      host.Snapshot // the last one
	haveSnap  bool
	lastErr   error
	truncated int
	config    parsedConfig
}

// New returns a Dashboard reading src. Nothing is sampled until Scrape or Run.
func New(src Source, opts Options) *Dashboard {
	opts = opts.withDefaults()
	n := int(opts.History/opts.Interval) + 1
	return &Dashboard{src: src, opts: opts, ring: NewRing[point](n)}
}

// Options returns the options in effect (defaults filled in).
func (d *Dashboard) Options() Options { return d.opts }

// Scrape takes a snapshot from the source and records it as taken at now. It returns
// ErrHostClosed when the host is closed (the snapshot is still recorded: it holds the
// final counts).
func (d *Dashboard) Scrape(now time.Time) error {
	snap := d.src.Snapshot()
	p := point{t: now, values: make(map[string]float64, len(snap.Metrics)+len(snap.Stats.Workers)+1)}
	truncated := 0
	kept := 0
	for _, m := range snap.Metrics {
		// Of the histograms, only a rule's delay_ms (its count and sum: the mean delay).
		hist := m.Type == host.MetricHistogram
		if hist && !strings.HasSuffix(m.Name, "."+delayHistogram) {
			continue
		}
		if kept >= d.opts.MaxSeries {
			truncated++
			continue
		}
		kept++
		if hist {
			p.values[guestKey+m.Name+histCount] = float64(m.Value)
			p.values[guestKey+m.Name+histSum] = float64(m.Sum)
			continue
		}
		p.values[guestKey+m.Name] = float64(m.Value)
	}
	p.values[requestsKey] = float64(snap.Stats.Requests)
	for _, w := range snap.Stats.Workers {
		p.values[memoryKey+strconv.Itoa(w.ID)] = float64(w.MemoryBytes)
	}
	var raw []byte
	if len(snap.Plugins) > 0 {
		raw = snap.Plugins[0].Config()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.config.raw == nil || !bytes.Equal(d.config.raw, raw) {
		d.config = parseConfig(raw)
	}
	d.snap, d.haveSnap, d.truncated = snap, true, truncated
	// A sample not after the newest one (the clock went backwards, or two scrapes raced)
	// is dropped: the series stays in time order, so every rate has a positive interval.
	if last, ok := d.ring.Last(); !ok || now.After(last.t) {
		d.ring.Push(p)
	}
	d.lastErr = nil
	if snap.Closed {
		d.lastErr = ErrHostClosed
	}
	return d.lastErr
}

// Run samples every Interval until ctx ends or the host is closed.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(d.opts.Interval)
	defer t.Stop()
	for {
		if err := d.Scrape(time.Now()); errors.Is(err, ErrHostClosed) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// State is the document served at api/state: everything the page shows.
type State struct {
	Time              time.Time `json:"time"`
	Live              bool      `json:"live"` // the last sample is recent and the host is open
	Error             string    `json:"error,omitempty"`
	IntervalSeconds   float64   `json:"interval_seconds"`
	RateWindowSeconds float64   `json:"rate_window_seconds"`
	ChartSpanSeconds  float64   `json:"chart_span_seconds"` // the charts' X span
	Samples           int       `json:"samples"`
	// Problems are what the page lists besides Error: metrics not kept, workers that
	// disagree on the configuration.
	Problems     []string `json:"problems,omitempty"`
	Host         *Health  `json:"host"`
	Config       Config   `json:"config"`
	Rules        []Rule   `json:"rules"`
	FilterErrors *float64 `json:"filter_errors"`
	MemoryChart  string   `json:"memory_chart,omitempty"`
}

// Health is the host's health, from the snapshot.
type Health struct {
	ABIVersion       string    `json:"abi_version"`
	VMID             string    `json:"vm_id"`
	PluginName       string    `json:"plugin_name"`
	FailOpen         bool      `json:"fail_open"`
	Closed           bool      `json:"closed"`
	UptimeSeconds    float64   `json:"uptime_seconds"`
	StartedAt        time.Time `json:"started_at"`
	Requests         uint64    `json:"requests"`
	RequestRate      *float64  `json:"request_rate"`
	VMRestarts       uint64    `json:"vm_restarts"`
	FailedRequests   uint64    `json:"failed_requests"`
	MemoryLimitBytes uint64    `json:"memory_limit_bytes"`
	SharedDataKeys   int       `json:"shared_data_keys"`
	SharedDataBytes  int       `json:"shared_data_bytes"`
	Workers          []Worker  `json:"workers"`
}

// Worker is one worker's line of Health.
type Worker struct {
	ID             int    `json:"id"`
	Healthy        bool   `json:"healthy"`
	MemoryBytes    uint64 `json:"memory_bytes"`
	VMRestarts     uint64 `json:"vm_restarts"`
	Requests       uint64 `json:"requests"`
	FailedRequests uint64 `json:"failed_requests"`
}

// Config is the active plugin configuration.
type Config struct {
	Pretty string `json:"pretty"`          // indented JSON, or the raw text if it is not JSON
	Error  string `json:"error,omitempty"` // why it is not a sluice configuration
}

// Rule is one rule with its counters. A rule found only by its metrics (the configuration
// is not one package config reads) has no mode, algorithm or limit.
type Rule struct {
	Name      string `json:"name"`
	Mode      string `json:"mode,omitempty"`
	Algorithm string `json:"algorithm,omitempty"`
	Limit     *int64 `json:"limit,omitempty"`
	Window    string `json:"window,omitempty"`
	Burst     *int64 `json:"burst,omitempty"` // token_bucket and leaky_bucket only
	// Summary is config's one-line description of the rule (Rule.Summary).
	Summary string `json:"summary,omitempty"`
	// Metrics maps a decision to the Prometheus name /metrics gives its counter ("" while
	// the filter has not defined it).
	Metrics map[string]string `json:"metrics"`
	// Totals are the counters' current values (null: not defined yet).
	Totals map[string]*float64 `json:"totals"`
	// Rates are per second over the last RateWindow (null: fewer than two samples).
	Rates map[string]*float64 `json:"rates"`
	// Chart is an <svg> of the allowed/denied/shadow-denied rates between consecutive
	// samples, over the history so far (at least 1m, at most ChartSpan); for a rule with
	// delay also the delayed and delay-refused rates.
	Chart string `json:"chart"`

	// A rule with "delay" (from the configuration, or when its held gauge exists) also
	// has DelayCounters and heldMetric in Metrics, DelayCounters in Totals and Rates, and:
	// Delay, its delay.max ("" without delay or when the configuration is not read), and
	// MaxHeld, its delay.max_held (per worker).
	Delay   string `json:"delay,omitempty"`
	MaxHeld *int   `json:"max_held,omitempty"`
	// Held is the requests the rule holds now, summed over workers (null: no delay, or
	// the gauge is not defined yet).
	Held *float64 `json:"held,omitempty"`
	// MeanDelayMS is the mean time held, in milliseconds, of the requests released over
	// the last RateWindow (null: none released, or fewer than two samples).
	MeanDelayMS *float64 `json:"mean_delay_ms,omitempty"`
	// HeldChart is an <svg> of the held gauge over the same span as Chart ("" without
	// delay).
	HeldChart string `json:"held_chart,omitempty"`

	// A rule with "cost" (from the configuration, or when its reserved counter exists)
	// also has CostCounters in Metrics, Totals and Rates, and: Cost, config's description
	// of its cost ("cost=header:x-max-tokens|1000 settle=usage:openai(total)
	// no_usage=reservation"; "" when the configuration is not read), and CostChart, an
	// <svg> of its reserved, refunded and excess cost units per second over the same span
	// as Chart ("" without cost).
	Cost      string `json:"cost,omitempty"`
	CostChart string `json:"cost_chart,omitempty"`

	// TopKeys are the rule's top-keys summaries (the configuration's "top_keys"; none
	// without it, or before anything was counted): denied then consumed, each the current
	// period then the last one (topkeys.go).
	TopKeys []TopKeys `json:"top_keys,omitempty"`
	// A concurrency rule (from the configuration, or when its in_flight gauge exists) also
	// has ConcurrencyCounters and inFlightMetric in Metrics, ConcurrencyCounters in Totals
	// and Rates, and: InFlight, the requests in flight now, summed over workers (null: the
	// gauge is not defined yet), and InFlightChart, an <svg> of the gauge over the same
	// span as Chart, up to the limit.
	InFlight      *float64 `json:"in_flight,omitempty"`
	InFlightChart string   `json:"in_flight_chart,omitempty"`
}

// parseConfig reads a plugin configuration: indented for display, and its rules as
// package config parses them (the same validation as the filter and `sluice check`).
func parseConfig(raw []byte) parsedConfig {
	pc := parsedConfig{raw: raw}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, raw, "", "  "); err != nil {
		pc.pretty = Config{Pretty: string(raw), Error: "not JSON: " + err.Error()}
		return pc
	}
	pc.pretty.Pretty = pretty.String()
	cfg, err := config.Parse(raw)
	if err != nil {
		pc.pretty.Error = "not a sluice configuration: " + err.Error()
		return pc
	}
	pc.rules = []Rule{}
	for _, r := range cfg.Rules {
		limit := r.Limit
		rule := Rule{Name: r.Name, Mode: r.Mode.String(), Algorithm: r.Algorithm.String(), Limit: &limit,
			Window: config.FormatDuration(r.Window), Summary: r.Summary()}
		if r.Algorithm == algorithms.TokenBucket || r.Algorithm == algorithms.LeakyBucket {
			burst := r.Burst
			rule.Burst = &burst
		}
		if r.Delay.Max > 0 {
			held := r.Delay.MaxHeld
			rule.Delay, rule.MaxHeld = config.FormatDuration(r.Delay.Max), &held
		}
		if r.Cost != nil {
			rule.Cost = r.Cost.String()
		}
		if r.Concurrency != nil {
			rule.Window = "" // in flight: no window
		}
		pc.rules = append(pc.rules, rule)
	}
	return pc
}

// discoverRules finds rules from the guest's metric names alone (when the configuration
// is not a sluice one): sluice.NAME.DECISION.
func discoverRules(metrics []host.Metric) []Rule {
	seen := map[string]bool{}
	var out []Rule
	for _, m := range metrics {
		rest, ok := strings.CutPrefix(m.Name, "sluice.")
		if !ok {
			continue
		}
		// Longest suffix first: "shadow_denied" before "denied".
		for _, dec := range []string{"shadow_denied", "store_errors", "allowed", "denied"} {
			if name, ok := strings.CutSuffix(rest, "."+dec); ok && name != "" {
				if !seen[name] {
					seen[name] = true
					out = append(out, Rule{Name: name})
				}
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func optional(v float64, ok bool) *float64 {
	if !ok {
		return nil
	}
	return &v
}

// increase is how much a counter grew from a to b; a decrease means the counter was reset,
// so everything it shows now is new.
func increase(a, b float64) float64 {
	if b < a {
		return b
	}
	return b - a
}

// rate returns the per-second rate of series key over the samples in (from, last], using
// the last sample at or before from as the starting point when there is one.
func (d *Dashboard) rate(key string, window time.Duration) (float64, bool) {
	sum, dt, ok := d.growth(key, window)
	if !ok {
		return 0, false
	}
	return sum / dt.Seconds(), true
}

// growth is how much counter key increased over the samples of the last window (as
// rate), and over how long; false with fewer than two samples of it.
func (d *Dashboard) growth(key string, window time.Duration) (float64, time.Duration, bool) {
	n := d.ring.Len()
	if n < 2 {
		return 0, 0, false
	}
	last := d.ring.At(n - 1)
	from := last.t.Add(-window)
	first := n - 1
	for first > 0 && d.ring.At(first).t.After(from) {
		first--
	}
	var sum float64
	var t0, t1 time.Time
	prev, havePrev := 0.0, false
	var prevT time.Time
	for i := first; i < n; i++ {
		p := d.ring.At(i)
		v, ok := p.values[key]
		if !ok {
			havePrev = false
			continue
		}
		if havePrev {
			sum += increase(prev, v)
			if t0.IsZero() {
				t0 = prevT
			}
			t1 = p.t
		}
		prev, prevT, havePrev = v, p.t, true
	}
	if t0.IsZero() || !t1.After(t0) {
		return 0, 0, false
	}
	return sum, t1.Sub(t0), true
}

// series returns, for each sample after the first within span of the last one, the rate of
// key since the previous sample (or, asRate false, its value), at x = seconds before the
// last sample (≤ 0). A missing value is a gap (NaN).
func (d *Dashboard) series(key string, span time.Duration, scale float64, asRate bool) []svgchart.Point {
	n := d.ring.Len()
	if n == 0 {
		return nil
	}
	last := d.ring.At(n - 1).t
	var pts []svgchart.Point
	for i := 0; i < n; i++ {
		p := d.ring.At(i)
		age := last.Sub(p.t)
		if age > span {
			continue
		}
		x := -age.Seconds()
		v, ok := p.values[key]
		if !asRate {
			y := math.NaN()
			if ok {
				y = v * scale
			}
			pts = append(pts, svgchart.Point{X: x, Y: y})
			continue
		}
		if i == 0 {
			continue
		}
		q := d.ring.At(i - 1)
		pv, pok := q.values[key]
		y := math.NaN()
		if ok && pok {
			y = increase(pv, v) / p.t.Sub(q.t).Seconds() * scale
		}
		pts = append(pts, svgchart.Point{X: x, Y: y})
	}
	return pts
}

// chartSpan is the X span of the charts: the history collected so far, at least one minute
// and at most ChartSpan, so a dashboard opened on a fresh host is readable at once.
func (d *Dashboard) chartSpan() time.Duration {
	span := time.Minute
	if n := d.ring.Len(); n > 0 {
		if age := d.ring.At(n - 1).t.Sub(d.ring.At(0).t); age > span {
			span = age.Round(time.Minute)
			if span < age {
				span += time.Minute
			}
		}
	}
	return min(span, d.opts.ChartSpan)
}

func xTicks(span time.Duration) []float64 {
	s := span.Seconds()
	step := 60.0
	switch {
	case s <= 60:
		step = 10
	case s <= 180:
		step = 30
	case s > 900:
		step = 300
	}
	var t []float64
	for x := 0.0; x >= -s; x -= step {
		t = append([]float64{x}, t...)
	}
	return t
}

func xFormat(v float64) string {
	if v == 0 {
		return "now"
	}
	return "-" + svgchart.FormatDuration(-v)
}

// chart renders one chart; an error (which svgchart only returns for charts it cannot draw)
// becomes a short message instead of an SVG.
func chart(c svgchart.Chart) string {
	s, err := c.SVG()
	if err != nil {
		return ""
	}
	return s
}

// ChartWidths are the widths, in pixels, the page draws its charts at: each rule's chart
// and the memory chart. The page asks for the widths its layout gives them, so that
// the charts fill the page at their own size (not scaled, text at its size).
type ChartWidths struct {
	Rule, Memory int
}

// DefaultChartWidth is a chart's width when the page names none; MinChartWidth and
// MaxChartWidth bound what it may ask for.
const (
	DefaultChartWidth = 640
	MinChartWidth     = 320
	MaxChartWidth     = 4096
)

func (cw ChartWidths) clamped() ChartWidths {
	c := func(w int) int {
		if w == 0 {
			return DefaultChartWidth
		}
		return min(max(w, MinChartWidth), MaxChartWidth)
	}
	return ChartWidths{Rule: c(cw.Rule), Memory: c(cw.Memory)}
}

// State returns what the page shows at now, with charts DefaultChartWidth wide.
func (d *Dashboard) State(now time.Time) State {
	return d.StateWithCharts(now, ChartWidths{})
}

// StateWithCharts is State with the charts drawn at the given widths (0: the default;
// others are clamped to MinChartWidth..MaxChartWidth).
func (d *Dashboard) StateWithCharts(now time.Time, widths ChartWidths) State {
	widths = widths.clamped()
	d.mu.Lock()
	defer d.mu.Unlock()
	st := State{
		Time:              now.UTC(),
		IntervalSeconds:   d.opts.Interval.Seconds(),
		RateWindowSeconds: d.opts.RateWindow.Seconds(),
		Samples:           d.ring.Len(),
		Rules:             []Rule{},
	}
	last, haveLast := d.ring.Last()
	switch {
	case d.lastErr != nil:
		st.Error = d.lastErr.Error()
	case !haveLast:
		st.Error = "no sample yet"
	case now.Sub(last.t) > 3*d.opts.Interval:
		st.Error = fmt.Sprintf("the last sample is %s old", now.Sub(last.t).Round(time.Millisecond))
	default:
		st.Live = true
	}
	if d.truncated > 0 {
		st.Problems = append(st.Problems, fmt.Sprintf("%d guest metrics beyond the first %d not kept", d.truncated, d.opts.MaxSeries))
	}
	if !d.haveSnap {
		return st
	}
	s := d.snap
	st.Host = health(s)
	st.Host.RequestRate = optional(d.rate(requestsKey, d.opts.RateWindow))
	st.Config = d.config.pretty
	if len(s.Plugins) > 0 && len(s.Plugins[0].Configs) > 1 {
		var parts []string
		for _, c := range s.Plugins[0].Configs {
			parts = append(parts, fmt.Sprint(c.Workers))
		}
		st.Problems = append(st.Problems, fmt.Sprintf("the workers disagree: %d configurations in force (on workers %s); shown: worker %d's",
			len(s.Plugins[0].Configs), strings.Join(parts, ", "), s.Plugins[0].Configs[0].Workers[0]))
	}
	rules := d.config.rules
	if rules == nil {
		rules = discoverRules(s.Metrics)
	}
	families := map[string]string{}
	for _, m := range s.Metrics {
		families[m.Name] = m.Family
	}
	v, ok := last.values[guestKey+filter.ErrorsMetric]
	st.FilterErrors = optional(v, ok)
	span := d.chartSpan()
	st.ChartSpanSeconds = span.Seconds()
	for _, r := range rules {
		rs := d.ruleState(r, last, families, span, widths.Rule)
		rs.TopKeys = topKeysOf(s.TopKeys, r.Name)
		st.Rules = append(st.Rules, rs)
	}
	st.MemoryChart = d.memoryChart(s, span, widths.Memory)
	return st
}

func health(s host.Snapshot) *Health {
	h := &Health{
		ABIVersion: s.Stats.ABIVersion, VMID: s.VMID, PluginName: s.PluginName, FailOpen: s.FailOpen, Closed: s.Closed,
		UptimeSeconds: s.Stats.Uptime.Seconds(), StartedAt: s.StartedAt.UTC(), Requests: s.Stats.Requests,
		VMRestarts: s.Stats.VMRestarts, FailedRequests: s.Stats.Failed, MemoryLimitBytes: s.MemoryLimitBytes,
		SharedDataKeys: s.Stats.SharedData.Keys, SharedDataBytes: s.Stats.SharedData.Bytes, Workers: []Worker{},
	}
	for _, w := range s.Stats.Workers {
		h.Workers = append(h.Workers, Worker{ID: w.ID, Healthy: w.Healthy, MemoryBytes: w.MemoryBytes, VMRestarts: w.VMRestarts, Requests: w.Requests, FailedRequests: w.Failed})
	}
	return h
}

// ruleState fills in a rule's counters, rates and chart.
func (d *Dashboard) ruleState(r Rule, last point, families map[string]string, span time.Duration, width int) Rule {
	r.Metrics = map[string]string{}
	r.Totals = map[string]*float64{}
	r.Rates = map[string]*float64{}
	d.counters(&r, Decisions, last, families)
	c := svgchart.Chart{
		ID: "chart-" + r.Name, Title: r.Name + " — requests per second", Width: width, Height: 220,
		XMin: -span.Seconds(), XMax: 0, XTicks: xTicks(span), XFormat: xFormat,
		YLabel: "req/s",
	}
	for _, cd := range chartDecisions {
		c.Series = append(c.Series, svgchart.Series{
			Name: strings.ReplaceAll(cd.name, "_", "-"), Class: cd.name, Color: cd.color,
			Points: d.series(guestKey+filter.RuleMetric(r.Name, cd.name), span, 1, true),
		})
	}
	if r.Delay != "" || families[filter.RuleMetric(r.Name, heldMetric)] != "" {
		for _, cd := range delayDecisions {
			c.Series = append(c.Series, svgchart.Series{
				Name: strings.ReplaceAll(cd.name, "_", "-"), Class: cd.name, Color: cd.color, Dash: cd.dash,
				Points: d.series(guestKey+filter.RuleMetric(r.Name, cd.name), span, 1, true),
			})
		}
		d.delayState(&r, last, families, span, width)
	}
	if r.Cost != "" || families[filter.RuleMetric(r.Name, CostCounters[0])] != "" {
		d.costState(&r, last, families, span, width)
	}
	if isConcurrency(&r, families) {
		d.concurrencyState(&r, last, families, span, width) // concurrency.go
	}
	r.Chart = chart(c)
	return r
}

// counters fills in the rule's counters names: each one's family, total and rate.
func (d *Dashboard) counters(r *Rule, names []string, last point, families map[string]string) {
	for _, dec := range names {
		name := filter.RuleMetric(r.Name, dec)
		r.Metrics[dec] = families[name]
		v, ok := last.values[guestKey+name]
		r.Totals[dec] = optional(v, ok)
		r.Rates[dec] = optional(d.rate(guestKey+name, d.opts.RateWindow))
	}
}

// costState fills in a rule with cost's counters and cost chart.
func (d *Dashboard) costState(r *Rule, last point, families map[string]string, span time.Duration, width int) {
	d.counters(r, CostCounters, last, families)
	c := svgchart.Chart{
		ID: "cost-chart-" + r.Name, Title: r.Name + " — cost units per second", Width: width, Height: 180,
		XMin: -span.Seconds(), XMax: 0, XTicks: xTicks(span), XFormat: xFormat,
		YLabel: "units/s",
	}
	for _, cu := range costUnits {
		c.Series = append(c.Series, svgchart.Series{
			Name: cu.name, Class: cu.name, Color: cu.color, Dash: cu.dash,
			Points: d.series(guestKey+filter.RuleMetric(r.Name, cu.name), span, 1, true),
		})
	}
	r.CostChart = chart(c)
}

// delayState fills in a rule with delay's counters, held gauge, mean delay and held
// chart.
func (d *Dashboard) delayState(r *Rule, last point, families map[string]string, span time.Duration, width int) {
	d.counters(r, DelayCounters, last, families)
	held := filter.RuleMetric(r.Name, heldMetric)
	r.Metrics[heldMetric] = families[held]
	v, ok := last.values[guestKey+held]
	r.Held = optional(v, ok)
	hist := guestKey + filter.RuleMetric(r.Name, delayHistogram)
	if n, _, ok := d.growth(hist+histCount, d.opts.RateWindow); ok && n > 0 {
		if sum, _, ok := d.growth(hist+histSum, d.opts.RateWindow); ok {
			r.MeanDelayMS = optional(sum/n, true)
		}
	}
	c := svgchart.Chart{
		ID: "held-chart-" + r.Name, Title: r.Name + " — requests held", Width: width, Height: 180,
		XMin: -span.Seconds(), XMax: 0, XTicks: xTicks(span), XFormat: xFormat,
		YLabel: "held",
		Series: []svgchart.Series{{
			Name: "held", Class: "held", Color: "#2f7ed8", Kind: svgchart.Step,
			Points: d.series(guestKey+held, span, 1, false),
		}},
	}
	r.HeldChart = chart(c)
}

// WorkerDashes are the dash patterns of the workers' memory lines, in order (then again,
// with the palette's colours): workers usually hold the same memory, so their lines lie on
// top of each other, and only a distinct dash leaves each one visible (the first solid at
// the bottom, the others dashed over it, each its own colour).
var WorkerDashes = []string{"", "7 4", "2 3", "10 3 2 3", "4 4", "1 5"}

// memoryChart draws each worker's linear memory, each worker its own colour and dash.
func (d *Dashboard) memoryChart(s host.Snapshot, span time.Duration, width int) string {
	if len(s.Stats.Workers) == 0 {
		return ""
	}
	c := svgchart.Chart{
		ID: "chart-memory", Title: "linear memory per worker", Width: width, Height: 220,
		XMin: -span.Seconds(), XMax: 0, XTicks: xTicks(span), XFormat: xFormat,
		YLabel: "MiB",
	}
	top := 0.0
	for i, w := range s.Stats.Workers {
		id := strconv.Itoa(w.ID)
		pts := d.series(memoryKey+id, span, 1.0/(1<<20), false)
		for _, p := range pts {
			if !math.IsNaN(p.Y) {
				top = max(top, p.Y)
			}
		}
		c.Series = append(c.Series, svgchart.Series{
			Name: "worker " + id, Class: "worker-" + id,
			Color: svgchart.Palette[i%len(svgchart.Palette)], Dash: WorkerDashes[i%len(WorkerDashes)],
			Points: pts,
		})
	}
	// Headroom above the highest value, to a tick: memory is flat most of the time, and a
	// line on the plot's top edge would be lost in its frame.
	if top > 0 {
		if t := svgchart.NiceTicks(0, top*1.2, 5); len(t) > 1 {
			step := t[1] - t[0]
			c.YMin, c.YMax = 0, math.Ceil(top*1.2/step)*step
		}
	}
	return chart(c)
}
