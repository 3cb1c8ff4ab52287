package fakeclock

import (
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	c := New()
	if !c.Now().Equal(Start) {
		t.Fatalf("Now = %v", c.Now())
	}
	a, _ := c.NewTimer(2 * time.Second)
	b, stopB := c.NewTimer(time.Second)
	z, _ := c.NewTimer(0)
	select {
	case at := <-z:
		if !at.Equal(Start) {
			t.Errorf("a timer of 0 fired at %v", at)
		}
	default:
		t.Fatal("a timer of 0 did not fire at once")
	}
	if next, ok := c.Next(); !ok || !next.Equal(Start.Add(time.Second)) || c.Timers() != 2 {
		t.Fatalf("Next %v %v, Timers %d", next, ok, c.Timers())
	}
	c.Advance(999 * time.Millisecond)
	select {
	case <-a:
		t.Fatal("fired early")
	case <-b:
		t.Fatal("fired early")
	default:
	}
	c.Advance(time.Millisecond)
	if at := <-b; !at.Equal(Start.Add(time.Second)) {
		t.Errorf("b fired at %v", at)
	}
	if stopB() {
		t.Error("Stop of a fired timer reported true")
	}
	_, stopC := c.NewTimer(time.Minute)
	if !stopC() || c.Timers() != 1 {
		t.Errorf("Stop of an armed timer: Timers %d", c.Timers())
	}
	c.Advance(-time.Hour) // never backwards
	c.Set(Start)
	if !c.Now().Equal(Start.Add(time.Second)) {
		t.Errorf("moved backwards: %v", c.Now())
	}
	c.Advance(time.Hour)
	if at := <-a; !at.Equal(Start.Add(2 * time.Second)) {
		t.Errorf("a fired at %v, want its own time", at)
	}
	if _, ok := c.Next(); ok || c.Timers() != 0 {
		t.Error("timers left")
	}
}
