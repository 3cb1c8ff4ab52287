package svgchart

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// node is a generic XML element tree, enough to inspect our output.
type node struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Text    string     `xml:",chardata"`
	Nodes   []node     `xml:",any"`
}

func (n *node) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (n *node) hasClass(c string) bool {
	for _, f := range strings.Fields(n.attr("class")) {
		if f == c {
			return true
		}
	}
	return false
}

// find returns every descendant (and n itself) for which ok is true.
func (n *node) find(ok func(*node) bool) []*node {
	var out []*node
	if ok(n) {
		out = append(out, n)
	}
	for i := range n.Nodes {
		out = append(out, n.Nodes[i].find(ok)...)
	}
	return out
}

func byClass(c string) func(*node) bool { return func(n *node) bool { return n.hasClass(c) } }

func parse(t *testing.T, svg string) *node {
	t.Helper()
	var root node
	d := xml.NewDecoder(strings.NewReader(svg))
	d.Strict = true
	if err := d.Decode(&root); err != nil {
		t.Fatalf("output is not well-formed XML: %v\n%s", err, svg)
	}
	// Nothing may follow the root element but white space.
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("after root: %v", err)
		}
		if cd, ok := tok.(xml.CharData); !ok || strings.TrimSpace(string(cd)) != "" {
			t.Fatalf("unexpected token after root: %#v", tok)
		}
	}
	if root.XMLName.Local != "svg" || root.XMLName.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root is %v, want svg in the SVG namespace", root.XMLName)
	}
	return &root
}

func mustSVG(t *testing.T, c *Chart) string {
	t.Helper()
	s, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func pointsOf(t *testing.T, attr string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, f := range strings.Fields(attr) {
		xs, ys, ok := strings.Cut(f, ",")
		if !ok {
			t.Fatalf("bad point %q", f)
		}
		x, err1 := strconv.ParseFloat(xs, 64)
		y, err2 := strconv.ParseFloat(ys, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad point %q", f)
		}
		out = append(out, [2]float64{x, y})
	}
	return out
}

func TestLineScaling(t *testing.T) {
	// 200×100 image: plot area x ∈ [56, 188], y ∈ [28, 60].
	c := &Chart{Width: 200, Height: 100, XMin: 0, XMax: 10, YMin: 0, YMax: 4,
		Series: []Series{{Name: "s", Kind: Line, Points: []Point{{0, 0}, {5, 2}, {10, 4}}}}}
	root := parse(t, mustSVG(t, c))
	if root.attr("width") != "200" || root.attr("height") != "100" || root.attr("viewBox") != "0 0 200 100" {
		t.Fatalf("size attributes: %v", root.Attrs)
	}
	lines := root.find(func(n *node) bool { return n.XMLName.Local == "polyline" })
	if len(lines) != 1 {
		t.Fatalf("got %d polylines, want 1", len(lines))
	}
	got := pointsOf(t, lines[0].attr("points"))
	want := [][2]float64{{56, 60}, {122, 44}, {188, 28}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("points = %v, want %v", got, want)
	}
}

func TestValuesOutsideFixedDomainAreClamped(t *testing.T) {
	c := &Chart{Width: 200, Height: 100, XMin: 0, XMax: 10, YMin: 0, YMax: 4,
		Series: []Series{{Kind: Line, Points: []Point{{0, -3}, {10, 99}}}}}
	root := parse(t, mustSVG(t, c))
	got := pointsOf(t, root.find(func(n *node) bool { return n.XMLName.Local == "polyline" })[0].attr("points"))
	if want := [][2]float64{{56, 60}, {188, 28}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("points = %v, want %v", got, want)
	}
}

func TestStepAreaShape(t *testing.T) {
	c := &Chart{Width: 200, Height: 100, YMin: 0, YMax: 4,
		Series: []Series{{Kind: StepArea, Points: []Point{{0, 4}, {5, 2}}}}}
	root := parse(t, mustSVG(t, c))
	polys := root.find(func(n *node) bool { return n.XMLName.Local == "polygon" })
	if len(polys) != 1 {
		t.Fatalf("got %d polygons, want 1", len(polys))
	}
	// X domain spans 0..10 (the last step is as wide as the one before).
	got := pointsOf(t, polys[0].attr("points"))
	want := [][2]float64{{56, 28}, {122, 28}, {122, 44}, {188, 44}, {188, 60}, {56, 60}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("points = %v, want %v", got, want)
	}
}

func TestNaNSplitsSeries(t *testing.T) {
	nan := math.NaN()
	c := &Chart{Series: []Series{{Kind: Line, Points: []Point{{0, 1}, {1, 2}, {2, nan}, {3, nan}, {4, 1}, {5, 3}, {6, nan}}}}}
	root := parse(t, mustSVG(t, c))
	lines := root.find(func(n *node) bool { return n.XMLName.Local == "polyline" })
	if len(lines) != 2 {
		t.Fatalf("got %d polylines, want 2 (one per run)", len(lines))
	}
	for i, l := range lines {
		if n := len(pointsOf(t, l.attr("points"))); n != 2 {
			t.Errorf("run %d has %d points, want 2", i, n)
		}
	}
}

func TestAutoYDomainTicks(t *testing.T) {
	c := &Chart{Series: []Series{{Kind: Line, Points: []Point{{0, 3}, {1, 87}}}},
		Rules: []Rule{{Y: 100, Label: "limit", Class: "limit"}}}
	root := parse(t, mustSVG(t, c))
	axis := root.find(byClass("y-axis"))
	if len(axis) != 1 {
		t.Fatal("no y axis")
	}
	var vals []string
	for _, tick := range axis[0].find(byClass("tick")) {
		vals = append(vals, tick.attr("data-value"))
	}
	// Domain [0, 100] (the rule counts), step 20.
	if want := []string{"0", "20", "40", "60", "80", "100"}; !reflect.DeepEqual(vals, want) {
		t.Fatalf("y ticks = %v, want %v", vals, want)
	}
	rules := root.find(byClass("limit"))
	if len(rules) != 1 || rules[0].attr("data-value") != "100" {
		t.Fatalf("limit rule missing or wrong: %d", len(rules))
	}
}

func TestXTicksFormatAndBounds(t *testing.T) {
	c := &Chart{XMin: 0, XMax: 3600, XTicks: []float64{-60, 0, 900, 1800, 2700, 3600, 4000},
		XFormat: FormatDuration, Series: []Series{{Kind: Line, Points: []Point{{0, 1}, {3600, 1}}}}}
	root := parse(t, mustSVG(t, c))
	var labels []string
	for _, tick := range root.find(byClass("x-axis"))[0].find(byClass("tick")) {
		labels = append(labels, tick.find(func(n *node) bool { return n.XMLName.Local == "text" })[0].Text)
	}
	if want := []string{"0", "15m", "30m", "45m", "1h"}; !reflect.DeepEqual(labels, want) {
		t.Fatalf("x tick labels = %v, want %v", labels, want)
	}
}

func TestEscaping(t *testing.T) {
	evil := `<script>alert("x")</script> & 'q'` + "\x00\x01"
	clean := `<script>alert("x")</script> & 'q'`
	c := &Chart{ID: `a"b`, Title: evil, XLabel: evil, YLabel: evil,
		Series: []Series{{Name: evil, Class: `x" onload="y`, Color: `red"/><script>`, Kind: Step, Points: []Point{{0, 1}, {1, 2}}}},
		Rules:  []Rule{{Y: 1, Label: evil}}}
	out := mustSVG(t, c)
	if strings.Contains(out, "<script") {
		t.Fatalf("unescaped markup in output:\n%s", out)
	}
	root := parse(t, out)
	if root.attr("id") != `a"b` {
		t.Errorf("id = %q", root.attr("id"))
	}
	titles := root.find(func(n *node) bool { return n.XMLName.Local == "title" })
	if len(titles) != 1 || titles[0].Text != clean {
		t.Errorf("title round trip = %q, want %q", titles[0].Text, clean)
	}
	series := root.find(byClass("series"))
	if len(series) != 1 || series[0].attr("data-name") != clean {
		t.Fatalf("series name round trip failed")
	}
	if got := series[0].attr("class"); got != "series x onloady" {
		t.Errorf("class = %q, want sanitised", got)
	}
	if root.find(func(n *node) bool { return n.attr("onload") != "" }) != nil {
		t.Error("attribute injection through class")
	}
}

func TestDeterministic(t *testing.T) {
	mk := func() *Chart {
		return &Chart{Title: "t", Series: []Series{
			{Name: "a", Kind: StepArea, Points: []Point{{0, 1.23456}, {1, 2}, {2, math.NaN()}, {3, 7}}},
			{Name: "b", Kind: Line, Points: []Point{{0, 1.0 / 3}, {3, 2.0 / 3}}},
		}}
	}
	a, b := mustSVG(t, mk()), mustSVG(t, mk())
	if a != b {
		t.Fatal("two renders of equal charts differ")
	}
	// Coordinates have at most two decimals.
	for _, f := range strings.FieldsFunc(a, func(r rune) bool { return r == '"' || r == ' ' || r == ',' }) {
		if i := strings.IndexByte(f, '.'); i >= 0 {
			if _, err := strconv.ParseFloat(f, 64); err == nil && len(f)-i-1 > 2 {
				t.Fatalf("number %q has more than two decimals", f)
			}
		}
	}
}

func TestEmptyAndDegenerate(t *testing.T) {
	for name, c := range map[string]*Chart{
		"no series":   {},
		"empty":       {Series: []Series{{Kind: Line}}},
		"single":      {Series: []Series{{Kind: Step, Points: []Point{{5, 0}}}}},
		"all nan":     {Series: []Series{{Kind: Line, Points: []Point{{0, math.NaN()}}}}},
		"flat zeroes": {Series: []Series{{Kind: StepArea, Points: []Point{{0, 0}, {1, 0}}}}},
		"negative":    {Series: []Series{{Kind: Line, Points: []Point{{0, -5}, {1, -1}}}}},
	} {
		t.Run(name, func(t *testing.T) { parse(t, mustSVG(t, c)) })
	}
}

func TestInvalid(t *testing.T) {
	for name, c := range map[string]*Chart{
		"too small":    {Width: 50, Height: 50},
		"inf point":    {Series: []Series{{Points: []Point{{0, math.Inf(1)}}}}},
		"nan x":        {Series: []Series{{Points: []Point{{math.NaN(), 1}}}}},
		"x decreasing": {Series: []Series{{Points: []Point{{1, 1}, {0, 1}}}}},
		"bad kind":     {Series: []Series{{Kind: 9, Points: []Point{{0, 1}}}}},
		"nan domain":   {YMax: math.NaN()},
		"inf rule":     {Rules: []Rule{{Y: math.Inf(-1)}}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := c.SVG(); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		n      int
		want   []float64
	}{
		{0, 100, 5, []float64{0, 20, 40, 60, 80, 100}},
		{0, 1, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		{0.1, 0.35, 5, []float64{0.1, 0.15, 0.2, 0.25, 0.3, 0.35}},
		{-7, 7, 4, []float64{-5, 0, 5}},
		{0, 230, 5, []float64{0, 50, 100, 150, 200}},
		{3, 3, 5, nil},
		{0, math.Inf(1), 5, nil},
	} {
		if got := NiceTicks(tc.lo, tc.hi, tc.n); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("NiceTicks(%v, %v, %d) = %v, want %v", tc.lo, tc.hi, tc.n, got, tc.want)
		}
	}
}

func TestDurationTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   []float64
	}{
		{0, 600, []float64{0, 120, 240, 360, 480, 600}},
		{0, 86400, []float64{0, 21600, 43200, 64800, 86400}},
		{0, 1, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		{30, 200, []float64{30, 60, 90, 120, 150, 180}},
	} {
		if got := DurationTicks(tc.lo, tc.hi, 6); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("DurationTicks(%v, %v) = %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 0.25: "250ms", 45: "45s", 90: "1m30s", 7200: "2h", 86400 + 6*3600: "1d6h", 61.5: "1m1.5s", -60: "-1m"} {
		if got := FormatDuration(in); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[float64]string{0: "0", 1.23456: "1.235", 100: "100", 12500: "12.5k", 3e6: "3M", -20000: "-20k"} {
		if got := FormatNumber(in); got != want {
			t.Errorf("FormatNumber(%v) = %q, want %q", in, got, want)
		}
	}
}

// TestLegendClearOfTitle: a legend that does not fit beside the title goes
// on rows of its own below it, wrapped inside the image, and the plot
// starts below the last row; a short one stays on the title's row, right of
// the title. No entry overlaps the title or another entry.
func TestLegendClearOfTitle(t *testing.T) {
	pts := []Point{{0, 1}, {1, 2}}
	for _, tc := range []struct {
		title string
		names []string
		rows  int // 0: on the title's row
	}{
		{"Under-admission", []string{"held in pools", "admitted without leases − with (cumulative)"}, 1},
		{"Global admissions: with leases vs without", []string{"offered", "without leases", "with leases"}, 1},
		{"Requests", []string{"a", "b"}, 0},
		{"", []string{"offered", "admitted"}, 0},
		{"A title", []string{strings.Repeat("x", 40), strings.Repeat("y", 40), strings.Repeat("z", 40)}, 3},
	} {
		c := &Chart{Title: tc.title, Width: 560, Height: 240}
		for _, n := range tc.names {
			c.Series = append(c.Series, Series{Name: n, Points: pts})
		}
		root := parse(t, mustSVG(t, c))
		titleEnd := marginLeft + titleCharWidth*float64(len([]rune(tc.title)))
		plotTop, _ := strconv.ParseFloat(root.find(byClass("plot"))[0].attr("y"), 64)
		type box struct{ x0, x1, y0, y1 float64 }
		var boxes []box
		rowsSeen := map[float64]bool{}
		for _, e := range root.find(byClass("entry")) {
			r := e.Nodes[0]
			x, _ := strconv.ParseFloat(r.attr("x"), 64)
			y, _ := strconv.ParseFloat(r.attr("y"), 64)
			w, _ := strconv.ParseFloat(e.attr("data-width"), 64)
			b := box{x, x + w, y, y + 10}
			if b.x0 < 0 || b.x1 > 560 {
				t.Errorf("%q: entry %v outside the image", tc.title, b)
			}
			if tc.title != "" && b.y0 < 20 && b.x0 < titleEnd {
				t.Errorf("%q: entry %v over the title (ends at x %.0f)", tc.title, b, titleEnd)
			}
			if b.y1 > plotTop {
				t.Errorf("%q: entry %v below the plot's top %.0f", tc.title, b, plotTop)
			}
			for _, o := range boxes {
				if b.x0 < o.x1 && o.x0 < b.x1 && b.y0 < o.y1 && o.y0 < b.y1 {
					t.Errorf("%q: entries %v and %v overlap", tc.title, b, o)
				}
			}
			boxes = append(boxes, b)
			if y > 8 {
				rowsSeen[y] = true
			}
		}
		if len(boxes) != len(tc.names) || len(rowsSeen) != tc.rows {
			t.Errorf("%q: %d entries on %d rows of their own, want %d on %d", tc.title, len(boxes), len(rowsSeen), len(tc.names), tc.rows)
		}
	}
}
