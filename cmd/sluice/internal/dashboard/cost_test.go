package dashboard

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/host"
)

const costConfig = `{"rules":[{"name":"tokens","key":[{"header":"x-team"}],"algorithm":"token_bucket","limit":10000,"window":"1m","burst":10000,` +
	`"cost":{"request":{"header":"x-max-tokens","default":1000},"response":{"usage":"openai"}}},` +
	`{"name":"plain","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1m"}]}`

// costSnapshot is a host running cfg: tokens admitted so many requests that reserved,
// refunded and charged beyond their reservations so many units, settled so many.
func costSnapshot(cfg string, allowed, reserved, settled, refunded, excess, noUsage int64) host.Snapshot {
	return snapshot(cfg, 0, map[string]int64{
		"sluice.tokens.allowed": allowed, "sluice.tokens.denied": 0, "sluice.tokens.shadow_denied": 0,
		"sluice.tokens.reserved": reserved, "sluice.tokens.settled": settled, "sluice.tokens.refunded": refunded,
		"sluice.tokens.excess": excess, "sluice.tokens.no_usage": noUsage,
		"sluice.plain.allowed": 3,
	})
}

func TestTokenBudgets(t *testing.T) {
	// A request a second reserving 2000; each settles a second later, using 500
	// (refund 1500), but the third uses 3000 (excess 1000) and the fourth gives no usage.
	d := New(source(
		costSnapshot(costConfig, 0, 0, 0, 0, 0, 0),
		costSnapshot(costConfig, 1, 2000, 0, 0, 0, 0),
		costSnapshot(costConfig, 2, 4000, 1, 1500, 0, 0),
		costSnapshot(costConfig, 3, 6000, 2, 3000, 0, 0),
		costSnapshot(costConfig, 4, 8000, 3, 3000, 1000, 0),
		costSnapshot(costConfig, 4, 8000, 4, 3000, 1000, 1),
	), Options{RateWindow: 2 * time.Second})
	scrapeAll(t, d, 0, 1, 2, 3, 4, 5)
	st := d.State(at(5))
	r := rule(t, st, "tokens")
	if r.Cost != "cost=header:x-max-tokens|1000 settle=usage:openai(total) no_usage=reservation" {
		t.Errorf("cost %q", r.Cost)
	}
	got := fmt.Sprintf("totals reserved %s settled %s refunded %s excess %s no_usage %s; rates reserved %s refunded %s excess %s settled %s",
		val(r.Totals["reserved"]), val(r.Totals["settled"]), val(r.Totals["refunded"]), val(r.Totals["excess"]), val(r.Totals["no_usage"]),
		val(r.Rates["reserved"]), val(r.Rates["refunded"]), val(r.Rates["excess"]), val(r.Rates["settled"]))
	// Over the last 2 s (samples at 3, 4, 5): 2000 reserved, 1000 excess, 0 refunded, 2 settled.
	if want := "totals reserved 8000 settled 4 refunded 3000 excess 1000 no_usage 1; rates reserved 1000 refunded 0 excess 500 settled 1"; got != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
	if r.Metrics["excess"] != "sluice_tokens_excess" || r.Metrics["no_usage"] != "sluice_tokens_no_usage" {
		t.Errorf("metrics %v", r.Metrics)
	}
	// The chart: units per second between samples.
	for name, want := range map[string]string{"reserved": "2000 2000 2000 2000 0", "refunded": "0 1500 1500 0 0", "excess": "0 0 0 1000 0"} {
		if got := seriesYs(t, r.CostChart, name); got != want {
			t.Errorf("cost chart %s %s, want %s", name, got, want)
		}
	}
	if !strings.Contains(r.CostChart, `id="cost-chart-tokens"`) || strings.Contains(r.Chart, "reserved") {
		t.Errorf("cost chart %.200s; the decisions chart has cost series: %v", r.CostChart, strings.Contains(r.Chart, "reserved"))
	}

	// A rule without cost shows none of it.
	p := rule(t, st, "plain")
	if p.Cost != "" || p.CostChart != "" || p.Rates["reserved"] != nil || len(p.Rates) != len(Decisions) {
		t.Errorf("plain: %+v", p)
	}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"cost":"cost=header:x-max-tokens|1000 settle=usage:openai(total) no_usage=reservation","cost_chart":"\u003csvg`) {
		t.Errorf("state JSON %.2000s", b)
	}
	if strings.Contains(string(b[strings.Index(string(b), `"name":"plain"`):]), `"cost`) {
		t.Errorf("plain rule has cost fields in JSON")
	}

	// Without a readable configuration, a rule with a reserved counter is a rule with cost.
	d = New(source(costSnapshot("not json", 1, 2000, 0, 0, 0, 0)), Options{})
	scrapeAll(t, d, 0)
	if r := rule(t, d.State(at(0)), "tokens"); r.Cost != "" || r.CostChart == "" || val(r.Totals["reserved"]) != "2000" {
		t.Errorf("discovered tokens: %+v", r)
	}
	if p := rule(t, d.State(at(0)), "plain"); p.CostChart != "" {
		t.Errorf("plain has a cost chart")
	}
}

// seriesYs reads back a line series' values from the chart's Y scale (as heldYs).
func seriesYs(t *testing.T, svg, class string) string {
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
	m := regexp.MustCompile(`class="series ` + class + `"[^>]*>\s*<polyline points="([^"]+)"`).FindStringSubmatch(svg)
	if m == nil {
		t.Fatalf("no %s series in %.3000s", class, svg)
	}
	var out []string
	for _, pt := range strings.Fields(m[1]) {
		var y float64
		fmt.Sscan(pt[strings.IndexByte(pt, ',')+1:], &y)
		out = append(out, fmt.Sprint(int64(tv[0]+(y-ty[0])*(tv[1]-tv[0])/(ty[1]-ty[0])+0.5)))
	}
	return strings.Join(out, " ")
}
