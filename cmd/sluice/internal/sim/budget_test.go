package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// budgetCSV is a token budget of 10 per 10 s (burst 10: a unit a second):
// a request reserves 10 and uses 2, refunded a second later; one that does
// not fit then; one that reserves 5 and uses 20, the excess charged at
// once (a debt of 11); one refused while the key is in debt; one after the
// debt is paid back, whose response gives no cost.
const budgetCSV = `timestamp,key,cost,actual,duration
0,a,10,2,1s
0.5,a,5,5
1,a,5,20
2,a,1,1
13,a,1
`

func runBudget(t *testing.T, in string, opt Options) *Result {
	t.Helper()
	tr, err := ReadCSV(strings.NewReader(in), "budget.csv")
	if err != nil {
		t.Fatal(err)
	}
	opt.Settle = true
	res, err := Run(tr, "budget", mustBucket(t, algorithms.TokenBucket, 10, 10*time.Second, 10), opt)
	if err != nil {
		t.Fatal(err)
	}
	if res.Budget == nil || res.Budget.Unsettled == nil || res.Budget.Unsettled.Budget == nil {
		t.Fatalf("no budget: %+v", res)
	}
	return res
}

func TestBudgetSettles(t *testing.T) {
	res := runBudget(t, budgetCSV, Options{Buckets: 14})
	b := res.Budget
	got := fmt.Sprintf("admitted %d denied %d reserved %d actual %d settled %d no_usage %d refunded %d excess %d debt %d (%s, wait %s) failed %d",
		res.Admitted, res.Denied, b.Reserved, b.Actual, b.Settled, b.NoUsage, b.Refunded, b.Excess, b.MaxDebt, b.MaxDebtKey, b.MaxDebtWait, b.Failed)
	want := "admitted 3 denied 2 reserved 16 actual 23 settled 3 no_usage 1 refunded 8 excess 15 debt 11 (a, wait 12s) failed 0"
	if got != want {
		t.Errorf("settled:\n got %s\nwant %s", got, want)
	}
	e := Epoch.UnixNano()
	if b.MaxActualInWindow != 22 || b.MaxActualAt != e+1e9 || b.Bound != 20 || b.Windows != 3 || b.Beyond != 1 || b.Violations != 0 {
		t.Errorf("windows: max actual %d at +%d bound %d; %d windows, %d beyond the bound, %d violations",
			b.MaxActualInWindow, b.MaxActualAt-e, b.Bound, b.Windows, b.Beyond, b.Violations)
	}
	// The reservations are what Decide saw: MaxInWindow counts them.
	if res.AdmittedCost != 16 || res.MaxInWindow != 15 {
		t.Errorf("admitted cost %d, max in window %d", res.AdmittedCost, res.MaxInWindow)
	}
	if got, want := fmt.Sprint(b.Charged), "[10 22 22 22 22 22 22 22 22 22 12 0 0 1]"; got != want {
		t.Errorf("charged per window %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(b.ActualIn), "[2 22 22 22 22 22 22 22 22 22 20 0 0 1]"; got != want {
		t.Errorf("actual per window %s, want %s", got, want)
	}

	// Never settled: the key is not refunded at 1 s (5 refused) nor in
	// debt at 2 s (1 admitted).
	u := res.Budget.Unsettled
	ub := u.Budget
	if u.Admitted != 3 || u.Denied != 2 || ub.Reserved != 12 || ub.Actual != 4 || ub.Settles || ub.Refunded != 0 || ub.Excess != 0 ||
		ub.Settled != 0 || ub.MaxDebt != 0 || ub.Windows != 0 || ub.Unsettled != nil {
		t.Errorf("unsettled: admitted %d denied %d %+v", u.Admitted, u.Denied, *ub)
	}
	if got, want := fmt.Sprint(ub.Charged), "[10 10 11 11 11 11 11 11 11 11 1 1 0 1]"; got != want {
		t.Errorf("unsettled charged %s, want %s", got, want)
	}

	// no_usage "refund": the last request costs nothing.
	res = runBudget(t, budgetCSV, Options{Buckets: 14, NoUsageRefund: true})
	if b := res.Budget; b.Refunded != 9 || b.Actual != 22 || b.NoUsage != 1 || res.Budget.Unsettled.Budget.Actual != 3 {
		t.Errorf("no_usage refund: refunded %d actual %d no_usage %d; unsettled actual %d", b.Refunded, b.Actual, b.NoUsage, res.Budget.Unsettled.Budget.Actual)
	}
}

// A response that ends later keeps its excess in flight: the key is not in
// debt until then, and the window's actual cost is over limit + burst by
// that excess (X), within the guarantee.
func TestBudgetInFlightExcess(t *testing.T) {
	in := "0,a,10,30,5s\n1,a,1,1\n6,a,1,1\n"
	res := runBudget(t, in, Options{})
	b := res.Budget
	// At 1 s the key holds 1 (nothing charged yet); at 5 s the excess of
	// 20 is charged: 0 + 5 − 1 − 20 = −16, so the request at 6 s (−15) is
	// refused. The windows ending at 0 s and 1 s hold 30 and 31 actual
	// units, over limit + burst (20) by less than the excess in flight.
	if res.Admitted != 2 || res.Denied != 1 || b.Excess != 20 || b.MaxDebt != 16 || b.MaxActualInWindow != 31 || b.Beyond != 2 || b.Violations != 0 {
		t.Errorf("admitted %d denied %d excess %d debt %d max actual %d beyond %d violations %d",
			res.Admitted, res.Denied, b.Excess, b.MaxDebt, b.MaxActualInWindow, b.Beyond, b.Violations)
	}
	if u := b.Unsettled; u.Admitted != 3 || u.Budget.Actual != 32 || u.Budget.MaxActualInWindow != 32 {
		t.Errorf("unsettled admitted %d actual %d max %d", u.Admitted, u.Budget.Actual, u.Budget.MaxActualInWindow)
	}
}

func TestBudgetRefused(t *testing.T) {
	tr, err := ReadCSV(strings.NewReader(budgetCSV), "b.csv")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		lim  algorithms.Limiter
		opt  Options
		want string
	}{
		{mustLimiter(t, algorithms.FixedWindow, 10, time.Minute), Options{Settle: true}, "fixed_window cannot settle"},
		{mustLimiter(t, algorithms.SlidingLog, 10, time.Minute), Options{Settle: true}, "sliding_log cannot settle"},
		{mustBucket(t, algorithms.TokenBucket, 10, time.Minute, 5), Options{Settle: true, MaxKeys: 10}, "key table"},
		{mustBucket(t, algorithms.TokenBucket, 10, time.Minute, 5), Options{Settle: true, Delay: time.Second}, "does not hold requests"},
		{mustBucket(t, algorithms.LeakyBucket, 100, 10, 5), Options{Settle: true}, "at most one cost unit per nanosecond"},
	} {
		if _, err := Run(tr, "x", c.lim, c.opt); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+v: %v, want %q", c.lim.Kind(), c.opt, err, c.want)
		}
	}
}

// budgetEvent is an admission or a settlement of the brute-force model.
type budgetEvent struct {
	at     int64
	admit  bool
	req    int   // the request
	amount int64 // reserved, or delta
}

// bruteBudget replays tr through s the plain way — every event in a sorted
// list, each key's state in a map — and checks the guarantee on every
// window ending with an admission by summing over the whole history. It
// returns what the run must report.
func bruteBudget(t *testing.T, tr *Traffic, s algorithms.Settler) (admitted, reserved, actual, refunded, excess, maxActual, beyond int64) {
	t.Helper()
	p := s.Params()
	W := int64(p.Window)
	bound := p.Limit + p.Burst
	states := map[int32][]byte{}
	type pend struct {
		end int64
		seq int
	}
	var pending []pend
	var events []budgetEvent
	settledAt := map[int]int{} // request -> its settlement's event index
	actualOf := func(i int) int64 {
		if a := tr.Usage[i].Actual; a != NoUsage {
			return a
		}
		return tr.Requests[i].Cost
	}
	settleUpTo := func(now int64, all bool) {
		for len(pending) > 0 && (all || pending[0].end <= now) {
			f := pending[0]
			pending = pending[1:]
			rq := tr.Requests[f.seq]
			delta := actualOf(f.seq) - rq.Cost
			if delta != 0 {
				ns, err := s.Settle(nil, states[rq.Key], f.end, delta)
				if err != nil {
					t.Fatal(err)
				}
				states[rq.Key] = ns
			}
			settledAt[f.seq] = len(events)
			events = append(events, budgetEvent{f.end, false, f.seq, delta})
			if delta < 0 {
				refunded -= delta
			} else {
				excess += delta
			}
		}
	}
	for i, rq := range tr.Requests {
		settleUpTo(rq.At, false)
		ns, d, err := s.Decide(nil, states[rq.Key], rq.At, rq.Cost)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			continue
		}
		states[rq.Key] = ns
		admitted++
		reserved += rq.Cost
		actual += actualOf(i)
		j := len(events)
		events = append(events, budgetEvent{rq.At, true, i, rq.Cost})
		pending = append(pending, pend{rq.At + tr.Usage[i].In, i})
		slices.SortStableFunc(pending, func(a, b pend) int { return int(min(max(a.end-b.end, -1), 1)) })
		// The window (rq.At − W, rq.At] of this key, in events up to j.
		var used, x, r int64
		for k := 0; k <= j; k++ {
			e := events[k]
			q := tr.Requests[e.req]
			if q.Key != rq.Key || e.at <= rq.At-W {
				continue
			}
			u := actualOf(e.req)
			if e.admit {
				used += u
				if si, ok := settledAt[e.req]; !ok || si > j {
					x += max(u-q.Cost, 0)
				}
			} else if q.At <= rq.At-W {
				r += max(-e.amount, 0)
			}
		}
		maxActual = max(maxActual, used)
		if used > bound {
			beyond++
		}
		if used > bound+x+r {
			t.Fatalf("%s %+v: request %d at +%v: actual %d in a window, over %d + X %d + R %d", s.Kind(), p, i, time.Duration(rq.At-tr.Start), used, bound, x, r)
		}
	}
	settleUpTo(0, true)
	return
}

// Random budgets through both buckets: the run reports what the plain
// model computes, and the guarantee holds in every window — with windows
// beyond limit + burst, so the check is not vacuous.
func TestPropertyBudget(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	var beyond int64
	for round := range 40 {
		p := algorithms.Params{Limit: 1 + rng.Int64N(30), Window: time.Duration(1+rng.Int64N(20)) * time.Second, Burst: 1 + rng.Int64N(20)}
		start := Epoch.UnixNano()
		tr := &Traffic{Start: start, Keys: []string{"a", "b"}}
		at := start
		for range 300 {
			at += rng.Int64N(int64(p.Window) / 3)
			cost := 1 + rng.Int64N(p.Burst)
			u := Usage{Actual: rng.Int64N(3*p.Burst + 1)}
			switch rng.IntN(6) {
			case 0:
				u.Actual = NoUsage
			case 1:
				u.Actual = cost
			}
			if rng.IntN(3) != 0 {
				u.In = rng.Int64N(2 * int64(p.Window))
			}
			tr.Requests = append(tr.Requests, Request{At: at, Key: int32(rng.IntN(2)), Cost: cost})
			tr.Usage = append(tr.Usage, u)
		}
		tr.End = at + 1
		for _, k := range []algorithms.Kind{algorithms.TokenBucket, algorithms.LeakyBucket} {
			lim, err := algorithms.New(k, p)
			if err != nil {
				t.Fatal(err)
			}
			s, _ := algorithms.AsSettler(lim)
			adm, res, act, ref, exc, maxA, bey := bruteBudget(t, tr, s)
			got, err := Run(tr, "p", lim, Options{Settle: true})
			if err != nil {
				t.Fatal(err)
			}
			b := got.Budget
			want := fmt.Sprint(adm, res, act, ref, exc, maxA, bey, 0, adm)
			if g := fmt.Sprint(got.Admitted, b.Reserved, b.Actual, b.Refunded, b.Excess, b.MaxActualInWindow, b.Beyond, b.Violations, b.Windows); g != want {
				t.Fatalf("round %d %s %+v: admitted reserved actual refunded excess max-actual beyond violations windows = %s, model %s", round, k, p, g, want)
			}
			beyond += bey
		}
	}
	if beyond == 0 {
		t.Fatal("no window went beyond limit + burst: the traffic never exercised the guarantee")
	}
}
