package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sluice-proxy/sluice/cmd/sluice/internal/dashboard"
	"github.com/sluice-proxy/sluice/filter"
)

// heldConfig holds what exceeds 10/s (burst 1) for up to 3 s: of 30 requests at once, 1
// goes at once and 29 are held, released 100 ms apart.
const heldConfig = `{"rules": [
  {"name": "queue", "key": [{"remote_ip": true}], "algorithm": "leaky_bucket", "limit": 10, "window": "1s", "burst": 1,
   "delay": {"max": "3s", "max_held": 100}}]}`

// In process: the dashboard of sluice run shows the requests a rule with delay holds
// while it holds them, and what it delayed and refused.
func TestDashboardHeldInRun(t *testing.T) {
	wasm, _ := buildSluice(t)
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfgPath, []byte(heldConfig), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	rs, err := startRun(ctx, runConfig{
		wasm: wasm, configPath: cfgPath, listen: "127.0.0.1:0", admin: "127.0.0.1:0",
		workers: 2, memoryMB: 64, vmID: "sluice", logLevel: "warn", clusters: clusterFlag{},
	}, io.Discard, io.Discard)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() { cancel(); rs.wait() }()
	admin := "http://" + rs.adminAddr
	state := func() dashboard.Rule {
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
		if len(st.Rules) != 1 {
			return dashboard.Rule{}
		}
		return st.Rules[0]
	}
	// Two samples before the burst, so that its rates show.
	deadline := time.Now().Add(30 * time.Second)
	for r := state(); r.Rates["delayed"] == nil; r = state() {
		if time.Now().After(deadline) {
			t.Fatalf("no delayed rate before the burst: %+v", r)
		}
		time.Sleep(100 * time.Millisecond)
	}

	const n = 30
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	delayed := 0
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get("http://" + rs.listenAddr + "/hello")
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			codes[resp.StatusCode]++
			if resp.Header.Get(filter.DelayHeader) != "" {
				delayed++
			}
		}()
	}
	// While they are held, the page shows them.
	maxHeld := 0.0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if r := state(); r.Held != nil {
			maxHeld = max(maxHeld, *r.Held)
		}
	}
	wg.Wait()
	if codes[200] != n || delayed != n-1 {
		t.Fatalf("statuses %v, %d with %s; want %d × 200, %d delayed", codes, delayed, filter.DelayHeader, n, n-1)
	}
	if maxHeld < 5 || maxHeld > n-1 {
		t.Errorf("the page showed at most %v held, want 5..%d while they were", maxHeld, n-1)
	}
	var r dashboard.Rule
	deadline = time.Now().Add(30 * time.Second)
	for r = state(); r.Held == nil || *r.Held != 0 || r.Totals["delayed"] == nil || *r.Totals["delayed"] != n-1; r = state() {
		if time.Now().After(deadline) {
			t.Fatalf("after the releases: held %v, totals %v", r.Held, r.Totals)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r.Delay != "3s" || r.MaxHeld == nil || *r.MaxHeld != 100 || r.HeldChart == "" || r.Metrics["held"] != "sluice_queue_held" ||
		r.Totals["delay_refused"] == nil || *r.Totals["delay_refused"] != 0 {
		t.Errorf("rule %+v", r)
	}
	// Held 100 ms … 2.9 s: 1.5 s on average, over the releases the rate window still sees.
	if r.MeanDelayMS == nil || *r.MeanDelayMS < 100 || *r.MeanDelayMS > 2950 {
		t.Errorf("mean delay %v ms", r.MeanDelayMS)
	}
}

// In a browser: the page lists the rule with delay under "Held requests", with its held
// chart, and shows what it delayed.
func TestDashboardHeldInBrowser(t *testing.T) {
	wasm, bin := buildSluice(t)
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfgPath, []byte(heldConfig), 0o644)
	proxy, admin := startSluice(t, bin, wasm, cfgPath)
	var mu sync.Mutex
	var problems []string
	ctx := newBrowser(t, chromedp.WithListener(func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *cdpruntime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s (%s:%d)", e.ExceptionDetails.Text, e.ExceptionDetails.URL, e.ExceptionDetails.LineNumber))
		case *cdpruntime.EventConsoleAPICalled:
			if e.Type == cdpruntime.ConsoleAPICalledTypeError {
				problems = append(problems, "console.error")
			}
		}
	}))
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000)); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	const row = `#held tbody tr[data-rule="queue"]`
	if err := chromedp.Do(tctx, chromedp.Navigate(admin+"/dashboard/"), chromedp.WaitVisible(row+` td[data-metric="delayed-rate"]`)); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := http.Get(proxy + "/hello"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	type shown struct {
		Cells  map[string]string `json:"cells"`
		Series []string          `json:"series"`
		Hidden bool              `json:"hidden"`
	}
	const js = `(() => {
		const row = document.querySelector('#held tbody tr[data-rule="queue"]');
		const svg = document.querySelector('#held-charts .chart[data-rule="queue"] svg.svgchart');
		return {
			cells: Object.fromEntries(Array.from(row.querySelectorAll('[data-metric]')).map(c => [c.dataset.metric, c.getAttribute('data-value') || ''])),
			series: svg ? Array.from(svg.querySelectorAll('g.series')).map(g => g.dataset.name) : [],
			hidden: document.getElementById('held-section').hidden,
		};
	})()`
	var got shown
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if got, err = chromedp.Run(tctx, chromedp.Evaluate[shown](js)); err != nil {
			t.Fatal(err)
		}
		if got.Cells["delayed-total"] == "29" && got.Cells["held"] == "0" && got.Cells["mean-delay"] != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed 29 delayed and none held: %+v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got.Hidden || got.Cells["delay"] != "≤ 3s (max_held 100)" || got.Cells["delay-refused-total"] != "0" || strings.Join(got.Series, ",") != "held" {
		t.Errorf("shown %+v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("page problems: %v", problems)
	}
}
