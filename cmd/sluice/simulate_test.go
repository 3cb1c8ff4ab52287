package main

import (
	"bytes"
	"context"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"golang.org/x/net/html"
)

func runSim(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	code = dispatch(append([]string{"simulate"}, args...), &o, &e)
	return o.String(), e.String(), code
}

// section is what a report shows for one rule/algorithm.
type section struct {
	attrs   map[string]string
	metrics map[string]int64
	charts  int
}

// parseReport reads the sections of a report the way a reader sees them:
// the numbers are the text of the <dd data-metric> elements.
func parseReport(t *testing.T, page []byte) map[string]section {
	t.Helper()
	doc, err := html.Parse(bytes.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	attrs := func(n *html.Node) map[string]string {
		m := map[string]string{}
		for _, a := range n.Attr {
			m[a.Key] = a.Val
		}
		return m
	}
	text := func(n *html.Node) string {
		var b strings.Builder
		for c := range n.Descendants() {
			if c.Type == html.TextNode {
				b.WriteString(c.Data)
			}
		}
		return strings.TrimSpace(b.String())
	}
	out := map[string]section{}
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode || n.Data != "section" || attrs(n)["class"] != "algo" {
			continue
		}
		s := section{attrs: attrs(n), metrics: map[string]int64{}}
		for c := range n.Descendants() {
			if c.Type != html.ElementNode {
				continue
			}
			if m := attrs(c)["data-metric"]; c.Data == "dd" && m != "" {
				v, err := strconv.ParseInt(text(c), 10, 64)
				if err != nil {
					t.Fatalf("metric %s shows %q", m, text(c))
				}
				s.metrics[m] = v
			}
			if c.Data == "svg" {
				s.charts++
			}
		}
		out[s.attrs["data-name"]] = s
	}
	return out
}

// The simulator end to end through the command.
func TestSimulateCompareBoundaryBurst(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.html")
	stdout, stderr, code := runSim(t, "--compare", "--limit", "100", "--window", "1m", "--traffic", "boundary-burst", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"fixed_window    fixed_window    100/1m", "report written to " + out} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	secs := parseReport(t, page)
	if len(secs) != 5 {
		t.Fatalf("%d sections, want 5", len(secs))
	}
	for name, s := range secs {
		if s.attrs["data-algorithm"] != name || s.charts != 2 || s.attrs["data-limit"] != "100" || s.attrs["data-window"] != "1m" {
			t.Errorf("%s: %v, %d charts", name, s.attrs, s.charts)
		}
		if s.metrics["admitted"]+s.metrics["denied"] != 1800 || s.metrics["state-bytes"] <= 0 {
			t.Errorf("%s: metrics %v", name, s.metrics)
		}
		if strconv.FormatInt(s.metrics["max-in-window"], 10) != s.attrs["data-max-in-window"] {
			t.Errorf("%s: shown %d, attribute %s", name, s.metrics["max-in-window"], s.attrs["data-max-in-window"])
		}
	}
	if got := secs["fixed_window"].metrics["max-in-window"]; got != 200 {
		t.Errorf("fixed_window max in window = %d, want 200", got)
	}
	if got := secs["sliding_log"].metrics["max-in-window"]; got > 100 || got < 1 {
		t.Errorf("sliding_log max in window = %d, want 1..100", got)
	}
}

func TestSimulateConfigRules(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.json")
	os.WriteFile(cfg, []byte(`{"rules": [
		{"name": "per-key", "key": [{"header": "x-api-key"}], "algorithm": "sliding_window", "limit": 5, "window": "10s"},
		{"name": "burst", "key": [{"remote_ip": true}], "algorithm": "token_bucket", "limit": 2, "window": "1s", "burst": 4}
	]}`), 0o644)
	traffic := filepath.Join(dir, "t.csv")
	os.WriteFile(traffic, []byte("timestamp,key,cost\n0,a\n0.1,a\n0.2,a,2\n0.3,b\n0.4,a\n0.5,a\n0.6,a\n"), 0o644)
	out := filepath.Join(dir, "r.html")
	stdout, stderr, code := runSim(t, "--config", cfg, "--csv", traffic, "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	page, _ := os.ReadFile(out)
	secs := parseReport(t, page)
	if len(secs) != 2 {
		t.Fatalf("sections %v", secs)
	}
	// sliding_window 5 per 10s: a gets 1+1+2 = 4 units, then one more (5),
	// then denied; b gets 1.
	pk := secs["per-key"]
	if pk.attrs["data-algorithm"] != "sliding_window" || pk.metrics["admitted"] != 5 || pk.metrics["denied"] != 2 || pk.metrics["max-in-window"] != 5 {
		t.Errorf("per-key: %v %v", pk.attrs, pk.metrics)
	}
	// token bucket of 4 refilling 2/s: a takes 1+1+2 by 0.2s, has 0.8 at
	// 0.4s (denied), 1.0 at 0.5s (admitted), 0.2 at 0.6s (denied); b takes 1.
	b := secs["burst"]
	if b.attrs["data-burst"] != "4" || b.metrics["admitted"] != 5 || b.metrics["denied"] != 2 || b.metrics["max-in-window"] != 5 {
		t.Errorf("burst: %v %v\n%s", b.attrs, b.metrics, stdout)
	}

	// --rule picks one; --compare uses its limit and window.
	_, stderr, code = runSim(t, "--config", cfg, "--rule", "burst", "--compare", "--traffic", "steady", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	page, _ = os.ReadFile(out)
	secs = parseReport(t, page)
	if len(secs) != 5 || secs["token_bucket"].attrs["data-burst"] != "4" || secs["fixed_window"].attrs["data-limit"] != "2" {
		t.Errorf("compare from rule: %v", secs["token_bucket"].attrs)
	}
	// Steady at 2×limit (4/s) for 10 s: 40 offered.
	if got := secs["fixed_window"].metrics["admitted"] + secs["fixed_window"].metrics["denied"]; got != 40 {
		t.Errorf("offered %d, want 40", got)
	}
}

func TestSimulateReportToStdout(t *testing.T) {
	stdout, stderr, code := runSim(t, "--algorithm", "leaky_bucket", "--limit", "10", "--window", "1s", "--traffic", "poisson", "--keys", "3", "--out", "-")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.HasPrefix(stdout, "<!DOCTYPE html>") || !strings.Contains(stderr, "leaky_bucket") {
		t.Fatalf("stdout %.40q, stderr %q", stdout, stderr)
	}
	if secs := parseReport(t, []byte(stdout)); len(secs) != 1 {
		t.Fatalf("%d sections", len(secs))
	}
}

func TestSimulateErrors(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "r.html")
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte("0,a\n1,a\n0.5,b\n"), 0o644)
	neg := filepath.Join(dir, "neg.csv")
	os.WriteFile(neg, []byte("0,a\n1,a,-1\n"), 0o644)
	empty := filepath.Join(dir, "empty.csv")
	os.WriteFile(empty, nil, 0o644)
	badCfg := filepath.Join(dir, "c.json")
	os.WriteFile(badCfg, []byte(`{"rules": [{"name": "x", "key": [{"path": true}], "algorithm": "fixed_window", "limit": 1, "window": "10x"}]}`), 0o644)
	cmp := []string{"--compare", "--limit", "100", "--window", "1m"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--compare", "--limit", "1", "--window", "1s"}, 2, "--out is required"},
		{append(cmp, "--out", out, "--traffic", "steady", "--csv", bad), 2, "exclude each other"},
		{[]string{"--compare", "--out", out}, 2, "give --config FILE, or --limit and --window"},
		{[]string{"--limit", "1", "--window", "1s", "--out", out}, 2, "give --algorithm or --compare"},
		{append(cmp, "--out", out, "--window", "soon"), 2, `"soon" is not a duration`},
		{append(cmp, "--out", out, "extra"), 2, `unexpected argument "extra"`},
		{append(cmp, "--out", out, "--csv", bad, "--rate", "3"), 2, "--rate applies to --traffic patterns"},
		{append(cmp, "--out", out, "--traffic", "zigzag"), 1, `unknown pattern "zigzag"`},
		{append(cmp, "--out", out, "--traffic", "steady", "--heavy", "3"), 2, "--heavy applies to --traffic flood"},
		{append(cmp, "--out", out, "--max-keys", "0"), 2, "--max-keys 0: want 1..1000000"},
		{append(cmp, "--out", out, "--traffic", "flood", "--attackers", "-5"), 1, "-5 keys × 1 requests out of range"},
		{append(cmp, "--out", out, "--traffic", "steady", "--rate", "-1"), 1, "rate -1 must be"},
		{append(cmp, "--out", out, "--csv", bad), 1, bad + `:3: timestamp "0.5" is earlier than the previous line's "1"`},
		{append(cmp, "--out", out, "--csv", neg), 1, neg + `:2: cost "-1" must be an integer >= 1`},
		{append(cmp, "--out", out, "--csv", empty), 1, empty + ": no requests"},
		{append(cmp, "--out", out, "--csv", filepath.Join(dir, "missing.csv")), 1, "cannot read traffic"},
		{[]string{"--config", badCfg, "--out", out}, 1, `rules[0].window: "10x" is not a duration`},
		{[]string{"--algorithm", "leaky", "--limit", "1", "--window", "1s", "--out", out}, 1, `unknown algorithm "leaky"`},
		{[]string{"--compare", "--limit", "0", "--window", "1s", "--out", out}, 1, "limit must be at least 1"},
		{append(cmp, "--out", filepath.Join(dir, "no", "such", "dir.html")), 1, "writing the report"},
	} {
		_, stderr, code := runSim(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, firstLine(stderr), tc.code, tc.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed run wrote a report")
	}
	if stdout, _, code := runSim(t, "--help"); code != 0 || !strings.Contains(stdout, "usage: sluice simulate") {
		t.Errorf("--help: exit %d", code)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// findChromium returns the browser the tests drive. The CI script installs
// Debian's chromium; a machine without it fails this test rather than
// skipping it, so a missing browser is never mistaken for a pass.
func findChromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found in PATH: install Debian's chromium (apt-get install -y chromium); .ci/run does")
	return ""
}

// newBrowser starts a headless chromium with a fresh profile and no
// background network activity.
func newBrowser(t *testing.T, opts ...chromedp.ContextOption) context.Context {
	t.Helper()
	skipShort(t, "runs headless Chromium")
	ctx, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(findChromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	t.Cleanup(cancel)
	bctx, bcancel := chromedp.NewContext(ctx, opts...)
	t.Cleanup(bcancel)
	return bctx
}

// TestSimulateReportInBrowser opens a `simulate --compare` report from a
// file:// URL in chromium and reads the five charts and their numbers from
// the rendered page. With SLUICE_SCREENSHOT_DIR set it saves a screenshot
// there (simulate-compare.png).
func TestSimulateReportInBrowser(t *testing.T) {
	// Run from the report's directory with the README's relative --out, so the command the
	// report shows (and the screenshot of it in docs/) holds no temporary path.
	sd := os.Getenv("SLUICE_SCREENSHOT_DIR")
	if sd != "" {
		var err error
		if sd, err = filepath.Abs(sd); err != nil { // before the Chdir
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	t.Chdir(dir)
	if _, stderr, code := runSim(t, "--compare", "--limit", "100", "--window", "1m", "--traffic", "boundary-burst", "--out", "report.html"); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	out := filepath.Join(dir, "report.html")
	pageURL := (&url.URL{Scheme: "file", Path: out}).String()

	var mu sync.Mutex
	var requested []string
	ctx := newBrowser(t, chromedp.WithListener(func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			requested = append(requested, e.Request.URL)
			mu.Unlock()
		}
	}))
	// The first Run starts the browser; it must not carry the timeout.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1720, 1000)); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate(pageURL), chromedp.WaitVisible("section.algo svg.svgchart")); err != nil {
		t.Fatal(err)
	}

	type chart struct {
		ID     string  `json:"id"`
		Width  float64 `json:"w"`
		Height float64 `json:"h"`
		Shapes int     `json:"shapes"`
	}
	type shown struct {
		Algorithm string            `json:"algorithm"`
		MaxAttr   string            `json:"maxAttr"`
		Metrics   map[string]string `json:"metrics"`
		Charts    []chart           `json:"charts"`
		Height    float64           `json:"height"`
	}
	const js = `Array.from(document.querySelectorAll('section.algo')).map(s => ({
		algorithm: s.dataset.algorithm,
		maxAttr: s.dataset.maxInWindow,
		metrics: Object.fromEntries(Array.from(s.querySelectorAll('dd[data-metric]')).map(d => [d.dataset.metric, d.textContent.trim()])),
		charts: Array.from(s.querySelectorAll('svg.svgchart')).map(c => {
			const r = c.getBoundingClientRect();
			return {id: c.id, w: r.width, h: r.height, shapes: c.querySelectorAll('g.series polygon, g.series polyline').length};
		}),
		height: s.getBoundingClientRect().height,
	}))`
	got, err := chromedp.Run(tctx, chromedp.Evaluate[[]shown](js))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 {
		t.Fatalf("the page shows %d algorithm sections, want 5: %+v", len(got), got)
	}
	byAlg := map[string]shown{}
	for _, s := range got {
		byAlg[s.Algorithm] = s
		if len(s.Charts) != 2 || s.Height <= 0 {
			t.Errorf("%s: %d charts, section height %v", s.Algorithm, len(s.Charts), s.Height)
		}
		for _, c := range s.Charts {
			if c.Width < 100 || c.Height < 100 || c.Shapes < 2 {
				t.Errorf("%s: chart %s rendered %vx%v with %d shapes", s.Algorithm, c.ID, c.Width, c.Height, c.Shapes)
			}
		}
		for _, m := range []string{"admitted", "denied", "max-in-window", "state-bytes"} {
			if _, err := strconv.ParseInt(s.Metrics[m], 10, 64); err != nil {
				t.Errorf("%s: %s shows %q", s.Algorithm, m, s.Metrics[m])
			}
		}
		if s.Metrics["max-in-window"] != s.MaxAttr {
			t.Errorf("%s: shows %s, data attribute %s", s.Algorithm, s.Metrics["max-in-window"], s.MaxAttr)
		}
	}
	// Legends clear of titles; nothing marked as a violation: every
	// algorithm keeps to its own guarantee, and those above the limit by
	// design (token_bucket's burst, fixed_window's boundary) are marked so.
	problems, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](chartLayoutProblems))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	marks, err := chromedp.Run(tctx, chromedp.Evaluate[map[string]string](`Object.fromEntries(Array.from(document.querySelectorAll('#summary tbody tr')).map(r => {
		const c = r.querySelector('[data-col="max-in-window"]');
		return [r.dataset.algorithm, c.className + ' ' + getComputedStyle(c).color + ' ' + r.querySelector('[data-col="bound"]').textContent];
	}))`))
	if err != nil {
		t.Fatal(err)
	}
	for alg, want := range map[string]string{"token_bucket": "above-limit rgb(138, 90, 0) 200", "fixed_window": "above-limit rgb(138, 90, 0) 200",
		"sliding_log": " rgb(34, 34, 34) 100", "sliding_window": "above-limit rgb(138, 90, 0) 200"} {
		if marks[alg] != want {
			t.Errorf("summary %s: max in any window marked %q, want %q", alg, marks[alg], want)
		}
	}
	if v := byAlg["fixed_window"].Metrics["max-in-window"]; v != "200" {
		t.Errorf("fixed_window shows max-in-window %q, want 200", v)
	}
	if v, _ := strconv.Atoi(byAlg["sliding_log"].Metrics["max-in-window"]); v < 1 || v > 100 {
		t.Errorf("sliding_log shows max-in-window %d, want 1..100", v)
	}

	if sd != "" {
		png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(sd, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(sd, "simulate-compare.png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}

	// Self-contained: the browser fetched nothing but the file itself.
	mu.Lock()
	defer mu.Unlock()
	for _, u := range requested {
		if u != pageURL {
			t.Errorf("the report made the browser fetch %s", u)
		}
	}
}

// The key flood, smaller (max_keys 100, 2,000 attacker keys, 20
// innocents, 3 heavy hitters) through every algorithm: the key-table
// summary says no innocent was denied, each heavy hitter got its limit, the
// table holds at most max_keys entries; the report carries the same
// numbers.
func TestSimulateFlood(t *testing.T) {
	out := filepath.Join(t.TempDir(), "flood.html")
	stdout, stderr, code := runSim(t, "--compare", "--limit", "10", "--window", "1m", "--traffic", "flood",
		"--attackers", "2000", "--innocents", "20", "--heavy", "3", "--max-keys", "100", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "2000 attacker keys × 1, 20 innocent × 5, 3 heavy × 100 requests") {
		t.Errorf("traffic line missing:\n%s", stdout)
	}
	for _, alg := range []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_log", "sliding_window"} {
		var line string
		for _, l := range strings.Split(stdout, "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[0] == alg && f[1] == "100" {
				line = l
			}
		}
		f := strings.Fields(line)
		if len(f) != 9 || f[2] != "0/100" || f[4] != "10/10" {
			t.Errorf("%s: key-table line %q, want 0/100 innocents denied and 10/10 for heavy hitters", alg, line)
			continue
		}
		if n, _ := strconv.Atoi(f[5]); n > 100 || n < 90 {
			t.Errorf("%s: %d entries, max_keys 100", alg, n)
		}
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for name, sec := range parseReport(t, page) {
		if sec.metrics["innocent-denied"] != 0 || sec.metrics["entries"] > 100 || sec.metrics["evicted"] == 0 {
			t.Errorf("%s: report numbers %v", name, sec.metrics)
		}
	}
}

// chartLayoutProblems is a script that measures, with the browser's own
// font metrics, every chart of the page: each legend entry must lie inside
// its image, clear of the title, of the other entries and of the plot.
const chartLayoutProblems = `(() => {
	const out = [];
	const overlap = (a, b) => a.x < b.x + b.width && b.x < a.x + a.width && a.y < b.y + b.height && b.y < a.y + a.height;
	for (const svg of document.querySelectorAll('svg.svgchart')) {
		const w = svg.viewBox.baseVal.width, id = svg.id || svg.getAttribute('aria-label');
		const title = svg.querySelector('text.title'), plot = svg.querySelector('rect.plot').getBBox();
		const boxes = [];
		for (const e of svg.querySelectorAll('g.legend g.entry')) {
			const b = e.getBBox(), name = e.textContent;
			if (b.x < 0 || b.x + b.width > w) out.push(id + ': legend "' + name + '" outside the image');
			if (title && overlap(b, title.getBBox())) out.push(id + ': legend "' + name + '" over the title');
			if (b.y + b.height > plot.y + 0.5) out.push(id + ': legend "' + name + '" inside the plot');
			for (const o of boxes) if (overlap(b, o)) out.push(id + ': legend "' + name + '" over another entry');
			boxes.push(b);
		}
	}
	return out;
})()`

// TestSimulateLeaseReportInBrowser opens the lease report of README's
// boundary burst (fixed_window 100/1m, lease 10, 3 proxies) in chromium:
// both charts are drawn with their legends clear of the titles, and the
// under-admission chart's held series rises to the summary's "most held in
// pools" (it used to be flat at 0 beside a summary of 27). With
// SLUICE_SCREENSHOT_DIR set it saves simulate-lease.png there.
func TestSimulateLeaseReportInBrowser(t *testing.T) {
	sd := os.Getenv("SLUICE_SCREENSHOT_DIR")
	if sd != "" {
		var err error
		if sd, err = filepath.Abs(sd); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	t.Chdir(dir)
	if _, stderr, code := runSim(t, "--algorithm", "fixed_window", "--limit", "100", "--window", "1m", "--traffic", "boundary-burst",
		"--lease", "10", "--out", "lease.html"); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	pageURL := (&url.URL{Scheme: "file", Path: filepath.Join(dir, "lease.html")}).String()
	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(900, 800)); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate(pageURL), chromedp.WaitVisible("#chart-lease-under")); err != nil {
		t.Fatal(err)
	}
	problems, err := chromedp.Run(tctx, chromedp.Evaluate[[]string](chartLayoutProblems))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	// The held series, read back in data units from the Y axis' ticks.
	type heldShown struct {
		MaxHeld string  `json:"maxHeld"`
		Peak    float64 `json:"peak"`
		Height  float64 `json:"height"`
	}
	const js = `(() => {
		const svg = document.getElementById('chart-lease-under');
		const ticks = Array.from(svg.querySelectorAll('g.y-axis g.tick')).map(g => [parseFloat(g.dataset.value), g.querySelector('line').y1.baseVal.value]);
		const [a, b] = [ticks[0], ticks[ticks.length - 1]];
		const toValue = y => a[0] + (y - a[1]) * (b[0] - a[0]) / (b[1] - a[1]);
		const line = svg.querySelector('g.series.held polyline');
		const ys = Array.from(line.points).map(p => p.y);
		return {maxHeld: document.querySelector('[data-metric="max-held"]').textContent.trim(),
			peak: toValue(Math.min(...ys)), height: line.getBBox().height};
	})()`
	got, err := chromedp.Run(tctx, chromedp.Evaluate[heldShown](js))
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := strconv.ParseFloat(got.MaxHeld, 64); want < 1 || math.Abs(got.Peak-want) > 0.5 || got.Height < 10 {
		t.Errorf("held series peaks at %.1f (drawn %.0f px high), the summary says most held %s", got.Peak, got.Height, got.MaxHeld)
	}
	if sd != "" {
		png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(sd, "simulate-lease.png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
}

// An in-flight limit on a CSV's arrivals and durations: never more than the limit in
// flight, the queue's numbers, and the report's in-flight chart.
func TestSimulateConcurrency(t *testing.T) {
	out := filepath.Join(t.TempDir(), "report.html")
	stdout, stderr, code := runSim(t, "--config", "internal/sim/testdata/concurrency.json", "--csv", "internal/sim/testdata/concurrency.csv", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"gpu         concurrency  4 in flight   27        45      4                  4",
		`gpu-queued  4                       "alice"  delay<=5s  59      34                    5s`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`class="chart inflight-chart"`, `data-metric="peak-in-flight">4<`, `data-metric="queued">59<`, "4 in flight</td>"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, stderr, code := runSim(t, "--config", "internal/sim/testdata/concurrency.json", "--compare", "--out", out); code == 0 || !strings.Contains(stderr, "in-flight limit") {
		t.Errorf("--compare of a concurrency rule: exit %d, %s", code, stderr)
	}
}
