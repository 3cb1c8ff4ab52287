package algorithms

import (
	"errors"
	"testing"
	"time"
)

// TestConcurrencyAcquireRelease: two holders share limit 3; a refusal
// charges nothing; releases give slots back, never below zero.
func TestConcurrencyAcquireRelease(t *testing.T) {
	base, err := NewConcurrency(3, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	a, b := base.Bind(1, 10*time.Second), base.Bind(2, 10*time.Second)
	now := int64(1e12)
	var st []byte
	acquire := func(l *ConcurrencyLimiter, want bool, rem int64) {
		t.Helper()
		ns, d, err := l.Decide(nil, st, now, 1)
		if err != nil || d.Allowed != want || d.Remaining != rem || d.Limit != 3 {
			t.Fatalf("Decide: %+v %v, want allowed=%v remaining=%d", d, err, want, rem)
		}
		if !want && (d.RetryAfter != 2*time.Second || string(ns) != string(st)) {
			t.Fatalf("refusal %+v changed the state or lacks the hint", d)
		}
		st = ns
	}
	acquire(a, true, 2)
	acquire(b, true, 1)
	acquire(a, true, 0)
	acquire(b, false, 0)
	if n := a.InFlight(st, now); n != 3 || a.Used(st, now) != 3 || a.Idle(st, now) {
		t.Fatalf("in flight %d", n)
	}
	st, held, err := a.Release(nil, st, now, 1)
	if err != nil || held != 2 {
		t.Fatalf("release: held %d %v", held, err)
	}
	acquire(b, true, 0)
	for i := 0; i < 3; i++ { // b holds 2: the third release finds none
		st, _, _ = b.Release(nil, st, now, 1)
	}
	st, _, _ = a.Release(nil, st, now, 1)
	if !a.Idle(st, now) || len(st) != concHeader {
		t.Fatalf("not idle after every release: %x", st)
	}
}

// TestConcurrencyLeaseLapse: a holder that stops renewing loses its
// slots after its lease; renewing keeps them; a lease of 0 never lapses.
func TestConcurrencyLeaseLapse(t *testing.T) {
	base, _ := NewConcurrency(2, time.Second)
	ttl := 10 * time.Second
	dead, alive := base.Bind(7, ttl), base.Bind(8, ttl)
	t0 := int64(5e12)
	st, _, _ := dead.Decide(nil, nil, t0, 1)
	st, _, _ = dead.Decide(nil, st, t0, 1)
	if _, d, _ := alive.Decide(nil, st, t0+int64(ttl)-1, 1); d.Allowed {
		t.Fatal("admitted at the lease's last instant")
	}
	after := t0 + int64(ttl)
	if r := alive.Reclaimed(st, after); r != 2 {
		t.Fatalf("reclaimed %d, want 2", r)
	}
	st, d, _ := alive.Decide(nil, st, after, 1)
	if !d.Allowed || d.Remaining != 1 || alive.Reclaimed(st, after) != 0 {
		t.Fatalf("after the lapse: %+v", d)
	}
	// alive renews at after+9s: still holds at after+15s.
	st, _ = alive.Renew(nil, st, after+int64(9*time.Second), 1)
	if n := dead.InFlight(st, after+int64(15*time.Second)); n != 1 {
		t.Fatalf("renewed slot lapsed: %d", n)
	}
	forever := base.Bind(9, 0)
	st, _, _ = forever.Decide(nil, nil, 0, 1)
	if n := alive.InFlight(st, 1<<62); n != 1 {
		t.Fatalf("a never-lapsing lease lapsed")
	}
}

// TestConcurrencyBadInput: corrupt states and costs are errors, never
// panics; the holders are bounded.
func TestConcurrencyBadInput(t *testing.T) {
	base, _ := NewConcurrency(1000, time.Second)
	l := base.Bind(1, time.Second)
	for _, st := range [][]byte{{1}, {2, 6, 0}, {1, 3, 0}, {1, 6, 1}, {1, 6, 65}} {
		if _, _, err := l.Decide(nil, st, 0, 1); !errors.Is(err, ErrCorruptState) {
			t.Errorf("Decide(%x): %v", st, err)
		}
		if _, _, err := l.Release(nil, st, 0, 1); !errors.Is(err, ErrCorruptState) {
			t.Errorf("Release(%x): %v", st, err)
		}
		if l.Idle(st, 0) || l.Used(st, 0) != 0 {
			t.Errorf("corrupt %x idle or used", st)
		}
	}
	if _, _, err := l.Decide(nil, nil, 0, 0); err != ErrInvalidCost {
		t.Fatal(err)
	}
	var st []byte
	for h := uint64(1); h <= MaxConcurrencyHolders; h++ {
		ns, d, err := base.Bind(h, time.Second).Decide(nil, st, 0, 1)
		if err != nil || !d.Allowed {
			t.Fatal(h, err)
		}
		st = ns
	}
	if len(st) != l.MaxStateSize() {
		t.Fatalf("full state %d bytes, MaxStateSize %d", len(st), l.MaxStateSize())
	}
	if _, _, err := base.Bind(999, time.Second).Decide(nil, st, 0, 1); err != ErrHoldersFull {
		t.Fatalf("65th holder: %v", err)
	}
	if _, err := NewConcurrency(0, time.Second); err == nil {
		t.Fatal("limit 0 accepted")
	}
}
