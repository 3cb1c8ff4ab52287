// Package svgchart draws small, static line and step charts as plain SVG.
//
// It exists so that reports (the `sluice simulate` HTML report) can embed
// charts without scripts, fonts or network access. The output is a pure
// function of the Chart value: the same Chart always renders the same bytes,
// numbers are printed with fixed precision, and every text (title, labels,
// series names) is XML-escaped. The package imports only the standard library.
//
// A Chart is a plain value; rendering does not modify it and is safe to call
// from several goroutines on distinct or shared Charts.
package svgchart

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Kind selects how a series is drawn.
type Kind uint8

const (
	// Line joins the points with straight segments.
	Line Kind = iota
	// Step draws each point as a flat segment from its X to the next
	// point's X (the last one extends by the same width as the one before),
	// the natural shape for bucketed counts.
	Step
	// StepArea is a Step series filled down to the X axis.
	StepArea
)

// Point is one (x, y) sample. A NaN Y is a gap: the series is interrupted.
type Point struct {
	X, Y float64
}

// Series is one named set of points, in increasing X order.
type Series struct {
	// Name is shown in the legend.
	Name string
	// Class is added to the series' SVG element (with "series"), so pages
	// and tests can style or find it. Only [A-Za-z0-9_-] are kept.
	Class string
	// Color is any SVG color ("#1f77b4", "steelblue"); default a palette entry.
	Color string
	// Dash, when set, is the stroke-dasharray of a Line or Step ("5 3"), so
	// that a series drawn over an equal one leaves it visible.
	Dash   string
	Kind   Kind
	Points []Point
}

// Rule is a horizontal reference line (a limit, a threshold).
type Rule struct {
	Y     float64
	Label string
	Class string
}

// Chart describes one chart. The zero values of the optional fields pick
// sensible defaults.
type Chart struct {
	// ID is the id attribute of the <svg> element (escaped); optional.
	ID string
	// Title is drawn above the plot and put in the <title> element.
	Title string
	// Width and Height of the whole image in pixels; defaults 640×240.
	Width, Height int
	// XLabel and YLabel name the axes; optional.
	XLabel, YLabel string
	// XMin/XMax fix the X domain; when equal the domain spans the points.
	XMin, XMax float64
	// YMin/YMax fix the Y domain; when equal the domain is [min(0, lowest),
	// highest] widened to nice tick values.
	YMin, YMax float64
	// XTicks, when set, are the X tick positions (those outside the domain
	// are dropped); otherwise NiceTicks picks about 6.
	XTicks []float64
	// XFormat and YFormat print tick values; default FormatNumber.
	XFormat, YFormat func(float64) string
	Series           []Series
	Rules            []Rule
}

// Palette is the default series colours, in order.
var Palette = []string{"#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2"}

// Layout margins in pixels (left room for Y tick labels, bottom for X).
const (
	marginLeft   = 56
	marginRight  = 12
	marginTop    = 28
	marginBottom = 40
)

// ErrInvalid is wrapped by every error about an unrenderable Chart.
var ErrInvalid = errors.New("svgchart: invalid chart")

// SVG renders the chart and returns the markup of one <svg> element.
func (c *Chart) SVG() (string, error) {
	var b strings.Builder
	if err := c.Render(&b); err != nil {
		return "", err
	}
	return b.String(), nil
}

// Render writes the chart as one <svg> element to w.
func (c *Chart) Render(w io.Writer) error {
	width, height, err := c.size()
	if err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	f := c.layout(width, height)
	if f.bottom-f.top < 10 {
		return fmt.Errorf("%w: size %dx%d leaves no room for the plot under the title and legend", ErrInvalid, width, height)
	}
	e := &errWriter{w: w}
	c.writeHeader(e, f)
	c.writeYAxis(e, f)
	c.writeXAxis(e, f)
	if err := c.writeSeries(e, f); err != nil {
		return err
	}
	c.writeRules(e, f)
	c.writeLegend(e, f)
	e.printf("</svg>\n")
	return e.err
}

// size returns the image size, defaults applied, or an error when the plot
// would have no room.
func (c *Chart) size() (width, height int, err error) {
	width, height = c.Width, c.Height
	if width == 0 {
		width = 640
	}
	if height == 0 {
		height = 240
	}
	if width < marginLeft+marginRight+10 || height < marginTop+marginBottom+10 {
		return 0, 0, fmt.Errorf("%w: size %dx%d is too small", ErrInvalid, width, height)
	}
	return width, height, nil
}

// validate refuses points, rules and domains that cannot be placed: non-finite
// values (a NaN Y is a gap, allowed) and X going backwards within a series.
func (c *Chart) validate() error {
	for i, s := range c.Series {
		prev := math.Inf(-1)
		for j, p := range s.Points {
			if math.IsNaN(p.X) || math.IsInf(p.X, 0) || math.IsInf(p.Y, 0) {
				return fmt.Errorf("%w: series %d point %d is not finite", ErrInvalid, i, j)
			}
			if p.X < prev {
				return fmt.Errorf("%w: series %d point %d: X decreases", ErrInvalid, i, j)
			}
			prev = p.X
		}
	}
	for i, r := range c.Rules {
		if !finite(r.Y) {
			return fmt.Errorf("%w: rule %d is not finite", ErrInvalid, i)
		}
	}
	if !finite(c.XMin) || !finite(c.XMax) || !finite(c.YMin) || !finite(c.YMax) {
		return fmt.Errorf("%w: domain is not finite", ErrInvalid)
	}
	return nil
}

// frame is the geometry of one rendering: the image size, the plot area in
// pixels, the data domain it shows, the ticks and how their labels print.
type frame struct {
	width, height            int
	left, right, top, bottom float64 // the plot area
	x0, x1, y0, y1           float64 // the data domain
	xTicks, yTicks           []float64
	xFormat, yFormat         func(float64) string
	legend                   []legendEntry
}

// legendEntry is where one series' legend swatch goes (its top left); the
// name is drawn right of it.
type legendEntry struct {
	x, y float64
}

// Text widths are estimated, as the chart has no font metrics: about 6 px
// per character of a 10 px label (wide enough for system-ui and Arial), 7.5
// px per character of the 13 px bold title. A legend entry is a 10 px
// swatch, 3 px, the name and a 10 px gap.
const (
	labelCharWidth = 6
	titleCharWidth = 7.5
	legendRow      = 14 // the height of one row of legend entries
	legendGap      = 10
)

// legendWidth is the width of a series' legend entry: its swatch (a square,
// or for a dashed line a stretch of the line long enough to show the dash),
// 3 px, its name.
func legendWidth(s Series) float64 {
	return swatchWidth(s) + 3 + float64(labelCharWidth*len([]rune(s.Name)))
}

func swatchWidth(s Series) float64 {
	if s.Dash != "" && s.Kind != StepArea {
		return 22
	}
	return 10
}

// layoutLegend places the legend entries and returns how far below the
// usual top margin the plot must start. The legend shares the title's row,
// right-aligned, when all of it fits to the right of the title; otherwise
// it takes rows of its own below the title, entries laid out left to right
// from the plot's left edge and wrapped at its right edge, so that no entry
// is drawn over the title or outside the image.
func (c *Chart) layoutLegend(f *frame) (extra float64) {
	if len(c.Series) == 0 {
		return 0
	}
	total := 0.0
	for i, s := range c.Series {
		if i > 0 {
			total += legendGap
		}
		total += legendWidth(s)
	}
	titleEnd := f.left
	if c.Title != "" {
		titleEnd += titleCharWidth*float64(len([]rune(c.Title))) + 2*legendGap
	}
	f.legend = make([]legendEntry, len(c.Series))
	if titleEnd+total <= f.right {
		x := f.right - total
		for i, s := range c.Series {
			f.legend[i] = legendEntry{x: x, y: 8}
			x += legendWidth(s) + legendGap
		}
		return 0
	}
	y := 8.0
	if c.Title != "" {
		y = 22 // below the title's baseline (16) and descenders
	}
	x := f.left
	for i, s := range c.Series {
		w := legendWidth(s)
		if x > f.left && x+w > f.right {
			x, y = f.left, y+legendRow
		}
		f.legend[i] = legendEntry{x: x, y: y}
		x += w + legendGap
	}
	// The plot starts as far below the last row as it starts below a
	// legend on the title's row (whose top is 8).
	return y - 8
}

// layout computes the geometry for an image of the given size.
func (c *Chart) layout(width, height int) *frame {
	f := &frame{
		width: width, height: height,
		left: marginLeft, right: float64(width - marginRight),
		top: marginTop, bottom: float64(height - marginBottom),
		xTicks: c.XTicks, xFormat: c.XFormat, yFormat: c.YFormat,
	}
	f.top += c.layoutLegend(f)
	f.x0, f.x1 = c.xDomain()
	f.y0, f.y1, f.yTicks = c.yDomain()
	if f.xTicks == nil {
		f.xTicks = NiceTicks(f.x0, f.x1, 6)
	}
	if f.xFormat == nil {
		f.xFormat = FormatNumber
	}
	if f.yFormat == nil {
		f.yFormat = FormatNumber
	}
	return f
}

// sx maps a data X to a pixel column.
func (f *frame) sx(x float64) float64 {
	return f.left + (x-f.x0)/(f.x1-f.x0)*(f.right-f.left)
}

// sy maps a data Y to a pixel row.
func (f *frame) sy(y float64) float64 {
	// Clamp so a value outside a fixed domain stays inside the plot.
	y = math.Max(f.y0, math.Min(f.y1, y))
	return f.bottom - (y-f.y0)/(f.y1-f.y0)*(f.bottom-f.top)
}

// writeHeader opens the <svg> element and draws the title and the plot frame.
func (c *Chart) writeHeader(e *errWriter, f *frame) {
	e.printf(`<svg xmlns="http://www.w3.org/2000/svg" class="svgchart"`)
	if c.ID != "" {
		e.printf(` id="%s"`, esc(c.ID))
	}
	e.printf(` width="%d" height="%d" viewBox="0 0 %d %d" role="img"`, f.width, f.height, f.width, f.height)
	if c.Title != "" {
		e.printf(` aria-label="%s"`, esc(c.Title))
	}
	e.printf(">\n")
	if c.Title != "" {
		e.printf("<title>%s</title>\n", esc(c.Title))
		e.printf(`<text class="title" x="%s" y="16" font-size="13" font-weight="bold">%s</text>`+"\n", num(f.left), esc(c.Title))
	}
	e.printf(`<rect class="plot" x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#ccc"/>`+"\n",
		num(f.left), num(f.top), num(f.right-f.left), num(f.bottom-f.top))
}

// writeYAxis draws the Y grid lines, their labels and the axis label.
func (c *Chart) writeYAxis(e *errWriter, f *frame) {
	e.printf(`<g class="axis y-axis" font-size="10" text-anchor="end">` + "\n")
	for _, v := range f.yTicks {
		y := f.sy(v)
		e.printf(`<g class="tick" data-value="%s"><line x1="%s" x2="%s" y1="%s" y2="%s" stroke="#eee"/><text x="%s" y="%s">%s</text></g>`+"\n",
			num(v), num(f.left), num(f.right), num(y), num(y), num(f.left-4), num(y+3), esc(f.yFormat(v)))
	}
	if c.YLabel != "" {
		e.printf(`<text class="label" transform="translate(12 %s) rotate(-90)" text-anchor="middle">%s</text>`+"\n", num((f.top+f.bottom)/2), esc(c.YLabel))
	}
	e.printf("</g>\n")
}

// writeXAxis draws the X tick marks inside the domain, their labels and the
// axis label.
func (c *Chart) writeXAxis(e *errWriter, f *frame) {
	e.printf(`<g class="axis x-axis" font-size="10" text-anchor="middle">` + "\n")
	for _, v := range f.xTicks {
		if v < f.x0 || v > f.x1 || !finite(v) {
			continue
		}
		x := f.sx(v)
		e.printf(`<g class="tick" data-value="%s"><line x1="%s" x2="%s" y1="%s" y2="%s" stroke="#999"/><text x="%s" y="%s">%s</text></g>`+"\n",
			num(v), num(x), num(x), num(f.bottom), num(f.bottom+4), num(x), num(f.bottom+15), esc(f.xFormat(v)))
	}
	if c.XLabel != "" {
		e.printf(`<text class="label" x="%s" y="%s">%s</text>`+"\n", num((f.left+f.right)/2), num(float64(f.height)-6), esc(c.XLabel))
	}
	e.printf("</g>\n")
}

// writeSeries draws each series as a group with one shape per run of points
// between gaps: a polyline, or for StepArea a polygon closed along the X axis.
func (c *Chart) writeSeries(e *errWriter, f *frame) error {
	for i, s := range c.Series {
		color := seriesColor(s, i)
		e.printf(`<g class="%s" data-name="%s">`+"\n", classAttr("series", s.Class), esc(s.Name))
		for _, rg := range runs(s.Points) {
			pts, ok := f.points(s, rg)
			if !ok {
				return fmt.Errorf("%w: series %d has unknown kind %d", ErrInvalid, i, s.Kind)
			}
			if s.Kind == StepArea {
				base := num(f.sy(math.Max(f.y0, 0)))
				pts = append(pts, num(f.sx(stepEnd(s.Points, rg[1]-1)))+","+base, num(f.sx(s.Points[rg[0]].X))+","+base)
				e.printf(`<polygon points="%s" fill="%s" fill-opacity="0.55" stroke="%s" stroke-width="1"/>`+"\n", strings.Join(pts, " "), esc(color), esc(color))
			} else {
				dash := ""
				if s.Dash != "" {
					dash = ` stroke-dasharray="` + esc(s.Dash) + `"`
				}
				e.printf(`<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"%s/>`+"\n", strings.Join(pts, " "), esc(color), dash)
			}
		}
		e.printf("</g>\n")
	}
	return nil
}

// points returns the pixel coordinates ("x,y") tracing s.Points[rg[0]:rg[1]]:
// each point for a Line, each point and the end of its step for the Step
// kinds. ok is false for an unknown kind.
func (f *frame) points(s Series, rg [2]int) (pts []string, ok bool) {
	pts = make([]string, 0, 2*(rg[1]-rg[0])+2)
	for k := rg[0]; k < rg[1]; k++ {
		p := s.Points[k]
		switch s.Kind {
		case Line:
			pts = append(pts, num(f.sx(p.X))+","+num(f.sy(p.Y)))
		case Step, StepArea:
			pts = append(pts, num(f.sx(p.X))+","+num(f.sy(p.Y)), num(f.sx(stepEnd(s.Points, k)))+","+num(f.sy(p.Y)))
		default:
			return nil, false
		}
	}
	return pts, true
}

// writeRules draws the horizontal reference lines and their labels.
func (c *Chart) writeRules(e *errWriter, f *frame) {
	for _, r := range c.Rules {
		y := f.sy(r.Y)
		e.printf(`<g class="%s" data-value="%s"><line x1="%s" x2="%s" y1="%s" y2="%s" stroke="#d62728" stroke-dasharray="4 3"/>`,
			classAttr("rule", r.Class), num(r.Y), num(f.left), num(f.right), num(y), num(y))
		if r.Label != "" {
			// Inside the plot at the left: below a line in the upper half,
			// above one in the lower half, so the label stays off the X axis
			// and clear of the legend.
			ly := y + 11
			if y > (f.top+f.bottom)/2 {
				ly = y - 4
			}
			e.printf(`<text x="%s" y="%s" font-size="10" fill="#d62728">%s</text>`, num(f.left+3), num(ly), esc(r.Label))
		}
		e.printf("</g>\n")
	}
}

// writeLegend draws the series names where layoutLegend placed them: beside
// the title when they fit, else in rows of their own below it.
func (c *Chart) writeLegend(e *errWriter, f *frame) {
	if len(c.Series) == 0 {
		return
	}
	e.printf(`<g class="legend" font-size="10">` + "\n")
	for i, s := range c.Series {
		p := f.legend[i]
		sw := swatchWidth(s)
		e.printf(`<g class="entry" data-width="%s">`, num(legendWidth(s)))
		if sw > 10 {
			e.printf(`<line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`,
				num(p.x), num(p.x+sw), num(p.y+5), num(p.y+5), esc(seriesColor(s, i)), esc(s.Dash))
		} else {
			e.printf(`<rect x="%s" y="%s" width="10" height="10" fill="%s"/>`, num(p.x), num(p.y), esc(seriesColor(s, i)))
		}
		e.printf(`<text x="%s" y="%s">%s</text></g>`+"\n", num(p.x+sw+3), num(p.y+9), esc(s.Name))
	}
	e.printf("</g>\n")
}

// seriesColor is the colour of the i-th series: its own, or a palette entry.
func seriesColor(s Series, i int) string {
	if s.Color != "" {
		return s.Color
	}
	return Palette[i%len(Palette)]
}

// classAttr is the class attribute of an element: base, plus the caller's
// class when anything of it survives sanitizeClass.
func classAttr(base, extra string) string {
	if cl := sanitizeClass(extra); cl != "" {
		return base + " " + cl
	}
	return base
}

// xDomain returns the X range: the fixed one, or the span of the points.
func (c *Chart) xDomain() (float64, float64) {
	if c.XMin != c.XMax {
		return math.Min(c.XMin, c.XMax), math.Max(c.XMin, c.XMax)
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for k, p := range s.Points {
			lo = math.Min(lo, p.X)
			end := p.X
			if s.Kind != Line {
				end = stepEnd(s.Points, k)
			}
			hi = math.Max(hi, end)
		}
	}
	if lo > hi { // no points
		return 0, 1
	}
	if lo == hi {
		return lo, lo + 1
	}
	return lo, hi
}

// yDomain returns the Y range and its ticks.
func (c *Chart) yDomain() (float64, float64, []float64) {
	if c.YMin != c.YMax {
		lo, hi := math.Min(c.YMin, c.YMax), math.Max(c.YMin, c.YMax)
		return lo, hi, NiceTicks(lo, hi, 5)
	}
	lo, hi := 0.0, math.Inf(-1)
	for _, s := range c.Series {
		for _, p := range s.Points {
			if !math.IsNaN(p.Y) {
				lo = math.Min(lo, p.Y)
				hi = math.Max(hi, p.Y)
			}
		}
	}
	for _, r := range c.Rules {
		lo = math.Min(lo, r.Y)
		hi = math.Max(hi, r.Y)
	}
	if hi <= lo {
		hi = lo + 1
	}
	// Widen to the enclosing ticks so the top grid line bounds the data.
	step := niceStep(lo, hi, 5)
	lo = math.Floor(lo/step) * step
	hi = math.Ceil(hi/step) * step
	return lo, hi, NiceTicks(lo, hi, 5)
}

// runs splits points into maximal index ranges [from, to) of non-NaN Y.
func runs(points []Point) [][2]int {
	var out [][2]int
	start := -1
	for i, p := range points {
		switch {
		case math.IsNaN(p.Y) && start >= 0:
			out = append(out, [2]int{start, i})
			start = -1
		case !math.IsNaN(p.Y) && start < 0:
			start = i
		}
	}
	if start >= 0 {
		out = append(out, [2]int{start, len(points)})
	}
	return out
}

// stepEnd is the X where the step starting at points[k] ends: the next
// point's X (gaps included), or, for the last point, one step width past it
// (1 when there is a single point).
func stepEnd(points []Point, k int) float64 {
	switch {
	case k+1 < len(points):
		return points[k+1].X
	case k >= 1:
		return points[k].X + (points[k].X - points[k-1].X)
	}
	return points[k].X + 1
}

// NiceTicks returns about n tick values covering [lo, hi] at a step of
// 1, 2 or 5 times a power of ten, starting at the first multiple of the
// step not below lo.
func NiceTicks(lo, hi float64, n int) []float64 {
	if !finite(lo) || !finite(hi) || hi <= lo || n < 1 {
		return nil
	}
	step := niceStep(lo, hi, n)
	return ticksEvery(lo, hi, step)
}

// ticksEvery lists the multiples of step in [lo, hi] (at most 1000).
func ticksEvery(lo, hi, step float64) []float64 {
	var out []float64
	first := math.Ceil(lo/step-1e-9) * step
	for i := 0; i < 1000; i++ {
		v := first + float64(i)*step
		if v > hi+step*1e-9 {
			break
		}
		out = append(out, clean(v))
	}
	return out
}

func niceStep(lo, hi float64, n int) float64 {
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / mag; {
	case f <= 1:
		return mag
	case f <= 2:
		return 2 * mag
	case f <= 5:
		return 5 * mag
	default:
		return 10 * mag
	}
}

// durationSteps are the tick steps, in seconds, that DurationTicks picks
// from: round numbers of seconds, minutes, hours and days.
var durationSteps = []float64{
	0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
	1, 2, 5, 10, 15, 30,
	60, 120, 300, 600, 900, 1800,
	3600, 7200, 10800, 21600, 43200,
	86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400,
}

// DurationTicks returns tick values for an axis in seconds: multiples of
// the smallest round duration (1s, 15s, 1m, 5m, 1h, 6h, 1d, ...) that
// gives at most about n ticks over [lo, hi].
func DurationTicks(lo, hi float64, n int) []float64 {
	if !finite(lo) || !finite(hi) || hi <= lo || n < 1 {
		return nil
	}
	step := durationSteps[len(durationSteps)-1]
	for _, s := range durationSteps {
		if (hi-lo)/s <= float64(n) {
			step = s
			break
		}
	}
	return ticksEvery(lo, hi, step)
}

// FormatDuration prints a number of seconds compactly: "0", "500ms",
// "45s", "1m30s", "2h", "1d6h".
func FormatDuration(sec float64) string {
	if sec == 0 {
		return "0"
	}
	sign := ""
	if sec < 0 {
		sign, sec = "-", -sec
	}
	if sec < 1 {
		return sign + FormatNumber(math.Round(sec*1e6)/1e3) + "ms"
	}
	ms := int64(math.Round(sec * 1000))
	var b strings.Builder
	b.WriteString(sign)
	units := []struct {
		name string
		ms   int64
	}{{"d", 86400000}, {"h", 3600000}, {"m", 60000}}
	for _, u := range units {
		if ms >= u.ms {
			b.WriteString(strconv.FormatInt(ms/u.ms, 10) + u.name)
			ms %= u.ms
		}
	}
	if ms > 0 {
		b.WriteString(FormatNumber(float64(ms)/1000) + "s")
	}
	return b.String()
}

// FormatNumber prints v with at most three decimals and no trailing zeros;
// values of 10,000 and more get a k/M suffix ("12.5k", "3M").
func FormatNumber(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return strconv.FormatFloat(math.Round(v/1e4)/1e2, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(math.Round(v/1e1)/1e2, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}

// num prints a coordinate with two decimals, trailing zeros removed, so the
// output is deterministic and compact.
func num(v float64) string {
	s := strconv.FormatFloat(v, 'f', 2, 64)
	s = strings.TrimRight(s, "0")
	s = strings.TrimSuffix(s, ".")
	if s == "-0" {
		s = "0"
	}
	return s
}

// clean removes float noise (0.30000000000000004 → 0.3) and -0.
func clean(v float64) float64 {
	v, _ = strconv.ParseFloat(strconv.FormatFloat(v, 'g', 12, 64), 64)
	if v == 0 {
		return 0
	}
	return v
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// esc escapes s for use in XML text and double-quoted attributes.
func esc(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '&':
			b.WriteString("&amp;")
		case '<':
			b.WriteString("&lt;")
		case '>':
			b.WriteString("&gt;")
		case '"':
			b.WriteString("&#34;")
		case '\'':
			b.WriteString("&#39;")
		default:
			// Drop characters XML 1.0 forbids (control characters).
			if r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0xFFFE || r == 0xFFFF {
				continue
			}
			b.WriteRune(r)
		}
	}
	return b.String()
}

func sanitizeClass(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == ' ' {
			b.WriteRune(r)
		}
	}
	return strings.TrimSpace(b.String())
}

type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err != nil {
		return
	}
	_, e.err = fmt.Fprintf(e.w, format, args...)
}
