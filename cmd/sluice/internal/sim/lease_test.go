package sim

import (
	"bytes"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

func leaseTraffic(t *testing.T, name string, limit int64, window time.Duration, rate float64, dur time.Duration) *Traffic {
	t.Helper()
	p := DefaultPattern(name, limit, window)
	if rate > 0 {
		p.Rate = rate
	}
	if dur > 0 {
		p.Duration = dur
	}
	tr, err := Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// Leases never admit more than the global state allows: per fixed window
// at most the limit, in total no more than without leases; the pools never
// hold more than proxies × lease; under steady heavy traffic the calls are
// about one per lease.
func TestRunLeasesBounds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		kind    algorithms.Kind
		traffic string
		rate    float64
	}{
		{"fw boundary", algorithms.FixedWindow, BoundaryBurst, 0},
		{"fw idle-burst", algorithms.FixedWindow, IdleBurst, 0},
		{"tb boundary", algorithms.TokenBucket, BoundaryBurst, 0},
		{"fw poisson", algorithms.FixedWindow, Poisson, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := algorithms.Params{Limit: 100, Window: time.Minute}
			tr := leaseTraffic(t, tc.traffic, p.Limit, p.Window, tc.rate, 0)
			r, err := RunLeases(tr, tc.kind, p, LeaseOptions{Proxies: 3, Lease: 10})
			if err != nil {
				t.Fatal(err)
			}
			if r.Admitted > r.Exact || r.MaxHeld > 30 || r.Offered != int64(len(tr.Requests)) {
				t.Fatalf("admitted %d (exact %d), max held %d, offered %d", r.Admitted, r.Exact, r.MaxHeld, r.Offered)
			}
			if tc.kind == algorithms.FixedWindow {
				// One bucket per window (the traffic starts on a window
				// boundary): never more than the limit in one.
				r2, err := RunLeases(tr, tc.kind, p, LeaseOptions{Proxies: 3, Lease: 10, Buckets: int((tr.End - tr.Start) / int64(p.Window))})
				if err != nil || r2.BucketWidth != int64(p.Window) || tr.Start%int64(p.Window) != 0 {
					t.Fatalf("buckets are not the windows: %v, width %d, start %d", err, r2.BucketWidth, tr.Start)
				}
				for i, b := range r2.Buckets {
					if b.Admitted > p.Limit {
						t.Fatalf("window %d: %d admitted > limit", i, b.Admitted)
					}
				}
			}
			if r.Exact-r.Admitted > 30*int64(len(r.Buckets)) {
				t.Fatalf("under-admission %d", r.Exact-r.Admitted)
			}
		})
	}
}

// Steady traffic well under the limit: 0.02 calls per request with lease
// 50 (one acquire per 50 admissions); and a slow key asks for less.
func TestRunLeasesCalls(t *testing.T) {
	p := algorithms.Params{Limit: 100_000, Window: time.Hour}
	tr := leaseTraffic(t, Steady, p.Limit, p.Window, 30, 10*time.Minute)
	r, err := RunLeases(tr, algorithms.FixedWindow, p, LeaseOptions{Proxies: 3, Lease: 50})
	if err != nil {
		t.Fatal(err)
	}
	if r.Admitted != r.Offered || float64(r.Acquires+r.Returns)/float64(r.Offered) > 0.03 {
		t.Fatalf("admitted %d/%d, %d acquires %d returns", r.Admitted, r.Offered, r.Acquires, r.Returns)
	}
	// 1 request/s over 3 proxies: a pool idles out after one spend; the
	// next acquires ask for 1, so leases cost no more than a call per
	// request (plus the first return).
	tr = leaseTraffic(t, Steady, 100, time.Minute, 1, 5*time.Minute)
	r, _ = RunLeases(tr, algorithms.FixedWindow, algorithms.Params{Limit: 100, Window: time.Minute}, LeaseOptions{Proxies: 3, Lease: 10})
	if calls := r.Acquires + r.Returns; calls > r.Offered+3 {
		t.Fatalf("%d calls for %d requests", calls, r.Offered)
	}
	var page bytes.Buffer
	if err := WriteLeaseReport(&page, "sluice simulate --lease 10", tr, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`id="chart-lease-admitted"`, `id="chart-lease-under"`, `data-metric="calls"`, "proxies × lease"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("report lacks %s", want)
		}
	}
}

func TestRunLeasesRefuses(t *testing.T) {
	tr := leaseTraffic(t, Steady, 10, time.Minute, 0, 0)
	if _, err := RunLeases(tr, algorithms.SlidingLog, algorithms.Params{Limit: 10, Window: time.Minute}, LeaseOptions{Proxies: 3, Lease: 2}); err == nil {
		t.Fatal("sliding_log accepted")
	}
	if _, err := RunLeases(tr, algorithms.FixedWindow, algorithms.Params{Limit: 10, Window: time.Minute}, LeaseOptions{Proxies: 0, Lease: 2}); err == nil {
		t.Fatal("0 proxies accepted")
	}
}

// The held series is the peak of each bucket: its largest value is the
// run's MaxHeld (the summary's "most held in pools"), it is zero in the
// buckets without traffic, and the report charts
// exactly these values. (It used to be sampled at each bucket's end, when
// the second-long pools of a burst had long expired: flat at 0 beside a
// summary of 27.)
func TestLeaseHeldSeries(t *testing.T) {
	p := algorithms.Params{Limit: 100, Window: time.Minute}
	for _, kind := range []algorithms.Kind{algorithms.FixedWindow, algorithms.TokenBucket} {
		tr := leaseTraffic(t, BoundaryBurst, p.Limit, p.Window, 0, 0)
		r, err := RunLeases(tr, kind, p, LeaseOptions{Proxies: 3, Lease: 10})
		if err != nil {
			t.Fatal(err)
		}
		peak, busy, nonzero := int64(0), 0, 0
		for _, b := range r.Buckets {
			peak = max(peak, b.Held)
			if b.Held > 0 {
				nonzero++
			}
			if b.Offered > 0 {
				busy++
			}
			if b.Held > int64(r.Proxies)*r.Lease {
				t.Errorf("%v: bucket held %d > proxies × lease", kind, b.Held)
			}
		}
		if r.MaxHeld == 0 || peak != r.MaxHeld {
			t.Errorf("%v: buckets peak at %d, MaxHeld %d", kind, peak, r.MaxHeld)
		}
		if nonzero == 0 || nonzero > busy {
			t.Errorf("%v: %d of %d buckets hold something, %d have traffic: the quiet ones must hold nothing", kind, nonzero, len(r.Buckets), busy)
		}

		var page bytes.Buffer
		if err := WriteLeaseReport(&page, "test", tr, r); err != nil {
			t.Fatal(err)
		}
		got := chartYs(t, page.String(), "chart-lease-under", "held")
		if len(got) != len(r.Buckets) {
			t.Fatalf("%v: %d held points, want one per bucket (%d)", kind, len(got), len(r.Buckets))
		}
		for i, b := range r.Buckets {
			if got[i] != b.Held {
				t.Fatalf("%v: bucket %d charted %d, held %d", kind, i, got[i], b.Held)
			}
		}
	}
}

// chartYs reads back the data values of series class in the chart with
// the given id of an HTML page: the chart's Y axis maps pixels to values by
// its tick marks (data-value), and a Step series has two points per value.
func chartYs(t *testing.T, page, id, class string) []int64 {
	t.Helper()
	start := strings.Index(page, `id="`+id+`"`)
	if start < 0 {
		t.Fatalf("no chart %s", id)
	}
	svg := page[start:]
	svg = svg[:strings.Index(svg, "</svg>")]
	// Two Y ticks give the scale.
	ticks := regexp.MustCompile(`<g class="tick" data-value="([-0-9.e+]+)"><line x1="[-0-9.]+" x2="[-0-9.]+" y1="([-0-9.]+)"`).FindAllStringSubmatch(svg, -1)
	var tv, ty []float64
	for _, m := range ticks {
		v, _ := strconv.ParseFloat(m[1], 64)
		y, _ := strconv.ParseFloat(m[2], 64)
		if len(ty) == 0 || y != ty[len(ty)-1] {
			tv, ty = append(tv, v), append(ty, y)
		}
		if len(tv) == 2 {
			break
		}
	}
	if len(tv) < 2 || tv[0] == tv[1] {
		t.Fatalf("%s: no Y scale in %v", id, ticks)
	}
	m := regexp.MustCompile(`class="series ` + class + `"[^>]*>\s*<polyline points="([^"]+)"`).FindStringSubmatch(svg)
	if m == nil {
		t.Fatalf("%s: no series %s", id, class)
	}
	pts := strings.Fields(m[1])
	var out []int64
	for k := 0; k < len(pts); k += 2 { // a step: start and end of each value
		y, _ := strconv.ParseFloat(pts[k][strings.IndexByte(pts[k], ',')+1:], 64)
		v := tv[0] + (y-ty[0])*(tv[1]-tv[0])/(ty[1]-ty[0])
		out = append(out, int64(math.Round(v)))
	}
	return out
}
