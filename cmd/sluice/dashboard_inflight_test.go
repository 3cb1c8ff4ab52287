package main

import (
	"context"
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
)

const inFlightConfig = `{"rules": [
  {"name": "gpu", "key": [{"remote_ip": true}], "algorithm": "concurrency", "limit": 4}]}`

// In a browser: the page lists the concurrency rule under "Requests in flight", with its
// limit, what it acquired and its in-flight chart (empty again once the requests ended).
func TestDashboardInFlightInBrowser(t *testing.T) {
	wasm, bin := buildSluice(t)
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	os.WriteFile(cfgPath, []byte(inFlightConfig), 0o644)
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
	const row = `#inflight tbody tr[data-rule="gpu"]`
	if err := chromedp.Do(tctx, chromedp.Navigate(admin+"/dashboard/"), chromedp.WaitVisible(row+` td[data-metric="in-flight"]`)); err != nil {
		t.Fatal(err)
	}
	for range 12 {
		resp, err := http.Get(proxy + "/hello")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("one request at a time refused: %d", resp.StatusCode)
		}
	}
	type shown struct {
		Cells  map[string]string `json:"cells"`
		Series []string          `json:"series"`
		Hidden bool              `json:"hidden"`
		Limit  string            `json:"limit"`
	}
	const js = `(() => {
		const row = document.querySelector('#inflight tbody tr[data-rule="gpu"]');
		const svg = document.querySelector('#inflight-charts .chart[data-rule="gpu"] svg.svgchart');
		return {
			cells: Object.fromEntries(Array.from(row.querySelectorAll('[data-metric]')).map(c => [c.dataset.metric, c.getAttribute('data-value') || ''])),
			series: svg ? Array.from(svg.querySelectorAll('g.series')).map(g => g.dataset.name) : [],
			hidden: document.getElementById('inflight-section').hidden,
			limit: document.querySelector('#rules tbody tr[data-rule="gpu"] [data-metric="limit"]')?.textContent || '',
		};
	})()`
	var got shown
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if got, err = chromedp.Run(tctx, chromedp.Evaluate[shown](js)); err != nil {
			t.Fatal(err)
		}
		if got.Cells["acquired-total"] == "12" && got.Cells["in-flight"] == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never showed 12 acquired and none in flight: %+v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got.Hidden || got.Cells["limit"] != "4" || got.Limit != "4 in flight" || got.Cells["refused-total"] != "0" || strings.Join(got.Series, ",") != "in flight" {
		t.Errorf("shown %+v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("page problems: %v", problems)
	}
}
