package sim

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/sluice-proxy/sluice/algorithms"
)

func mustLimiter(t testing.TB, k algorithms.Kind, limit int64, window time.Duration) algorithms.Limiter {
	t.Helper()
	l, err := algorithms.New(k, algorithms.Params{Limit: limit, Window: window})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustGenerate(t testing.TB, p Pattern) *Traffic {
	t.Helper()
	tr, err := Generate(p)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// compare runs tr through every algorithm with limit per window.
func compare(t testing.TB, tr *Traffic, limit int64, window time.Duration) map[algorithms.Kind]*Result {
	t.Helper()
	out := map[algorithms.Kind]*Result{}
	for _, k := range algorithms.Kinds {
		r, err := Run(tr, k.String(), mustLimiter(t, k, limit, window), Options{})
		if err != nil {
			t.Fatal(err)
		}
		out[k] = r
	}
	return out
}

// The simulator's boundary check: the boundary burst lets fixed_window admit twice
// its limit within one window length; sliding_log never more than limit.
func TestBoundaryBurstCompare(t *testing.T) {
	tr := mustGenerate(t, DefaultPattern(BoundaryBurst, 100, time.Minute))
	// Ten minutes: boundaries at 1m..9m (the 10m one has no "after" side).
	if got, want := len(tr.Requests), 9*200; got != want {
		t.Fatalf("offered %d requests, want %d", got, want)
	}
	res := compare(t, tr, 100, time.Minute)
	fw, sl := res[algorithms.FixedWindow], res[algorithms.SlidingLog]
	if fw.MaxInWindow != 200 {
		t.Errorf("fixed_window max in window = %d, want 200", fw.MaxInWindow)
	}
	// Each of the ten calendar windows admits exactly its limit.
	if fw.Admitted != 1000 {
		t.Errorf("fixed_window admitted %d, want 10 windows × 100", fw.Admitted)
	}
	// The 200 happen within 2 × spread (3 s) around a boundary.
	if span := fw.MaxInWindowTo - fw.MaxInWindowFrom; span >= int64(6*time.Second) || span <= 0 {
		t.Errorf("fixed_window max interval spans %v", time.Duration(span))
	}
	if sl.MaxInWindow > 100 || sl.MaxInWindow < 1 {
		t.Errorf("sliding_log max in window = %d, want 1..100", sl.MaxInWindow)
	}
	for k, r := range res {
		if r.Admitted+r.Denied != r.Offered || r.Offered != int64(len(tr.Requests)) {
			t.Errorf("%s: admitted %d + denied %d != offered %d", k, r.Admitted, r.Denied, r.Offered)
		}
		if r.StateBytesMax <= 0 || r.StateBytesMax > r.MaxStateSize {
			t.Errorf("%s: state %d bytes, bound %d", k, r.StateBytesMax, r.MaxStateSize)
		}
		var off, adm int64
		for _, b := range r.Buckets {
			off += b.Offered
			adm += b.Admitted
		}
		if off != r.Offered || adm != r.Admitted {
			t.Errorf("%s: buckets sum to %d/%d, totals %d/%d", k, off, adm, r.Offered, r.Admitted)
		}
	}
	for _, r := range res {
		t.Logf("%-14s admitted %4d denied %4d max-in-window %3d state %d/%d bytes",
			r.Kind, r.Admitted, r.Denied, r.MaxInWindow, r.StateBytesMax, r.MaxStateSize)
	}
}

// MaxInWindow is checked against a brute-force count over the admitted
// times for the interval (t−window, t].
func TestMaxInWindowBruteForce(t *testing.T) {
	p := DefaultPattern(Poisson, 20, 10*time.Second)
	p.Rate = 5
	p.Keys = 3
	tr := mustGenerate(t, p)
	for _, k := range algorithms.Kinds {
		lim := mustLimiter(t, k, 20, 10*time.Second)
		res, err := Run(tr, "x", lim, Options{})
		if err != nil {
			t.Fatal(err)
		}
		// Replay to collect the admitted times per key.
		states := make([][]byte, len(tr.Keys))
		admitted := make([][]int64, len(tr.Keys))
		for _, rq := range tr.Requests {
			ns, d, err := lim.Decide(nil, states[rq.Key], rq.At, rq.Cost)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				states[rq.Key] = ns
				admitted[rq.Key] = append(admitted[rq.Key], rq.At)
			}
		}
		var want int64
		for _, ts := range admitted {
			for _, end := range ts {
				var n int64
				for _, x := range ts {
					if x > end-int64(10*time.Second) && x <= end {
						n++
					}
				}
				want = max(want, n)
			}
		}
		if res.MaxInWindow != want {
			t.Errorf("%s: MaxInWindow = %d, brute force %d", k, res.MaxInWindow, want)
		}
	}
}

func TestPatterns(t *testing.T) {
	w := time.Minute
	t.Run("steady", func(t *testing.T) {
		p := DefaultPattern(Steady, 60, w) // 2 per second
		tr := mustGenerate(t, p)
		if len(tr.Requests) != 1200 {
			t.Fatalf("%d requests, want 1200", len(tr.Requests))
		}
		if gap := tr.Requests[1].At - tr.Requests[0].At; gap != int64(500*time.Millisecond) {
			t.Fatalf("gap %v", time.Duration(gap))
		}
		// Admits exactly the limit per window in steady state (fixed window).
		r, err := Run(tr, "x", mustLimiter(t, algorithms.FixedWindow, 60, w), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if r.Admitted != 600 || r.MaxInWindow != 60 {
			t.Fatalf("admitted %d max %d, want 600 and 60", r.Admitted, r.MaxInWindow)
		}
	})
	t.Run("boundary-burst", func(t *testing.T) {
		p := DefaultPattern(BoundaryBurst, 3, w)
		tr := mustGenerate(t, p)
		b := Epoch.Add(w).UnixNano()
		want := []int64{b - 3e9, b - 2e9, b - 1e9, b, b + 1e9, b + 2e9}
		for i, x := range want {
			if tr.Requests[i].At != x {
				t.Fatalf("request %d at %d, want %d", i, tr.Requests[i].At-b, x-b)
			}
		}
	})
	t.Run("poisson deterministic", func(t *testing.T) {
		p := DefaultPattern(Poisson, 100, w)
		a, b := mustGenerate(t, p), mustGenerate(t, p)
		if len(a.Requests) != len(b.Requests) || a.Requests[17] != b.Requests[17] {
			t.Fatal("same seed, different traffic")
		}
		// Mean rate 2/s over 600 s: 1200 expected; 5 sigma is ±175.
		if n := len(a.Requests); n < 1025 || n > 1375 {
			t.Fatalf("%d arrivals, want about 1200", n)
		}
		p.Seed = 2
		if c := mustGenerate(t, p); len(c.Requests) == len(a.Requests) && c.Requests[0] == a.Requests[0] {
			t.Fatal("different seed, same traffic")
		}
	})
	t.Run("idle-burst", func(t *testing.T) {
		p := DefaultPattern(IdleBurst, 10, w) // idle 3m, 20 requests in 3s
		tr := mustGenerate(t, p)
		if tr.Requests[0].At != Epoch.Add(3*w).UnixNano() {
			t.Fatalf("first request at +%v", time.Duration(tr.Requests[0].At-tr.Start))
		}
		// Bursts start at 3m, 6m3s, 9m6s: 60 requests.
		if len(tr.Requests) != 60 {
			t.Fatalf("%d requests, want 60", len(tr.Requests))
		}
		r, err := Run(tr, "x", mustLimiter(t, algorithms.TokenBucket, 10, w), Options{})
		if err != nil {
			t.Fatal(err)
		}
		// A full bucket of 10 per burst; the refill during the burst's
		// 2.85 s (0.475 token) is not a whole token.
		if r.Admitted != 30 {
			t.Fatalf("token bucket admitted %d, want 30", r.Admitted)
		}
		// The probe sees a full bucket before the first burst, an empty one
		// right after it, and the refill (10 per minute) in between.
		if r.ProbeKey != "client-1" || r.BucketWidth != int64(5*time.Second) {
			t.Fatalf("probe key %q, bucket width %v", r.ProbeKey, time.Duration(r.BucketWidth))
		}
		at := func(d time.Duration) int64 { return r.Buckets[int(d/(5*time.Second))].Available }
		if a, b, c := at(2*time.Minute), at(3*time.Minute), at(3*time.Minute+65*time.Second); a != 10 || b != 0 || c != 10 {
			t.Fatalf("available before, at and after the refill of the first burst: %d %d %d, want 10 0 10", a, b, c)
		}
		// Ten admitted by 3m1.35s with 0.225 token refilled meanwhile; at
		// 3m35s: 0.225 + 33.65/6 = 5.83 tokens.
		if m := at(3*time.Minute + 30*time.Second); m != 5 {
			t.Fatalf("available at the end of 3m30s..3m35s = %d, want 5", m)
		}
	})
	t.Run("keys", func(t *testing.T) {
		p := DefaultPattern(Poisson, 10, w)
		p.Keys = 4
		tr := mustGenerate(t, p)
		if len(tr.Keys) != 4 || tr.Keys[3] != "client-4" {
			t.Fatalf("keys %v", tr.Keys)
		}
		for i := 1; i < len(tr.Requests); i++ {
			if tr.Requests[i].At < tr.Requests[i-1].At {
				t.Fatal("not sorted")
			}
		}
	})
}

func TestPatternErrors(t *testing.T) {
	base := DefaultPattern(Steady, 10, time.Second)
	for _, tc := range []struct {
		mod  func(*Pattern)
		want string
	}{
		{func(p *Pattern) { p.Name = "zigzag" }, `unknown pattern "zigzag"`},
		{func(p *Pattern) { p.Duration = 0 }, "duration 0s must be positive"},
		{func(p *Pattern) { p.Rate = -1 }, "rate -1 must be"},
		{func(p *Pattern) { p.Keys = 0 }, "keys 0 must be"},
		{func(p *Pattern) { p.Cost = 0 }, "cost 0 must be"},
		{func(p *Pattern) { p.Rate = 1e9; p.Duration = time.Hour }, "would offer about"},
		{func(p *Pattern) { p.Name = BoundaryBurst; p.Burst = 0 }, "burst 0 must be"},
		{func(p *Pattern) { p.Name = IdleBurst; p.Burst = 1; p.Idle = 0 }, "idle 0s must be"},
		{func(p *Pattern) { p.Name = BoundaryBurst; p.Burst = 1; p.Window = 10 * time.Second }, "offers no request"},
	} {
		p := base
		tc.mod(&p)
		_, err := Generate(p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want it to contain %q", err, tc.want)
		}
	}
}

func TestRunErrors(t *testing.T) {
	lim := mustLimiter(t, algorithms.FixedWindow, 1, time.Second)
	if _, err := Run(&Traffic{}, "x", lim, Options{}); err == nil {
		t.Error("empty traffic accepted")
	}
	tr := &Traffic{Start: 0, End: 10, Keys: []string{"a"}, Requests: []Request{{At: 5, Key: 1, Cost: 1}}}
	if _, err := Run(tr, "x", lim, Options{}); err == nil {
		t.Error("bad key index accepted")
	}
	tr.Requests[0].Key, tr.Requests[0].Cost = 0, 0
	if _, err := Run(tr, "x", lim, Options{}); err == nil || !strings.Contains(err.Error(), "request 0") {
		t.Errorf("cost 0: err = %v", err)
	}
	tr.Requests[0].Cost = 1
	if _, err := Run(tr, "x", lim, Options{Buckets: -3}); err == nil {
		t.Error("negative buckets accepted")
	}
}

// findAll returns the elements under n for which ok is true.
func findAll(n *html.Node, ok func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for c := range n.Descendants() {
		if c.Type == html.ElementNode && ok(c) {
			out = append(out, c)
		}
	}
	return out
}

func attr(n *html.Node, name string) string {
	for _, a := range n.Attr {
		if a.Key == name {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	for c := range n.Descendants() {
		if c.Type == html.TextNode {
			b.WriteString(c.Data)
		}
	}
	return b.String()
}

// ReportNumbers parses a report and returns, per algorithm, the metrics of
// its section as shown in the page (the <dd data-metric> text) after
// checking they agree with the section's data attributes.
func reportNumbers(t *testing.T, page []byte) map[string]map[string]int64 {
	t.Helper()
	doc, err := html.Parse(bytes.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, sec := range findAll(doc, func(n *html.Node) bool { return n.Data == "section" && attr(n, "class") == "algo" }) {
		alg := attr(sec, "data-algorithm")
		m := map[string]int64{}
		for _, dd := range findAll(sec, func(n *html.Node) bool { return n.Data == "dd" && attr(n, "data-metric") != "" }) {
			v, err := strconv.ParseInt(strings.TrimSpace(text(dd)), 10, 64)
			if err != nil {
				t.Fatalf("%s: metric %s = %q", alg, attr(dd, "data-metric"), text(dd))
			}
			m[attr(dd, "data-metric")] = v
			if a := attr(sec, "data-"+attr(dd, "data-metric")); a != strconv.FormatInt(v, 10) {
				t.Errorf("%s: data-%s=%q but the page shows %d", alg, attr(dd, "data-metric"), a, v)
			}
		}
		want := 2
		if attr(sec, "data-delay-ns") != "" {
			want = 4 // and the upstream arrivals, the requests held
		}
		if n := len(findAll(sec, func(n *html.Node) bool { return n.Data == "svg" })); n != want {
			t.Errorf("%s: %d charts, want %d", alg, n, want)
		}
		out[alg] = m
	}
	return out
}

func TestReportBoundaryBurst(t *testing.T) {
	tr := mustGenerate(t, DefaultPattern(BoundaryBurst, 100, time.Minute))
	res := compare(t, tr, 100, time.Minute)
	rep := &Report{Command: `sluice simulate --compare <x>`, Traffic: tr}
	for _, k := range algorithms.Kinds {
		rep.Results = append(rep.Results, res[k])
	}
	var buf bytes.Buffer
	if err := WriteReport(&buf, rep); err != nil {
		t.Fatal(err)
	}
	page := buf.Bytes()
	for _, banned := range []string{"<script", "http://", "https://", "@import", "url(", "<link"} {
		// The SVG namespace URI is the one allowed URL.
		s := strings.ReplaceAll(string(page), `xmlns="http://www.w3.org/2000/svg"`, "")
		if strings.Contains(s, banned) {
			t.Errorf("report contains %q: not self-contained", banned)
		}
	}
	if !strings.Contains(string(page), "&lt;x&gt;") {
		t.Error("command not escaped")
	}
	nums := reportNumbers(t, page)
	if len(nums) != 5 {
		t.Fatalf("%d algorithm sections, want 5", len(nums))
	}
	if got := nums["fixed_window"]["max-in-window"]; got != 200 {
		t.Errorf("report: fixed_window max-in-window %d, want 200", got)
	}
	if got := nums["sliding_log"]["max-in-window"]; got > 100 {
		t.Errorf("report: sliding_log max-in-window %d, want <= 100", got)
	}
	for _, k := range algorithms.Kinds {
		m, r := nums[k.String()], res[k]
		if m["admitted"] != r.Admitted || m["denied"] != r.Denied || m["state-bytes"] != int64(r.StateBytesMax) {
			t.Errorf("%s: page %v, result admitted %d denied %d state %d", k, m, r.Admitted, r.Denied, r.StateBytesMax)
		}
	}
	// Deterministic: a second rendering is identical.
	var again bytes.Buffer
	if err := WriteReport(&again, rep); err != nil || !bytes.Equal(again.Bytes(), page) {
		t.Error("two renderings differ")
	}
}

func TestWriteReportErrors(t *testing.T) {
	if err := WriteReport(&bytes.Buffer{}, &Report{}); err == nil {
		t.Error("empty report accepted")
	}
}

// A day of steady traffic at 10 requests per second (864,000 requests)
// through one rule, per algorithm; and generating a day of Poisson traffic.
// These are the figures behind "a day of traffic takes well under a second"
// (docs/simulate.md): go test -run '^$' -bench Day ./cmd/sluice/internal/sim
func BenchmarkDay(b *testing.B) {
	p := DefaultPattern(Steady, 100, time.Minute)
	p.Duration = 24 * time.Hour
	p.Rate = 10
	tr := mustGenerate(b, p)
	for _, k := range algorithms.Kinds {
		lim := mustLimiter(b, k, 100, time.Minute)
		b.Run(k.String(), func(b *testing.B) {
			for b.Loop() {
				if _, err := Run(tr, "x", lim, Options{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(tr.Requests)), "requests/op")
		})
	}
	b.Run("generate-poisson", func(b *testing.B) {
		p := DefaultPattern(Poisson, 100, time.Minute)
		p.Duration = 24 * time.Hour
		p.Rate = 10
		var n int
		for b.Loop() {
			n = len(mustGenerate(b, p).Requests)
		}
		b.ReportMetric(float64(n), "requests/op")
	})
}

// A day of Poisson traffic at 10 per second goes through token_bucket whole:
// every request offered, at least the limit of every minute admitted. How
// long it takes is BenchmarkDay's figure, not a test's bound.
func TestDayOfPoissonTraffic(t *testing.T) {
	p := DefaultPattern(Poisson, 100, time.Minute)
	p.Duration = 24 * time.Hour
	p.Rate = 10
	tr := mustGenerate(t, p)
	res, err := Run(tr, "x", mustLimiter(t, algorithms.TokenBucket, 100, time.Minute), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Offered != int64(len(tr.Requests)) || res.Admitted < 100*24*60 {
		t.Errorf("offered %d admitted %d", res.Offered, res.Admitted)
	}
}

// Compare the five algorithms on the classic fixed-window exploit: limit
// requests just before and limit just after every window boundary.
func Example() {
	tr, err := Generate(DefaultPattern(BoundaryBurst, 100, time.Minute))
	if err != nil {
		panic(err)
	}
	fmt.Println(tr.Description)
	for _, k := range algorithms.Kinds {
		lim, err := algorithms.New(k, algorithms.Params{Limit: 100, Window: time.Minute})
		if err != nil {
			panic(err)
		}
		r, err := Run(tr, k.String(), lim, Options{})
		if err != nil {
			panic(err)
		}
		fmt.Printf("%-14s admitted %d of %d, at most %d in any minute\n", k, r.Admitted, r.Offered, r.MaxInWindow)
	}
	// Output:
	// boundary-burst for 10m, 100 requests in the 3s before and 100 in the 3s after every 1m boundary
	// token_bucket   admitted 909 of 1800, at most 109 in any minute
	// leaky_bucket   admitted 909 of 1800, at most 109 in any minute
	// fixed_window   admitted 1000 of 1800, at most 200 in any minute
	// sliding_log    admitted 900 of 1800, at most 100 in any minute
	// sliding_window admitted 897 of 1800, at most 104 in any minute
}

func TestBucketWidth(t *testing.T) {
	const s, m, h, d = int64(time.Second), int64(time.Minute), int64(time.Hour), int64(24 * time.Hour)
	for _, c := range []struct {
		span int64
		n    int
		want int64
	}{
		{1, 120, 1},                      // shorter than a nanosecond per bucket
		{120, 120, 1},                    // exactly 1ns
		{121, 120, 2},                    // just over
		{250_000, 120, 5_000},            // 2.08µs -> 5µs
		{60*s + 500*1e6 + 1, 120, 1 * s}, // example.csv: 504.17ms -> 1s, not "504.167ms"
		{60*s + 100*1e6, 120, 1 * s},     // 500.833ms -> 1s
		{60 * s, 120, 500 * 1e6},         // exactly 500ms
		{10 * m, 120, 5 * s},             // the boundary-burst default: exactly 5s
		{10*m + 1, 120, 10 * s},          // a nanosecond more: the next round width
		{13 * m, 120, 10 * s},            // 6.5s -> 10s
		{25 * m, 120, 15 * s},            // 12.5s -> 15s
		{3 * h, 120, 2 * m},              // 90s -> 2m
		{10*d + 1, 120, 3 * h},           // just over 2h -> 3h
		{100 * d, 120, d},                // 20h -> 1d
		{400 * d, 120, 5 * d},            // 3.33d -> 5d
		{1000 * d, 120, 10 * d},          // 8.3d -> 10d
		{1<<63 - 1, 1, 1<<63 - 1},        // 292 years in one bucket: the exact width
		{1<<63 - 1, 120, 1000 * d},       // 889d -> 1000d
	} {
		got := BucketWidth(c.span, c.n)
		if got != c.want {
			t.Errorf("BucketWidth(%v, %d) = %v, want %v", time.Duration(c.span), c.n, time.Duration(got), time.Duration(c.want))
		}
		if nb := c.span/got + min(c.span%got, 1); nb > int64(c.n) {
			t.Errorf("BucketWidth(%v, %d) = %v needs more than %d buckets", time.Duration(c.span), c.n, time.Duration(got), c.n)
		}
	}
}

// The axis of a CSV report names a round bucket width that is the real
// one: example.csv spans 60.5s, which 120 buckets would cut into
// 504.167ms; the run uses 61 buckets of 1s.
func TestReportBucketLabel(t *testing.T) {
	f, err := os.Open("testdata/example.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := ReadCSV(f, "testdata/example.csv")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(tr, "example", mustLimiter(t, algorithms.FixedWindow, 5, time.Minute), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.BucketWidth != int64(time.Second) || len(r.Buckets) != 61 {
		t.Fatalf("bucket width %v, %d buckets; want 1s, 61", time.Duration(r.BucketWidth), len(r.Buckets))
	}
	var offered int64
	for _, b := range r.Buckets {
		offered += b.Offered
	}
	if offered != 8 || r.Buckets[60].Offered != 3 || r.Buckets[59].Offered != 1 {
		t.Errorf("buckets hold %d requests (59: %d, 60: %d), want 8 (1, 3)", offered, r.Buckets[59].Offered, r.Buckets[60].Offered)
	}
	var buf bytes.Buffer
	if err := WriteReport(&buf, &Report{Command: "sluice simulate --csv example.csv", Traffic: tr, Results: []*Result{r}}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if !strings.Contains(page, ">requests per 1s<") || !strings.Contains(page, "lowest remaining in 1s") {
		t.Error(`report lacks "requests per 1s" and "lowest remaining in 1s"`)
	}
	if strings.Contains(page, "504.") {
		t.Error("report shows an unrounded bucket width")
	}
}

func TestFmtBucketWidth(t *testing.T) {
	for w, want := range map[int64]string{1: "1ns", 5_000: "5µs", 200_000: "200µs", 1e6: "1ms", 5e8: "500ms", 5e9: "5s", 15e9: "15s", 120e9: "2m", 3 * 3600e9: "3h", 5 * 86400e9: "5d"} {
		if got := fmtBucketWidth(w); got != want {
			t.Errorf("fmtBucketWidth(%v) = %q, want %q", time.Duration(w), got, want)
		}
	}
}
