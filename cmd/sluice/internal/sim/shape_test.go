package sim

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// burstTraffic is n requests of one key at the same instant, in a span of
// one second.
func burstTraffic(n int) *Traffic {
	start := Epoch.UnixNano()
	tr := &Traffic{Description: "burst", Start: start, End: start + int64(time.Second), Keys: []string{"client-1"}}
	for range n {
		tr.Requests = append(tr.Requests, Request{At: start, Key: 0, Cost: 1})
	}
	return tr
}

func mustBucket(t testing.TB, k algorithms.Kind, limit int64, window time.Duration, burst int64) algorithms.Limiter {
	t.Helper()
	l, err := algorithms.New(k, algorithms.Params{Limit: limit, Window: window, Burst: burst})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// nonZero returns the indexes of the non-zero values of v, and their sum.
func nonZero(v []int64) (idx []int, sum int64) {
	for i, x := range v {
		if x != 0 {
			idx = append(idx, i)
			sum += x
		}
	}
	return idx, sum
}

// 50 requests at once at 10/s, burst 1, delay 3s: one goes at once, 30 are
// released 100 ms apart up to +3s, 19 are refused; the meter admits one.
func TestShapingBurstOfFifty(t *testing.T) {
	for _, opt := range []Options{{}, {MaxKeys: 100}} { // own states, and the filter's key table
		opt.Delay, opt.Buckets = 3*time.Second, 100_000 // buckets of 10µs
		lim := mustBucket(t, algorithms.LeakyBucket, 10, time.Second, 1)
		res, err := Run(burstTraffic(50), "shaped", lim, opt)
		if err != nil {
			t.Fatal(err)
		}
		s := res.Shaping
		if s == nil || s.Meter == nil {
			t.Fatalf("max_keys %d: no shaping in the result", opt.MaxKeys)
		}
		if res.BucketWidth != 10_000 {
			t.Fatalf("bucket width %d", res.BucketWidth)
		}
		if res.Offered != 50 || res.Admitted != 31 || res.Denied != 19 || s.AtOnce != 1 || s.Held != 30 || s.Metered != 0 {
			t.Errorf("max_keys %d: offered %d admitted %d denied %d, at once %d held %d metered %d; want 50 31 19, 1 30 0",
				opt.MaxKeys, res.Offered, res.Admitted, res.Denied, s.AtOnce, s.Held, s.Metered)
		}
		// Upstream: one arrival in each bucket 0, 10000, 20000, … 300000 (0, 100ms, … 3s).
		idx, sum := nonZero(s.Arrivals)
		if sum != 31 || len(idx) != 31 {
			t.Fatalf("max_keys %d: %d arrivals in %d buckets, want 31 in 31", opt.MaxKeys, sum, len(idx))
		}
		for k, i := range idx {
			if i != k*10_000 || s.Arrivals[i] != 1 {
				t.Fatalf("max_keys %d: arrival %d in bucket %d (+%v), want +%v", opt.MaxKeys, k, i, time.Duration(int64(i)*res.BucketWidth), time.Duration(k)*100*time.Millisecond)
			}
		}
		if got, want := s.LastArrival-res.Start, int64(3*time.Second); got != want {
			t.Errorf("last arrival at +%v, want +3s", time.Duration(got))
		}
		if s.DelayP50 != 1500*time.Millisecond || s.DelayP99 != 3*time.Second || s.DelayMax != 3*time.Second {
			t.Errorf("delays p50 %v p99 %v max %v, want 1.5s 3s 3s", s.DelayP50, s.DelayP99, s.DelayMax)
		}
		// All 30 are held from the first instant; one leaves every 100 ms.
		if s.MostHeld != 30 || s.MostHeldIn[0] != 30 || s.MostHeldIn[10_000] != 29 || s.MostHeldIn[150_000] != 15 || s.MostHeldIn[299_999] != 1 || s.MostHeldIn[300_000] != 0 {
			t.Errorf("held: most %d; at 0 %d, +100ms %d, +1.5s %d, +3s−10µs %d, +3s %d", s.MostHeld,
				s.MostHeldIn[0], s.MostHeldIn[10_000], s.MostHeldIn[150_000], s.MostHeldIn[299_999], s.MostHeldIn[300_000])
		}
		if len(s.MostHeldIn) != len(s.Arrivals) || len(s.Arrivals) < 300_001 {
			t.Errorf("series of %d and %d buckets", len(s.MostHeldIn), len(s.Arrivals))
		}
		// In any second: 0, 0.1 … 0.9 s: 10 arrivals; the per-key window agrees.
		if res.MaxArrivals != 10 || res.MaxInWindow != 10 {
			t.Errorf("max arrivals %d, max in window %d, want 10", res.MaxArrivals, res.MaxInWindow)
		}
		m := s.Meter
		if m.Shaping != nil || m.Admitted != 1 || m.Denied != 49 || m.MaxArrivals != 1 || m.Buckets[0].Admitted != 1 {
			t.Errorf("meter: admitted %d denied %d max arrivals %d, shaping %v; want 1 49 1", m.Admitted, m.Denied, m.MaxArrivals, m.Shaping)
		}
	}
}

// A token bucket of burst 5: five go at once, 30 more 100 ms apart.
func TestShapingTokenBucket(t *testing.T) {
	lim := mustBucket(t, algorithms.TokenBucket, 10, time.Second, 5)
	res, err := Run(burstTraffic(50), "tb", lim, Options{Delay: 3 * time.Second, Buckets: 10}) // 100 ms buckets
	if err != nil {
		t.Fatal(err)
	}
	s := res.Shaping
	if res.Admitted != 35 || res.Denied != 15 || s.AtOnce != 5 || s.Held != 30 || s.DelayMax != 3*time.Second || s.DelayP50 != 1500*time.Millisecond {
		t.Fatalf("admitted %d denied %d at once %d held %d max delay %v p50 %v", res.Admitted, res.Denied, s.AtOnce, s.Held, s.DelayMax, s.DelayP50)
	}
	want := []int64{5}
	for range 30 {
		want = append(want, 1)
	}
	if got := s.Arrivals[:31]; !equal(got, want) {
		t.Errorf("arrivals per 100ms %v, want %v", got, want)
	}
	// 5 at once, then 10 per second: at most 5 + 9 in (t−1s, t].
	if res.MaxArrivals != 14 || s.Meter.Admitted != 5 || s.Meter.MaxArrivals != 5 {
		t.Errorf("max arrivals %d (meter %d), meter admitted %d", res.MaxArrivals, s.Meter.MaxArrivals, s.Meter.Admitted)
	}
}

func equal(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// max_held 10: after ten are held, the rest are decided as by the meter
// (refused: the bucket is full).
func TestShapingMaxHeld(t *testing.T) {
	lim := mustBucket(t, algorithms.LeakyBucket, 10, time.Second, 1)
	res, err := Run(burstTraffic(50), "bounded", lim, Options{Delay: 3 * time.Second, MaxHeld: 10})
	if err != nil {
		t.Fatal(err)
	}
	s := res.Shaping
	if res.Admitted != 11 || res.Denied != 39 || s.Held != 10 || s.MostHeld != 10 || s.Metered != 39 || s.DelayMax != time.Second {
		t.Errorf("admitted %d denied %d held %d most held %d metered %d max delay %v; want 11 39 10 10 39 1s",
			res.Admitted, res.Denied, s.Held, s.MostHeld, s.Metered, s.DelayMax)
	}

	// Spread out, the bound frees up: one request every 50 ms at 10/s for
	// 10 s, max_held 3. The queue grows by one every 100 ms until three
	// are held; then every second request is refused.
	start := Epoch.UnixNano()
	tr := &Traffic{Start: start, End: start + int64(10*time.Second), Keys: []string{"k"}}
	for i := range int64(200) {
		tr.Requests = append(tr.Requests, Request{At: start + i*int64(50*time.Millisecond), Cost: 1})
	}
	res, err = Run(tr, "spread", lim, Options{Delay: 3 * time.Second, MaxHeld: 3})
	if err != nil {
		t.Fatal(err)
	}
	s = res.Shaping
	if s.MostHeld != 3 || s.DelayMax > 300*time.Millisecond || res.Admitted+res.Denied != 200 {
		t.Errorf("most held %d, max delay %v", s.MostHeld, s.DelayMax)
	}
	// The upstream still sees 10/s: 100 in 10 s, and the three held at
	// the end (released by +10.2s).
	if res.Admitted != 103 || s.Meter.Admitted != 100 || res.MaxInWindow > 11 {
		t.Errorf("admitted %d (meter %d), max in window %d", res.Admitted, s.Meter.Admitted, res.MaxInWindow)
	}
}

// Random traffic above the rate: shaping admits at least what the meter
// does, never more in any window than the bucket's bound, each delay
// within delay.max.
func TestShapingPoisson(t *testing.T) {
	for _, k := range []algorithms.Kind{algorithms.LeakyBucket, algorithms.TokenBucket} {
		tr := mustGenerate(t, Pattern{Name: Poisson, Duration: time.Minute, Rate: 15, Keys: 3, Seed: 7, Cost: 1})
		lim := mustBucket(t, k, 10, time.Second, 4)
		res, err := Run(tr, k.String(), lim, Options{Delay: 500 * time.Millisecond, Buckets: 60})
		if err != nil {
			t.Fatal(err)
		}
		s, m := res.Shaping, res.Shaping.Meter
		bound, _ := WindowBound(k, lim.Params())
		if res.Admitted <= m.Admitted || res.MaxInWindow > bound || m.MaxInWindow > bound || s.DelayMax > 500*time.Millisecond || s.DelayMax == 0 {
			t.Errorf("%s: admitted %d (meter %d), max in window %d (meter %d, bound %d), max delay %v",
				k, res.Admitted, m.Admitted, res.MaxInWindow, m.MaxInWindow, bound, s.DelayMax)
		}
		if s.AtOnce+s.Held != res.Admitted || res.Admitted+res.Denied != res.Offered {
			t.Errorf("%s: %d at once + %d held != %d admitted", k, s.AtOnce, s.Held, res.Admitted)
		}
		if _, sum := nonZero(s.Arrivals); sum != res.Admitted {
			t.Errorf("%s: %d arrivals for %d admitted", k, sum, res.Admitted)
		}
		var madm int64
		for _, b := range m.Buckets {
			madm += b.Admitted
		}
		if madm != m.Admitted || m.MaxArrivals < m.MaxInWindow || res.MaxArrivals < res.MaxInWindow {
			t.Errorf("%s: meter buckets %d for %d; max arrivals %d/%d", k, madm, m.Admitted, m.MaxArrivals, res.MaxArrivals)
		}
	}
}

// A rule without a delay: no shaping, nothing new in the report; a window
// algorithm cannot shape.
func TestNoDelayNoShaping(t *testing.T) {
	lim := mustBucket(t, algorithms.LeakyBucket, 10, time.Second, 1)
	tr := burstTraffic(50)
	res, err := Run(tr, "plain", lim, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Shaping != nil || res.MaxArrivals != 0 || res.Admitted != 1 {
		t.Fatalf("shaping %v, max arrivals %d, admitted %d", res.Shaping, res.MaxArrivals, res.Admitted)
	}
	var page bytes.Buffer
	if err := WriteReport(&page, &Report{Traffic: tr, Results: []*Result{res}}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"arrivals", `data-metric="held"`, "delay", "shaping"} {
		if strings.Contains(page.String(), bad) {
			t.Errorf("a report without delay mentions %q", bad)
		}
	}
	_, err = Run(tr, "fw", mustLimiter(t, algorithms.FixedWindow, 10, time.Second), Options{Delay: time.Second})
	if err == nil || !strings.Contains(err.Error(), "cannot hold requests") {
		t.Errorf("fixed_window with a delay: %v", err)
	}
	if _, err := Run(tr, "neg", lim, Options{Delay: -1}); err == nil {
		t.Error("a negative delay is accepted")
	}
}

// The report shows both sides: numbers and the charts' data.
func TestShapingReport(t *testing.T) {
	lim := mustBucket(t, algorithms.LeakyBucket, 10, time.Second, 1)
	tr := burstTraffic(50)
	res, err := Run(tr, "shaped", lim, Options{Delay: 3 * time.Second, MaxHeld: 1000, Buckets: 10})
	if err != nil {
		t.Fatal(err)
	}
	var page bytes.Buffer
	if err := WriteReport(&page, &Report{Traffic: tr, Results: []*Result{res}}); err != nil {
		t.Fatal(err)
	}
	nums := reportNumbers(t, page.Bytes())["leaky_bucket"]
	for m, want := range map[string]int64{"admitted": 31, "denied": 19, "at-once": 1, "held": 30, "refused": 19, "most-held": 30,
		"max-arrivals": 10, "meter-admitted": 1, "meter-denied": 49} {
		if nums[m] != want {
			t.Errorf("%s = %d, want %d (all: %v)", m, nums[m], want, nums)
		}
	}
	p := page.String()
	for _, want := range []string{`data-p50-ns="1500000000" data-p99-ns="3000000000" data-max-ns="3000000000">1.5s / 3s / 3s</dd>`,
		`data-delay-ns="3000000000" data-max-held="1000"`, `<span data-metric="meter-max-arrivals">1</span>`, "delay ≤ 3s"} {
		if !strings.Contains(p, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// 100 ms buckets: with shaping one per bucket up to +3s; without, one.
	with := chartYs(t, p, "chart-1-arrivals", "with")
	without := chartYs(t, p, "chart-1-arrivals", "without")
	held := chartYs(t, p, "chart-1-held", "held")
	// The last release is at +3s exactly: bucket 30, where nothing is held.
	if len(with) != 31 || len(without) != 31 || len(held) != 31 {
		t.Fatalf("%d, %d, %d buckets charted", len(with), len(without), len(held))
	}
	for i := range 31 {
		wo := int64(0)
		if i == 0 {
			wo = 1
		}
		if with[i] != 1 || without[i] != wo || held[i] != int64(30-i) {
			t.Errorf("bucket %d: with %d without %d held %d, want 1 %d %d", i, with[i], without[i], held[i], wo, 30-i)
		}
	}
}
