package filter_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
)

// TestTopKeysGauges: with top_keys.gauges, the end of a period sets each rank's gauge to
// the count of the finished period's key of that rank (0 past the last key), once a tick
// ends it even without new traffic; the next quiet period sets them back to 0.
func TestTopKeysGauges(t *testing.T) {
	cfg := `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":3,"window":"1h"}],
	  "top_keys":{"size":16,"key":"raw","log_every":"10s","log_top":5,"gauges":5}}`
	n := startNative(t, cfg, t0)
	gauges := func(kind string) string {
		var out []string
		for r := 1; r <= 5; r++ {
			v, ok := n.w.Host.Metrics.Get(filter.TopKeysGauge("per-key", kind, r))
			if !ok {
				t.Fatalf("gauge %s not defined", filter.TopKeysGauge("per-key", kind, r))
			}
			out = append(out, fmt.Sprint(v))
		}
		return strings.Join(out, " ")
	}
	for i, sent := range []int{10, 8, 6, 4} { // 7, 5, 3 and 1 denied
		for j := 0; j < sent; j++ {
			n.do(keyed(fmt.Sprintf("abuser-%d", i)))
		}
	}
	for i := 0; i < 10; i++ { // 14 keys in all: the summaries of 16 stay exact
		n.do(keyed(fmt.Sprintf("bg-%d", i)))
	}
	n.w.Handler.OnTick(1)
	if g := gauges("denied"); g != "0 0 0 0 0" {
		t.Fatalf("gauges during the first period: %s", g)
	}
	n.advance(11 * time.Second)
	n.w.Handler.OnTick(1) // no traffic since: the tick ends the period all the same
	if g := gauges("denied"); g != "7 5 3 1 0" {
		t.Errorf("denied gauges %s, want 7 5 3 1 0", g)
	}
	if g := gauges("consumed"); g != "3 3 3 3 1" {
		t.Errorf("consumed gauges %s, want 3 3 3 3 1", g)
	}
	lines := 0
	for _, l := range n.w.Host.Logs {
		if strings.Contains(l.Msg, "top keys: rule per-key denied") && strings.Contains(l.Msg, ": abuser-0=7 abuser-1=5 abuser-2=3 abuser-3=1") {
			lines++
		}
	}
	if lines != 1 {
		t.Errorf("%d log lines of the period naming the ranks: %v", lines, n.w.Host.Logs)
	}
	n.advance(11 * time.Second)
	n.w.Handler.OnTick(1)
	if g := gauges("denied") + " / " + gauges("consumed"); g != "0 0 0 0 0 / 0 0 0 0 0" {
		t.Errorf("after a quiet period: %s", g)
	}
}

// The gauges' # HELP texts, and none for a name that only looks like one.
func TestTopKeysGaugeHelp(t *testing.T) {
	for name, want := range map[string]string{
		"sluice.api.top_denied_1":    "sluice rule api: the denials of the key ranked 1 in the last finished top-keys period (gauge; the key is in the period's log line)",
		"sluice.api.top_consumed_12": "sluice rule api: the consumption (cost units) of the key ranked 12 in the last finished top-keys period (gauge; the key is in the period's log line)",
		"sluice.api.top_denied_01":   "",
		"sluice.api.top_denied_":     "",
		"sluice.api.top_other_1":     "",
	} {
		if got := filter.MetricHelp(name); got != want {
			t.Errorf("MetricHelp(%q) = %q, want %q", name, got, want)
		}
	}
}
