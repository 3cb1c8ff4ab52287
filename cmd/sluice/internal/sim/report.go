package sim

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/svgchart"
)

// Report is the content of one HTML report.
type Report struct {
	// Title heads the page; default "sluice simulate".
	Title string
	// Command is the command line that produced the report (shown as is).
	Command string
	Traffic *Traffic
	Results []*Result
}

// Explanations are one-line descriptions of each algorithm's trade-off,
// shown under its chart.
var Explanations = map[algorithms.Kind]string{
	algorithms.Concurrency:   "Holds a slot of the key from each request's admission until its response ends (the traffic's duration): never more than limit in flight at once, whatever the rate; a request that finds none free is refused, or queued within delay.max.",
	algorithms.TokenBucket:   "Starts full at burst and refills continuously: a client idle for a while may send a whole burst at once, then is held to the refill rate.",
	algorithms.LeakyBucket:   "A meter draining at limit/window: admissions are spaced out smoothly; bursts beyond its capacity are denied immediately.",
	algorithms.FixedWindow:   "One counter per calendar window: cheap and simple, but a client can send limit just before a boundary and limit just after — up to 2× limit in one window length.",
	algorithms.SlidingLog:    "Remembers every admitted request of the last window: exact (never more than limit in any window length), at the cost of state that grows with the limit.",
	algorithms.SlidingWindow: "Weights the previous window's count by how much of it still overlaps: nearly as smooth as the log with two counters of state; approximate at the boundary.",
}

// WindowBound is what kind guarantees for the cost admitted for one key in
// any interval (t−window, t], the number "max in any window" is held to:
//   - sliding_log: limit (it is exact in every interval);
//   - token_bucket and leaky_bucket: burst + limit — the bucket may be full
//     (burst) at the interval's start and refills limit over it, so a
//     client idle for a while gets a whole burst on top of the rate, by
//     design;
//   - fixed_window: 2 × limit — limit per calendar window, so up to limit on
//     each side of a boundary;
//   - sliding_window: 2 × limit (strictly less): its estimate assumes the
//     previous window was evenly spread.
//
// A report marks a number above the limit but within this bound as the
// algorithm's design, and only a number above the bound as a violation.
// p.Burst must be normalized (as algorithms.New leaves Params).
// formula is how the bound follows from the parameters ("burst + limit").
func WindowBound(kind algorithms.Kind, p algorithms.Params) (bound int64, formula string) {
	switch kind {
	case algorithms.SlidingLog:
		return p.Limit, "limit"
	case algorithms.TokenBucket, algorithms.LeakyBucket:
		b := p.Burst
		if b == 0 {
			b = p.Limit
		}
		return satAdd(b, p.Limit), "burst + limit"
	case algorithms.FixedWindow:
		return satAdd(p.Limit, p.Limit), "2 × limit"
	case algorithms.Concurrency:
		return p.Limit, "limit: requests of one key in flight at once"
	default: // sliding_window
		return satAdd(p.Limit, p.Limit), "2 × limit"
	}
}

func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// WriteReport writes r as one self-contained HTML page: inline CSS and
// SVG, no scripts, no external resources. Elements carry stable classes and
// data attributes for tools and tests: every result is a
// <section class="algo" data-algorithm=... data-max-in-window=...>, its
// numbers are <dd data-metric="admitted|denied|max-in-window|state-bytes">
// holding a bare integer (through the key table also entries, evicted and
// per flood class "<class>-denied"), and its charts are <svg class="svgchart"> with
// ids "chart-N-traffic" and "chart-N-remaining". A rule with a delay
// (Result.Shaping) also has the metrics at-once, held, refused, most-held,
// max-arrivals, meter-admitted and meter-denied (each also a data- attribute
// of its section, with data-delay-ns and data-max-held), its delays in
// <dd class="delays" data-p50-ns data-p99-ns data-max-ns>, and the charts
// "chart-N-arrivals" (series "with" and "without" shaping) and
// "chart-N-held". A token budget (Result.Budget, with its Unsettled twin)
// has the metrics reserved, actual, settled, no-usage, refunded, excess,
// max-debt, max-actual-in-window, guarantee-windows, guarantee-beyond,
// guarantee-violations, unsettled-admitted, unsettled-denied,
// unsettled-actual and unsettled-max-actual-in-window (the section also
// has data-settles, data-refunded, data-excess, data-max-debt and
// data-violations), and the charts "chart-N-budget" (units charged in the
// last window, series "with" and "without" settlement) and "chart-N-actual"
// (the actual cost admitted in the last window, the same series).
func WriteReport(w io.Writer, r *Report) error {
	if r.Traffic == nil || len(r.Results) == 0 {
		return fmt.Errorf("sim: report has no traffic or no results")
	}
	page := pageData{Title: r.Title, Command: r.Command, Traffic: r.Traffic}
	if page.Title == "" {
		page.Title = "sluice simulate"
	}
	tr := r.Traffic
	page.SpanNS = tr.End - tr.Start
	page.Span = fmtDuration(time.Duration(tr.End - tr.Start))
	page.StartTime = time.Unix(0, tr.Start).UTC().Format(time.RFC3339Nano)
	for _, req := range tr.Requests {
		page.OfferedCost += req.Cost
	}
	for i, res := range r.Results {
		sd, err := newSection(i+1, res)
		if err != nil {
			return err
		}
		page.Sections = append(page.Sections, sd)
	}
	return reportTemplate.Execute(w, page)
}

type pageData struct {
	Title, Command      string
	Traffic             *Traffic
	Span, StartTime     string
	OfferedCost, SpanNS int64
	Sections            []sectionData
}

type sectionData struct {
	N                        int
	R                        *Result
	Algorithm, Window        string
	Burst                    int64
	HasBurst                 bool
	Ratio                    string // MaxInWindow / limit
	CostUnits                bool   // some request costs more than 1
	Bound                    int64  // WindowBound
	BoundWhy                 string // how WindowBound is reached
	Over                     bool   // MaxInWindow > Bound: a violation
	Refunds                  bool   // MaxInWindow > Bound by refunds (a token budget)
	AboveLimit               bool   // Limit < MaxInWindow <= Bound: by design
	Where                    string
	TrafficSVG, RemainingSVG template.HTML
	Explain                  string
	DeniedPct                string

	// Sh is a rule with a delay's numbers (R.Shaping), nil without.
	Sh                   *shapingData
	ArrivalsSVG, HeldSVG template.HTML

	// Bu is a token budget's numbers (R.Budget), nil without.
	Bu                   *budgetData
	BudgetSVG, ActualSVG template.HTML

	// IF is an in-flight limit's numbers (R.InFlight), nil for a rate rule.
	IF          *InFlight
	InFlightSVG template.HTML
}

// budgetData is what a section shows of a token budget: with settlement
// and without.
type budgetData struct {
	*Budget
	U        *Result // Unsettled
	Window   string
	DebtWait string
	Probe    string
}

// shapingData is what a section shows of a rule with a delay: the upstream
// with and without shaping.
type shapingData struct {
	*Shaping
	R              *Result
	Delay, Window  string // delay.max, the rule's window
	FmtP50, FmtP99 string // the delays, printed
	FmtMax         string
	DeniedPct      string // refused with shaping, in % of offered
	MeterPct       string // refused by the meter, in % of offered
}

func newSection(n int, res *Result) (sectionData, error) {
	p := res.Params
	sd := sectionData{
		N: n, R: res, Algorithm: res.Kind.String(), Window: fmtDuration(p.Window),
		Burst:    p.Burst,
		HasBurst: res.Kind == algorithms.TokenBucket || res.Kind == algorithms.LeakyBucket,
		Explain:  Explanations[res.Kind],
	}
	sd.Bound, sd.BoundWhy = WindowBound(res.Kind, p)
	sd.Over = res.MaxInWindow > sd.Bound
	if b := res.Budget; b != nil && b.Settles {
		// Reservations, with refunds giving capacity back: the budget's
		// guarantee is the bound (Budget.Violations).
		sd.Refunds = sd.Over
		sd.Over = b.Violations > 0
	}
	sd.AboveLimit = !sd.Over && res.MaxInWindow > p.Limit
	if p.Limit > 0 {
		sd.Ratio = strconv.FormatFloat(float64(res.MaxInWindow)/float64(p.Limit), 'f', 2, 64)
	}
	if res.Offered > 0 {
		sd.DeniedPct = strconv.FormatFloat(100*float64(res.Denied)/float64(res.Offered), 'f', 1, 64)
	}
	sd.CostUnits = res.OfferedCost != res.Offered
	if res.MaxInWindow > 0 {
		sd.Where = fmt.Sprintf("key %q, admitted between +%s and +%s", res.MaxInWindowKey,
			fmtDuration(time.Duration(res.MaxInWindowFrom-res.Start)), fmtDuration(time.Duration(res.MaxInWindowTo-res.Start)))
	}

	// X in seconds since the start; one point per bucket.
	nb := len(res.Buckets)
	sec := func(i int) float64 { return float64(int64(i)*res.BucketWidth) / 1e9 }
	xMax := sec(nb)
	offered := make([]svgchart.Point, nb)
	admitted := make([]svgchart.Point, nb)
	remMin := make([]svgchart.Point, nb)
	avail := make([]svgchart.Point, nb)
	for i, b := range res.Buckets {
		x := sec(i)
		offered[i] = svgchart.Point{X: x, Y: float64(b.Offered)}
		admitted[i] = svgchart.Point{X: x, Y: float64(b.Admitted)}
		remMin[i] = svgchart.Point{X: x, Y: math.NaN()}
		// Available is the quota at the end of bucket i.
		avail[i] = svgchart.Point{X: sec(i + 1), Y: float64(b.Available)}
		if b.RemainingMin >= 0 {
			remMin[i].Y = float64(b.RemainingMin)
		}
	}
	ticks := svgchart.DurationTicks(0, xMax, 6)
	bw := fmtBucketWidth(res.BucketWidth)
	traffic := &svgchart.Chart{
		ID:    fmt.Sprintf("chart-%d-traffic", n),
		Title: "Offered vs admitted requests", Width: 560, Height: 220,
		XLabel: "time since start", YLabel: "requests per " + bw,
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "offered", Class: "offered", Color: "#bbbbbb", Kind: svgchart.StepArea, Points: offered},
			{Name: "admitted", Class: "admitted", Color: "#2f7ed8", Kind: svgchart.StepArea, Points: admitted},
		},
	}
	remaining := &svgchart.Chart{
		ID:    fmt.Sprintf("chart-%d-remaining", n),
		Title: "Remaining quota", Width: 560, Height: 180,
		XLabel: "time since start", YLabel: "remaining",
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "lowest remaining in " + bw, Class: "remaining-min", Color: "#e45756", Kind: svgchart.Step, Points: remMin},
			{Name: "available to " + res.ProbeKey, Class: "available", Color: "#54a24b", Kind: svgchart.Line, Points: avail},
		},
		Rules: []svgchart.Rule{{Y: float64(res.Limit), Label: "limit " + strconv.FormatInt(res.Limit, 10), Class: "limit"}},
	}
	type chartOut struct {
		chart *svgchart.Chart
		dst   *template.HTML
	}
	charts := []chartOut{{traffic, &sd.TrafficSVG}, {remaining, &sd.RemainingSVG}}
	if res.Shaping != nil {
		arr, held := shapingCharts(n, res, &sd)
		charts = append(charts, chartOut{arr, &sd.ArrivalsSVG}, chartOut{held, &sd.HeldSVG})
	}
	if res.Budget != nil && res.Budget.Unsettled != nil {
		b, a := budgetCharts(n, res, &sd)
		charts = append(charts, chartOut{b, &sd.BudgetSVG}, chartOut{a, &sd.ActualSVG})
	}
	if res.InFlight != nil {
		charts = append(charts, chartOut{inFlightChart(n, res, &sd), &sd.InFlightSVG}) // concurrency.go
	}
	for _, c := range charts {
		s, err := c.chart.SVG()
		if err != nil {
			return sd, fmt.Errorf("sim: chart of %s: %w", res.Name, err)
		}
		// The chart package escapes every text it writes.
		*c.dst = template.HTML(s)
	}
	return sd, nil
}

// shapingCharts fills sd's numbers of a rule with a delay and returns its
// charts: the upstream arrivals with and without shaping, and the
// requests held.
func shapingCharts(n int, res *Result, sd *sectionData) (arrivals, held *svgchart.Chart) {
	s := res.Shaping
	sh := &shapingData{Shaping: s, R: res, Delay: fmtDuration(s.Max), Window: sd.Window, DeniedPct: sd.DeniedPct,
		FmtP50: fmtDelay(s.DelayP50), FmtP99: fmtDelay(s.DelayP99), FmtMax: fmtDelay(s.DelayMax)}
	if m := s.Meter; m.Offered > 0 {
		sh.MeterPct = strconv.FormatFloat(100*float64(m.Denied)/float64(m.Offered), 'f', 1, 64)
	}
	sd.Sh = sh
	nb := max(len(s.Arrivals), len(s.Meter.Buckets))
	sec := func(i int) float64 { return float64(int64(i)*res.BucketWidth) / 1e9 }
	xMax := sec(nb)
	with := make([]svgchart.Point, nb)
	without := make([]svgchart.Point, nb)
	heldPts := make([]svgchart.Point, nb)
	for i := range nb {
		x := sec(i)
		w, wo := s.bucket(i)
		var h int64
		if i < len(s.MostHeldIn) {
			h = s.MostHeldIn[i]
		}
		with[i] = svgchart.Point{X: x, Y: float64(w)}
		without[i] = svgchart.Point{X: x, Y: float64(wo)}
		heldPts[i] = svgchart.Point{X: x, Y: float64(h)}
	}
	ticks := svgchart.DurationTicks(0, xMax, 6)
	bw := fmtBucketWidth(res.BucketWidth)
	arrivals = &svgchart.Chart{
		ID:    fmt.Sprintf("chart-%d-arrivals", n),
		Title: "Upstream arrivals: with shaping vs without", Width: 560, Height: 220,
		XLabel: "time since start", YLabel: "requests per " + bw,
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "without shaping (meter)", Class: "without", Color: "#54a24b", Kind: svgchart.Step, Points: without},
			// Dashed: where the two agree, the green line shows between.
			{Name: "with shaping (delay ≤ " + sh.Delay + ")", Class: "with", Color: "#2f7ed8", Dash: "5 4", Kind: svgchart.Step, Points: with},
		},
	}
	held = &svgchart.Chart{
		ID:    fmt.Sprintf("chart-%d-held", n),
		Title: "Requests held", Width: 560, Height: 180,
		XLabel: "time since start", YLabel: "held",
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "most held at once in " + bw, Class: "held", Color: "#e45756", Kind: svgchart.Step, Points: heldPts},
		},
	}
	if s.MaxHeld > 0 && s.MostHeld >= int64(s.MaxHeld) {
		held.Rules = []svgchart.Rule{{Y: float64(s.MaxHeld), Label: "max_held " + strconv.Itoa(s.MaxHeld), Class: "max-held"}}
	}
	return arrivals, held
}

// budgetCharts fills sd's numbers of a token budget and returns its
// charts: the probe key's units charged, and its actual cost admitted, in
// the window ending at each bucket's end, with settlement and without.
func budgetCharts(n int, res *Result, sd *sectionData) (charged, actual *svgchart.Chart) {
	b := res.Budget
	u := b.Unsettled.Budget
	sd.Bu = &budgetData{Budget: b, U: b.Unsettled, Window: sd.Window, DebtWait: fmtDelay(b.MaxDebtWait), Probe: res.ProbeKey}
	nb := max(len(b.Charged), len(u.Charged))
	sec := func(i int) float64 { return float64(int64(i+1)*res.BucketWidth) / 1e9 }
	series := func(v []int64) []svgchart.Point {
		pts := make([]svgchart.Point, nb)
		for i := range nb {
			pts[i] = svgchart.Point{X: sec(i), Y: math.NaN()}
			if i < len(v) {
				pts[i].Y = float64(v[i])
			}
		}
		return pts
	}
	xMax := sec(nb - 1)
	ticks := svgchart.DurationTicks(0, xMax, 6)
	limit := []svgchart.Rule{
		{Y: float64(res.Params.Limit), Label: "limit " + strconv.FormatInt(res.Params.Limit, 10), Class: "limit"},
		{Y: float64(b.Bound), Label: "limit + burst " + strconv.FormatInt(b.Bound, 10), Class: "bound"},
	}
	charged = &svgchart.Chart{
		ID:    fmt.Sprintf("chart-%d-budget", n),
		Title: "Budget charged in the last " + sd.Window + " (key " + res.ProbeKey + ")", Width: 560, Height: 220,
		XLabel: "time since start", YLabel: "cost units",
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "without settlement (estimates)", Class: "without", Color: "#54a24b", Kind: svgchart.Line, Points: series(u.Charged)},
			{Name: "with settlement", Class: "with", Color: "#2f7ed8", Dash: "5 4", Kind: svgchart.Line, Points: series(b.Charged)},
		},
		Rules: limit,
	}
	actual = &svgchart.Chart{
		ID:    fmt.Sprintf("chart-%d-actual", n),
		Title: "Actual cost admitted in the last " + sd.Window + " (key " + res.ProbeKey + ")", Width: 560, Height: 220,
		XLabel: "time since start", YLabel: "cost units",
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "without settlement", Class: "without", Color: "#e45756", Kind: svgchart.Line, Points: series(u.ActualIn)},
			{Name: "with settlement", Class: "with", Color: "#2f7ed8", Dash: "5 4", Kind: svgchart.Line, Points: series(b.ActualIn)},
		},
		Rules: limit,
	}
	return charged, actual
}

// fmtDelay prints a delay to the microsecond ("0" for none).
func fmtDelay(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	if d < time.Millisecond {
		return d.String()
	}
	return fmtDuration(d.Round(time.Microsecond))
}

// fmtDuration prints d without Go's trailing zero units ("1m" not "1m0s").
// fmtBucketWidth labels a bucket width (BucketWidth: a round duration) as
// written: "500µs", "250ms", "5s", "2m".
func fmtBucketWidth(w int64) string {
	if w < int64(time.Millisecond) {
		return time.Duration(w).String()
	}
	return fmtDuration(time.Duration(w))
}

func fmtDuration(d time.Duration) string {
	return svgchart.FormatDuration(d.Seconds())
}

var reportTemplate = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="sluice simulate">
<title>{{.Title}}</title>
<style>
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0; color: #222; background: #f6f7f9; }
header { padding: 16px 24px; background: #fff; border-bottom: 1px solid #ddd; }
h1 { margin: 0 0 4px; font-size: 20px; }
header p { margin: 2px 0; color: #444; }
code { font: 12px ui-monospace, Menlo, Consolas, monospace; background: #f0f0f0; padding: 1px 4px; border-radius: 3px; }
table#summary { border-collapse: collapse; margin: 16px 24px; background: #fff; }
#summary th, #summary td { border: 1px solid #ddd; padding: 4px 10px; text-align: right; }
#summary th:first-child, #summary td:first-child { text-align: left; }
#summary td.over, dd.over { color: #b00020; font-weight: bold; }
#summary td.above-limit, dd.above-limit { color: #8a5a00; }
#summary td.bound { color: #555; }
p.legend-note { margin: -8px 24px 16px; max-width: 1100px; color: #555; font-size: 13px; }
main { display: grid; grid-template-columns: repeat(auto-fill, minmax(820px, 1fr)); gap: 16px; padding: 0 24px 24px; }
section.algo { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 12px 16px; }
section.algo h2 { margin: 0 0 6px; font-size: 16px; }
section.algo h2 small { font-weight: normal; color: #666; }
.body { display: flex; gap: 16px; align-items: flex-start; flex-wrap: wrap; }
.charts { display: flex; flex-direction: column; gap: 4px; }
figure { margin: 0; }
dl.numbers { display: grid; grid-template-columns: auto auto; gap: 2px 10px; margin: 0; flex: 0 0 210px; }
dl.numbers dt { color: #555; }
dl.numbers dd { margin: 0; font-weight: bold; font-variant-numeric: tabular-nums; text-align: right; }
dl.numbers dd.note { grid-column: 1 / span 2; font-weight: normal; color: #666; font-size: 12px; text-align: left; }
p.explain { margin: 6px 0 0; color: #444; font-size: 13px; }
svg.svgchart { font-family: system-ui, sans-serif; }
</style>
</head>
<body>
<header>
<h1>{{.Title}}</h1>
<p class="traffic" data-requests="{{len .Traffic.Requests}}" data-keys="{{len .Traffic.Keys}}" data-span-ns="{{.SpanNS}}">Traffic: {{.Traffic.Description}}</p>
<p>{{len .Traffic.Requests}} requests ({{.OfferedCost}} cost units) from {{len .Traffic.Keys}} key(s) over {{.Span}}, starting {{.StartTime}}. Simulated in virtual time with sluice's own algorithms.</p>
{{with .Command}}<p>Command: <code>{{.}}</code></p>{{end}}
</header>
<table id="summary">
<thead><tr><th>rule</th><th>algorithm</th><th>limit / window</th><th>admitted</th><th>denied</th><th>max in any window</th><th>guaranteed at most</th><th>state bytes / key</th></tr></thead>
<tbody>
{{range .Sections}}<tr data-algorithm="{{.Algorithm}}"><td>{{.R.Name}}</td><td>{{.Algorithm}}</td><td>{{.R.Params.Limit}}{{if .IF}} in flight{{else}} / {{.Window}}{{end}}</td><td>{{.R.Admitted}}</td><td>{{.R.Denied}}</td><td{{if .Over}} class="over"{{else if .AboveLimit}} class="above-limit"{{end}} data-col="max-in-window">{{.R.MaxInWindow}}</td><td class="bound" data-col="bound" title="{{.BoundWhy}}">{{.Bound}}</td><td>{{.R.StateBytesMax}}</td></tr>
{{end}}</tbody>
</table>
<p class="legend-note">Guaranteed at most: each algorithm's own bound for one key in any window-length interval — limit for sliding_log; burst + limit for token_bucket and leaky_bucket (a full bucket, then one window's refill); 2 × limit for fixed_window (limit on each side of a boundary) and sliding_window (its estimate, worst case). Above the limit within the bound (brown) is the algorithm's design; above the bound (red) would be a violation.</p>
<main>
{{range .Sections}}<section class="algo" id="result-{{.N}}" data-name="{{.R.Name}}" data-algorithm="{{.Algorithm}}" data-limit="{{.R.Params.Limit}}" data-window="{{.Window}}" data-window-ns="{{.R.Params.Window.Nanoseconds}}" data-burst="{{.Burst}}" data-offered="{{.R.Offered}}" data-admitted="{{.R.Admitted}}" data-denied="{{.R.Denied}}" data-max-in-window="{{.R.MaxInWindow}}" data-state-bytes="{{.R.StateBytesMax}}" data-max-state-size="{{.R.MaxStateSize}}"{{with .Sh}} data-delay-ns="{{.Max.Nanoseconds}}" data-max-held="{{.MaxHeld}}" data-at-once="{{.AtOnce}}" data-held="{{.Held}}" data-refused="{{.R.Denied}}" data-most-held="{{.MostHeld}}" data-max-arrivals="{{.R.MaxArrivals}}" data-meter-admitted="{{.Meter.Admitted}}" data-meter-denied="{{.Meter.Denied}}"{{end}}{{with .Bu}} data-settles="true" data-refunded="{{.Refunded}}" data-excess="{{.Excess}}" data-max-debt="{{.MaxDebt}}" data-violations="{{.Violations}}"{{end}}>
<h2>{{.R.Name}} <small>{{.Algorithm}}, {{.R.Params.Limit}} {{if .IF}}in flight{{else}}per {{.Window}}{{end}}{{if .HasBurst}}, burst {{.Burst}}{{end}}{{with .Sh}}, delay ≤ {{.Delay}}{{end}}</small></h2>
<div class="body">
<div class="charts">
<figure class="chart traffic-chart">{{.TrafficSVG}}</figure>
{{if not .IF}}<figure class="chart remaining-chart">{{.RemainingSVG}}</figure>{{end}}
{{if .Sh}}<figure class="chart arrivals-chart">{{.ArrivalsSVG}}</figure>
<figure class="chart held-chart">{{.HeldSVG}}</figure>
{{end}}{{if .Bu}}<figure class="chart budget-chart">{{.BudgetSVG}}</figure>
<figure class="chart actual-chart">{{.ActualSVG}}</figure>
{{end}}{{if .IF}}<figure class="chart inflight-chart">{{.InFlightSVG}}</figure>
{{end}}</div>
<dl class="numbers">
<dt>Offered</dt><dd data-metric="offered">{{.R.Offered}}</dd>
<dt>Admitted</dt><dd data-metric="admitted">{{.R.Admitted}}</dd>
<dt>Denied</dt><dd data-metric="denied">{{.R.Denied}}</dd>
<dd class="note">{{.DeniedPct}}% of requests denied</dd>
{{with .IF}}<dt>Most in flight at once</dt><dd data-metric="peak-in-flight">{{.Peak}}</dd>
<dd class="note">{{with .PeakKey}}key {{printf "%q" .}}; {{end}}never more than the limit{{if not .Durations}}; the traffic gives no durations (a CSV's duration column): every request ends at once{{end}}</dd>
{{if .Delay}}<dt>Queued</dt><dd data-metric="queued">{{.Queued}}</dd>
<dd class="note">waited for a slot (at most {{.Delay}}{{if .MaxHeld}}, {{.MaxHeld}} waiting at once{{end}}); <span data-metric="expired">{{.Expired}}</span> refused at the delay; longest wait of one admitted {{.WaitMax}}</dd>
{{end}}{{else}}<dt>Max admitted in any {{.Window}}</dt><dd data-metric="max-in-window"{{if .Over}} class="over"{{else if .AboveLimit}} class="above-limit"{{end}}>{{.R.MaxInWindow}}</dd>
<dd class="note">{{.Ratio}}× the limit{{if .CostUnits}}, counted in cost units{{end}}{{with .Where}}; {{.}}{{end}}; {{if .Over}}<strong>over</strong>{{else if .Refunds}}beyond, by refunds (the reservations' units given back: see the guarantee below),{{else}}within{{end}} its bound of {{.Bound}} ({{.BoundWhy}})</dd>
<dt>State per key (bytes)</dt><dd data-metric="state-bytes">{{.R.StateBytesMax}}</dd>
<dd class="note">largest encoded state seen; at most {{.R.MaxStateSize}} bytes for this rule; {{.R.StateBytesEnd}} bytes for all {{.R.Keys}} key(s) at the end</dd>
{{end}}
{{range .R.Classes}}<dt>{{.Name}} keys: denied</dt><dd data-metric="{{.Name}}-denied">{{.Denied}}</dd>
<dd class="note">of {{.Offered}} requests from {{.Keys}} key(s); the most admitted for one in any window: <span data-metric="{{.Name}}-max">{{.MaxPerKey}}</span></dd>
{{end}}{{with .Sh}}<dt>Sent upstream at once</dt><dd data-metric="at-once">{{.AtOnce}}</dd>
<dt>Held until their slot</dt><dd data-metric="held">{{.Held}}</dd>
<dt>Refused</dt><dd data-metric="refused">{{.R.Denied}}</dd>
<dd class="note">with a delay of at most {{.Delay}}{{if .MaxHeld}}, at most {{.MaxHeld}} held at once{{end}}: {{.DeniedPct}}% refused{{if .Metered}}; {{.Metered}} decided without a queue while max_held were held{{end}}</dd>
<dt>Delay p50 / p99 / max</dt><dd class="delays" data-p50-ns="{{.DelayP50.Nanoseconds}}" data-p99-ns="{{.DelayP99.Nanoseconds}}" data-max-ns="{{.DelayMax.Nanoseconds}}">{{.FmtP50}} / {{.FmtP99}} / {{.FmtMax}}</dd>
<dd class="note">of the held requests (the delay_ms histogram)</dd>
<dt>Most held at once</dt><dd data-metric="most-held">{{.MostHeld}}</dd>
<dt>Max upstream arrivals in any {{.Window}}</dt><dd data-metric="max-arrivals">{{.R.MaxArrivals}}</dd>
<dd class="note">all keys, at their release; without shaping <span data-metric="meter-max-arrivals">{{.Meter.MaxArrivals}}</span></dd>
<dt>Without shaping: admitted</dt><dd data-metric="meter-admitted">{{.Meter.Admitted}}</dd>
<dt>Without shaping: refused</dt><dd data-metric="meter-denied">{{.Meter.Denied}}</dd>
<dd class="note">the same traffic through the same rule without a delay: {{.MeterPct}}% refused</dd>
{{end}}{{with .Bu}}<dt>Reserved (estimates)</dt><dd data-metric="reserved">{{.Reserved}}</dd>
<dt>Actual cost admitted</dt><dd data-metric="actual">{{.Actual}}</dd>
<dd class="note">cost units of the admitted requests, as their responses reported them</dd>
<dt>Settled</dt><dd data-metric="settled">{{.Settled}}</dd>
<dd class="note"><span data-metric="no-usage">{{.NoUsage}}</span> without a cost, settled by no_usage ({{if .NoUsageRefund}}refund{{else}}reservation{{end}}){{if .Failed}}; {{.Failed}} refused: the debt would last too long{{end}}</dd>
<dt>Refunded</dt><dd data-metric="refunded">{{.Refunded}}</dd>
<dt>Excess charged</dt><dd data-metric="excess">{{.Excess}}</dd>
<dt>Max debt</dt><dd data-metric="max-debt">{{.MaxDebt}}</dd>
<dd class="note">{{if .MaxDebt}}cost units key {{printf "%q" .MaxDebtKey}} owed after a settlement: {{.DebtWait}} before a request of cost 1 fit{{else}}never in debt{{end}}</dd>
<dt>Max actual cost in any {{.Window}}</dt><dd data-metric="max-actual-in-window"{{if .Violations}} class="over"{{end}}>{{.MaxActualInWindow}}</dd>
<dd class="note">guarantee: actual ≤ limit + burst ({{.Bound}}) + in-flight excess + refunds of earlier admissions, checked in <span data-metric="guarantee-windows">{{.Windows}}</span> windows: <span data-metric="guarantee-beyond">{{.Beyond}}</span> beyond {{.Bound}}, <span data-metric="guarantee-violations">{{.Violations}}</span> over the guarantee</dd>
<dt>Without settlement: admitted</dt><dd data-metric="unsettled-admitted">{{.U.Admitted}}</dd>
<dt>Without settlement: refused</dt><dd data-metric="unsettled-denied">{{.U.Denied}}</dd>
<dt>Without settlement: actual</dt><dd data-metric="unsettled-actual">{{.U.Budget.Actual}}</dd>
<dd class="note">the same reservations never settled; the most actual cost in any {{.Window}}: <span data-metric="unsettled-max-actual-in-window">{{.U.Budget.MaxActualInWindow}}</span></dd>
{{end}}{{if .R.MaxKeys}}<dt>Shared-data entries</dt><dd data-metric="entries">{{.R.Entries}}</dd>
<dd class="note">max_keys {{.R.MaxKeys}}; <span data-metric="entry-bytes">{{.R.EntryBytes}}</span> bytes of keys and values</dd>
<dt>Evicted</dt><dd data-metric="evicted">{{.R.Evicted}}</dd>
<dd class="note">live keys pushed out of the full table, who had used {{.R.EvictedUsed}} in all</dd>
{{end}}</dl>
</div>
<p class="explain">{{.Explain}}</p>
</section>
{{end}}</main>
</body>
</html>
`))
