package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// topKeysConfig limits each x-api-key to 5 requests an hour and keeps top keys of 16
// counters per rule and kind, shown raw.
const topKeysConfig = `{"rules": [
  {"name": "per-key", "key": [{"header": "x-api-key"}], "algorithm": "fixed_window", "limit": 5, "window": "1h"}],
  "top_keys": {"size": 16, "key": "raw"}}`

const (
	topBackground = 200 // keys with one request each
	topAbusers    = 5   // keys with topAbuse requests each
	topAbuse      = 15  // 10 of them denied
)

// sendTopKeysTraffic sends the background keys' requests and the abusers', interleaved,
// and returns how many were denied.
func sendTopKeysTraffic(t *testing.T, proxy string) (denied int) {
	t.Helper()
	var keys []string
	rounds := 0
	for i := 0; i < topBackground; i++ {
		keys = append(keys, fmt.Sprintf("bg-%d", i))
		if i%(topBackground/topAbuse) == 0 && rounds < topAbuse {
			rounds++
			for a := 0; a < topAbusers; a++ {
				keys = append(keys, fmt.Sprintf("abuser-%d", a))
			}
		}
	}
	for _, k := range keys {
		req, _ := http.NewRequest("GET", proxy+"/", nil)
		req.Header.Set("x-api-key", k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == 429 && strings.HasPrefix(k, "abuser-"):
			denied++
		case resp.StatusCode != 200:
			t.Fatalf("key %s: status %d", k, resp.StatusCode)
		}
	}
	return denied
}

// The dashboard's top keys in chromium, against a real `sluice run` (built binary and
// module): 200 background keys and 5 abusive ones, 10 refusals each; the per-key rule's
// table names the 5 abusers, each with its 10 denials and no error (the summary of the
// denials never filled), above the background keys' consumption, updating as the workers
// merge.
func TestDashboardTopKeysInBrowser(t *testing.T) {
	wasm, bin := buildSluice(t)
	cfgPath := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfgPath, []byte(topKeysConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	proxy, admin := startSluice(t, bin, wasm, cfgPath)
	ctx := newBrowser(t)
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1400, 1000)); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, chromedp.Navigate(admin+"/dashboard/"), chromedp.WaitVisible(`#rules tbody tr[data-rule="per-key"]`)); err != nil {
		t.Fatal(err)
	}
	type shown struct {
		Hidden bool              `json:"hidden"`
		Rule   string            `json:"rule"`
		Denied []string          `json:"denied"` // key=count (text), the current and the last period
		Bounds map[string]string `json:"bounds"` // kind/period -> header text
	}
	const js = `(() => {
		const div = document.querySelector('#topkeys .topkeys[data-rule="per-key"]');
		const out = {hidden: document.getElementById('topkeys-section').hidden, rule: '', denied: [], bounds: {}};
		if (!div) return out;
		out.rule = div.querySelector('h3').textContent;
		for (const tr of div.querySelectorAll('tbody tr')) {
			for (const period of ['current', 'last']) {
				const q = (f) => tr.querySelector('td[data-kind="denied"][data-period="' + period + '"][data-field="' + f + '"]');
				if (q('key').dataset.value) out.denied.push(q('key').textContent + '=' + q('count').textContent);
			}
		}
		for (const th of div.querySelectorAll('th[data-field="bound"]')) out.bounds[th.dataset.kind + '/' + th.dataset.period] = th.textContent;
		return out;
	})()`
	read := func() shown {
		t.Helper()
		s, err := chromedp.Run(tctx, chromedp.Evaluate[shown](js))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if s := read(); !s.Hidden || len(s.Denied) != 0 {
		t.Fatalf("top keys before any traffic: %+v", s)
	}
	if d := sendTopKeysTraffic(t, proxy); d != topAbusers*(topAbuse-5) {
		t.Fatalf("%d denied, want %d", d, topAbusers*(topAbuse-5))
	}
	var want []string
	for a := 0; a < topAbusers; a++ {
		want = append(want, fmt.Sprintf("abuser-%d=%d", a, topAbuse-5))
	}
	var got shown
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got = read()
		sort.Strings(got.Denied)
		if strings.Join(got.Denied, " ") == strings.Join(want, " ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page never named the 5 abusers with 10 denials each: %+v", got)
		}
	}
	if got.Hidden || got.Rule != "per-key" || !strings.HasPrefix(got.Bounds["denied/current"], "total 50, error ≤ 0, since ") {
		t.Errorf("top keys shown %+v", got)
	}
	// Consumption: every admitted request, background and abusers alike (200 + 5×5).
	for deadline := time.Now().Add(10 * time.Second); !strings.HasPrefix(got.Bounds["consumed/current"], "total 225, error ≤ 14,"); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("consumed bound %q", got.Bounds["consumed/current"])
		}
		got = read()
	}
}
