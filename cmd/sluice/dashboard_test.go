package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sluice-proxy/sluice/cmd/sluice/internal/dashboard"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// dashboardConfig allows 5 requests per minute per client IP: the 6th request of a burst
// is denied. The "audit" rule, in shadow mode, would allow only 3: it shadow-denies the
// 4th request on, never rejecting any.
const dashboardConfig = `{"rules": [
  {"name": "per-client", "key": [{"remote_ip": true}], "algorithm": "fixed_window", "limit": 5, "window": "1m"},
  {"name": "audit", "key": [{"remote_ip": true}], "algorithm": "sliding_log", "limit": 3, "window": "1m", "mode": "shadow"}],
  "response": {"status": 429, "body": "rate limited\n", "headers": "both"}}`

var (
	dashBuildOnce sync.Once
	dashBuildDir  string
	dashBuildErr  error
)

// buildSluice compiles the filter (sluice.wasm) and this command (sluice) into a temporary
// directory once per test binary, and returns their paths.
func buildSluice(t *testing.T) (wasm, bin string) {
	t.Helper()
	skipShort(t, "builds sluice.wasm and the sluice binary (go build)")
	dashBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-dashboard-test-")
		if err != nil {
			dashBuildErr = err
			return
		}
		dashBuildDir = dir
		wasmCmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", filepath.Join(dir, "sluice.wasm"), "../sluice-wasm")
		wasmCmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if out, err := wasmCmd.CombinedOutput(); err != nil {
			dashBuildErr = fmt.Errorf("building sluice.wasm: %v\n%s", err, out)
			return
		}
		if dashBuildErr = wasmpatch.PatchFile(filepath.Join(dir, "sluice.wasm")); dashBuildErr != nil {
			return
		}
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, "sluice"), ".").CombinedOutput(); err != nil {
			dashBuildErr = fmt.Errorf("building sluice: %v\n%s", err, out)
		}
	})
	if dashBuildErr != nil {
		t.Fatal(dashBuildErr)
	}
	return filepath.Join(dashBuildDir, "sluice.wasm"), filepath.Join(dashBuildDir, "sluice")
}

// sendBurst sends n GETs to the proxy and returns how many were allowed (200) and denied (429).
func sendBurst(t *testing.T, proxy string, n int) (allowed, denied int) {
	t.Helper()
	for i := 0; i < n; i++ {
		resp, err := http.Get(proxy + "/hello")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case 200:
			allowed++
		case 429:
			denied++
		default:
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	return allowed, denied
}

// In process: startRun mounts the dashboard on the admin server, and its api/state shows
// the filter's counters and the host's health.
func TestDashboardAPIInRun(t *testing.T) {
	wasm, _ := buildSluice(t)
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfgPath, []byte(dashboardConfig), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	rs, err := startRun(ctx, runConfig{
		wasm: wasm, configPath: cfgPath, listen: "127.0.0.1:0", admin: "127.0.0.1:0",
		workers: 2, memoryMB: 64, vmID: "sluice", logLevel: "warn", clusters: clusterFlag{},
	}, io.Discard, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			rs.wait()
		}
	}
	defer stop()
	admin := "http://" + rs.adminAddr

	// The admin root is the dashboard's front door.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	root, err := noFollow.Get(admin + "/")
	if err != nil {
		t.Fatal(err)
	}
	root.Body.Close()
	if root.StatusCode != http.StatusFound || root.Header.Get("Location") != "/dashboard/" {
		t.Fatalf("GET /: %d Location %q, want 302 to /dashboard/", root.StatusCode, root.Header.Get("Location"))
	}

	resp, err := http.Get(admin + "/dashboard/")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(page), `<table id="rules">`) {
		t.Fatalf("/dashboard/: %d %.200s", resp.StatusCode, page)
	}

	state := func() dashboard.State {
		t.Helper()
		resp, err := http.Get(admin + "/dashboard/api/state")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st dashboard.State
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// waitState polls the state until ok holds (the sampler runs on its own clock).
	waitState := func(what string, ok func(dashboard.State) bool) dashboard.State {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			st := state()
			if ok(st) {
				return st
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v", what, st.Rules)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// A rate needs a sample from before the burst: a counter first sampled after it shows
	// no increase. Two samples give the rates (null before).
	waitState("no rates before the burst", func(st dashboard.State) bool {
		return len(st.Rules) == 2 && st.Rules[0].Rates["denied"] != nil
	})
	if a, d := sendBurst(t, "http://"+rs.listenAddr, 12); a != 5 || d != 7 {
		t.Fatalf("allowed %d denied %d, want 5 and 7", a, d)
	}
	st := waitState("denied rate still not positive", func(st dashboard.State) bool {
		return len(st.Rules) == 2 && st.Rules[0].Rates["denied"] != nil && *st.Rules[0].Rates["denied"] > 0
	})
	r := st.Rules[0]
	if r.Name != "per-client" || r.Algorithm != "fixed_window" || r.Mode != "enforce" || r.Metrics["denied"] != "sluice_per_client_denied" {
		t.Errorf("rule %+v", r)
	}
	if r.Totals["allowed"] == nil || *r.Totals["allowed"] != 5 || r.Totals["denied"] == nil || *r.Totals["denied"] != 7 {
		t.Errorf("totals %v", r.Totals)
	}
	if a := st.Rules[1]; a.Name != "audit" || a.Mode != "shadow" || a.Totals["denied"] == nil || *a.Totals["denied"] != 0 ||
		a.Totals["shadow_denied"] == nil || *a.Totals["shadow_denied"] < 2 || a.Rates["shadow_denied"] == nil || *a.Rates["shadow_denied"] <= 0 {
		t.Errorf("audit rule %+v, totals %v, rates %v", a, a.Totals, a.Rates)
	}
	if !st.Live || st.Host == nil || len(st.Host.Workers) != 2 || st.Host.Requests != 12 || st.Host.VMRestarts != 0 || st.Host.MemoryLimitBytes != 64<<20 {
		t.Errorf("live %v error %q host %+v", st.Live, st.Error, st.Host)
	}
	for _, w := range st.Host.Workers {
		if !w.Healthy || w.MemoryBytes == 0 {
			t.Errorf("worker %+v", w)
		}
	}
	if !strings.Contains(st.Config.Pretty, `"name": "per-client"`) || st.Config.Error != "" || len(st.Problems) != 0 {
		t.Errorf("config %q (error %q), problems %v", st.Config.Pretty, st.Config.Error, st.Problems)
	}
	if r.Summary != "per-client: fixed_window 5/1m key=remote_ip match=all local enforce" {
		t.Errorf("summary %q", r.Summary)
	}

	// /metrics renders the same snapshot: the counters the page shows, and a # HELP line
	// for every family — the filter's from their names, none left to the host's generic text.
	resp, err = http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"# HELP sluice_per_client_allowed sluice rule per-client: requests allowed\n# TYPE sluice_per_client_allowed counter\nsluice_per_client_allowed 5\n",
		"# HELP sluice_per_client_denied sluice rule per-client: requests denied\n# TYPE sluice_per_client_denied counter\nsluice_per_client_denied 7\n",
		"# HELP sluice_audit_shadow_denied sluice rule audit: requests the rule, in shadow mode, would have denied (let through)\n",
		"# HELP sluice_errors sluice: internal errors of the filter",
		"sluice_host_requests_total 12\n",
		"sluice_host_metrics_unexposed 0\n",
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	helps, types := 0, 0
	for _, line := range strings.Split(string(metrics), "\n") {
		switch {
		case strings.HasPrefix(line, "# HELP "):
			helps++
			if strings.Contains(line, "defined by the module") {
				t.Errorf("a filter metric without its own HELP: %s", line)
			}
		case strings.HasPrefix(line, "# TYPE "):
			types++
		}
	}
	if helps != types || helps < 20 {
		t.Errorf("%d HELP lines, %d TYPE lines", helps, types)
	}

	// The dashboard's scraping goroutine ends with the host.
	stop()
	deadline := time.Now().Add(10 * time.Second)
	for dashboardRunning() {
		if time.Now().After(deadline) {
			t.Fatal("the dashboard's Run goroutine outlived the host")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func dashboardRunning() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Contains(string(buf[:n]), "dashboard.(*Dashboard).Run(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// startSluice runs the built binary as `sluice run` with the proxy and the admin server on
// free ports, and returns their base URLs once it is serving. The process is stopped with
// SIGINT at the end of the test.
func startSluice(t *testing.T, bin, wasm, configPath string) (proxy, admin string) {
	t.Helper()
	cmd := exec.Command(bin, "run", "--wasm", wasm, "--config", configPath,
		"--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--workers", "2", "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("sluice run exited with %v after SIGINT\n%s", err, stderr.String())
			}
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("sluice run did not stop within 15s of SIGINT")
		}
	})
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	timeout := time.After(60 * time.Second)
	for proxy == "" || admin == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("sluice run ended before serving:\n%s", stderr.String())
			}
			if rest, ok := strings.CutPrefix(line, "sluice: listening on "); ok {
				proxy, _, _ = strings.Cut(rest, " ")
			}
			if rest, ok := strings.CutPrefix(line, "sluice: admin on "); ok {
				admin, _, _ = strings.Cut(rest, " ")
			}
		case <-timeout:
			t.Fatalf("sluice run did not report its addresses within 60s:\n%s", stderr.String())
		}
	}
	go func() {
		for range lines { // keep draining so the process never blocks on stdout
		}
	}()
	return proxy, admin
}

// The dashboard end to end: a real `sluice run` (built binary and module, as
// a subprocess), its dashboard open in chromium; traffic beyond the limit makes the
// per-client rule's denied rate non-zero on the page. With SLUICE_SCREENSHOT_DIR set, a
// screenshot is saved there as dashboard.png.
func TestDashboardInBrowser(t *testing.T) {
	wasm, bin := buildSluice(t)
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfgPath, []byte(dashboardConfig), 0o644)
	proxy, admin := startSluice(t, bin, wasm, cfgPath)
	pageURL := admin + "/dashboard/"

	var mu sync.Mutex
	var requested, problems []string
	ctx := newBrowser(t, chromedp.WithListener(func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			requested = append(requested, e.Request.URL)
		case *cdplog.EventEntryAdded: // CSP violations, failed loads
			if e.Entry.Level == cdplog.EntryLevelError {
				problems = append(problems, e.Entry.Text)
			}
		case *cdpruntime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s (%s:%d)", e.ExceptionDetails.Text, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber))
		case *cdpruntime.EventConsoleAPICalled:
			if e.Type == cdpruntime.ConsoleAPICalledTypeError {
				problems = append(problems, "console.error")
			}
		}
	}))
	// The first action starts the browser; it must not carry the timeout.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000)); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	const row = `#rules tbody tr[data-rule="per-client"]`
	if err := chromedp.Do(tctx, chromedp.Navigate(pageURL), chromedp.WaitVisible(row+` td[data-metric="denied-rate"]`)); err != nil {
		t.Fatal(err)
	}

	type shown struct {
		Status      string            `json:"status"`
		Rule        map[string]string `json:"rule"` // data-metric -> data-value
		RuleText    map[string]string `json:"ruleText"`
		ChartSeries []string          `json:"chartSeries"`
		ChartShapes int               `json:"chartShapes"`
		Host        map[string]string `json:"host"`
		Workers     []string          `json:"workers"`
		Config      string            `json:"config"`
		Audit       map[string]string `json:"audit"`
	}
	const js = `(() => {
		const row = document.querySelector('#rules tbody tr[data-rule="per-client"]');
		const cells = row ? Array.from(row.querySelectorAll('[data-metric]')) : [];
		const chart = document.querySelector('#charts .chart[data-rule="per-client"] svg.svgchart');
		return {
			status: document.getElementById('status').dataset.state,
			rule: Object.fromEntries(cells.map(c => [c.dataset.metric, c.getAttribute('data-value') || ''])),
			ruleText: Object.fromEntries(cells.map(c => [c.dataset.metric, c.textContent.trim()])),
			chartSeries: chart ? Array.from(chart.querySelectorAll('g.series')).map(g => g.dataset.name) : [],
			chartShapes: chart ? chart.querySelectorAll('g.series polyline, g.series polygon, g.series path').length : 0,
			host: Object.fromEntries(Array.from(document.querySelectorAll('#host dd[data-metric]')).map(d => [d.dataset.metric, d.getAttribute('data-value') || ''])),
			workers: Array.from(document.querySelectorAll('#workers tbody tr[data-worker]')).map(r => r.dataset.worker + ':' + r.querySelector('[data-metric="healthy"]').dataset.value),
			config: document.getElementById('config').textContent,
			audit: Object.fromEntries(Array.from(document.querySelectorAll('#rules tbody tr[data-rule="audit"] [data-metric]')).map(c => [c.dataset.metric, c.getAttribute('data-value') || ''])),
		};
	})()`
	read := func() shown {
		t.Helper()
		s, err := chromedp.Run(tctx, chromedp.Evaluate[shown](js))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := read()
	if v := before.Rule["denied-rate"]; v != "" && v != "0" {
		t.Fatalf("denied rate %q before any traffic", v)
	}

	if a, d := sendBurst(t, proxy, 12); a != 5 || d != 7 {
		t.Fatalf("allowed %d denied %d, want 5 and 7", a, d)
	}
	var got shown
	deadline := time.Now().Add(30 * time.Second)
	for {
		got = read()
		var rate float64
		fmt.Sscan(got.Rule["denied-rate"], &rate)
		if rate > 0 && got.Rule["denied-total"] == "7" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed a positive denied rate with 7 denied: %+v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got.RuleText["denied-rate"] == "0" || got.RuleText["denied-rate"] == "–" {
		t.Errorf("denied rate text %q", got.RuleText["denied-rate"])
	}
	if got.Status != "live" || got.Rule["allowed-total"] != "5" || got.Rule["algorithm"] != "fixed_window" || got.Rule["mode"] != "enforce" || got.Rule["limit"] != "5 / 1m" {
		t.Errorf("rule row %+v (status %s)", got.Rule, got.Status)
	}
	var shadowRate, shadowTotal float64
	fmt.Sscan(got.Audit["shadow-denied-rate"], &shadowRate)
	fmt.Sscan(got.Audit["shadow-denied-total"], &shadowTotal)
	if got.Audit["mode"] != "shadow" || got.Audit["denied-total"] != "0" || shadowTotal < 2 || shadowRate <= 0 {
		t.Errorf("audit row %+v", got.Audit)
	}
	if strings.Join(got.ChartSeries, ",") != "allowed,denied,shadow-denied" || got.ChartShapes < 2 {
		t.Errorf("chart series %v, %d shapes", got.ChartSeries, got.ChartShapes)
	}
	if got.Host["workers"] != "2" || got.Host["vm-restarts"] != "0" || got.Host["requests"] != "12" || got.Host["uptime"] == "" {
		t.Errorf("host %+v", got.Host)
	}
	if strings.Join(got.Workers, ",") != "0:true,1:true" {
		t.Errorf("workers %v", got.Workers)
	}
	if !strings.Contains(got.Config, `"name": "per-client"`) || !strings.Contains(got.Config, `"limit": 5`) {
		t.Errorf("config shown %q", got.Config)
	}

	// The charts fill the width the page has, drawn at
	// their own size rather than scaled; the two workers' memory lines are told apart by
	// colour and dash, each named in the legend (one used to hide the other).
	type layout struct {
		Problems []string `json:"problems"`
		Workers  []string `json:"workers"`
	}
	const layoutJS = `(() => {
		const out = [], near = (a, b, d) => Math.abs(a - b) <= d;
		const section = document.getElementById('rules-section').clientWidth;
		const grid = document.getElementById('charts');
		if (!near(grid.clientWidth, section, 1)) out.push('charts ' + grid.clientWidth + ' px wide in a section of ' + section);
		const charts = Array.from(grid.querySelectorAll('.chart svg.svgchart'));
		if (charts.length !== 2) out.push(charts.length + ' rule charts');
		const rows = new Map();
		for (const svg of charts.concat(Array.from(document.querySelectorAll('#memory-chart svg.svgchart')))) {
			const r = svg.getBoundingClientRect(), box = svg.parentElement.clientWidth;
			if (!near(r.width, box, 1)) out.push(svg.id + ': ' + r.width + ' px in a box of ' + box);
			if (!near(r.width - 2, svg.width.baseVal.value, 2)) out.push(svg.id + ': drawn for ' + svg.width.baseVal.value + ' px, shown at ' + r.width + ' (scaled)');
			if (svg.closest('#charts')) rows.set(r.top, (rows.get(r.top) || 0) + r.width);
		}
		for (const [top, w] of rows) if (w + 12 * 2 < grid.clientWidth) out.push('a row of charts at y ' + top + ' fills ' + w + ' of ' + grid.clientWidth + ' px');
		const mem = document.querySelector('#memory-chart svg.svgchart');
		const host = document.getElementById('host-section').clientWidth;
		if (!mem || !near(mem.getBoundingClientRect().width, host, 1)) out.push('memory chart ' + (mem ? mem.getBoundingClientRect().width : 0) + ' px wide in a section of ' + host);
		const workers = mem ? Array.from(mem.querySelectorAll('g.series')).map(g => {
			const l = g.querySelector('polyline'), cs = l ? getComputedStyle(l) : null;
			return g.dataset.name + '|' + (cs ? cs.stroke + '|' + cs.strokeDasharray + '|' + l.points.numberOfItems : 'none');
		}) : [];
		const legend = mem ? Array.from(mem.querySelectorAll('g.legend g.entry')).map(e => e.textContent) : [];
		if (legend.join(',') !== 'worker 0,worker 1') out.push('memory legend ' + legend.join(','));
		return {problems: out, workers: workers};
	})()`
	var lay layout
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if lay, err = chromedp.Run(tctx, chromedp.Evaluate[layout](layoutJS)); err != nil {
			t.Fatal(err)
		}
		if len(lay.Problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, p := range lay.Problems {
		t.Error(p)
	}
	if len(lay.Workers) != 2 {
		t.Fatalf("memory chart series %v, want two workers", lay.Workers)
	}
	w0, w1 := strings.Split(lay.Workers[0], "|"), strings.Split(lay.Workers[1], "|")
	if len(w0) != 4 || len(w1) != 4 || w0[1] == w1[1] || w0[2] == w1[2] || w0[3] == "0" || w1[3] == "0" {
		t.Errorf("worker lines not told apart (name|stroke|dash|points): %v", lay.Workers)
	}

	if sd := os.Getenv("SLUICE_SCREENSHOT_DIR"); sd != "" {
		// For the picture, some history: 20 s of traffic at 2 requests a second.
		for i := 0; i < 40; i++ {
			sendBurst(t, proxy, 1)
			time.Sleep(500 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond) // the page's next poll
		png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(sd, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(sd, "dashboard.png")
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}

	// Offline: the browser fetched nothing outside the dashboard; and the page ran clean.
	mu.Lock()
	defer mu.Unlock()
	for _, u := range requested {
		if !strings.HasPrefix(u, pageURL) {
			t.Errorf("the dashboard made the browser fetch %s", u)
		}
	}
	for _, p := range problems {
		t.Errorf("browser error: %s", p)
	}
}
