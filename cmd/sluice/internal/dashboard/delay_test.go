package dashboard

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

const delayConfig = `{"rules":[{"name":"queue","key":[{"remote_ip":true}],"algorithm":"leaky_bucket","limit":10,"window":"1s","burst":1,"delay":{"max":"3s","max_held":50}},` +
	`{"name":"plain","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1m"}]}`

// delaySnapshot is a host running delayConfig: queue held `held` requests now, has
// delayed and refused so many, and released `released` requests held `heldMS` ms in all.
func delaySnapshot(cfg string, delayed, refused, held, released, heldMS int64) host.Snapshot {
	s := snapshot(cfg, 0, map[string]int64{
		"sluice.queue.allowed": delayed + 1, "sluice.queue.denied": refused, "sluice.queue.shadow_denied": 0,
		"sluice.queue.delayed": delayed, "sluice.queue.delay_refused": refused, "sluice.queue.delay_abandoned": 0,
		"sluice.plain.allowed": 3,
	})
	s.Metrics = append(s.Metrics,
		host.Metric{Name: "sluice.queue.held", Family: "sluice_queue_held", Type: host.MetricGauge, Value: held},
		host.Metric{Name: "sluice.queue.delay_ms", Family: "sluice_queue_delay_ms", Type: host.MetricHistogram, Value: released, Sum: uint64(heldMS)},
	)
	sort.Slice(s.Metrics, func(i, j int) bool { return s.Metrics[i].Name < s.Metrics[j].Name })
	return s
}

func TestHeldRequests(t *testing.T) {
	// A burst of 50: 30 held at once, 19 refused; one released every 100 ms.
	d := New(source(
		delaySnapshot(delayConfig, 0, 0, 0, 0, 0),
		delaySnapshot(delayConfig, 30, 19, 30, 0, 0),
		delaySnapshot(delayConfig, 30, 19, 20, 10, 5500), // 100+200+…+1000 ms
		delaySnapshot(delayConfig, 30, 19, 10, 20, 21000),
		delaySnapshot(delayConfig, 30, 19, 0, 30, 46500),
	), Options{RateWindow: 2 * time.Second})
	scrapeAll(t, d, 0, 1, 2, 3, 4)

	st := d.State(at(4))
	q := rule(t, st, "queue")
	if q.Delay != "3s" || val2i(q.MaxHeld) != "50" || val(q.Held) != "0" {
		t.Errorf("queue: delay %q max_held %s held %s", q.Delay, val2i(q.MaxHeld), val(q.Held))
	}
	// Over the last 2 s (samples at 2, 3, 4): 20 released, held 41000 ms in all.
	if val(q.MeanDelayMS) != "2050" {
		t.Errorf("mean delay %s ms, want 2050", val(q.MeanDelayMS))
	}
	if val(q.Totals["delayed"]) != "30" || val(q.Totals["delay_refused"]) != "19" || val(q.Rates["delayed"]) != "0" || q.Metrics["held"] != "sluice_queue_held" ||
		q.Metrics["delay_refused"] != "sluice_queue_delay_refused" {
		t.Errorf("queue totals %v rates delayed %s metrics %v", q.Totals, val(q.Rates["delayed"]), q.Metrics)
	}
	// The held gauge over time, as it was sampled.
	if got := heldYs(t, q.HeldChart); got != "0 30 20 10 0" {
		t.Errorf("held chart %s, want 0 30 20 10 0", got)
	}
	for _, want := range []string{`id="held-chart-queue"`} {
		if !strings.Contains(q.HeldChart, want) {
			t.Errorf("held chart lacks %s", want)
		}
	}
	for _, dec := range []string{"allowed", "denied", "shadow-denied", "delayed", "delay-refused"} {
		if !strings.Contains(q.Chart, `data-name="`+dec+`"`) {
			t.Errorf("queue chart lacks series %s", dec)
		}
	}

	// Over the whole run: 30 delayed and 19 refused in the first second.
	d2 := New(source(
		delaySnapshot(delayConfig, 0, 0, 0, 0, 0),
		delaySnapshot(delayConfig, 30, 19, 30, 0, 0),
	), Options{RateWindow: 10 * time.Second})
	scrapeAll(t, d2, 0, 1)
	q = rule(t, d2.State(at(1)), "queue")
	if val(q.Rates["delayed"]) != "30" || val(q.Rates["delay_refused"]) != "19" || val(q.Held) != "30" || q.MeanDelayMS != nil {
		t.Errorf("first second: delayed/s %s refused/s %s held %s mean %s", val(q.Rates["delayed"]), val(q.Rates["delay_refused"]), val(q.Held), val(q.MeanDelayMS))
	}

	// A rule without delay shows none of it.
	p := rule(t, st, "plain")
	if p.Delay != "" || p.MaxHeld != nil || p.Held != nil || p.MeanDelayMS != nil || p.HeldChart != "" || p.Rates["delayed"] != nil || len(p.Rates) != len(Decisions) ||
		strings.Contains(p.Chart, "delayed") {
		t.Errorf("plain: %+v", p)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"delay":"3s","max_held":50,"held":0,"mean_delay_ms":2050,"held_chart":"\u003csvg`) {
		t.Errorf("state JSON %.2000s", b)
	}
	if strings.Contains(string(b[strings.Index(string(b), `"name":"plain"`):]), `"held`) {
		t.Errorf("plain rule has held fields in JSON")
	}
}

// Without a readable configuration, a rule with a held gauge is a rule with delay.
func TestHeldRequestsFromMetrics(t *testing.T) {
	d := New(source(delaySnapshot("not json", 5, 1, 2, 3, 300)), Options{})
	scrapeAll(t, d, 0)
	q := rule(t, d.State(at(0)), "queue")
	if q.Delay != "" || val(q.Held) != "2" || q.HeldChart == "" || val(q.Totals["delayed"]) != "5" {
		t.Errorf("discovered queue: %+v", q)
	}
	if p := rule(t, d.State(at(0)), "plain"); p.HeldChart != "" {
		t.Errorf("plain has a held chart")
	}
}

func val2i(p *int) string {
	if p == nil {
		return "null"
	}
	return fmt.Sprint(*p)
}

// heldYs reads back the held chart's values from its Y scale (the ticks'
// data-value and y) and the series' polyline.
func heldYs(t *testing.T, svg string) string {
	t.Helper()
	ticks := regexp.MustCompile(`<g class="tick" data-value="([-0-9.e+]+)"><line x1="[-0-9.]+" x2="[-0-9.]+" y1="([-0-9.]+)"`).FindAllStringSubmatch(svg, -1)
	var tv, ty []float64
	for _, m := range ticks {
		var v, y float64
		fmt.Sscan(m[1], &v)
		fmt.Sscan(m[2], &y)
		if len(ty) == 0 || y != ty[len(ty)-1] {
			tv, ty = append(tv, v), append(ty, y)
		}
		if len(tv) == 2 {
			break
		}
	}
	if len(tv) < 2 {
		t.Fatalf("no Y scale in %.300s", svg)
	}
	m := regexp.MustCompile(`class="series held"[^>]*>\s*<polyline points="([^"]+)"`).FindStringSubmatch(svg)
	if m == nil {
		t.Fatalf("no held series in %.2000s", svg)
	}
	var out []string
	pts := strings.Fields(m[1])
	for k := 0; k < len(pts); k += 2 { // a step: each value's start and end
		var y float64
		fmt.Sscan(pts[k][strings.IndexByte(pts[k], ',')+1:], &y)
		out = append(out, fmt.Sprint(int64(tv[0]+(y-ty[0])*(tv[1]-tv[0])/(ty[1]-ty[0])+0.5)))
	}
	return strings.Join(out, " ")
}
