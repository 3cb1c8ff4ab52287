package integration

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/host/fakeclock"
)

// The compiled module reads the time through WASI clock_time_get, which the embedded host
// serves from its clock (host.Options.Clock): with a clock the test steps, the filter's
// windows, Retry-After and refills move exactly as far as the test says, and not while it
// waits. fakeclock.Start is on a whole hour, so an hourly fixed window starts with it.
func TestHostGuestReadsInjectedClock(t *testing.T) {
	c := fakeclock.New()
	h, err := host.New(context.Background(), host.Options{
		Wasm:         filtertest.Wasm(t, ""),
		PluginConfig: []byte(perIPConfig), // fixed_window, 3 per hour per client address
		Workers:      2,
		Clock:        c,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	ht := &hostTarget{t: t, h: h}
	for i := 0; i < 3; i++ {
		if r := ht.do(req("10.0.0.1:1")); r.Status != 200 {
			t.Fatalf("request %d: %d", i, r.Status)
		}
	}
	for _, step := range []struct {
		advance    time.Duration
		status     int
		retryAfter string
	}{
		{0, 429, "3600"},
		{20 * time.Minute, 429, "2400"},
		{39*time.Minute + 59*time.Second, 429, "1"},
		{time.Second, 200, ""}, // the next window
	} {
		c.Advance(step.advance)
		r := ht.do(req("10.0.0.1:1"))
		if r.Status != step.status || r.Header("retry-after") != step.retryAfter {
			t.Fatalf("%v after the window began: %d, Retry-After %q; want %d, %q",
				c.Now().Sub(fakeclock.Start), r.Status, r.Header("retry-after"), step.status, step.retryAfter)
		}
	}
	if up := h.Stats().Uptime; up != time.Hour {
		t.Errorf("Stats().Uptime = %v, want the hour the test stepped", up)
	}
}
