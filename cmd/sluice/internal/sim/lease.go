package sim

import (
	"errors"
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/svgchart"
)

// Leases (rules[].lease, filter/lease.go) modelled over a fleet: requests
// are spread round-robin over Proxies, each proxy holds a pool per key,
// filled by an acquire of min(Lease, ⌈available/Proxies⌉) from the global
// state (the lease script's grant) and spent one admission per request; a
// pool expires (see below; a fixed window's also at the window's end) and
// its rest goes back to the global state, checked every tick (100 ms). Calls take no time: the model shows what
// the grants and pools do, not latency.
//
// A pool expires after LeaseIdle without a spend, at the latest
// LeaseMaxLifetime after its acquire. An acquire that gets nothing holds
// the key's denial on that proxy for the wait until an admission is
// available, at most LeaseHold (no call meanwhile). The same traffic
// without leases is the global state deciding every request (the exact
// algorithm).

// LeaseIdle and LeaseMaxLifetime are the filter's pool expiry
// (filter/lease.go).
const (
	LeaseIdle        = time.Second
	LeaseMaxLifetime = 30 * time.Second
	LeaseHold        = time.Second
)

// LeaseOptions configure RunLeases.
type LeaseOptions struct {
	Proxies int   // >= 1
	Lease   int64 // >= 1
	Buckets int   // chart buckets; 0 = DefaultBuckets
}

// LeaseBucket is one time bucket of a lease run.
type LeaseBucket struct {
	Offered  int64
	Admitted int64 // with leases
	Exact    int64 // the same traffic without leases
	// Held is the most admissions sitting unspent in pools at any moment
	// of the bucket (what the pools carried in from the bucket before
	// included): the peak, as LeaseResult.MaxHeld is over the whole run.
	// Pools live about a second, so a sample at the bucket's end would
	// miss nearly all of them.
	Held int64
}

// LeaseResult is what a fleet with leases did with one traffic, next to
// the same traffic without leases.
type LeaseResult struct {
	Kind    algorithms.Kind
	Params  algorithms.Params
	Proxies int
	Lease   int64

	Offered, Admitted, Exact int64
	// Calls counts acquires and returns (the Redis calls); without leases
	// every request is one call.
	Acquires, Returns int64
	// MaxHeld is the most admissions held in pools at a tick.
	MaxHeld int64
	// MaxInWindow and ExactMaxInWindow are the most admissions for one key
	// in any interval (t−Window, t], with and without leases.
	MaxInWindow, ExactMaxInWindow int64

	Start, BucketWidth int64
	Buckets            []LeaseBucket
}

// globalKey is the global state of one key (the lease script's
// arithmetic, in µs): fixed_window {ws, n}; token_bucket {s = tokens × W, ts}.
type globalKey struct {
	ws, n, s, ts int64
	init         bool
}

type leaseModel struct {
	kind        algorithms.Kind
	l, w, b     int64 // limit, window µs, burst
	inst, lease int64
}

func (m *leaseModel) refill(g *globalKey, now int64) {
	if m.kind == algorithms.FixedWindow {
		if ws := now / m.w * m.w; !g.init || ws != g.ws {
			g.ws, g.n, g.init = ws, 0, true
		}
		return
	}
	bw := m.b * m.w
	if !g.init {
		g.s, g.ts, g.init = bw, now, true
	}
	if now > g.ts {
		if (now - g.ts) >= (bw-g.s+m.l-1)/m.l {
			g.s = bw
		} else {
			g.s += (now - g.ts) * m.l
		}
		g.ts = now
	}
}

// acquire grants up to want admissions (adaptive when inst > 1).
func (m *leaseModel) acquire(g *globalKey, now, want int64) int64 {
	m.refill(g, now)
	var avail int64
	if m.kind == algorithms.FixedWindow {
		avail = m.l - g.n
	} else {
		avail = g.s / m.w
	}
	if avail <= 0 {
		return 0
	}
	grant := min(want, (avail+m.inst-1)/m.inst)
	if m.kind == algorithms.FixedWindow {
		g.n += grant
	} else {
		g.s -= grant * m.w
	}
	return grant
}

func (m *leaseModel) giveBack(g *globalKey, now, n, stamp int64) {
	m.refill(g, now)
	if m.kind == algorithms.FixedWindow {
		if stamp == g.ws {
			g.n = max(g.n-n, 0)
		}
		return
	}
	g.s = min(g.s+n*m.w, m.b*m.w)
}

type pool struct {
	tokens, expiry, stamp, touched int64 // expiry, touched in Unix ns
	want, spent, acquired          int64 // the filter's adaptive acquire size
	until                          int64 // a held denial (Unix ns)
}

// wait is the µs until key g has an admission again (after an acquire that
// got nothing at now): the window's end, or the next token.
func (m *leaseModel) wait(g *globalKey, now int64) int64 {
	if m.kind == algorithms.FixedWindow {
		return g.ws + m.w - now
	}
	return max((m.w-g.s+m.l-1)/m.l, 1)
}

func (p *pool) expired(at int64) bool { return at >= p.expiry || at >= p.touched+int64(LeaseIdle) }

// RunLeases replays tr through a fleet with leases and through the global
// state alone. Only token_bucket and fixed_window have leases.
func RunLeases(tr *Traffic, kind algorithms.Kind, p algorithms.Params, opt LeaseOptions) (*LeaseResult, error) {
	if err := checkLeaseRun(tr, kind, p, opt); err != nil {
		return nil, err
	}
	burst := p.Burst
	if burst == 0 || kind == algorithms.FixedWindow {
		burst = p.Limit
	}
	if float64(burst)*float64(p.Window/time.Microsecond) >= 1<<62 {
		return nil, errors.New("sim: limit × window too large for the lease model")
	}
	nb := opt.Buckets
	if nb <= 0 {
		nb = DefaultBuckets
	}
	width := BucketWidth(tr.End-tr.Start, nb)
	n := int((tr.End - tr.Start + width - 1) / width)
	r := &leaseRun{
		res: &LeaseResult{Kind: kind, Params: p, Proxies: opt.Proxies, Lease: opt.Lease, Start: tr.Start, BucketWidth: width,
			Buckets: make([]LeaseBucket, n)},
		m:      leaseModel{kind: kind, l: p.Limit, w: int64(p.Window / time.Microsecond), b: burst, inst: int64(opt.Proxies), lease: opt.Lease},
		opt:    opt,
		start:  tr.Start,
		global: make([]globalKey, len(tr.Keys)), exact: make([]globalKey, len(tr.Keys)),
		pools:    make([]map[int32]*pool, opt.Proxies),
		leaseWin: map[int32]*window{}, exactWin: map[int32]*window{},
		winNS: int64(p.Window),
	}
	r.exactM = r.m
	r.exactM.inst = 1
	for i := range r.pools {
		r.pools[i] = map[int32]*pool{}
	}
	tick := int64(100 * time.Millisecond)
	nextTick := tr.Start + tick
	for i, rq := range tr.Requests {
		for nextTick <= rq.At {
			r.noteHeld(nextTick)
			r.expire(nextTick, false)
			nextTick += tick
		}
		b := &r.res.Buckets[r.bucketOf(rq.At)]
		b.Offered++
		r.res.Offered++
		r.exactly(b, rq)
		r.leased(b, r.pools[i%opt.Proxies], rq)
	}
	r.noteHeld(tr.End)
	r.expire(tr.End, true)
	return r.res, nil
}

// checkLeaseRun checks RunLeases's arguments.
func checkLeaseRun(tr *Traffic, kind algorithms.Kind, p algorithms.Params, opt LeaseOptions) error {
	switch {
	case kind != algorithms.TokenBucket && kind != algorithms.FixedWindow:
		return errors.New("sim: leases exist for token_bucket and fixed_window only, not " + kind.String())
	case opt.Proxies < 1 || opt.Lease < 1:
		return errors.New("sim: leases need --proxies >= 1 and --lease >= 1")
	case p.Limit < 1 || p.Window < time.Microsecond || p.Window%time.Microsecond != 0:
		return errors.New("sim: leases need a limit >= 1 and a window of whole microseconds")
	case tr == nil || len(tr.Requests) == 0 || tr.End <= tr.Start:
		return errors.New("sim: no traffic")
	}
	return nil
}

// leaseRun is RunLeases's state: the global state with leases (m, global)
// and without (exactM, exact), each proxy's pools, the tokens held in
// pools, and the result being built.
type leaseRun struct {
	res                *LeaseResult
	m, exactM          leaseModel
	opt                LeaseOptions
	start              int64
	global, exact      []globalKey
	pools              []map[int32]*pool
	held               int64
	lastHeldBucket     int
	leaseWin, exactWin map[int32]*window
	winNS              int64
}

// stamp is the lease stamp at now (µs): its window's start for
// fixed_window.
func (r *leaseRun) stamp(now int64) int64 {
	if r.m.kind == algorithms.FixedWindow {
		return now / r.m.w * r.m.w
	}
	return 0
}

func (r *leaseRun) bucketOf(at int64) int {
	return min(int((at-r.start)/r.res.BucketWidth), len(r.res.Buckets)-1)
}

// noteHeld records held at time at: the peak of its bucket, and the value
// carried into every bucket entered since the last note.
func (r *leaseRun) noteHeld(at int64) {
	for b := r.bucketOf(at); r.lastHeldBucket < b; {
		r.lastHeldBucket++
		r.res.Buckets[r.lastHeldBucket].Held = max(r.res.Buckets[r.lastHeldBucket].Held, r.held)
	}
	r.res.Buckets[r.lastHeldBucket].Held = max(r.res.Buckets[r.lastHeldBucket].Held, r.held)
}

// giveBack returns pool pl of key k to the global state at time at.
func (r *leaseRun) giveBack(k int32, pl *pool, at int64) {
	r.m.giveBack(&r.global[k], at/1000, pl.tokens, pl.stamp)
	r.res.Returns++
	r.held -= pl.tokens
	pl.tokens = 0
	pl.want, pl.spent = max(pl.spent, 1), 0
}

// expire gives back the pools expired at time at (all: every pool).
func (r *leaseRun) expire(at int64, all bool) {
	for _, ps := range r.pools {
		for k, pl := range ps {
			if pl.tokens > 0 && (all || pl.expired(at)) {
				r.giveBack(k, pl, at)
			}
		}
	}
}

// exactly decides rq without leases: the global state decides each
// request.
func (r *leaseRun) exactly(b *LeaseBucket, rq Request) {
	if r.exactM.acquire(&r.exact[rq.Key], rq.At/1000, 1) == 1 {
		b.Exact++
		r.res.Exact++
		r.res.ExactMaxInWindow = max(r.res.ExactMaxInWindow, winFor(r.exactWin, rq.Key).push(rq.At, 1, r.winNS))
	}
}

// leased decides rq with leases: its proxy (pools ps) spends from its
// pool, or acquires.
func (r *leaseRun) leased(b *LeaseBucket, ps map[int32]*pool, rq Request) {
	now := rq.At / 1000
	pl := ps[rq.Key]
	if pl == nil {
		pl = &pool{}
		ps[rq.Key] = pl
	}
	if pl.tokens > 0 && pl.expired(rq.At) {
		r.giveBack(rq.Key, pl, rq.At)
	}
	if pl.tokens == 0 && rq.At < pl.until {
		return // the held denial: no call
	}
	if pl.tokens == 0 {
		r.res.Acquires++
		want := r.opt.Lease
		if pl.want > 0 {
			want = min(pl.want, r.opt.Lease)
		}
		g := r.m.acquire(&r.global[rq.Key], now, want)
		if g == 0 {
			pl.until = rq.At + min(r.m.wait(&r.global[rq.Key], now)*1000, int64(LeaseHold))
			return
		}
		exp := rq.At + int64(LeaseMaxLifetime)
		if r.m.kind == algorithms.FixedWindow {
			exp = min(exp, (r.stamp(now)+r.m.w)*1000)
		}
		if pl.want > 0 && pl.acquired > 0 && rq.At-pl.acquired < int64(LeaseIdle) {
			pl.want = min(2*pl.want, r.opt.Lease)
		}
		pl.tokens, pl.expiry, pl.stamp, pl.acquired, pl.spent = g, exp, r.stamp(now), rq.At, 0
		r.held += g
	}
	pl.tokens--
	pl.spent++
	pl.touched = rq.At
	r.held--
	b.Admitted++
	r.res.Admitted++
	r.res.MaxInWindow = max(r.res.MaxInWindow, winFor(r.leaseWin, rq.Key).push(rq.At, 1, r.winNS))
	r.res.MaxHeld = max(r.res.MaxHeld, r.held)
	r.noteHeld(rq.At)
}

func winFor(m map[int32]*window, k int32) *window {
	w := m[k]
	if w == nil {
		w = &window{}
		m[k] = w
	}
	return w
}

// WriteLeaseReport writes one self-contained HTML page for a lease run:
// global admissions with and without leases against the limit, and the
// admissions held in pools (the under-admission).
func WriteLeaseReport(w io.Writer, command string, tr *Traffic, r *LeaseResult) error {
	nb := len(r.Buckets)
	sec := func(i int) float64 { return float64(int64(i)*r.BucketWidth) / 1e9 }
	var offered, admitted, exact, held, under []svgchart.Point
	cum := int64(0)
	for i, b := range r.Buckets {
		x := sec(i)
		offered = append(offered, svgchart.Point{X: x, Y: float64(b.Offered)})
		admitted = append(admitted, svgchart.Point{X: x, Y: float64(b.Admitted)})
		exact = append(exact, svgchart.Point{X: x, Y: float64(b.Exact)})
		held = append(held, svgchart.Point{X: x, Y: float64(b.Held)})
		cum += b.Exact - b.Admitted
		under = append(under, svgchart.Point{X: sec(i + 1), Y: float64(cum)})
	}
	xMax := sec(nb)
	ticks := svgchart.DurationTicks(0, xMax, 6)
	bw := fmtBucketWidth(r.BucketWidth)
	perBucket := float64(r.Params.Limit) * float64(r.BucketWidth) / float64(r.Params.Window)
	adm := &svgchart.Chart{
		ID: "chart-lease-admitted", Title: "Global admissions: with leases vs without", Width: 560, Height: 220,
		XLabel: "time since start", YLabel: "requests per " + bw,
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "offered", Class: "offered", Color: "#bbbbbb", Kind: svgchart.StepArea, Points: offered},
			{Name: "without leases", Class: "exact", Color: "#54a24b", Kind: svgchart.Step, Points: exact},
			// Dashed: where the two agree, the green line shows between.
			{Name: "with leases", Class: "admitted", Color: "#2f7ed8", Dash: "5 4", Kind: svgchart.Step, Points: admitted},
		},
	}
	if perBucket >= 1 && !math.IsInf(perBucket, 0) {
		adm.Rules = []svgchart.Rule{{Y: perBucket, Label: "limit rate per " + bw, Class: "limit"}}
	}
	und := &svgchart.Chart{
		ID: "chart-lease-under", Title: "Under-admission", Width: 560, Height: 180,
		XLabel: "time since start", YLabel: "admissions",
		XMin: 0, XMax: xMax, XTicks: ticks, XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "most held in pools", Class: "held", Color: "#e45756", Kind: svgchart.Step, Points: held},
			{Name: "admitted without leases − with (cumulative)", Class: "under", Color: "#f58518", Kind: svgchart.Line, Points: under},
		},
		Rules: []svgchart.Rule{{Y: float64(int64(r.Proxies) * r.Lease), Label: "proxies × lease", Class: "bound"}},
	}
	var svgs [2]template.HTML
	for i, c := range []*svgchart.Chart{adm, und} {
		s, err := c.SVG()
		if err != nil {
			return fmt.Errorf("sim: lease chart: %w", err)
		}
		svgs[i] = template.HTML(s)
	}
	return leaseTemplate.Execute(w, map[string]any{
		"Command": command, "Traffic": tr.Description, "R": r, "Algorithm": r.Kind.String(),
		"Window": fmtDuration(r.Params.Window), "Admitted": svgs[0], "Under": svgs[1],
		"Calls": r.Acquires + r.Returns, "PerRequest": strconv.FormatFloat(float64(r.Acquires+r.Returns)/float64(max(r.Offered, 1)), 'f', 3, 64),
	})
}

var leaseTemplate = template.Must(template.New("lease").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="generator" content="sluice simulate">
<title>sluice simulate: leases</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }
code { font: 12px ui-monospace, monospace; background: #f0f0f0; padding: 1px 4px; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 12px; }
dt { color: #555; }
</style>
</head>
<body>
<h1>Leases: {{.R.Proxies}} proxies, lease {{.R.Lease}}</h1>
<p><code>{{.Command}}</code></p>
<p>{{.Traffic}} — {{.Algorithm}}, limit {{.R.Params.Limit}} per {{.Window}}.</p>
<section class="lease" data-proxies="{{.R.Proxies}}" data-lease="{{.R.Lease}}">
<dl>
<dt>offered</dt><dd data-metric="offered">{{.R.Offered}}</dd>
<dt>admitted with leases</dt><dd data-metric="admitted">{{.R.Admitted}}</dd>
<dt>admitted without leases</dt><dd data-metric="exact">{{.R.Exact}}</dd>
<dt>most admitted in any window, with leases</dt><dd data-metric="max-in-window">{{.R.MaxInWindow}}</dd>
<dt>most admitted in any window, without</dt><dd data-metric="exact-max-in-window">{{.R.ExactMaxInWindow}}</dd>
<dt>most held in pools</dt><dd data-metric="max-held">{{.R.MaxHeld}}</dd>
<dt>remote calls (acquires + returns)</dt><dd data-metric="calls">{{.Calls}}</dd>
<dt>calls per request</dt><dd data-metric="calls-per-request">{{.PerRequest}}</dd>
</dl>
{{.Admitted}}
{{.Under}}
<p>Pools hold admissions taken from the global state before they are spent, so the fleet never
admits more than the limit; what they hold unspent (at most proxies × lease) is missing elsewhere
until it is spent or returned (after a second without a spend, a fixed window's at its end).</p>
</section>
</body>
</html>
`))
