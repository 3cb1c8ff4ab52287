// Package dashboard is the live dashboard of `sluice run --admin`: per-rule allowed, denied
// and shadow-denied rates over the last minutes, the active configuration, and the host's
// health (workers, VM restarts, memory per worker, uptime).
//
// It reads only what the host already exposes to anyone: the Prometheus text of /metrics
// and the JSON of /status. A Dashboard scrapes both through a Source (in `sluice run`, the
// admin handler in process) once per Interval, parses the metrics text (ParseText), and keeps
// the samples in a ring buffer covering History. The rules come from the active configuration
// in /status; a rule's counters are found by the names the filter defines for it
// ("sluice.RULE.allowed", ".denied", ".shadow_denied", ".store_errors", as the host exposes
// them: see PromName). The host knows nothing of rules: it only serves its metrics.
//
// Rates are computed here, in Go: the increase of a counter between consecutive samples
// (a decrease is taken as a counter reset) divided by the time between them. The browser
// polls api/state once a second and gets numbers and charts ready to show; the charts are
// plain SVG rendered by package svgchart. The page, its script and its style sheet are
// embedded (go:embed) and fetch nothing else, so the dashboard works offline.
//
// Time is an argument: Scrape(ctx, now) and State(now); only Run and the HTTP handler read
// the clock. A Dashboard is safe for concurrent use.
package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/internal/svgchart"
)

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
	// MaxSeries bounds the series kept per sample (default 2000); a host exposing more keeps
	// the first ones in text order, and State reports the truncation.
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
// decision D for rule R is PromName("sluice." + R + "." + D).
var Decisions = []string{"allowed", "denied", "shadow_denied", "store_errors"}

// chartDecisions are drawn, with their colours.
var chartDecisions = []struct{ name, color string }{
	{"allowed", "#54a24b"},
	{"denied", "#e45756"},
	{"shadow_denied", "#f58518"},
}

// ErrorsMetric is the filter's counter of internal errors, as exposed by the host.
const ErrorsMetric = "sluice_errors"

// RuleMetric returns the Prometheus name of a rule's counter for decision.
func RuleMetric(rule, decision string) string {
	return PromName("sluice." + rule + "." + decision)
}

// point is one scrape.
type point struct {
	t      time.Time
	values map[string]float64 // Sample.Key() -> value
}

// Dashboard collects samples and serves the page. Make one with New.
type Dashboard struct {
	src  Source
	opts Options

	mu         sync.Mutex
	ring       *Ring[point]
	status     statusDoc
	statusOK   bool
	lastTry    time.Time
	lastErr    error
	lineErrs   []LineError
	truncated  int
	scrapeLock sync.Mutex // one scrape at a time
}

// New returns a Dashboard reading src. Nothing is scraped until Scrape or Run.
func New(src Source, opts Options) *Dashboard {
	opts = opts.withDefaults()
	n := int(opts.History/opts.Interval) + 1
	return &Dashboard{src: src, opts: opts, ring: NewRing[point](n)}
}

// Options returns the options in effect (defaults filled in).
func (d *Dashboard) Options() Options { return d.opts }

// Scrape fetches the metrics and the status once and records them as taken at now. A
// fetch error or an unreadable /status is returned (and shown on the page); malformed
// metric lines are skipped and shown, not fatal.
func (d *Dashboard) Scrape(ctx context.Context, now time.Time) error {
	d.scrapeLock.Lock()
	defer d.scrapeLock.Unlock()
	metrics, status, err := d.src.Fetch(ctx)
	if err != nil {
		d.mu.Lock()
		d.lastTry, d.lastErr = now, err
		d.mu.Unlock()
		return err
	}
	samples, lineErrs := ParseText(metrics)
	p := point{t: now, values: make(map[string]float64, len(samples))}
	truncated := 0
	for _, s := range samples {
		if len(p.values) >= d.opts.MaxSeries {
			truncated++
			continue
		}
		p.values[s.Key()] = s.Value
	}
	var st statusDoc
	stErr := json.Unmarshal(status, &st)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastTry, d.lastErr = now, nil
	d.lineErrs, d.truncated = lineErrs, truncated
	// A sample not after the newest one (the clock went backwards, or two scrapes raced)
	// is dropped: the series stays in time order, so every rate has a positive interval.
	if last, ok := d.ring.Last(); !ok || now.After(last.t) {
		d.ring.Push(p)
	}
	if stErr != nil {
		d.lastErr = fmt.Errorf("/status is not the expected JSON: %v", stErr)
		return d.lastErr
	}
	d.status, d.statusOK = st, true
	return nil
}

// Run scrapes every Interval until ctx ends or the source reports ErrSourceClosed. Other
// errors are kept for the page and do not stop it.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(d.opts.Interval)
	defer t.Stop()
	for {
		if err := d.Scrape(ctx, time.Now()); errors.Is(err, ErrSourceClosed) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// statusDoc is the part of the host's /status JSON the dashboard shows.
type statusDoc struct {
	ABIVersion    string  `json:"abi_version"`
	VMID          string  `json:"vm_id"`
	PluginName    string  `json:"plugin_name"`
	FailOpen      bool    `json:"fail_open"`
	UptimeSeconds float64 `json:"uptime_seconds"`
	StartedAt     string  `json:"started_at"`
	Requests      uint64  `json:"requests"`
	VMRestarts    uint64  `json:"vm_restarts"`
	Failed        uint64  `json:"failed_requests"`
	MemoryLimit   uint64  `json:"memory_limit_bytes"`
	Workers       []struct {
		ID          int    `json:"id"`
		Healthy     bool   `json:"healthy"`
		MemoryBytes uint64 `json:"memory_bytes"`
		VMRestarts  uint64 `json:"vm_restarts"`
		Requests    uint64 `json:"requests"`
		Failed      uint64 `json:"failed_requests"`
	} `json:"workers"`
	SharedData struct {
		Keys  int `json:"keys"`
		Bytes int `json:"bytes"`
	} `json:"shared_data"`
	PluginConfig string `json:"plugin_config"`
}

// State is the document served at api/state: everything the page shows.
type State struct {
	Time              time.Time `json:"time"`
	Live              bool      `json:"live"` // the last scrape succeeded and is recent
	Error             string    `json:"error,omitempty"`
	IntervalSeconds   float64   `json:"interval_seconds"`
	RateWindowSeconds float64   `json:"rate_window_seconds"`
	ChartSpanSeconds  float64   `json:"chart_span_seconds"` // the charts' X span
	Samples           int       `json:"samples"`
	MetricErrors      []string  `json:"metric_errors,omitempty"`
	Host              *Health   `json:"host"`
	Config            Config    `json:"config"`
	Rules             []Rule    `json:"rules"`
	FilterErrors      *float64  `json:"filter_errors"`
	MemoryChart       string    `json:"memory_chart,omitempty"`
}

// Health is the host's health, from /status.
type Health struct {
	ABIVersion       string   `json:"abi_version"`
	VMID             string   `json:"vm_id"`
	PluginName       string   `json:"plugin_name"`
	FailOpen         bool     `json:"fail_open"`
	UptimeSeconds    float64  `json:"uptime_seconds"`
	StartedAt        string   `json:"started_at"`
	Requests         uint64   `json:"requests"`
	RequestRate      *float64 `json:"request_rate"`
	VMRestarts       uint64   `json:"vm_restarts"`
	FailedRequests   uint64   `json:"failed_requests"`
	MemoryLimitBytes uint64   `json:"memory_limit_bytes"`
	SharedDataKeys   int      `json:"shared_data_keys"`
	SharedDataBytes  int      `json:"shared_data_bytes"`
	Workers          []Worker `json:"workers"`
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
	Error  string `json:"error,omitempty"` // why it could not be read as JSON
}

// Rule is one configured rule with its counters.
type Rule struct {
	Name      string          `json:"name"`
	Mode      string          `json:"mode"`
	Algorithm string          `json:"algorithm"`
	Limit     json.RawMessage `json:"limit,omitempty"`
	Window    string          `json:"window,omitempty"`
	Burst     json.RawMessage `json:"burst,omitempty"`
	// Metrics maps a decision to the Prometheus name read for it.
	Metrics map[string]string `json:"metrics"`
	// Totals are the counters' current values (null: not exposed yet).
	Totals map[string]*float64 `json:"totals"`
	// Rates are per second over the last RateWindow (null: fewer than two samples).
	Rates map[string]*float64 `json:"rates"`
	// Chart is an <svg> of the allowed/denied/shadow-denied rates between consecutive
	// samples, over the history so far (at least 1m, at most ChartSpan).
	Chart string `json:"chart"`
}

// configRules reads the rule list from the plugin configuration; ok is false when it is
// not JSON of the expected shape.
func configRules(cfg string) ([]Rule, error) {
	var doc struct {
		Rules []struct {
			Name      string          `json:"name"`
			Mode      string          `json:"mode"`
			Algorithm string          `json:"algorithm"`
			Limit     json.RawMessage `json:"limit"`
			Window    string          `json:"window"`
			Burst     json.RawMessage `json:"burst"`
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(cfg), &doc); err != nil {
		return nil, err
	}
	var out []Rule
	for _, r := range doc.Rules {
		if r.Mode == "" {
			r.Mode = "enforce"
		}
		out = append(out, Rule{Name: r.Name, Mode: r.Mode, Algorithm: r.Algorithm, Limit: r.Limit, Window: r.Window, Burst: r.Burst})
	}
	return out, nil
}

// discoverRules finds rules from metric names alone (used when the configuration cannot be
// read): sluice_NAME_DECISION. Names are the sanitized ones, so a rule called "per-client"
// shows as "per_client".
func discoverRules(values map[string]float64) []Rule {
	seen := map[string]bool{}
	var out []Rule
	for key := range values {
		if !strings.HasPrefix(key, "sluice_") || strings.ContainsRune(key, '{') {
			continue
		}
		rest := key[len("sluice_"):]
		// Longest suffix first: "shadow_denied" before "denied".
		for _, dec := range []string{"shadow_denied", "store_errors", "allowed", "denied"} {
			if name, ok := strings.CutSuffix(rest, "_"+dec); ok && name != "" && !strings.HasPrefix(name, "host_") {
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

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func optional(v float64, ok bool) *float64 {
	if !ok || !finite(v) {
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
	n := d.ring.Len()
	if n < 2 {
		return 0, false
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
		if !ok || !finite(v) {
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
		return 0, false
	}
	return sum / t1.Sub(t0).Seconds(), true
}

// series returns, for each sample after the first within span of the last one, the rate of
// key since the previous sample, at x = seconds before the last sample (≤ 0). A missing or
// non-finite value is a gap (NaN).
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
			if ok && finite(v) {
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
		if ok && pok && finite(v) && finite(pv) {
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

// State returns what the page shows at now.
func (d *Dashboard) State(now time.Time) State {
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
	for _, e := range d.lineErrs {
		st.MetricErrors = append(st.MetricErrors, "/metrics "+e.Error())
	}
	if d.truncated > 0 {
		st.MetricErrors = append(st.MetricErrors, fmt.Sprintf("/metrics: %d series beyond the first %d not kept", d.truncated, d.opts.MaxSeries))
	}

	var rules []Rule
	if d.statusOK {
		s := d.status
		h := &Health{
			ABIVersion: s.ABIVersion, VMID: s.VMID, PluginName: s.PluginName, FailOpen: s.FailOpen,
			UptimeSeconds: s.UptimeSeconds, StartedAt: s.StartedAt, Requests: s.Requests,
			VMRestarts: s.VMRestarts, FailedRequests: s.Failed, MemoryLimitBytes: s.MemoryLimit,
			SharedDataKeys: s.SharedData.Keys, SharedDataBytes: s.SharedData.Bytes, Workers: []Worker{},
		}
		h.RequestRate = optional(d.rate("sluice_host_requests_total", d.opts.RateWindow))
		for _, w := range s.Workers {
			h.Workers = append(h.Workers, Worker{ID: w.ID, Healthy: w.Healthy, MemoryBytes: w.MemoryBytes, VMRestarts: w.VMRestarts, Requests: w.Requests, FailedRequests: w.Failed})
		}
		st.Host = h
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, []byte(s.PluginConfig), "", "  "); err != nil {
			st.Config = Config{Pretty: s.PluginConfig, Error: "not JSON: " + err.Error()}
		} else {
			st.Config.Pretty = pretty.String()
		}
		var err error
		if rules, err = configRules(s.PluginConfig); err != nil && st.Config.Error == "" {
			st.Config.Error = "rules not readable: " + err.Error()
		}
		if err != nil {
			rules = nil
		}
	}
	if rules == nil && haveLast {
		rules = discoverRules(last.values)
	}
	if haveLast {
		v, ok := last.values[ErrorsMetric]
		st.FilterErrors = optional(v, ok)
	}
	span := d.chartSpan()
	st.ChartSpanSeconds = span.Seconds()
	for _, r := range rules {
		r.Metrics = map[string]string{}
		r.Totals = map[string]*float64{}
		r.Rates = map[string]*float64{}
		for _, dec := range Decisions {
			name := RuleMetric(r.Name, dec)
			r.Metrics[dec] = name
			if haveLast {
				v, ok := last.values[name]
				r.Totals[dec] = optional(v, ok)
			} else {
				r.Totals[dec] = nil
			}
			r.Rates[dec] = optional(d.rate(name, d.opts.RateWindow))
		}
		c := svgchart.Chart{
			ID: "chart-" + r.Name, Title: r.Name + " — requests per second", Width: 640, Height: 220,
			XMin: -span.Seconds(), XMax: 0, XTicks: xTicks(span), XFormat: xFormat,
			YLabel: "req/s",
		}
		for _, cd := range chartDecisions {
			c.Series = append(c.Series, svgchart.Series{
				Name: strings.ReplaceAll(cd.name, "_", "-"), Class: cd.name, Color: cd.color,
				Points: d.series(r.Metrics[cd.name], span, 1, true),
			})
		}
		r.Chart = chart(c)
		st.Rules = append(st.Rules, r)
	}
	if haveLast {
		var workers []string
		for key := range last.values {
			if strings.HasPrefix(key, "sluice_host_worker_memory_bytes{") {
				workers = append(workers, key)
			}
		}
		sort.Strings(workers)
		if len(workers) > 0 {
			c := svgchart.Chart{
				ID: "chart-memory", Title: "linear memory per worker", Width: 640, Height: 220,
				XMin: -span.Seconds(), XMax: 0, XTicks: xTicks(span), XFormat: xFormat,
				YLabel: "MiB",
			}
			for _, key := range workers {
				name := key
				if i := strings.Index(key, `worker="`); i >= 0 {
					name = "worker " + strings.TrimSuffix(key[i+len(`worker="`):], `"}`)
				}
				c.Series = append(c.Series, svgchart.Series{Name: name, Points: d.series(key, span, 1.0/(1<<20), false)})
			}
			st.MemoryChart = chart(c)
		}
	}
	return st
}
