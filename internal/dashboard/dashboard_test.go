package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// script is a Source that returns its next document on every Fetch.
type script struct {
	metrics []string
	status  []string // the last one repeats
	errs    []error  // a non-nil entry fails that fetch
	n       int
}

func (s *script) Fetch(ctx context.Context) ([]byte, []byte, error) {
	i := s.n
	s.n++
	if i < len(s.errs) && s.errs[i] != nil {
		return nil, nil, s.errs[i]
	}
	m := s.metrics[min(i, len(s.metrics)-1)]
	st := s.status[min(i, len(s.status)-1)]
	return []byte(m), []byte(st), nil
}

const statusJSON = `{"abi_version":"0.2.1","vm_id":"sluice","plugin_name":"sluice","fail_open":false,
"uptime_seconds":12.5,"started_at":"2026-11-30T00:00:00Z","requests":40,"vm_restarts":1,"failed_requests":1,
"memory_limit_bytes":268435456,"workers":[{"id":0,"healthy":true,"memory_bytes":2097152,"vm_restarts":1,"requests":25,"failed_requests":1},
{"id":1,"healthy":false,"memory_bytes":0,"vm_restarts":0,"requests":15,"failed_requests":0}],
"shared_data":{"keys":3,"bytes":120},
"plugin_config":"{\"rules\":[{\"name\":\"per-client\",\"key\":[{\"remote_ip\":true}],\"algorithm\":\"fixed_window\",\"limit\":5,\"window\":\"1m\"},{\"name\":\"audit\",\"mode\":\"shadow\",\"algorithm\":\"token_bucket\",\"limit\":2,\"window\":\"1s\",\"burst\":4}]}"}`

// metricsText is what the host would expose for the two rules of statusJSON.
func metricsText(allowed, denied, shadow float64, requests float64) string {
	return fmt.Sprintf(`# TYPE sluice_audit_allowed counter
sluice_audit_allowed 0
# TYPE sluice_audit_shadow_denied counter
sluice_audit_shadow_denied %v
# TYPE sluice_errors counter
sluice_errors 0
# TYPE sluice_per_client_allowed counter
sluice_per_client_allowed %v
# TYPE sluice_per_client_denied counter
sluice_per_client_denied %v
sluice_per_client_shadow_denied 0
sluice_per_client_store_errors 0
# HELP sluice_host_requests_total Requests run through the filter.
sluice_host_requests_total %v
sluice_host_worker_memory_bytes{worker="0"} 2097152
sluice_host_worker_memory_bytes{worker="1"} 0
`, shadow, allowed, denied, requests)
}

var t0 = time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

func rule(t *testing.T, st State, name string) Rule {
	t.Helper()
	for _, r := range st.Rules {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no rule %q in %+v", name, st.Rules)
	return Rule{}
}

func val(p *float64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

func scrapeAll(t *testing.T, d *Dashboard, times ...float64) {
	t.Helper()
	for _, s := range times {
		if err := d.Scrape(context.Background(), at(s)); err != nil {
			t.Fatalf("scrape at %v: %v", s, err)
		}
	}
}

func TestRatesFromCounters(t *testing.T) {
	src := &script{status: []string{statusJSON}, metrics: []string{
		metricsText(0, 0, 0, 0),
		metricsText(5, 0, 1, 5),
		metricsText(5, 3, 1, 8),
		metricsText(5, 6, 2, 11),
		metricsText(5, 9, 2, 14),
	}}
	d := New(src, Options{RateWindow: 10 * time.Second})
	scrapeAll(t, d, 0, 1, 2, 3, 4)
	st := d.State(at(4.5))
	if !st.Live || st.Error != "" || st.Samples != 5 {
		t.Fatalf("live %v error %q samples %d", st.Live, st.Error, st.Samples)
	}
	pc := rule(t, st, "per-client")
	// Over the whole 4 s: 5 allowed, 9 denied.
	for dec, want := range map[string]string{"allowed": "1.25", "denied": "2.25", "shadow_denied": "0", "store_errors": "0"} {
		if got := val(pc.Rates[dec]); got != want {
			t.Errorf("per-client %s rate = %s, want %s", dec, got, want)
		}
	}
	if val(pc.Totals["denied"]) != "9" || val(pc.Totals["allowed"]) != "5" {
		t.Errorf("totals %s %s", val(pc.Totals["allowed"]), val(pc.Totals["denied"]))
	}
	if pc.Metrics["denied"] != "sluice_per_client_denied" || pc.Mode != "enforce" || pc.Algorithm != "fixed_window" || string(pc.Limit) != "5" || pc.Window != "1m" {
		t.Errorf("per-client %+v", pc)
	}
	audit := rule(t, st, "audit")
	if val(audit.Rates["shadow_denied"]) != "0.5" || audit.Mode != "shadow" || string(audit.Burst) != "4" {
		t.Errorf("audit %+v rates %s", audit, val(audit.Rates["shadow_denied"]))
	}
	if st.Host == nil || val(st.Host.RequestRate) != "3.5" {
		t.Fatalf("host %+v", st.Host)
	}

	// A 2 s window starts at the sample 2 s before the newest: (9-3)/2.
	d2 := New(&script{status: src.status, metrics: src.metrics}, Options{RateWindow: 2 * time.Second})
	scrapeAll(t, d2, 0, 1, 2, 3, 4)
	pc = rule(t, d2.State(at(4)), "per-client")
	if val(pc.Rates["denied"]) != "3" || val(pc.Rates["allowed"]) != "0" {
		t.Errorf("2s window: denied %s allowed %s", val(pc.Rates["denied"]), val(pc.Rates["allowed"]))
	}
}

func TestHealthAndConfig(t *testing.T) {
	d := New(&script{status: []string{statusJSON}, metrics: []string{metricsText(1, 2, 3, 4)}}, Options{})
	scrapeAll(t, d, 0)
	st := d.State(at(0))
	h := st.Host
	if h.UptimeSeconds != 12.5 || h.VMRestarts != 1 || h.FailedRequests != 1 || h.Requests != 40 || h.MemoryLimitBytes != 256<<20 || h.SharedDataKeys != 3 || h.SharedDataBytes != 120 || h.ABIVersion != "0.2.1" {
		t.Errorf("health %+v", h)
	}
	if len(h.Workers) != 2 || !h.Workers[0].Healthy || h.Workers[0].MemoryBytes != 2<<20 || h.Workers[1].Healthy || h.Workers[1].Requests != 15 {
		t.Errorf("workers %+v", h.Workers)
	}
	// One sample: totals known, rates not yet.
	pc := rule(t, st, "per-client")
	if val(pc.Totals["denied"]) != "2" || pc.Rates["denied"] != nil {
		t.Errorf("one sample: total %s rate %s", val(pc.Totals["denied"]), val(pc.Rates["denied"]))
	}
	if st.Config.Error != "" || !strings.Contains(st.Config.Pretty, "\n  \"rules\": [\n    {\n      \"name\": \"per-client\",") {
		t.Errorf("config %q error %q", st.Config.Pretty, st.Config.Error)
	}
	if val(st.FilterErrors) != "0" {
		t.Errorf("filter errors %s", val(st.FilterErrors))
	}
	if !strings.Contains(st.MemoryChart, `id="chart-memory"`) || !strings.Contains(st.MemoryChart, `data-name="worker 1"`) {
		t.Errorf("memory chart %.300s", st.MemoryChart)
	}
	if !strings.Contains(pc.Chart, `id="chart-per-client"`) {
		t.Errorf("chart %.200s", pc.Chart)
	}
	for _, dec := range []string{"allowed", "denied", "shadow-denied"} {
		if !strings.Contains(pc.Chart, `data-name="`+dec+`"`) {
			t.Errorf("chart lacks series %s", dec)
		}
	}
}

func TestCounterResetAndGaps(t *testing.T) {
	text := func(v string) string { return "sluice_r_denied " + v + "\n" }
	cfg := `{"plugin_config":"{\"rules\":[{\"name\":\"r\"}]}"}`
	d := New(&script{status: []string{cfg}, metrics: []string{text("10"), text("12"), text("3"), "", text("NaN"), text("5"), text("7")}}, Options{RateWindow: time.Minute})
	scrapeAll(t, d, 0, 1, 2)
	// 10 -> 12 (+2), reset to 3 (+3): 5 over 2 s.
	if got := val(rule(t, d.State(at(2)), "r").Rates["denied"]); got != "2.5" {
		t.Fatalf("rate across a reset = %s, want 2.5", got)
	}
	scrapeAll(t, d, 3, 4, 5, 6)
	// The missing and NaN samples break the chain: only 5 -> 7 after them counts, so
	// 10->12->3 (+5 in 2 s) and 5->7 (+2 in 1 s): 7 over the 6 s between first and last.
	st := d.State(at(6))
	r := rule(t, st, "r")
	if got := val(r.Rates["denied"]); got != fmt.Sprint(7.0/6) {
		t.Errorf("rate with gaps = %s, want %v", got, 7.0/6)
	}
	if r.Totals["denied"] == nil || *r.Totals["denied"] != 7 {
		t.Errorf("total %s", val(r.Totals["denied"]))
	}
	pts := d.series("sluice_r_denied", time.Minute, 1, true)
	var ys []string
	for _, p := range pts {
		ys = append(ys, fmt.Sprint(p.Y))
	}
	if got := strings.Join(ys, " "); got != "2 3 NaN NaN NaN 2" {
		t.Errorf("per-interval rates %s", got)
	}
	if _, err := json.Marshal(st); err != nil {
		t.Fatalf("state with NaN does not encode: %v", err)
	}
	// A NaN total is shown as unknown, not as NaN.
	d.mu.Lock()
	d.ring.Push(point{t: at(7), values: map[string]float64{"sluice_r_denied": math.Inf(1)}})
	d.mu.Unlock()
	if r := rule(t, d.State(at(7)), "r"); r.Totals["denied"] != nil {
		t.Errorf("Inf total shown as %s", val(r.Totals["denied"]))
	}
}

func TestErrorsAndStaleness(t *testing.T) {
	boom := errors.New("connection refused")
	src := &script{
		status:  []string{statusJSON, "not json", statusJSON},
		metrics: []string{metricsText(1, 1, 0, 2) + "garbage here\n"},
		errs:    []error{nil, nil, boom},
	}
	d := New(src, Options{})
	if st := d.State(at(0)); st.Live || st.Error != "no sample yet" || len(st.Rules) != 0 || st.Host != nil {
		t.Fatalf("empty state %+v", st)
	}
	scrapeAll(t, d, 0)
	st := d.State(at(0.5))
	if !st.Live || len(st.MetricErrors) != 1 || st.MetricErrors[0] != `/metrics line 17: value "here" is not a number` {
		t.Fatalf("live %v metric errors %q", st.Live, st.MetricErrors)
	}
	if err := d.Scrape(context.Background(), at(1)); err == nil || !strings.Contains(err.Error(), "/status is not the expected JSON") {
		t.Fatalf("bad status: %v", err)
	}
	st = d.State(at(1))
	if st.Live || !strings.Contains(st.Error, "/status") || st.Host == nil || len(st.Rules) != 2 {
		t.Errorf("after bad status: live %v error %q (the previous status is still shown)", st.Live, st.Error)
	}
	if err := d.Scrape(context.Background(), at(2)); !errors.Is(err, boom) {
		t.Fatalf("fetch error: %v", err)
	}
	if st = d.State(at(2)); st.Live || st.Error != "connection refused" || st.Samples != 2 {
		t.Errorf("after fetch error: %+v", st)
	}
	scrapeAll(t, d, 3)
	if st = d.State(at(3.2)); !st.Live {
		t.Errorf("not live again: %q", st.Error)
	}
	if st = d.State(at(10)); st.Live || st.Error != "the last sample is 7s old" {
		t.Errorf("stale: live %v %q", st.Live, st.Error)
	}
}

func TestClockBackwardsAndHistoryBound(t *testing.T) {
	d := New(&script{status: []string{statusJSON}, metrics: []string{metricsText(0, 0, 0, 0)}}, Options{History: 5 * time.Second, ChartSpan: time.Hour})
	if d.Options().ChartSpan != 5*time.Second {
		t.Errorf("chart span %v not capped at the history", d.Options().ChartSpan)
	}
	scrapeAll(t, d, 10, 9, 10)
	if st := d.State(at(10)); st.Samples != 1 {
		t.Fatalf("samples %d after scrapes not after the first", st.Samples)
	}
	for s := 11.0; s < 40; s++ {
		scrapeAll(t, d, s)
	}
	if st := d.State(at(40)); st.Samples != 6 {
		t.Fatalf("samples %d, want 6 (5 s of history at 1 s)", st.Samples)
	}
}

func TestRulesFromMetricsWhenConfigUnreadable(t *testing.T) {
	status := `{"plugin_config":"rules: yaml?","workers":[]}`
	metrics := "sluice_api_key_shadow_denied 1\nsluice_api_key_denied 2\nsluice_other_allowed 3\nsluice_host_requests_total 9\nsluice_errors 0\n" +
		`sluice_x_denied{a="b"} 1` + "\n"
	d := New(&script{status: []string{status}, metrics: []string{metrics}}, Options{})
	scrapeAll(t, d, 0)
	st := d.State(at(0))
	if !strings.HasPrefix(st.Config.Error, "not JSON") || st.Config.Pretty != "rules: yaml?" {
		t.Errorf("config %+v", st.Config)
	}
	var names []string
	for _, r := range st.Rules {
		names = append(names, r.Name)
	}
	if strings.Join(names, ",") != "api_key,other" {
		t.Fatalf("discovered rules %v", names)
	}
	if r := rule(t, st, "api_key"); val(r.Totals["shadow_denied"]) != "1" || val(r.Totals["denied"]) != "2" {
		t.Errorf("api_key totals %v", r.Totals)
	}
}

func TestRunStopsWhenTheSourceCloses(t *testing.T) {
	src := &script{status: []string{statusJSON}, metrics: []string{metricsText(0, 0, 0, 0)}, errs: []error{nil, nil, ErrSourceClosed}}
	d := New(src, Options{Interval: time.Millisecond})
	done := make(chan struct{})
	go func() { d.Run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop on ErrSourceClosed")
	}
	if src.n != 3 {
		t.Errorf("%d fetches, want 3", src.n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d2 := New(&script{status: []string{statusJSON}, metrics: []string{""}}, Options{})
	d2.Run(ctx) // returns after one scrape
}

func TestAdminSource(t *testing.T) {
	closed := false
	metricsCode := http.StatusOK
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(metricsCode)
		w.Write([]byte("m 1\n"))
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"vm_id":"x"}`)) })
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if closed {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("closed\n"))
			return
		}
		w.Write([]byte("ok\n"))
	})
	src := AdminSource(mux)
	m, s, err := src.Fetch(context.Background())
	if err != nil || string(m) != "m 1\n" || string(s) != `{"vm_id":"x"}` {
		t.Fatalf("%q %q %v", m, s, err)
	}
	metricsCode = http.StatusInternalServerError
	if _, _, err := src.Fetch(context.Background()); err == nil || err.Error() != "/metrics answered 500" {
		t.Errorf("500: %v", err)
	}
	closed = true
	if _, _, err := src.Fetch(context.Background()); !errors.Is(err, ErrSourceClosed) {
		t.Errorf("closed: %v", err)
	}
}

func TestChartSpanGrowsWithHistory(t *testing.T) {
	d := New(&script{status: []string{statusJSON}, metrics: []string{metricsText(0, 0, 0, 0)}}, Options{})
	scrapeAll(t, d, 0, 1)
	for _, step := range []struct {
		at   float64
		want time.Duration
	}{{1, time.Minute}, {61, 2 * time.Minute}, {100, 2 * time.Minute}, {121, 3 * time.Minute}, {1000, 5 * time.Minute}} {
		if step.at > 1 {
			scrapeAll(t, d, step.at)
		}
		if got := d.chartSpan(); got != step.want {
			t.Errorf("history %vs: span %v, want %v", step.at, got, step.want)
		}
		st := d.State(at(step.at))
		if want := fmt.Sprintf(`data-value="%v"`, -step.want.Seconds()); !strings.Contains(rule(t, st, "per-client").Chart, want) {
			t.Errorf("history %vs: chart lacks an X tick at %s", step.at, want)
		}
	}
}
