package dashboard

import (
	"embed"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

//go:embed assets/index.html assets/app.js assets/style.css
var assets embed.FS

// contentSecurityPolicy forbids every origin but the dashboard's own: the page cannot load
// anything from the network even by mistake.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the dashboard at the root of its own path space: "/" (the page),
// "/app.js", "/style.css" and "/api/state" (State as JSON). Mount it under a prefix with
// http.StripPrefix; the page uses relative URLs. When the newest sample is older than
// 2×Interval (Run is not running, or lags), api/state takes a snapshot before answering.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	file := func(name, ctype string) http.HandlerFunc {
		body, err := assets.ReadFile("assets/" + name)
		if err != nil {
			panic("dashboard: missing embedded asset " + name) // a build defect, caught by tests
		}
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ctype)
			w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("Cache-Control", "no-cache")
			w.Write(body)
		}
	}
	mux.HandleFunc("GET /{$}", file("index.html", "text/html; charset=utf-8"))
	mux.HandleFunc("GET /app.js", file("app.js", "text/javascript; charset=utf-8"))
	mux.HandleFunc("GET /style.css", file("style.css", "text/css; charset=utf-8"))
	mux.HandleFunc("GET /api/state", func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		d.mu.Lock()
		last, ok := d.ring.Last()
		stale := !ok || now.Sub(last.t) >= 2*d.opts.Interval
		d.mu.Unlock()
		if stale {
			d.Scrape(now) // a closed host is part of the state shown
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		// The page asks for charts as wide as its layout makes them: ?chart_width=N for
		// each rule's, ?memory_width=N for the memory chart's.
		width := func(name string) int {
			n, _ := strconv.Atoi(r.URL.Query().Get(name))
			return n
		}
		json.NewEncoder(w).Encode(d.StateWithCharts(now, ChartWidths{Rule: width("chart_width"), Memory: width("memory_width")}))
	})
	return mux
}
