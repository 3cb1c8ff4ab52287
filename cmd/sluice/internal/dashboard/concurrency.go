package dashboard

import (
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/svgchart"
	"github.com/sluice-proxy/sluice/filter"
	"time"
)

// The metrics of a concurrency rule (filter.ConcurrencyMetrics): ConcurrencyCounters
// (acquired, refused, queued, reclaimed) are read as rates and totals, like Decisions;
// the gauge inFlightMetric is the requests in flight now (summed over workers).
var (
	ConcurrencyCounters = []string{filter.ConcurrencyMetrics[1], filter.ConcurrencyMetrics[2], filter.ConcurrencyMetrics[3], filter.ConcurrencyMetrics[4]}
	inFlightMetric      = filter.ConcurrencyMetrics[0]
)

// isConcurrency reports whether r is a concurrency rule: from the configuration, or
// when its in-flight gauge exists.
func isConcurrency(r *Rule, families map[string]string) bool {
	return r.Algorithm == "concurrency" || families[filter.RuleMetric(r.Name, inFlightMetric)] != ""
}

// concurrencyState fills in a concurrency rule's counters, in-flight gauge and chart.
func (d *Dashboard) concurrencyState(r *Rule, last point, families map[string]string, span time.Duration, width int) {
	d.counters(r, ConcurrencyCounters, last, families)
	g := filter.RuleMetric(r.Name, inFlightMetric)
	r.Metrics[inFlightMetric] = families[g]
	v, ok := last.values[guestKey+g]
	r.InFlight = optional(v, ok)
	c := svgchart.Chart{
		ID: "inflight-chart-" + r.Name, Title: r.Name + " — requests in flight", Width: width, Height: 180,
		XMin: -span.Seconds(), XMax: 0, XTicks: xTicks(span), XFormat: xFormat,
		YLabel: "in flight",
		Series: []svgchart.Series{{
			Name: "in flight", Class: "in_flight", Color: "#2f7ed8", Kind: svgchart.Step,
			Points: d.series(guestKey+g, span, 1, false),
		}},
	}
	if r.Limit != nil {
		c.YMin, c.YMax = 0, float64(*r.Limit)
	}
	r.InFlightChart = chart(c)
}
