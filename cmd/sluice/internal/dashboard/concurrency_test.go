package dashboard

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

const concurrencyConfig = `{"rules":[{"name":"gpu","key":[{"header":"x-api-key"}],"algorithm":"concurrency","limit":10,"delay":{"max":"5s"}},` +
	`{"name":"plain","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1m"}]}`

// concurrencySnapshot is a host running concurrencyConfig with gpu's slots: inFlight now,
// acquired and refused so far.
func concurrencySnapshot(inFlight, acquired, refused int64) host.Snapshot {
	s := snapshot(concurrencyConfig, 0, map[string]int64{
		"sluice.gpu.allowed": acquired, "sluice.gpu.denied": refused, "sluice.gpu.shadow_denied": 0,
		"sluice.gpu.acquired": acquired, "sluice.gpu.refused": refused, "sluice.gpu.queued": 0, "sluice.gpu.reclaimed": 0,
		"sluice.plain.allowed": 3,
	})
	s.Metrics = append(s.Metrics, host.Metric{Name: "sluice.gpu.in_flight", Family: "sluice_gpu_in_flight", Type: host.MetricGauge, Value: inFlight})
	sort.Slice(s.Metrics, func(i, j int) bool { return s.Metrics[i].Name < s.Metrics[j].Name })
	return s
}

// The dashboard shows a concurrency rule's requests in flight now and over time, its
// acquisitions and refusals; a rate rule gets none of it.
func TestInFlight(t *testing.T) {
	d := New(source(
		concurrencySnapshot(0, 0, 0),
		concurrencySnapshot(10, 10, 4),
		concurrencySnapshot(7, 12, 4),
		concurrencySnapshot(0, 12, 4),
	), Options{RateWindow: 2 * time.Second})
	scrapeAll(t, d, 0, 1, 2, 3)
	st := d.State(at(3))
	g := rule(t, st, "gpu")
	if val(g.InFlight) != "0" || g.Window != "" || val(g.Totals["acquired"]) != "12" || val(g.Totals["refused"]) != "4" ||
		g.Metrics["in_flight"] != "sluice_gpu_in_flight" {
		t.Errorf("gpu: in flight %s window %q totals %v metrics %v", val(g.InFlight), g.Window, g.Totals, g.Metrics)
	}
	svg := strings.ReplaceAll(g.InFlightChart, `class="series in_flight"`, `class="series held"`)
	if got := heldYs(t, svg); got != "0 10 7 0" {
		t.Errorf("in-flight chart %s, want 0 10 7 0", got)
	}
	if p := rule(t, st, "plain"); p.InFlight != nil || p.InFlightChart != "" {
		t.Errorf("a rate rule with in-flight state: %+v", p)
	}
}
