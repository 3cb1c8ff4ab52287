package sim

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// Every algorithm keeps to its WindowBound whatever the traffic: the bound
// the report holds "max in any window" to is each algorithm's actual
// guarantee, not the limit (a token bucket admits burst + limit in one
// window by design).
func TestWindowBoundHolds(t *testing.T) {
	for _, pat := range []string{Steady, BoundaryBurst, Poisson, IdleBurst} {
		for _, burst := range []int64{0, 1, 7, 250} {
			for _, cost := range []int64{1, 3} {
				p := DefaultPattern(pat, 40, 10*time.Second)
				p.Cost = cost
				p.Keys = 2
				if pat == Steady || pat == Poisson {
					p.Rate = 20 // 5× the limit rate
				}
				tr := mustGenerate(t, p)
				for _, k := range algorithms.Kinds {
					params := algorithms.Params{Limit: 40, Window: 10 * time.Second}
					if k == algorithms.TokenBucket || k == algorithms.LeakyBucket {
						params.Burst = burst
					}
					lim, err := algorithms.New(k, params)
					if err != nil {
						t.Fatal(err)
					}
					res, err := Run(tr, "x", lim, Options{})
					if err != nil {
						t.Fatal(err)
					}
					bound, why := WindowBound(k, res.Params)
					if res.MaxInWindow > bound || why == "" {
						t.Errorf("%s burst %d cost %d: %v admitted %d in a window, bound %d (%s)", pat, burst, cost, k, res.MaxInWindow, bound, why)
					}
				}
			}
		}
	}
	for _, tc := range []struct {
		k    algorithms.Kind
		p    algorithms.Params
		want int64
	}{
		{algorithms.TokenBucket, algorithms.Params{Limit: 100, Burst: 100}, 200},
		{algorithms.TokenBucket, algorithms.Params{Limit: 100, Burst: 20}, 120},
		{algorithms.LeakyBucket, algorithms.Params{Limit: 100, Burst: 5}, 105},
		{algorithms.FixedWindow, algorithms.Params{Limit: 100}, 200},
		{algorithms.SlidingWindow, algorithms.Params{Limit: 100}, 200},
		{algorithms.SlidingLog, algorithms.Params{Limit: 100}, 100},
	} {
		if got, _ := WindowBound(tc.k, tc.p); got != tc.want {
			t.Errorf("%v %+v: bound %d, want %d", tc.k, tc.p, got, tc.want)
		}
	}
}

// The --compare report on a boundary burst marks nothing red: token_bucket's
// and leaky_bucket's 109, fixed_window's 200 and sliding_window's 104 are
// above the limit within each algorithm's guarantee (marked as the design),
// sliding_log's 100 is at the limit. A result above its bound is red.
func TestReportMarksOnlyViolations(t *testing.T) {
	tr := mustGenerate(t, DefaultPattern(BoundaryBurst, 100, time.Minute))
	var results []*Result
	for _, k := range algorithms.Kinds {
		res, err := Run(tr, k.String(), mustLimiter(t, k, 100, time.Minute), Options{})
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, res)
	}
	// One made-up violation: a sliding_log result that admitted 101.
	bad := *results[len(results)-1]
	for _, r := range results {
		if r.Kind == algorithms.SlidingLog {
			bad = *r
		}
	}
	bad.Name, bad.MaxInWindow = "broken", 101
	results = append(results, &bad)
	var page bytes.Buffer
	if err := WriteReport(&page, &Report{Traffic: tr, Results: results}); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`<tr data-algorithm="([a-z_]+)"><td>([a-z_]+)</td>.*?<td( class="[a-z-]+")? data-col="max-in-window">(\d+)</td><td class="bound" data-col="bound"[^>]*>(\d+)</td>`)
	rows := row.FindAllStringSubmatch(page.String(), -1)
	if len(rows) != len(results) {
		t.Fatalf("%d summary rows, want %d", len(rows), len(results))
	}
	want := map[string][3]string{ // class, max, bound
		"token_bucket":   {` class="above-limit"`, "109", "200"},
		"leaky_bucket":   {` class="above-limit"`, "109", "200"},
		"fixed_window":   {` class="above-limit"`, "200", "200"},
		"sliding_window": {` class="above-limit"`, "104", "200"},
		"sliding_log":    {"", "100", "100"},
		"broken":         {` class="over"`, "101", "100"},
	}
	for _, m := range rows {
		w, ok := want[m[2]]
		if !ok || m[3] != w[0] || m[4] != w[1] || m[5] != w[2] {
			t.Errorf("%s: class %q max %s bound %s, want %q", m[2], m[3], m[4], m[5], w)
		}
	}
	if n := strings.Count(page.String(), `class="over"`); n != 2 { // the broken row and its section
		t.Errorf("%d elements marked over, want 2 (the broken result's)", n)
	}
}
