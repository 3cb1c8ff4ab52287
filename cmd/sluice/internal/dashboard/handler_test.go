package dashboard

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestHandlerServesThePageAndState(t *testing.T) {
	src := source(snapshot(configJSON, 3, counters(1, 2, 0)))
	d := New(src, Options{})
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", http.StripPrefix("/dashboard", d.Handler()))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for path, ctype := range map[string]string{"/dashboard/": "text/html", "/dashboard/app.js": "text/javascript", "/dashboard/style.css": "text/css"} {
		resp, body := get(path)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) || len(body) < 100 {
			t.Errorf("%s: %d %s (%d bytes)", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
	}
	if resp, _ := get("/dashboard/nope"); resp.StatusCode != 404 {
		t.Errorf("unknown path: %d", resp.StatusCode)
	}

	// No Run loop: api/state takes a snapshot on demand.
	resp, body := get("/dashboard/api/state")
	if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("api/state: %d %v", resp.StatusCode, resp.Header)
	}
	var st State
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Samples != 1 || !st.Live || len(st.Rules) != 2 || val(rule(t, st, "per-client").Totals["denied"]) != "2" {
		t.Errorf("state %+v", st)
	}
	// A second request right away reuses the fresh sample.
	get("/dashboard/api/state")
	if n := src.calls(); n != 1 {
		t.Errorf("%d snapshots for two immediate requests, want 1", n)
	}
}

// The page works offline: no asset refers to anything outside the admin server.
func TestAssetsAreSelfContained(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(\s*['"]?(https?:|//)`)
	for _, name := range []string{"index.html", "app.js", "style.css"} {
		b, err := assets.ReadFile("assets/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to %q", name, m)
		}
	}
	page, _ := assets.ReadFile("assets/index.html")
	for _, id := range []string{`id="rules"`, `id="charts"`, `id="host"`, `id="workers"`, `id="config"`, `id="status"`, `data-metric="vm-restarts"`, `data-metric="uptime"`} {
		if !strings.Contains(string(page), id) {
			t.Errorf("index.html lacks %s", id)
		}
	}
}

// The page asks for its charts at the widths its layout gives them; the
// server draws them that wide (clamped), and each worker's memory line has
// its own colour and dash, named in the legend, so that equal lines do not
// hide each other.
func TestChartWidthsAndWorkerLines(t *testing.T) {
	d := New(source(snapshot(configJSON, 3, counters(1, 2, 0))), Options{})
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	state := func(query string) State {
		t.Helper()
		resp, err := http.Get(srv.URL + "/api/state" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st State
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	width := regexp.MustCompile(`^<svg [^>]* width="(\d+)"`)
	for _, tc := range []struct {
		query        string
		rule, memory string
	}{
		{"", "640", "640"},
		{"?chart_width=701&memory_width=1388", "701", "1388"},
		{"?chart_width=5&memory_width=100000", "320", "4096"},
		{"?chart_width=x", "640", "640"},
	} {
		st := state(tc.query)
		if m := width.FindStringSubmatch(st.MemoryChart); m == nil || m[1] != tc.memory {
			t.Errorf("%s: memory chart width %v, want %s", tc.query, m, tc.memory)
		}
		for _, r := range st.Rules {
			if m := width.FindStringSubmatch(r.Chart); m == nil || m[1] != tc.rule {
				t.Errorf("%s: rule %s chart width %v, want %s", tc.query, r.Name, m, tc.rule)
			}
		}
	}

	mem := state("").MemoryChart
	lines := regexp.MustCompile(`<g class="series (worker-\d+)" data-name="([^"]+)">\s*<polyline points="[^"]+" fill="none" stroke="([^"]+)" stroke-width="[^"]+"( stroke-dasharray="([^"]+)")?/>`).FindAllStringSubmatch(mem, -1)
	if len(lines) != 2 {
		t.Fatalf("memory chart: %d worker lines, want 2:\n%s", len(lines), mem)
	}
	if lines[0][3] == lines[1][3] || lines[0][5] == lines[1][5] {
		t.Errorf("workers drawn alike: %q %q and %q %q", lines[0][3], lines[0][5], lines[1][3], lines[1][5])
	}
	for _, l := range lines {
		if !strings.Contains(mem, `<text x=`) || !strings.Contains(mem, ">"+l[2]+"</text>") {
			t.Errorf("legend lacks %s", l[2])
		}
	}
	if !strings.Contains(mem, `stroke-dasharray="`+lines[1][5]+`"/><text`) {
		t.Errorf("the legend does not show worker 1's dash %q", lines[1][5])
	}
}
