package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// Token budgets (rules[].cost with a response, filter/cost.go) in virtual
// time: a request reserves its cost — the traffic's cost column, its
// estimate — and is admitted only if that fits (Decide with cost =
// reserved); when its response ends, Usage.In later, the rule settles
// (algorithms.Settler.Settle with delta = actual − reserved): the unused
// part is refunded, an excess is charged even where it does not fit, and
// the key goes into debt. A response without a cost (Usage.Actual NoUsage)
// settles by no_usage: the reservation stands, or is refunded. The same
// traffic then runs a second time through the same rule with the same
// reservations never settled (Budget.Unsettled): what a budget charged on
// estimates alone admits, and what that actually cost.
//
// What is modelled: every key's state as the filter keeps it, settled on
// that state. Through the key table (Options.MaxKeys) it is not:
// filter.KeyTable decides but has no settlement path, so a run that
// settles keeps every key's state on its own.
//
// The guarantee (algorithms/settle.go) is checked on every window of
// length Window that ends with an admission, for each key: the actual cost
// of the requests admitted in (b−Window, b] is at most Limit + Burst + X +
// R, where X is the excess of those requests still in flight at b and R
// the refunds made in the window of requests admitted before it.

// Budget is what a run of a token budget admitted and charged.
type Budget struct {
	// Settles is true for the run that settles; false for its Unsettled
	// twin, whose refunds, excess, debt and guarantee stay zero.
	Settles bool
	// NoUsageRefund: a response without a cost is refunded (no_usage
	// "refund"), else its reservation stands.
	NoUsageRefund bool

	// Reserved is the cost units reserved by the admitted requests (the
	// filter's reserved); Actual what the admitted requests cost.
	Reserved, Actual int64
	// Settled counts settlements (the filter's settled); NoUsage those of
	// responses without a cost; Failed those refused because the debt
	// would exceed algorithms.MaxDebtWait (the filter counts them as
	// store errors; nothing is charged).
	Settled, NoUsage, Failed int64
	// Refunded and Excess are cost units given back and charged beyond
	// the reservations by settlements (the filter's refunded and excess).
	Refunded, Excess int64

	// MaxDebt is the most cost units one key owed right after a
	// settlement (0: never in debt), MaxDebtKey that key and MaxDebtWait
	// how long it then had to wait before a request of cost 1 fits.
	MaxDebt     int64
	MaxDebtKey  string
	MaxDebtWait time.Duration

	// MaxActualInWindow is the most actual cost admitted for one key in
	// any interval (b−Window, b] ending with an admission, with its key
	// and that admission's time (Unix ns).
	MaxActualInWindow int64
	MaxActualKey      string
	MaxActualAt       int64
	// Bound is Limit + Burst: what the actual cost in a window may reach
	// before in-flight excess and late refunds count.
	Bound int64

	// Windows counts the windows the guarantee was checked on (one per
	// admission); Beyond those whose actual cost exceeded Bound, within
	// it by X + R; Violations those over Bound + X + R (none, if the
	// algorithms keep their guarantee), the first at ViolationAt on
	// ViolationKey.
	Windows, Beyond, Violations int64
	ViolationKey                string
	ViolationAt                 int64

	// Charged[i] and ActualIn[i] are, for the probe key (Result.ProbeKey),
	// the units charged (reservations and settlements' deltas) and the
	// actual cost admitted in the window ending at the end of bucket i
	// (Result.Start, Result.BucketWidth). They may extend past the
	// traffic's span, to the last settlement.
	Charged, ActualIn []int64
	// LastSettle is when the last settlement was made (Unix ns).
	LastSettle int64

	// Unsettled is the same traffic through the same rule, the same
	// reservations never settled (nil on the Unsettled run itself).
	Unsettled *Result
}

// flight is an admitted request of a budget run until it settles.
type flight struct {
	end, seq         int64 // settles at end; seq orders those at one instant
	key              int32
	reserved, actual int64 // actual: the cost settled to (no_usage applied)
	noUsage          bool
	rec              int // its record in its key's tracker (absolute index)
}

type flights []flight

func (h flights) Len() int { return len(h) }
func (h flights) Less(i, j int) bool {
	return h[i].end < h[j].end || h[i].end == h[j].end && h[i].seq < h[j].seq
}
func (h flights) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *flights) Push(x any)   { *h = append(*h, x.(flight)) }
func (h *flights) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// admRec is an admission within its key's window.
type admRec struct {
	at, actual     int64
	excess, refund int64 // max(actual − reserved, 0), max(reserved − actual, 0)
	settled        bool
}

// amount is a dated number of units.
type amount struct{ at, n int64 }

// keyWindow follows one key's admissions and settlements within the last
// Window: the actual cost admitted (used), the excess of those still in
// flight (x), and the refunds R made in the window of requests admitted
// before it (s1 − s2).
type keyWindow struct {
	adm        []admRec
	base, head int // adm[i] is record base+i; those before head have left
	used, x    int64
	s1, s2     int64    // refunds settled in the window; of those, the window's own admissions'
	refunds    []amount // refunds by settlement time, from rhead
	rhead      int
	charged    []amount // the probe key's charges, from chead
	chead      int
	csum       int64
}

// advance drops what is at or before a (a never decreases).
func (w *keyWindow) advance(a int64) {
	for w.head < len(w.adm) && w.adm[w.head].at <= a {
		r := &w.adm[w.head]
		w.used -= r.actual
		if !r.settled {
			w.x -= r.excess
		} else {
			w.s2 -= r.refund // now a refund of a request admitted before the window
		}
		w.head++
	}
	for w.rhead < len(w.refunds) && w.refunds[w.rhead].at <= a {
		w.s1 -= w.refunds[w.rhead].n
		w.rhead++
	}
	for w.chead < len(w.charged) && w.charged[w.chead].at <= a {
		w.csum -= w.charged[w.chead].n
		w.chead++
	}
	if w.head > 64 && w.head > len(w.adm)/2 {
		n := copy(w.adm, w.adm[w.head:])
		w.adm, w.base, w.head = w.adm[:n], w.base+w.head, 0
	}
	if w.rhead > 64 && w.rhead > len(w.refunds)/2 {
		n := copy(w.refunds, w.refunds[w.rhead:])
		w.refunds, w.rhead = w.refunds[:n], 0
	}
	if w.chead > 64 && w.chead > len(w.charged)/2 {
		n := copy(w.charged, w.charged[w.chead:])
		w.charged, w.chead = w.charged[:n], 0
	}
}

// budgetRun is a Run with a token budget in progress.
type budgetRun struct {
	r       *replay
	settler algorithms.Settler // nil: the Unsettled run
	res     *Budget
	pending flights
	seq     int64
	keys    []keyWindow
	limit   int64 // the bucket's burst, for the debt
	next    int   // the first bucket whose Charged is not filled yet
	out     []byte
}

// startBudget makes r a token budget's run: settling (opt.Settle), or its
// Unsettled twin.
func (r *replay) startBudget(opt Options) error {
	b := &budgetRun{r: r, keys: make([]keyWindow, len(r.tr.Keys)),
		res: &Budget{Settles: opt.Settle, NoUsageRefund: opt.NoUsageRefund}}
	p := r.lim.Params()
	burst := p.Burst
	if burst == 0 {
		burst = p.Limit
	}
	b.limit = burst
	b.res.Bound = satAdd(p.Limit, burst)
	if opt.Settle {
		s, ok := algorithms.AsSettler(r.lim)
		if !ok {
			_, why := algorithms.SettlesWith(r.lim.Kind(), p)
			return fmt.Errorf("sim: %s cannot settle a cost: %s", r.lim.Kind(), why)
		}
		if ok, why := algorithms.SettlesWith(r.lim.Kind(), p); !ok {
			return fmt.Errorf("sim: %s", why)
		}
		b.settler = s
		b.out = make([]byte, 0, r.lim.MaxStateSize())
	}
	r.budget = b
	r.res.Budget = b.res
	return nil
}

// errBudgetTable: filter.KeyTable has no settlement path.
var errBudgetTable = errors.New("sim: a token budget is simulated on each key's own state: the filter's key table (max_keys) has no settlement path here; drop --max-keys")

// bucketEnd is the last instant of bucket i.
func (b *budgetRun) bucketEnd(i int) int64 {
	return b.r.res.Start + int64(i+1)*b.r.res.BucketWidth - 1
}

// fill records the probe key's window at the end of every bucket that
// ends before t.
func (b *budgetRun) fill(t int64) {
	w := &b.keys[b.r.probeKey]
	for ; b.bucketEnd(b.next) < t; b.next++ {
		end := b.bucketEnd(b.next)
		w.advance(end - b.r.width)
		b.res.Charged = append(b.res.Charged, w.csum)
		b.res.ActualIn = append(b.res.ActualIn, w.used)
	}
}

// charge adds n units charged to key at t (the probe key's chart).
func (b *budgetRun) charge(key int32, t, n int64) {
	if int(key) != b.r.probeKey || n == 0 {
		return
	}
	w := &b.keys[key]
	w.charged = append(w.charged, amount{t, n})
	w.csum += n
}

// before settles the requests whose response ended at or before now, in
// time order, each after the probes and chart points of the buckets that
// ended before it.
func (b *budgetRun) before(now int64) error {
	for len(b.pending) > 0 && b.pending[0].end <= now {
		f := heap.Pop(&b.pending).(flight)
		if err := b.settle(f); err != nil {
			return err
		}
	}
	b.fill(now)
	return nil
}

// settle ends flight f: the settling run applies delta = actual − reserved
// to its key's state; both runs follow its key's window.
func (b *budgetRun) settle(f flight) error {
	r := b.r
	if err := r.probe(min(b.bucketOf(f.end), len(r.res.Buckets))); err != nil {
		return err
	}
	b.fill(f.end)
	res := b.res
	w := &b.keys[f.key]
	if i := f.rec - w.base; i >= w.head && i < len(w.adm) {
		rec := &w.adm[i]
		rec.settled = true
		w.x -= rec.excess
		w.s2 += rec.refund
	}
	if b.settler == nil {
		return nil
	}
	delta := f.actual - f.reserved
	delta = max(min(delta, algorithms.MaxSettle), -algorithms.MaxSettle)
	res.LastSettle = f.end
	if f.noUsage {
		res.NoUsage++
	}
	if delta != 0 {
		ns, err := b.settler.Settle(b.out[:0], r.states[f.key], f.end, delta)
		if errors.Is(err, algorithms.ErrSettleRange) {
			res.Failed++
			return nil
		}
		if err != nil {
			return fmt.Errorf("sim: settling a request of key %q: %w", r.tr.Keys[f.key], err)
		}
		if len(ns) > 0 {
			r.states[f.key] = append(r.states[f.key][:0], ns...)
		}
		b.out = ns
	}
	res.Settled++
	b.charge(f.key, f.end, delta)
	if delta < 0 {
		res.Refunded -= delta
		w.refunds = append(w.refunds, amount{f.end, -delta})
		w.s1 -= delta
	} else if delta > 0 {
		res.Excess += delta
		b.debt(f.key, f.end)
	}
	return nil
}

// debt notes key's debt right after a charge at now: from a probe of cost
// 1 (thrown away), whose ResetAfter is the time to refill the debt and the
// whole bucket, D = ⌊ResetAfter × Limit / Window⌋ − Burst (exact for a
// whole debt: the bucket refills at most a unit per nanosecond).
func (b *budgetRun) debt(key int32, now int64) {
	r := b.r
	_, d, err := r.lim.Decide(r.scratch[:0], r.states[key], now, 1)
	if err != nil || d.Allowed {
		return
	}
	p := r.lim.Params()
	hi, lo := bits.Mul64(uint64(d.ResetAfter), uint64(p.Limit))
	if hi >= uint64(p.Window) {
		return
	}
	q, _ := bits.Div64(hi, lo, uint64(p.Window))
	if debt := int64(q) - b.limit; debt > b.res.MaxDebt {
		b.res.MaxDebt, b.res.MaxDebtKey, b.res.MaxDebtWait = debt, r.tr.Keys[key], d.RetryAfter
	}
}

func (b *budgetRun) bucketOf(t int64) int {
	return int((t - b.r.res.Start) / b.r.res.BucketWidth)
}

// admitted records request i (rq, admitted at rq.At): it is in flight
// until rq.At + its Usage.In, and its window is checked.
func (b *budgetRun) admitted(i int, rq Request) {
	res := b.res
	u := b.r.tr.usage(i)
	f := flight{end: rq.At + u.In, seq: b.seq, key: rq.Key, reserved: rq.Cost, actual: u.Actual}
	b.seq++
	if u.Actual == NoUsage {
		f.noUsage, f.actual = true, rq.Cost
		if res.NoUsageRefund {
			f.actual = 0
		}
	}
	res.Reserved += rq.Cost
	res.Actual += f.actual
	w := &b.keys[rq.Key]
	f.rec = w.base + len(w.adm)
	w.adm = append(w.adm, admRec{at: rq.At, actual: f.actual,
		excess: max(f.actual-f.reserved, 0), refund: max(f.reserved-f.actual, 0)})
	w.used += f.actual
	w.x += w.adm[len(w.adm)-1].excess
	b.charge(rq.Key, rq.At, rq.Cost)
	heap.Push(&b.pending, f)

	w.advance(rq.At - b.r.width)
	if w.used > res.MaxActualInWindow {
		res.MaxActualInWindow, res.MaxActualKey, res.MaxActualAt = w.used, b.r.tr.Keys[rq.Key], rq.At
	}
	if b.settler == nil {
		return
	}
	res.Windows++
	if w.used > res.Bound {
		res.Beyond++
	}
	if w.used > satAdd(res.Bound, w.x+w.s1-w.s2) {
		if res.Violations == 0 {
			res.ViolationKey, res.ViolationAt = b.r.tr.Keys[rq.Key], rq.At
		}
		res.Violations++
	}
}

// finish settles the requests still in flight after the last one, and
// fills the chart up to the last settlement.
func (b *budgetRun) finish() error {
	for len(b.pending) > 0 {
		f := heap.Pop(&b.pending).(flight)
		if err := b.settle(f); err != nil {
			return err
		}
	}
	end := max(b.r.tr.End, b.res.LastSettle+1)
	n := max(len(b.r.res.Buckets), b.bucketOf(end-1)+1)
	b.fill(b.bucketEnd(n-1) + 1)
	return nil
}
