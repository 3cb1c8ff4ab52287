// Package fakeclock is a clock for tests of the embedded host (host.Options.Clock; it
// imports nothing of the host, so the host's own tests use it too): time
// stands still until the test steps it, and timers fire when a step passes their time. A
// test that waits for a tick, a backoff or a timeout steps the clock instead of sleeping.
package fakeclock

import (
	"sort"
	"sync"
	"time"
)

// Start is the time a clock from New shows before it is stepped: 2026-01-01 00:00 UTC.
var Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Clock is a host.Clock that moves only when Advance or Set moves it. Safe for concurrent
// use.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*timer // armed, in no particular order
}

// New returns a clock showing Start.
func New() *Clock { return &Clock{now: Start} }

// Now implements host.Clock.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer implements host.Clock: the timer fires when the clock reaches now + d (at once
// when d ≤ 0).
func (c *Clock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	if d <= 0 {
		t.ch <- c.now
		return t.ch, func() bool { return false }
	}
	c.timers = append(c.timers, t)
	return t.ch, t.stop
}

// Advance moves the clock forward by d and fires, in the order of their times, the timers
// it passes. d < 0 is ignored: the clock never goes backwards.
func (c *Clock) Advance(d time.Duration) {
	if d > 0 {
		c.Set(c.Now().Add(d))
	}
}

// Set moves the clock to t (if t is later) and fires the timers it passes.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.After(c.now) {
		c.now = t
	}
	var due, rest []*timer
	for _, x := range c.timers {
		if x.at.After(c.now) {
			rest = append(rest, x)
		} else {
			due = append(due, x)
		}
	}
	c.timers = rest
	sort.SliceStable(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, x := range due {
		x.ch <- x.at // buffered, sent once: never blocks
	}
}

// Timers is the number of timers armed and not yet fired: a test polls it to know that the
// host is waiting on the clock before it steps it.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Next is the time of the earliest armed timer; false when none is armed.
func (c *Clock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first time.Time
	for _, x := range c.timers {
		if first.IsZero() || x.at.Before(first) {
			first = x.at
		}
	}
	return first, !first.IsZero()
}

type timer struct {
	c  *Clock
	at time.Time
	ch chan time.Time
}

func (t *timer) stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}
