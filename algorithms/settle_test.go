package algorithms

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

var bucketKinds = []Kind{TokenBucket, LeakyBucket}

func mustSettler(tb testing.TB, k Kind, p Params) Settler {
	tb.Helper()
	s, ok := AsSettler(mustNew(tb, k, p))
	if !ok {
		tb.Fatalf("%v %+v is not a Settler", k, p)
	}
	return s
}

// settle calls Settle with a fresh buffer and checks that the state it
// returns decodes.
func settle(tb testing.TB, s Settler, state []byte, now, delta int64) []byte {
	tb.Helper()
	out, err := s.Settle(make([]byte, 0, s.MaxStateSize()), state, now, delta)
	if err != nil {
		tb.Fatalf("Settle(%x, %d, %d): %v", state, now, delta, err)
	}
	if len(out) > s.MaxStateSize() {
		tb.Fatalf("state of %d bytes exceeds MaxStateSize %d", len(out), s.MaxStateSize())
	}
	if _, _, err := s.Decide(nil, out, now, 1); err != nil {
		tb.Fatalf("Settle(%x, %d, %d) wrote a state Decide rejects: %x: %v", state, now, delta, out, err)
	}
	return out
}

// lastOf is the last instant recorded in a bucket state (0 when empty).
func lastOf(k Kind, state []byte) int64 {
	switch {
	case len(state) == 0:
		return 0
	case k == TokenBucket:
		return int64(getU64(state, 2))
	}
	return int64(getU64(state, 18))
}

// bucketModel is the specification of a settling bucket, written apart
// from the implementation: a balance v (tokens × Window, so that it is an
// integer) which may be negative, refilled at Limit per nanosecond up to
// Burst × Window; a request of cost c is admitted iff v >= c × Window and
// takes it; a settlement takes delta × Window, however low that leaves v,
// and a refund gives back at most up to Burst × Window. Times never go
// backwards. Small parameters keep everything in int64.
type bucketModel struct {
	limit, window, burst int64
	v, t                 int64
	started              bool
}

func newModel(p Params) *bucketModel {
	return &bucketModel{limit: p.Limit, window: int64(p.Window), burst: p.Burst, v: p.Burst * int64(p.Window)}
}

func (m *bucketModel) advance(now int64) {
	if !m.started {
		m.t, m.started = now, true
	}
	if now < m.t {
		panic("the model's clock went backwards")
	}
	m.v = min(m.burst*m.window, m.v+(now-m.t)*m.limit)
	m.t = now
}

func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}

func (m *bucketModel) decide(now, cost int64) Decision {
	m.advance(now)
	full := m.burst * m.window
	d := Decision{Limit: m.burst}
	if cost <= m.burst && m.v >= cost*m.window {
		m.v -= cost * m.window
		d.Allowed = true
	} else if cost > m.burst {
		d.RetryAfter = time.Duration(m.window)
	} else {
		d.RetryAfter = time.Duration(ceilDiv(cost*m.window-m.v, m.limit))
	}
	d.Remaining = max(m.v, 0) / m.window
	d.ResetAfter = time.Duration(ceilDiv(full-m.v, m.limit))
	return d
}

func (m *bucketModel) settle(now, delta int64) {
	m.advance(now)
	m.v = min(m.burst*m.window, m.v-delta*m.window)
}

func (m *bucketModel) idle(now int64) bool {
	c := *m
	c.advance(now)
	return c.v == c.burst*c.window
}

func (m *bucketModel) used(now int64) int64 {
	c := *m
	c.advance(now)
	return c.burst - max(c.v, 0)/c.window
}

// The table of the feature, for both buckets (as meters they are the
// same): 100 per second, burst 100, one unit every 10 ms.
func TestSettleTable(t *testing.T) {
	p := Params{Limit: 100, Window: time.Second, Burst: 100}
	at := func(d time.Duration) int64 { return t0 + int64(d) }
	for _, k := range bucketKinds {
		t.Run(k.String(), func(t *testing.T) {
			s := mustSettler(t, k, p)
			reserve := func(now, cost int64) []byte {
				out, d := decide(t, s, nil, now, cost)
				if !d.Allowed || d.Remaining != 100-cost {
					t.Fatalf("reserve %d: %+v", cost, d)
				}
				return out
			}
			expect := func(state []byte, now, cost int64, allowed bool, remaining int64, retry, reset time.Duration) {
				t.Helper()
				out, d := decide(t, s, state, now, cost)
				checkDecision(t, s, state, out, now, cost, d)
				if d.Allowed != allowed || d.Remaining != remaining || d.RetryAfter != retry || d.ResetAfter != reset {
					t.Fatalf("cost %d at +%v: %+v, want allowed=%v remaining=%d retry=%v reset=%v",
						cost, time.Duration(now-t0), d, allowed, remaining, retry, reset)
				}
			}

			// Reserve 100, use 30: 70 come back. 100 ms later the bucket
			// holds 10 refilled + 70.
			st := settle(t, s, reserve(t0, 100), at(100*ms), 30-100)
			expect(st, at(100*ms), 80, true, 0, 0, time.Second)
			expect(st, at(100*ms), 81, false, 80, 10*ms, 200*ms)
			out, d := decide(t, s, st, at(100*ms), 1)
			checkRemaining(t, s, out, at(100*ms), d)

			// Reserve 100, use 250: 150 charged although nothing is left.
			// 100 ms later the bucket is at 10 − 150 = −140: a request of
			// 1 waits 141 units, 1.41 s; 100 units, 2.4 s; the bucket is
			// full again 2.4 s later.
			st = settle(t, s, reserve(t0, 100), at(100*ms), 250-100)
			expect(st, at(100*ms), 1, false, 0, 1410*ms, 2400*ms)
			expect(st, at(100*ms), 100, false, 0, 2400*ms, 2400*ms)
			expect(st, at(1*time.Second), 1, false, 0, 510*ms, 1500*ms)
			expect(st, at(1510*ms)-1, 1, false, 0, 1, 990*ms+1)
			expect(st, at(1510*ms), 1, true, 0, 0, time.Second)
			expect(st, at(2500*ms), 100, true, 0, 0, time.Second)
			for i, now := range []int64{at(100 * ms), at(time.Second), at(1510*ms) - 1, at(1510 * ms), at(2500*ms) - 1} {
				if s.Idle(st, now) {
					t.Fatalf("idle at +%v before the bucket is full again", time.Duration(now-t0))
				}
				if u := s.Used(st, now); i < 3 && u != 100 {
					t.Fatalf("Used at +%v = %d, want 100", time.Duration(now-t0), u)
				}
			}
			if !s.Idle(st, at(2500*ms)) || s.Used(st, at(2500*ms)) != 0 {
				t.Fatal("not idle once the debt is paid back and the bucket full")
			}
			// Held instead of refused: the wait is the debt's.
			out, d = decideDelay(t, s.(Shaper), st, at(100*ms), 1, 2*time.Second)
			if !d.Allowed || d.Delay != 1410*ms {
				t.Fatalf("DecideDelay in debt: %+v, want admitted with Delay 1.41s", d)
			}
			if _, d := decide(t, s, out, at(1510*ms), 1); d.Allowed || d.RetryAfter != 10*ms {
				t.Fatalf("after the held request: %+v, want denied for 10ms", d)
			}

			// Two in flight: 40 and 60 reserved. The first uses 190
			// (+150, the bucket at 10 − 150 = −140 after 100 ms); the
			// second uses nothing (−60, at 600 ms: −140 + 50 + 60 = −30):
			// the refund shortens the wait exactly, to 310 ms for one.
			st = reserve(t0, 40)
			st, d = decide(t, s, st, t0, 60)
			if !d.Allowed {
				t.Fatalf("second reservation: %+v", d)
			}
			st = settle(t, s, st, at(100*ms), 150)
			st = settle(t, s, st, at(600*ms), -60)
			expect(st, at(600*ms), 1, false, 0, 310*ms, 1300*ms)
			expect(st, at(900*ms), 1, false, 0, 10*ms, time.Second)
			expect(st, at(910*ms), 1, true, 0, 0, time.Second)

			// A refund after the bucket has refilled finds no room: the
			// reservation no longer holds anything. The key is fresh.
			st = settle(t, s, reserve(t0, 100), at(5*time.Second), -70)
			if !s.Idle(st, at(5*time.Second)) {
				t.Fatalf("a refund after a full refill: %x is not fresh", st)
			}
			expect(st, at(5*time.Second), 100, true, 0, 0, time.Second)

			// actual == reserved: nothing to settle, the state is copied.
			st = reserve(t0, 100)
			if out := settle(t, s, st, at(50*ms), 0); !bytes.Equal(out, st) {
				t.Fatalf("delta 0 changed the state: %x -> %x", st, out)
			}
			// A refund of a fresh key leaves it fresh (and unwritten).
			if out := settle(t, s, nil, t0, -5); len(out) != 0 {
				t.Fatalf("a refund to a fresh key wrote %x", out)
			}
		})
	}
}

// A rate whose unit interval is not a whole number of nanoseconds: 3 per
// second. A debt of one unit after an empty bucket needs two units of
// refill before a request of one: ⌈2 s / 3⌉ ns. The fraction carries on.
func TestSettleFractionalRate(t *testing.T) {
	p := Params{Limit: 3, Window: time.Second, Burst: 3}
	for _, k := range bucketKinds {
		s := mustSettler(t, k, p)
		m := newModel(p)
		st, _ := decide(t, s, nil, t0, 3)
		m.decide(t0, 3)
		st = settle(t, s, st, t0, 1)
		m.settle(t0, 1)
		now := t0
		for i := range 12 {
			d0 := m.decide(now, 1)
			out, d := decide(t, s, st, now, 1)
			if d != d0 {
				t.Fatalf("%v request %d at +%d: %+v, model %+v", k, i, now-t0, d, d0)
			}
			if !d.Allowed {
				if i == 0 && d.RetryAfter != 666_666_667 {
					t.Fatalf("%v: RetryAfter %v, want 666666667ns", k, d.RetryAfter)
				}
				if _, e := decide(t, s, st, now+int64(d.RetryAfter)-1, 1); e.Allowed {
					t.Fatalf("%v: admitted 1 ns before RetryAfter", k)
				}
				now += int64(d.RetryAfter)
				continue
			}
			st = settle(t, s, out, now, int64(i%3)) // a little over each time
			m.settle(now, int64(i%3))
		}
	}
}

// event is one step of a simulated history: an admission (amount is the
// reservation) or a settlement (amount is delta).
type event struct {
	at     int64
	admit  bool
	id     int
	amount int64
}

// flight is one admitted request.
type flight struct {
	admitIdx, settleIdx int // indices in the events; settleIdx -1: never settled
	end                 int64
	reserved, actual    int64
}

// simulate runs random traffic on a monotone clock through s and the
// model: reservations of 1..Burst+1, in flight for up to two windows
// (sometimes none), actual costs from 0 to three times the burst. Every
// decision, and probes between events (Decide not applied, Idle, Used),
// must equal the model's exactly — RetryAfter included, so a key in debt
// waits exactly until it is paid back. It returns the history.
func simulate(t *testing.T, s Settler, p Params, rng *rand.Rand, arrivals int) ([]event, []flight) {
	t.Helper()
	m := newModel(p)
	w := int64(p.Window)
	var state []byte
	var events []event
	var flights []flight
	var pending []int // flights in flight, by end
	now := t0 + rng.Int64N(w)
	probe := func(at int64) {
		t.Helper()
		for _, cost := range []int64{1, 1 + rng.Int64N(p.Burst)} {
			c := *m
			want := c.decide(at, cost)
			if _, d := decide(t, s, state, at, cost); d != want {
				t.Fatalf("%v %+v: probe cost %d at +%d: %+v, model %+v (state %x)", s.Kind(), p, cost, at-t0, d, want, state)
			}
		}
		if s.Idle(state, at) != m.idle(at) || s.Used(state, at) != m.used(at) {
			t.Fatalf("%v %+v: at +%d Idle %v Used %d, model %v %d (state %x)", s.Kind(), p, at-t0,
				s.Idle(state, at), s.Used(state, at), m.idle(at), m.used(at), state)
		}
	}
	next := now
	for a := 0; a < arrivals || len(pending) > 0; {
		settling := len(pending) > 0 && (a == arrivals || flights[pending[0]].end <= next)
		at := next
		if settling {
			at = flights[pending[0]].end
		}
		if at > now && rng.IntN(3) == 0 {
			probe(now + rng.Int64N(at-now))
		}
		now = at
		if settling {
			i := pending[0]
			pending = pending[1:]
			f := &flights[i]
			delta := f.actual - f.reserved
			state = settle(t, s, state, now, delta)
			m.settle(now, delta)
			f.settleIdx = len(events)
			events = append(events, event{now, false, i, delta})
			continue
		}
		a++
		switch x := rng.IntN(10); {
		case x < 4: // the same instant
		case x < 9:
			next += rng.Int64N(w/10 + 1)
		default:
			next += rng.Int64N(2*w + 1)
		}
		cost := 1 + rng.Int64N(p.Burst)
		if rng.IntN(30) == 0 {
			cost = p.Burst + 1
		}
		want := m.decide(now, cost)
		out, d := decide(t, s, state, now, cost)
		checkDecision(t, s, state, out, now, cost, d)
		if d != want {
			t.Fatalf("%v %+v: cost %d at +%d: %+v, model %+v (state %x)", s.Kind(), p, cost, now-t0, d, want, state)
		}
		state = out
		if !d.Allowed {
			continue
		}
		f := flight{admitIdx: len(events), settleIdx: -1, reserved: cost}
		switch rng.IntN(5) {
		case 0:
			f.actual = 0
		case 1:
			f.actual = cost / 2
		case 2:
			f.actual = cost
		default:
			f.actual = rng.Int64N(3*p.Burst + 1)
		}
		f.end = now
		if rng.IntN(4) != 0 {
			f.end += rng.Int64N(2*w + 1)
		}
		events = append(events, event{now, true, len(flights), cost})
		flights = append(flights, f)
		if rng.IntN(20) != 0 { // a few are never settled: in flight at the end
			pending = append(pending, len(flights)-1)
			sort.SliceStable(pending, func(i, j int) bool { return flights[pending[i]].end < flights[pending[j]].end })
		}
	}
	return events, flights
}

// randomSettleParams draws small parameters at most one unit per ns, the
// unit interval often fractional, sometimes exactly 1 ns.
func randomSettleParams(rng *rand.Rand) Params {
	p := Params{Limit: 1 + rng.Int64N(40), Burst: 1 + rng.Int64N(30)}
	switch rng.IntN(4) {
	case 0:
		p.Window = time.Duration(p.Limit) // one unit per nanosecond
	case 1:
		p.Window = time.Duration(p.Limit + rng.Int64N(1000))
	default:
		p.Window = time.Duration(1+rng.Int64N(3000)) * time.Millisecond
	}
	return p
}

// The guarantee of settle.go, over random traffic with reservations,
// excesses, refunds and overlapping requests, for both buckets.
//
// Let events e_0 … e_n be the admissions (a reservation r) and
// settlements (delta = actual − reserved) in order, at instants t_0 <= …
// <= t_n, and e_{−1} a key never seen at t_0. Then for all i < j with e_j an
// admission, in integers (× Window):
//
//	(1) Σ_{i<k<=j} amount_k          <= Burst + Limit × (t_j − t_i)/Window
//	(2) Σ_{i<k<=j, e_k admits} actual <= Burst + Limit × (t_j − t_i)/Window + X + R
//
// where X is the excess (actual − reserved > 0) of the requests admitted in
// (i, j] not settled by j — the in-flight excess at t_j — and R the refunds
// (reserved − actual > 0) settled in (i, j] of requests admitted at or
// before i. (1) is the bucket's bound with settlements charged when they
// are made; (2) is what it means for actual costs. That (2) needs X and R
// is checked too: the actual cost does exceed the plain bound, by an excess
// not yet charged or a late refund. And every decision is the exact
// model's (simulate), so each charged excess is waited off exactly.
func TestPropertySettleGuarantee(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	var neededX, neededR, tight int
	for round := 0; round < 60; round++ {
		p := randomSettleParams(rng)
		seed := rng.Uint64()
		for _, k := range bucketKinds {
			s := mustSettler(t, k, p)
			events, flights := simulate(t, s, p, rand.New(rand.NewPCG(seed, 1)), 150)
			W, L, B := int64(p.Window), p.Limit, p.Burst
			for j, ej := range events {
				if !ej.admit {
					continue
				}
				var net, used, x, r int64
				for m := j; m >= 0; m-- { // the window is (m−1, j]
					em := events[m]
					net += em.amount
					if em.admit {
						f := flights[em.id]
						used += f.actual
						if f.settleIdx < 0 || f.settleIdx > j {
							x += max(f.actual-f.reserved, 0)
						} else {
							r -= max(f.reserved-f.actual, 0) // its settlement is no longer of an earlier request
						}
					} else {
						r += max(-em.amount, 0)
					}
					ti := events[0].at
					if m > 0 {
						ti = events[m-1].at
					}
					capW := B*W + L*(ej.at-ti)
					if net*W > capW {
						t.Fatalf("%v %+v: (1) events (%d, %d]: %d charged over %v, bound %d/%d", k, p, m-1, j, net, time.Duration(ej.at-ti), capW, W)
					}
					if used*W > capW+(x+r)*W {
						t.Fatalf("%v %+v: (2) events (%d, %d]: actual %d over %v, bound %d/%d + X %d + R %d",
							k, p, m-1, j, used, time.Duration(ej.at-ti), capW, W, x, r)
					}
					if net*W == capW {
						tight++
					}
					if used*W > capW && used*W <= capW+x*W && x > 0 {
						neededX++
					}
					if used*W > capW+x*W {
						neededR++
					}
				}
			}
		}
	}
	t.Logf("tight %d, exceeded by in-flight excess %d, by late refunds %d", tight, neededX, neededR)
	if neededX == 0 || neededR == 0 || tight == 0 {
		t.Fatalf("the traffic never exercised the bound: tight %d, exceeded by in-flight excess %d, by late refunds %d", tight, neededX, neededR)
	}
}

// Token bucket and leaky bucket stay the same meter with settlements:
// every decision, and the states' Idle and Used, agree (both equal the
// model in simulate; here their states are also compared after every
// step of one shared history).
func TestPropertySettleBucketsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for round := 0; round < 20; round++ {
		p := randomSettleParams(rng)
		tb, lb := mustSettler(t, TokenBucket, p), mustSettler(t, LeakyBucket, p)
		var st, sl []byte
		now := t0
		for i := 0; i < 300; i++ {
			now += rng.Int64N(int64(p.Window)/4 + 1)
			if rng.IntN(2) == 0 {
				delta := rng.Int64N(4*p.Burst+1) - 2*p.Burst
				st, sl = settle(t, tb, st, now, delta), settle(t, lb, sl, now, delta)
			} else {
				cost := 1 + rng.Int64N(p.Burst)
				var dt, dl Decision
				st, dt = decide(t, tb, st, now, cost)
				sl, dl = decide(t, lb, sl, now, cost)
				if dt != dl {
					t.Fatalf("%+v step %d: token bucket %+v, leaky bucket %+v", p, i, dt, dl)
				}
			}
			probe := now + rng.Int64N(int64(p.Window))
			if tb.Idle(st, probe) != lb.Idle(sl, probe) || tb.Used(st, probe) != lb.Used(sl, probe) {
				t.Fatalf("%+v step %d: Idle/Used disagree", p, i)
			}
			_, dt, _ := tb.(Shaper).DecideDelay(nil, st, now, 1, p.Window)
			_, dl, _ := lb.(Shaper).DecideDelay(nil, sl, now, 1, p.Window)
			if dt != dl {
				t.Fatalf("%+v step %d: DecideDelay: token bucket %+v, leaky bucket %+v", p, i, dt, dl)
			}
		}
	}
}

// A refund never creates capacity beyond fresh: whatever the state, after
// a refund of any size the key admits at most what a fresh key admits,
// and at most what it admitted before plus the refund.
func TestSettleRefundNeverBeyondFresh(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 19))
	for _, k := range bucketKinds {
		p := Params{Limit: 7, Window: time.Second, Burst: 9}
		s := mustSettler(t, k, p)
		var state []byte
		now := t0
		for i := 0; i < 400; i++ {
			now += rng.Int64N(int64(300 * ms))
			if rng.IntN(3) == 0 {
				state = settle(t, s, state, now, rng.Int64N(20)-5)
			} else {
				state, _ = decide(t, s, state, now, 1+rng.Int64N(p.Burst))
			}
			refund := 1 + rng.Int64N(30)
			before := burstAt(t, s, state, now)
			after := burstAt(t, s, settle(t, s, state, now, -refund), now)
			if after > p.Burst || after > before+refund || after < min(before, p.Burst) {
				t.Fatalf("%v step %d: admitted %d before a refund of %d, %d after (burst %d)", k, i, before, refund, after, p.Burst)
			}
		}
		big := settle(t, s, nil, now, -MaxSettle)
		if len(big) != 0 {
			t.Fatalf("%v: a refund of a fresh key wrote %x", k, big)
		}
		st, _ := decide(t, s, nil, now, 3)
		if got := settle(t, s, st, now, -MaxSettle); !s.Idle(got, now) {
			t.Fatalf("%v: the largest refund leaves %x, not fresh", k, got)
		}
	}
}

// A settlement made at a now before the state's last instant (a clock
// that went backwards, or another worker's) is applied to the key's
// balance at that now. Then the key is never more open than if the
// settlement had been made at the state's last instant (as Decide would
// see it), at any later instant, and exactly as open from that instant on.
func TestSettleClockBackwards(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 29))
	for _, k := range bucketKinds {
		for round := 0; round < 300; round++ {
			p := randomSettleParams(rng)
			s := mustSettler(t, k, p)
			w := int64(p.Window)
			// A state with some history, possibly in debt.
			var state []byte
			now := t0
			for range 1 + rng.IntN(8) {
				now += rng.Int64N(w/2 + 1)
				if rng.IntN(3) == 0 {
					state = settle(t, s, state, now, rng.Int64N(3*p.Burst+1)-p.Burst)
				} else {
					state, _ = decide(t, s, state, now, 1+rng.Int64N(p.Burst))
				}
			}
			if len(state) == 0 {
				continue
			}
			last := lastOf(k, state) // Decide's instant for any earlier now
			back := last - rng.Int64N(3*w+1)
			delta := rng.Int64N(3*p.Burst+1) - p.Burst
			early := settle(t, s, state, back, delta)
			atLast := settle(t, s, state, last, delta)
			for range 20 {
				at := back + rng.Int64N(last-back+2*w+1)
				cost := 1 + rng.Int64N(p.Burst)
				_, de := decide(t, s, early, at, cost)
				_, dl := decide(t, s, atLast, at, cost)
				if at >= last && de != dl {
					t.Fatalf("%v %+v: after the last instant, settled early %+v, at last %+v", k, p, de, dl)
				}
				if (de.Allowed && !dl.Allowed) || avail(de, cost) > avail(dl, cost) || (!de.Allowed && !dl.Allowed && de.RetryAfter < dl.RetryAfter) {
					t.Fatalf("%v %+v: settled at a clock %d ns behind: %+v at +%d, more open than %+v", k, p, last-back, de, at-back, dl)
				}
			}
		}
		// Far behind, and before the epoch: no panic, a valid state, at
		// most as open as the settlement made at the state's instant.
		s := mustSettler(t, k, p5)
		st, _ := decide(t, s, nil, t0, 5)
		for _, now := range []int64{0, -1, math.MinInt64, t0 - int64(100*365*24*time.Hour)} {
			for _, delta := range []int64{-3, 1, 500} {
				out := settle(t, s, st, now, delta)
				_, d := decide(t, s, out, t0, 1)
				_, want := decide(t, s, settle(t, s, st, t0, delta), t0, 1)
				if avail(d, 1) > avail(want, 1) || (d.Allowed && !want.Allowed) || (delta > 0 && d.Allowed) {
					t.Fatalf("%v: settling %d at %d: %+v, more open than %+v", k, delta, now, d, want)
				}
			}
		}
	}
}

// avail is the cost-1 requests a decision saw before it took effect.
func avail(d Decision, cost int64) int64 {
	if d.Allowed {
		return d.Remaining + cost
	}
	return d.Remaining
}

// Overflow bounds: |delta| up to MaxSettle, a debt of at most
// MaxDebtWait, never past the latest instant; beyond, ErrSettleRange and
// nothing appended. Extreme parameters settle exactly.
func TestSettleBounds(t *testing.T) {
	for _, k := range bucketKinds {
		t.Run(k.String(), func(t *testing.T) {
			s := mustSettler(t, k, Params{Limit: MaxLimit, Window: time.Second, Burst: MaxLimit})
			dst := make([]byte, 3, 64)
			for _, delta := range []int64{MaxSettle + 1, -MaxSettle - 1, math.MaxInt64, math.MinInt64} {
				out, err := s.Settle(dst, nil, t0, delta)
				if !errors.Is(err, ErrSettleRange) || len(out) != 3 {
					t.Fatalf("delta %d: %x, %v", delta, out, err)
				}
			}
			// The largest charge on the fastest bucket: 1e12 units at
			// 1e9/s after a full bucket of 1e9: 999 s of debt.
			st := settle(t, s, nil, t0, MaxSettle)
			if _, d := decide(t, s, st, t0, 1); d.RetryAfter != 999*time.Second+time.Nanosecond {
				t.Fatalf("largest charge: %+v, want RetryAfter 999s+1ns", d)
			}

			// The slowest bucket: 1 per 366 days, burst 100. A debt of
			// 100 windows is the most: delta 200 from full, not 201.
			slow := mustSettler(t, k, Params{Limit: 1, Window: MaxWindow, Burst: 100})
			st = settle(t, slow, nil, t0, 200)
			if _, d := decide(t, slow, st, t0, 1); d.RetryAfter != 101*MaxWindow {
				t.Fatalf("debt of 100 windows: %+v, want RetryAfter 101 windows", d)
			}
			if _, err := slow.Settle(nil, nil, t0, 201); !errors.Is(err, ErrSettleRange) {
				t.Fatalf("a debt beyond MaxDebtWait: %v", err)
			}
			if _, err := slow.Settle(nil, st, t0+1, 1); !errors.Is(err, ErrSettleRange) {
				t.Fatalf("a debt accumulated beyond MaxDebtWait: %v", err)
			}
			if got := settle(t, slow, st, t0+int64(MaxWindow), 1); lastOf(k, got) != t0+101*int64(MaxWindow) {
				t.Fatalf("after a window paid back, one more unit: last %d", lastOf(k, got))
			}
			// A refund still works on the largest debt.
			if got := settle(t, slow, st, t0, -50); lastOf(k, got) != t0+50*int64(MaxWindow) {
				t.Fatalf("a refund of 50 windows: last %d", lastOf(k, got))
			}
			// Not past the latest instant: near it, a charge that fits is
			// made, one that leaves a debt is refused.
			for _, now := range []int64{maxTime - 1, maxTime, math.MaxInt64} {
				st := settle(t, s, nil, now, 10)
				if _, err := s.Settle(nil, st, now, MaxLimit); !errors.Is(err, ErrSettleRange) {
					t.Fatalf("a debt past the latest instant at %d: %v", now, err)
				}
			}
			for _, p := range []Params{
				{Limit: 1, Window: time.Nanosecond, Burst: 1},
				{Limit: MaxLimit, Window: MaxWindow, Burst: 1},
				{Limit: 3, Window: MaxWindow - 1, Burst: 299},
				{Limit: MaxLimit, Window: MaxLimit, Burst: MaxLimit},
			} {
				s := mustSettler(t, k, p)
				m := newModelBig(p)
				var st []byte
				now := t0
				for i := range 40 {
					if now > t0+int64(30*365*24*time.Hour) {
						break
					}
					delta := []int64{MaxLimit, -MaxLimit, 1, p.Burst, -1, 0, 7 * p.Burst}[i%7]
					out, err := s.Settle(nil, st, now, delta)
					if errors.Is(err, ErrSettleRange) {
						now += int64(p.Window)
						continue
					}
					if err != nil {
						t.Fatalf("%+v: %v", p, err)
					}
					st = out
					m.settle(now, delta)
					_, d := decide(t, s, st, now, 1)
					if want := m.retry(now, 1); d.RetryAfter != want {
						t.Fatalf("%+v step %d: RetryAfter %v, exact %v", p, i, d.RetryAfter, want)
					}
					now += int64(d.RetryAfter)
					if _, d := decide(t, s, st, now, 1); !d.Allowed {
						t.Fatalf("%+v step %d: denied at RetryAfter: %+v", p, i, d)
					}
				}
			}
		})
	}
}

// newModelBig is the model's balance in 128 bits, for extreme parameters:
// only settlements and the wait of a request.
type bigModel struct {
	p        Params
	neg      bool
	mag      u128 // |v|, v = tokens × Window
	t        int64
	started  bool
	capacity u128
}

func newModelBig(p Params) *bigModel {
	c := mul(uint64(p.Burst), uint64(p.Window))
	return &bigModel{p: p, mag: c, capacity: c}
}

func (m *bigModel) addSigned(neg bool, x u128) {
	switch {
	case m.neg == neg:
		m.mag = m.mag.add(x)
	case !m.mag.less(x):
		m.mag = m.mag.sub(x)
	default:
		m.mag, m.neg = x.sub(m.mag), neg
	}
	if m.mag.isZero() {
		m.neg = false
	}
	if !m.neg && m.capacity.less(m.mag) {
		m.mag = m.capacity
	}
}

func (m *bigModel) advance(now int64) {
	if !m.started {
		m.t, m.started = now, true
	}
	m.addSigned(false, mul(uint64(now-m.t), uint64(m.p.Limit)))
	m.t = now
}

func (m *bigModel) settle(now, delta int64) {
	m.advance(now)
	if delta >= 0 {
		m.addSigned(true, mul(uint64(delta), uint64(m.p.Window)))
	} else {
		m.addSigned(false, mul(uint64(-delta), uint64(m.p.Window)))
	}
}

func (m *bigModel) retry(now, cost int64) time.Duration {
	m.advance(now)
	need := mul(uint64(cost), uint64(m.p.Window))
	if m.neg {
		need = need.add(m.mag)
	} else if !m.mag.less(need) {
		return 0
	} else {
		need = need.sub(m.mag)
	}
	w, _ := need.divCeil(uint64(m.p.Limit))
	return time.Duration(w)
}

// Corrupt states are caught by Settle as by Decide, whatever the delta;
// the window algorithms and a bucket faster than a unit per nanosecond
// do not settle, with a reason.
func TestSettleCorruptAndRefused(t *testing.T) {
	u := func(k Kind, words ...uint64) []byte {
		b := appendHeader(nil, k)
		for _, w := range words {
			b = appendU64(b, w)
		}
		return b
	}
	T, sec := uint64(t0), uint64(time.Second)
	for _, k := range bucketKinds {
		s := mustSettler(t, k, p5)
		good, _ := decide(t, s, nil, t0, 2)
		other := TokenBucket
		if k == TokenBucket {
			other = LeakyBucket
		}
		bad := [][]byte{
			{stateVersion},
			append([]byte{0}, good[1:]...),
			append([]byte{good[0] + 1}, good[1:]...),
			append([]byte{stateVersion, byte(other)}, good[2:]...),
			good[:len(good)-1],
			append(append([]byte{}, good...), 1),
			append([]byte{stateVersion, byte(k)}, bytes.Repeat([]byte{0xff}, len(good)-2)...),
		}
		if k == TokenBucket {
			bad = append(bad, u(k, T, 6, 0), u(k, T, 5, 1), u(k, T, 1, sec), u(k, 1<<63, 1, 0))
		} else {
			bad = append(bad, u(k, T, 5, T), u(k, T+sec+1, 0, T), u(k, 1<<63, 0, T))
		}
		for _, st := range bad {
			for _, delta := range []int64{-3, 0, 4} {
				if out, err := s.Settle(nil, st, t0, delta); !isCorrupt(err) || out != nil {
					t.Errorf("%v Settle(%x, %d): %x, %v", k, st, delta, out, err)
				}
			}
		}
	}
	for _, k := range Kinds {
		ok, why := Settles(k)
		_, is := AsSettler(mustNew(t, k, p5))
		if ok != is || ok == (why != "") {
			t.Errorf("%v: Settles = %v %q, AsSettler %v", k, ok, why, is)
		}
	}
	if ok, why := Settles(Kind(0)); ok || why == "" {
		t.Error("Settles(0)")
	}
	// Faster than one unit per nanosecond: refused, and Settle says so.
	fast := Params{Limit: MaxLimit, Window: time.Second - 1, Burst: MaxLimit}
	for _, k := range bucketKinds {
		l := mustNew(t, k, fast)
		if _, ok := AsSettler(l); ok {
			t.Errorf("%v %+v settles", k, fast)
		}
		if ok, why := SettlesWith(k, fast); ok || why == "" {
			t.Errorf("%v SettlesWith %+v = %v %q", k, fast, ok, why)
		}
		if _, err := l.(Settler).Settle(nil, nil, t0, 1); !errors.Is(err, ErrSettleRate) {
			t.Errorf("%v %+v: Settle: %v", k, fast, err)
		}
		if ok, _ := SettlesWith(k, Params{Limit: MaxLimit, Window: time.Second}); !ok {
			t.Errorf("%v: one unit per nanosecond does not settle", k)
		}
	}
	if ok, why := SettlesWith(FixedWindow, p5); ok || why == "" {
		t.Error("SettlesWith(fixed_window)")
	}
}

// Settle rewrites a state in place (dst = state[:0]) exactly as into a
// fresh buffer, and does not allocate.
func TestSettleInPlaceNoAlloc(t *testing.T) {
	for _, k := range bucketKinds {
		s := mustSettler(t, k, p5)
		st, _ := decide(t, s, nil, t0, 4)
		for _, delta := range []int64{-2, 0, 3, 40} {
			want := settle(t, s, st, t0+int64(ms), delta)
			buf := append(make([]byte, 0, s.MaxStateSize()), st...)
			got, err := s.Settle(buf[:0], buf, t0+int64(ms), delta)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%v delta %d in place: %x %v, want %x", k, delta, got, err, want)
			}
		}
		buf := make([]byte, 0, s.MaxStateSize())
		if n := testing.AllocsPerRun(100, func() { _, _ = s.Settle(buf, st, t0, 7) }); n != 0 {
			t.Fatalf("%v: Settle allocates %v times", k, n)
		}
	}
}

// fuzzSettle feeds arbitrary bytes, instants and deltas to Settle: it
// never panics, fails only with a corrupt state or out of range, and what
// it writes decodes; a charge leaves the key at most as open as before.
func fuzzSettle(f *testing.F, k Kind) {
	s := mustSettler(f, k, fuzzParams)
	var state []byte
	for i := range 10 {
		f.Add(append([]byte(nil), state...), t0+int64(i)*int64(90*ms), int64(i%7)-2)
		if i%2 == 0 {
			state, _ = decide(f, s, state, t0+int64(i)*int64(90*ms), int64(1+i%3))
		} else {
			state = settle(f, s, state, t0+int64(i)*int64(90*ms), int64(i))
		}
	}
	f.Add([]byte{}, int64(0), int64(MaxSettle))
	f.Add(append([]byte{stateVersion, byte(k)}, bytes.Repeat([]byte{0xff}, 24)...), t0, int64(1))
	f.Fuzz(func(t *testing.T, state []byte, now, delta int64) {
		out, err := s.Settle(nil, state, now, delta)
		if err != nil {
			if !isCorrupt(err) && !errors.Is(err, ErrSettleRange) {
				t.Fatalf("Settle: %v", err)
			}
			return
		}
		if _, _, err := s.Decide(nil, out, now, 1); err != nil {
			t.Fatalf("Settle wrote %x, Decide: %v", out, err)
		}
		if delta > 0 && s.Used(out, now) < s.Used(state, now) {
			t.Fatalf("a charge of %d lowered Used: %x -> %x", delta, state, out)
		}
	})
}

func FuzzSettleTokenBucket(f *testing.F) { fuzzSettle(f, TokenBucket) }
func FuzzSettleLeakyBucket(f *testing.F) { fuzzSettle(f, LeakyBucket) }

// SettleCapped charges the deepest debt a state can hold when a charge goes beyond it,
// exactly as Settle of that largest charge; within the bounds it is Settle.
func TestSettleCapped(t *testing.T) {
	for _, k := range bucketKinds {
		slow := mustSettler(t, k, Params{Limit: 1, Window: MaxWindow, Burst: 100})
		want := settle(t, slow, nil, t0, 200) // the deepest debt: 100 windows
		for _, delta := range []int64{201, 5000, MaxSettle} {
			got, charged, err := SettleCapped(slow, nil, nil, t0, delta)
			if err != nil || charged != 200 || string(got) != string(want) {
				t.Fatalf("%v: SettleCapped(%d) = %x, %d, %v; want %x, 200", k, delta, got, charged, err, want)
			}
		}
		for _, delta := range []int64{-3, 0, 7, 200} {
			got, charged, err := SettleCapped(slow, nil, want, t0+1, delta)
			ref, rerr := slow.Settle(nil, want, t0+1, delta)
			if delta > 0 { // beyond the depth from the deepest debt: capped, nothing dropped silently
				if err != nil || charged >= delta || charged < 0 || rerr == nil {
					t.Fatalf("%v: from the deepest debt, SettleCapped(%d) charged %d, %v (Settle: %v)", k, delta, charged, err, rerr)
				}
				continue
			}
			if err != rerr || charged != delta || string(got) != string(ref) {
				t.Fatalf("%v: SettleCapped(%d) = %x %d %v, Settle %x %v", k, delta, got, charged, err, ref, rerr)
			}
		}
		if _, _, err := SettleCapped(slow, nil, nil, t0, MaxSettle+1); !errors.Is(err, ErrSettleRange) {
			t.Fatalf("%v: beyond MaxSettle: %v", k, err)
		}
	}
}
