package rlqs

import (
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/serve/rls"
)

// A limit lowered mid-window below what the pool has taken: the Envoy's
// bucket is revoked (DENY_ALL) at its next report instead of being sent
// again, so the window admits at most what it had when the limit changed
// plus one interval of demand; and a limit whose unit grows (minute to
// hour) keeps what the pool took in the hour so far.
func TestSimLimitChanges(t *testing.T) {
	const minute300 = "domain: d\ndescriptors:\n  - key: api\n    rate_limit: {unit: minute, requests_per_unit: 300}\n"
	cfg := config(t, minute300)
	c := &clock{now: minuteStart(time.Now()).Add(time.Minute + 2*time.Second)}
	s := New(Options{Backend: backend(t), Config: func() *rls.Config { return cfg }, Now: c.Now, ScriptClock: true})
	a := newSimEnvoy(t, s, map[string]string{"api": uniq(t)})
	a.denyNo = true
	first := minuteStart(c.now).UnixMicro()
	demand := func(int, time.Time) int { return 2 } // 20/s
	sim(t, c, []*simEnvoy{a}, demand, 5*time.Second, 300)
	at := a.admitted[first]
	cfg = config(t, "domain: d\ndescriptors:\n  - key: api\n    rate_limit: {unit: minute, requests_per_unit: 50}\n")
	sim(t, c, []*simEnvoy{a}, demand, 20*time.Second, 1000)
	bound := max(int64(50), at+20+2) // one report's interval of demand, and a tick
	t.Logf("admitted %d when the limit went from 300 to 50, %d in the window", at, a.admitted[first])
	if got := a.admitted[first]; got > bound {
		t.Errorf("the window admitted %d after the limit was lowered to 50 (%d when it changed); want at most %d", got, at, bound)
	}
	if s.Metrics.Domain("d").Actions[actionDenyAll] == 0 {
		t.Error("no DENY_ALL sent")
	}

	// The unit grows: what the minute's pool took stays taken in the hour.
	c2 := &clock{now: c.now.Truncate(time.Hour).Add(time.Hour + 10*time.Minute + 2*time.Second)} // a minute inside the hour
	cfg = config(t, minute300)
	s2 := New(Options{Backend: backend(t), Config: func() *rls.Config { return cfg }, Now: c2.Now, ScriptClock: true})
	e := newSimEnvoy(t, s2, map[string]string{"api": uniq(t)})
	e.denyNo = true
	sim(t, c2, []*simEnvoy{e}, demand, 5*time.Second, 300)
	taken := e.total
	cfg = config(t, "domain: d\ndescriptors:\n  - key: api\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	sim(t, c2, []*simEnvoy{e}, demand, 20*time.Second, 1000)
	t.Logf("minute to hour: %d admitted under the minute's limit, %d in all", taken, e.total)
	if e.total > max(100, taken+22) {
		t.Errorf("after the unit grew to an hour of 100, %d admitted in all (%d before); the hour forgot the minute's count", e.total, taken)
	}
}
