package main

import (
	"fmt"
	"strings"
	"time"
)

// figure is one column of the report: a value of a measurement.
type figure struct {
	name string
	verb string // for the absolute values
	get  func(measurement) float64
}

var figures = []figure{
	{"decisions/s", "%.0f", func(m measurement) float64 { return m.res.perSecond() }},
	{"p50 µs", "%.0f", func(m measurement) float64 { return float64(percentile(m.res.lat, 50)) / float64(time.Microsecond) }},
	{"p99 µs", "%.0f", func(m measurement) float64 { return float64(percentile(m.res.lat, 99)) / float64(time.Microsecond) }},
	{"Redis CPU µs/decision", "%.1f", measurement.redisPerDecision},
	{"Redis command µs/decision", "%.1f", measurement.commandPerDecision},
	{"Redis reads/decision", "%.3f", measurement.readsPerDecision},
	{"service CPU µs/decision", "%.1f", measurement.servicePerDecision},
	{"service+Redis CPU µs/decision", "%.1f", func(m measurement) float64 { return m.servicePerDecision() + m.redisPerDecision() }},
}

// summary prints, per variant, the absolute figures (median and range over
// the rounds) of every service and algorithm, and the ratio to the peer of
// the same round (median and range of the per-round ratios).
func summary(ms []measurement, o options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Medians over %d rounds, range in parentheses; ratios are sluice/peer per round, then the median and range of those ratios.\n", o.rounds)
	fmt.Fprintf(&b, "ok: %d values, limit %d/s each (never reached); denied: %d values, limit %d/min each (nearly all over).\n",
		o.okKeys, okLimit, o.deniedKeys, deniedLimit)
	for _, variant := range []string{"ok", "denied"} {
		peer := pick(ms, "peer", "", variant)
		if len(peer) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n### %s\n\n", variant)
		fmt.Fprintf(&b, "| service | admitted |")
		for _, f := range figures {
			fmt.Fprintf(&b, " %s |", f.name)
		}
		b.WriteString("\n|---|---|" + strings.Repeat("---|", len(figures)) + "\n")
		rows := [][]measurement{peer}
		for _, a := range o.algorithms {
			if row := pick(ms, "sluice", a, variant); len(row) > 0 {
				rows = append(rows, row)
			}
		}
		for _, row := range rows {
			var okf []float64
			for _, m := range row {
				okf = append(okf, 100*float64(m.res.ok)/float64(m.res.decisions()))
			}
			fmt.Fprintf(&b, "| %s | %s%% |", row[0].label(), spreadOf(okf).format("%.1f"))
			for _, f := range figures {
				fmt.Fprintf(&b, " %s |", spreadOf(values(row, f.get)).format(f.verb))
			}
			b.WriteString("\n")
		}
		if len(rows) < 2 {
			continue
		}
		fmt.Fprintf(&b, "\n| sluice/peer | ")
		for _, f := range figures {
			fmt.Fprintf(&b, " %s |", f.name)
		}
		b.WriteString("\n|---|" + strings.Repeat("---|", len(figures)) + "\n")
		for _, row := range rows[1:] {
			fmt.Fprintf(&b, "| %s |", row[0].label())
			for _, f := range figures {
				fmt.Fprintf(&b, " %s |", spreadOf(ratios(row, peer, f.get)).format("%.2f"))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// pick returns the measurements of one service (and algorithm, for sluice)
// on one variant, in round order.
func pick(ms []measurement, service, algorithm, variant string) []measurement {
	var out []measurement
	for _, m := range ms {
		if m.service == service && m.variant == variant && (algorithm == "" || m.algorithm == algorithm) {
			out = append(out, m)
		}
	}
	return out
}

func values(ms []measurement, get func(measurement) float64) []float64 {
	var out []float64
	for _, m := range ms {
		out = append(out, get(m))
	}
	return out
}

// ratios pairs a and b by round and returns get(a)/get(b) for each round
// both measured (and b's value is not zero).
func ratios(a, b []measurement, get func(measurement) float64) []float64 {
	var out []float64
	for _, x := range a {
		for _, y := range b {
			if x.round == y.round && get(y) != 0 {
				out = append(out, get(x)/get(y))
			}
		}
	}
	return out
}
