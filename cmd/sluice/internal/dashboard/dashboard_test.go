package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

// The host is a Source.
var _ Source = (*host.Host)(nil)

// fake is a Source that returns its next snapshot on every call; the last one repeats.
type fake struct {
	mu    sync.Mutex
	snaps []host.Snapshot
	n     int
}

func (f *fake) Snapshot() host.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := min(f.n, len(f.snaps)-1)
	f.n++
	return f.snaps[i]
}

func (f *fake) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

func source(snaps ...host.Snapshot) *fake { return &fake{snaps: snaps} }

const configJSON = `{"rules":[{"name":"per-client","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1m"},` +
	`{"name":"audit","mode":"shadow","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":2,"window":"1s","burst":4}]}`

// snapshot is what a host running configJSON (or cfg) would give: two workers, and the
// guest metrics named in counters (a missing name is not defined).
func snapshot(cfg string, requests uint64, counters map[string]int64) host.Snapshot {
	s := host.Snapshot{
		Stats: host.Stats{
			ABIVersion: "0.2.1", Uptime: 12500 * time.Millisecond, Requests: requests, VMRestarts: 1, Failed: 1,
			Workers: []host.WorkerStats{
				{ID: 0, Healthy: true, MemoryBytes: 2 << 20, VMRestarts: 1, Requests: 25, Failed: 1},
				{ID: 1, Healthy: false, Requests: 15},
			},
		},
		StartedAt: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), VMID: "sluice", PluginName: "sluice",
		MemoryLimitBytes: 256 << 20,
		Plugins:          []host.Plugin{{Plugin: 0, Configs: []host.PluginConfig{{Config: []byte(cfg), Workers: []int{0, 1}}}}},
	}
	s.Stats.SharedData.Keys, s.Stats.SharedData.Bytes = 3, 120
	for name, v := range counters {
		family := strings.NewReplacer(".", "_", "-", "_").Replace(name)
		s.Metrics = append(s.Metrics, host.Metric{Name: name, Family: family, Type: host.MetricCounter, Value: v})
	}
	sort.Slice(s.Metrics, func(i, j int) bool { return s.Metrics[i].Name < s.Metrics[j].Name })
	return s
}

// counters are the filter's metrics for the two rules of configJSON.
func counters(allowed, denied, shadow int64) map[string]int64 {
	return map[string]int64{
		"sluice.audit.allowed":             0,
		"sluice.audit.shadow_denied":       shadow,
		"sluice.errors":                    0,
		"sluice.per-client.allowed":        allowed,
		"sluice.per-client.denied":         denied,
		"sluice.per-client.shadow_denied":  0,
		"sluice.per-client.store_errors":   0,
		"sluice.guest.heap_bytes":          1 << 20,
		"kitchen_unrelated{label=\"x\"}":   7,
		"sluice.per-client.something_else": 9,
	}
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
		if err := d.Scrape(at(s)); err != nil {
			t.Fatalf("scrape at %v: %v", s, err)
		}
	}
}

func TestRatesFromCounters(t *testing.T) {
	snaps := []host.Snapshot{
		snapshot(configJSON, 0, counters(0, 0, 0)),
		snapshot(configJSON, 5, counters(5, 0, 1)),
		snapshot(configJSON, 8, counters(5, 3, 1)),
		snapshot(configJSON, 11, counters(5, 6, 2)),
		snapshot(configJSON, 14, counters(5, 9, 2)),
	}
	d := New(source(snaps...), Options{RateWindow: 10 * time.Second})
	scrapeAll(t, d, 0, 1, 2, 3, 4)
	st := d.State(at(4.5))
	if !st.Live || st.Error != "" || st.Samples != 5 || len(st.Problems) != 0 {
		t.Fatalf("live %v error %q samples %d problems %q", st.Live, st.Error, st.Samples, st.Problems)
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
	if pc.Metrics["denied"] != "sluice_per_client_denied" || pc.Mode != "enforce" || pc.Algorithm != "fixed_window" ||
		val2(pc.Limit) != "5" || pc.Window != "1m" || pc.Burst != nil {
		t.Errorf("per-client %+v", pc)
	}
	audit := rule(t, st, "audit")
	if val(audit.Rates["shadow_denied"]) != "0.5" || audit.Mode != "shadow" || val2(audit.Burst) != "4" || audit.Window != "1s" {
		t.Errorf("audit %+v rates %s", audit, val(audit.Rates["shadow_denied"]))
	}
	// audit.store_errors is not defined: unknown, not zero; and it has no Prometheus name.
	if audit.Totals["store_errors"] != nil || audit.Rates["store_errors"] != nil || audit.Metrics["store_errors"] != "" {
		t.Errorf("an undefined counter shows as %s / %s / %q", val(audit.Totals["store_errors"]), val(audit.Rates["store_errors"]), audit.Metrics["store_errors"])
	}
	if st.Host == nil || val(st.Host.RequestRate) != "3.5" {
		t.Fatalf("host %+v", st.Host)
	}

	// A 2 s window starts at the sample 2 s before the newest: (9-3)/2.
	d2 := New(source(snaps...), Options{RateWindow: 2 * time.Second})
	scrapeAll(t, d2, 0, 1, 2, 3, 4)
	pc = rule(t, d2.State(at(4)), "per-client")
	if val(pc.Rates["denied"]) != "3" || val(pc.Rates["allowed"]) != "0" {
		t.Errorf("2s window: denied %s allowed %s", val(pc.Rates["denied"]), val(pc.Rates["allowed"]))
	}
}

func val2(p *int64) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

func TestHealthAndConfig(t *testing.T) {
	d := New(source(snapshot(configJSON, 40, counters(1, 2, 3))), Options{})
	scrapeAll(t, d, 0)
	st := d.State(at(0))
	h := st.Host
	if h.UptimeSeconds != 12.5 || h.VMRestarts != 1 || h.FailedRequests != 1 || h.Requests != 40 || h.MemoryLimitBytes != 256<<20 ||
		h.SharedDataKeys != 3 || h.SharedDataBytes != 120 || h.ABIVersion != "0.2.1" || h.VMID != "sluice" || h.Closed ||
		!h.StartedAt.Equal(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)) {
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
	if st.Config.Error != "" || !strings.Contains(st.Config.Pretty, "{\n  \"rules\": [\n    {\n      \"name\": \"per-client\",") {
		t.Errorf("config %q error %q", st.Config.Pretty, st.Config.Error)
	}
	// The rules are config's: its summary, in configuration order.
	if len(st.Rules) != 2 || st.Rules[0].Name != "per-client" || st.Rules[1].Summary != "audit: token_bucket 2/1s burst 4 key=header:x-api-key match=all local shadow" {
		t.Errorf("rules %+v", st.Rules)
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
	// The page's JSON: a window rule has no burst.
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"name":"per-client","mode":"enforce","algorithm":"fixed_window","limit":5,"window":"1m","summary":`) {
		t.Errorf("state JSON %.400s", b)
	}
}

// A new configuration in force shows at the next sample.
func TestConfigChanges(t *testing.T) {
	other := `{"rules":[{"name":"only","key":[{"path":true}],"algorithm":"leaky_bucket","limit":3,"window":"10s"}]}`
	d := New(source(snapshot(configJSON, 0, nil), snapshot(other, 0, nil)), Options{})
	scrapeAll(t, d, 0)
	if n := len(d.State(at(0)).Rules); n != 2 {
		t.Fatalf("%d rules", n)
	}
	scrapeAll(t, d, 1)
	st := d.State(at(1))
	if len(st.Rules) != 1 || st.Rules[0].Name != "only" || val2(st.Rules[0].Burst) != "3" || !strings.Contains(st.Config.Pretty, `"only"`) {
		t.Errorf("after the change: %+v", st.Rules)
	}
}

func TestCounterResetAndGaps(t *testing.T) {
	cfg := `{"rules":[{"name":"r","key":[{"path":true}],"algorithm":"fixed_window","limit":1,"window":"1s"}]}`
	s := func(v int64, defined bool) host.Snapshot {
		if !defined {
			return snapshot(cfg, 0, nil)
		}
		return snapshot(cfg, 0, map[string]int64{"sluice.r.denied": v})
	}
	d := New(source(s(10, true), s(12, true), s(3, true), s(0, false), s(0, false), s(5, true), s(7, true)), Options{RateWindow: time.Minute})
	scrapeAll(t, d, 0, 1, 2)
	// 10 -> 12 (+2), reset to 3 (+3): 5 over 2 s.
	if got := val(rule(t, d.State(at(2)), "r").Rates["denied"]); got != "2.5" {
		t.Fatalf("rate across a reset = %s, want 2.5", got)
	}
	scrapeAll(t, d, 3, 4, 5, 6)
	// The samples without the counter break the chain: only 5 -> 7 after them counts, so
	// 10->12->3 (+5 in 2 s) and 5->7 (+2 in 1 s): 7 over the 6 s between first and last.
	st := d.State(at(6))
	r := rule(t, st, "r")
	if got := val(r.Rates["denied"]); got != fmt.Sprint(7.0/6) {
		t.Errorf("rate with gaps = %s, want %v", got, 7.0/6)
	}
	if val(r.Totals["denied"]) != "7" {
		t.Errorf("total %s", val(r.Totals["denied"]))
	}
	pts := d.series(guestKey+"sluice.r.denied", time.Minute, 1, true)
	var ys []string
	for _, p := range pts {
		ys = append(ys, fmt.Sprint(p.Y))
	}
	if got := strings.Join(ys, " "); got != "2 3 NaN NaN NaN 2" {
		t.Errorf("per-interval rates %s", got)
	}
	if _, err := json.Marshal(st); err != nil {
		t.Fatalf("state with gaps does not encode: %v", err)
	}
}

func TestClosedHostAndStaleness(t *testing.T) {
	closed := snapshot(configJSON, 3, counters(1, 1, 0))
	closed.Closed = true
	d := New(source(snapshot(configJSON, 2, counters(1, 1, 0)), closed, snapshot(configJSON, 4, counters(1, 1, 0))), Options{})
	if st := d.State(at(0)); st.Live || st.Error != "no sample yet" || len(st.Rules) != 0 || st.Host != nil {
		t.Fatalf("empty state %+v", st)
	}
	scrapeAll(t, d, 0)
	if st := d.State(at(0.5)); !st.Live || st.Error != "" {
		t.Fatalf("live %v error %q", st.Live, st.Error)
	}
	if err := d.Scrape(at(1)); err != ErrHostClosed {
		t.Fatalf("closed host: %v", err)
	}
	st := d.State(at(1))
	if st.Live || st.Error != "the host is closed" || !st.Host.Closed || st.Host.Requests != 3 || st.Samples != 2 || len(st.Rules) != 2 {
		t.Errorf("after close: live %v error %q host %+v samples %d", st.Live, st.Error, st.Host, st.Samples)
	}
	scrapeAll(t, d, 2)
	if st = d.State(at(2.2)); !st.Live {
		t.Errorf("not live again: %q", st.Error)
	}
	if st = d.State(at(10)); st.Live || st.Error != "the last sample is 8s old" {
		t.Errorf("stale: live %v %q", st.Live, st.Error)
	}
}

func TestProblems(t *testing.T) {
	// More guest metrics than MaxSeries: the first by name are kept.
	d := New(source(snapshot(configJSON, 0, counters(1, 2, 3))), Options{MaxSeries: 4})
	scrapeAll(t, d, 0)
	st := d.State(at(0))
	if strings.Join(st.Problems, "|") != "6 guest metrics beyond the first 4 not kept" {
		t.Errorf("problems %q", st.Problems)
	}
	if pc := rule(t, st, "per-client"); pc.Totals["denied"] != nil || val(rule(t, st, "audit").Totals["shadow_denied"]) != "3" {
		t.Errorf("kept the wrong metrics: %v / %v", pc.Totals, rule(t, st, "audit").Totals)
	}

	// Workers that disagree on the configuration: worker 0's is shown, the page says so.
	s := snapshot(configJSON, 0, nil)
	s.Plugins[0].Configs = []host.PluginConfig{{Config: []byte(configJSON), Workers: []int{0, 2}}, {Config: []byte(`{"rules":[]}`), Workers: []int{1}}}
	d = New(source(s), Options{})
	scrapeAll(t, d, 0)
	st = d.State(at(0))
	if strings.Join(st.Problems, "|") != "the workers disagree: 2 configurations in force (on workers [0 2], [1]); shown: worker 0's" || len(st.Rules) != 2 {
		t.Errorf("problems %q, %d rules", st.Problems, len(st.Rules))
	}
}

func TestClockBackwardsAndHistoryBound(t *testing.T) {
	d := New(source(snapshot(configJSON, 0, counters(0, 0, 0))), Options{History: 5 * time.Second, ChartSpan: time.Hour})
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
	metrics := map[string]int64{
		"sluice.api-key.shadow_denied": 1, "sluice.api-key.denied": 2, "sluice.other.allowed": 3,
		"sluice.errors": 0, "sluice.guest.gc_cycles": 4, "sluice.checkout.per-ip.denied": 5, "kitchen.denied": 6,
	}
	for _, c := range []struct{ cfg, err string }{
		{"rules: yaml?", "not JSON: "},
		{`{"rules":[{"name":"x"}]}`, "not a sluice configuration: rules[0]"},
	} {
		d := New(source(snapshot(c.cfg, 0, metrics)), Options{})
		scrapeAll(t, d, 0)
		st := d.State(at(0))
		if !strings.HasPrefix(st.Config.Error, c.err) || !strings.Contains(st.Config.Pretty, "rules") {
			t.Errorf("%s: config %+v", c.cfg, st.Config)
		}
		var names []string
		for _, r := range st.Rules {
			names = append(names, r.Name)
		}
		if strings.Join(names, ",") != "api-key,checkout.per-ip,other" {
			t.Fatalf("%s: discovered rules %v", c.cfg, names)
		}
		if r := rule(t, st, "api-key"); val(r.Totals["shadow_denied"]) != "1" || val(r.Totals["denied"]) != "2" || r.Limit != nil || r.Mode != "" {
			t.Errorf("api-key %+v totals %v", r, r.Totals)
		}
	}
}

func TestRunStopsWhenTheHostCloses(t *testing.T) {
	closed := snapshot(configJSON, 0, nil)
	closed.Closed = true
	src := source(snapshot(configJSON, 0, nil), snapshot(configJSON, 0, nil), closed)
	d := New(src, Options{Interval: time.Millisecond})
	done := make(chan struct{})
	go func() { d.Run(context.Background()); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop when the host closed")
	}
	if n := src.calls(); n != 3 {
		t.Errorf("%d snapshots, want 3", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	src2 := source(snapshot(configJSON, 0, nil))
	New(src2, Options{}).Run(ctx) // returns after one sample
	if n := src2.calls(); n != 1 {
		t.Errorf("%d snapshots with a cancelled context, want 1", n)
	}
}

func TestChartSpanGrowsWithHistory(t *testing.T) {
	d := New(source(snapshot(configJSON, 0, counters(0, 0, 0))), Options{})
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
