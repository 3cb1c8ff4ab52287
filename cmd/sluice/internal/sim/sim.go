package sim

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/internal/shareddata"
)

// DefaultBuckets is the number of chart buckets when Options.Buckets is 0.
const DefaultBuckets = 120

// Options tune a run.
type Options struct {
	// Buckets is the most time buckets the span is divided into for the
	// charts; 0 means DefaultBuckets. The bucket width is the shortest
	// round duration (see BucketWidth) that covers the span in that many
	// buckets, so a chart's "requests per 5s" is exact; the run may use
	// fewer buckets.
	Buckets int
	// MaxKeys, when > 0, keeps the keys' states where the filter keeps
	// them: in its own key table (filter.KeyTable) of MaxKeys shared-data
	// entries, which evicts the least-used key when full. 0 keeps every
	// key's state, as a table that never fills would.
	MaxKeys int
	// Delay, when > 0, shapes: the rule decides with
	// algorithms.Shaper.DecideDelay (token_bucket and leaky_bucket only),
	// holding a request that would fit within Delay until its slot, as a
	// rule with "delay" does (see shape.go). The Result's Shaping then
	// says what went upstream when, next to a second run of the same
	// traffic through the same rule as a meter (Shaping.Meter).
	Delay time.Duration
	// MaxHeld bounds the requests held at once (delay.max_held, all
	// traffic on one worker): a request that would be held while MaxHeld
	// are is decided as by a meter. 0: no bound.
	MaxHeld int
	// Settle runs a token budget (see budget.go): each request reserves
	// its cost and, when its response ends (Traffic.Usage), the rule
	// settles with its actual cost (token_bucket and leaky_bucket only).
	// The Result's Budget says what was admitted and charged, next to a
	// second run of the same traffic whose reservations are never settled
	// (Budget.Unsettled). Not with MaxKeys or Delay.
	Settle bool
	// NoUsageRefund settles a response without a cost (Usage.Actual
	// NoUsage) by refunding its reservation (no_usage "refund"); else the
	// reservation stands.
	NoUsageRefund bool
	// Reserve, when > 0, is what every request reserves instead of its
	// Cost (a rule whose cost.request is a number).
	Reserve int64

	// meter: this run is a shaped run's meter; count MaxArrivals.
	meter bool
	// unsettled: this run is a settled run's twin; follow its budget.
	unsettled bool
}

// Class is what one class of keys of a flood (see Pattern) was offered and
// admitted.
type Class struct {
	// Name is the key-name prefix without its dash ("attacker", "innocent",
	// "heavy").
	Name string
	Keys int
	// Offered, Admitted and Denied count requests.
	Offered, Admitted, Denied int64
	// MaxPerKey is the most cost units admitted for one key of the class in
	// any interval (t−Window, t].
	MaxPerKey int64
}

// Bucket aggregates the decisions of one time bucket, over every key.
type Bucket struct {
	// Offered and Admitted count requests (not cost units).
	Offered, Admitted int64
	// RemainingMin is the smallest Decision.Remaining of the bucket; -1
	// when the bucket has no request.
	RemainingMin int64
	// Available is how many requests of cost 1 the probe key (see
	// Result.ProbeKey) could make at the end of the bucket: a decision
	// computed on a copy of its state and thrown away, so it changes
	// nothing. It shows the quota refilling between requests.
	Available int64
}

// Result is what one limiter did with one traffic.
type Result struct {
	// Name is the rule name (or the algorithm name in a comparison).
	Name   string
	Kind   algorithms.Kind
	Params algorithms.Params
	// Limit is Decision.Limit as the limiter reports it (the burst for the
	// token and leaky bucket).
	Limit int64

	// Offered, Admitted and Denied count requests.
	Offered, Admitted, Denied int64
	// OfferedCost and AdmittedCost count cost units.
	OfferedCost, AdmittedCost int64

	// MaxInWindow is the largest number of cost units admitted for one key
	// in any interval (t−Window, t] — computed exactly over the admitted
	// timestamps, so the 2× burst of a fixed window across its boundary
	// shows as a number. It equals a request count when every cost is 1.
	// With shaping (Options.Delay) it is over the times the requests
	// reached the upstream: a held request at its release.
	MaxInWindow int64
	// MaxInWindowKey, MaxInWindowFrom and MaxInWindowTo say where it
	// happened: the key and the first and last admitted request (Unix ns)
	// of that interval.
	MaxInWindowKey                 string
	MaxInWindowFrom, MaxInWindowTo int64

	// Keys is the number of distinct keys seen.
	Keys int
	// StateBytesMax is the largest encoded state any key had; StateBytesEnd
	// is the total size of every key's state after the last request.
	StateBytesMax, StateBytesEnd int
	// MaxStateSize is the limiter's bound on one key's state.
	MaxStateSize int

	// ProbeKey is the key whose quota Bucket.Available follows: the one
	// with the most requests (the first such in Traffic.Keys).
	ProbeKey string

	// Start and BucketWidth place the buckets: bucket i covers
	// [Start+i·BucketWidth, Start+(i+1)·BucketWidth).
	Start, BucketWidth int64
	Buckets            []Bucket

	// The key table (Options.MaxKeys > 0): its size, the live keys it
	// evicted and their Used (the filter's evicted and evicted_used
	// metrics), and its shared-data entries with their key + value bytes
	// at the end (entries are never removed, so that is also the most).
	MaxKeys              int
	Evicted, EvictedUsed int64
	Entries, EntryBytes  int

	// Shaping is what the rule did with a queue (Options.Delay > 0); nil
	// without a delay.
	Shaping *Shaping
	// MaxArrivals is the largest number of cost units that reached the
	// upstream, all keys together, in any interval (t−Window, t]: for a
	// run with shaping at each request's release, for its meter at its
	// decision; 0 for a run without a delay.
	MaxArrivals int64

	// Budget is what a token budget admitted and charged (Options.Settle,
	// and its Unsettled twin); nil otherwise.
	Budget *Budget

	// InFlight is what an in-flight limit did (RunConcurrency); nil for a
	// rate rule.
	InFlight *InFlight

	// Classes are the flood's key classes (keys named "attacker-N",
	// "innocent-N", "heavy-N"), in that order, for those present; nil when
	// no key is so named.
	Classes []Class
}

// window tracks one key's admitted requests inside the last Window, to
// compute MaxInWindow in one pass.
type window struct {
	at, cost []int64
	head     int
	sum      int64
}

func (w *window) push(at, cost, width int64) int64 {
	w.at = append(w.at, at)
	w.cost = append(w.cost, cost)
	w.sum += cost
	for w.at[w.head] <= at-width {
		w.sum -= w.cost[w.head]
		w.head++
	}
	if w.head > 64 && w.head > len(w.at)/2 { // drop the expired prefix
		n := copy(w.at, w.at[w.head:])
		copy(w.cost, w.cost[w.head:])
		w.at, w.cost, w.head = w.at[:n], w.cost[:n], 0
	}
	return w.sum
}

// roundWidths are the bucket widths from one second up to one day, in
// nanoseconds: the steps of a clock (and of svgchart.DurationTicks).
var roundWidths = []int64{
	1e9, 2e9, 5e9, 10e9, 15e9, 30e9,
	60e9, 2 * 60e9, 5 * 60e9, 10 * 60e9, 15 * 60e9, 30 * 60e9,
	3600e9, 2 * 3600e9, 3 * 3600e9, 6 * 3600e9, 12 * 3600e9, 86400e9,
}

// BucketWidth returns the shortest round duration w, in nanoseconds, with
// n·w >= span (span, n >= 1): 1, 2 or 5 times a power of ten below one
// second (1ns … 500ms), 1s 2s 5s 10s 15s 30s, 1m 2m 5m 10m 15m 30m, 1h 2h
// 3h 6h 12h, then 1, 2 or 5 times a power of ten days. Printed with
// svgchart.FormatDuration, it reads as written ("500ms", "5s", "2m"),
// never as a remainder of a division ("500.833ms").
func BucketWidth(span int64, n int) int64 {
	need := span / int64(n) // the exact width, rounded up to 1ns
	if span%int64(n) != 0 || need < 1 {
		need++
	}
	for base := int64(1); base < 1e9; base *= 10 { // below one second
		for _, m := range []int64{1, 2, 5} {
			if w := m * base; w >= need {
				return w
			}
		}
	}
	for _, w := range roundWidths {
		if w >= need {
			return w
		}
	}
	for base := int64(86400e9); base <= (1<<63-1)/5; base *= 10 { // 2d, 5d, 10d, … up to 5·10^4 days
		for _, m := range []int64{1, 2, 5} {
			if w := m * base; w >= need {
				return w
			}
		}
	}
	return need // a span of more than 137 years: the exact width
}

// Run feeds every request of tr, in order, through lim, keeping each key's
// encoded state between requests as the filter does, and returns the
// totals and the bucketed series. name labels the result.
func Run(tr *Traffic, name string, lim algorithms.Limiter, opt Options) (*Result, error) {
	nb, err := checkRun(tr, lim, opt)
	if err != nil {
		return nil, err
	}
	r := newReplay(tr, name, lim, nb)
	if opt.Delay > 0 {
		if err := r.startShaping(opt); err != nil {
			return nil, err
		}
	}
	r.meter = opt.meter
	r.reserve = opt.Reserve
	if opt.Settle || opt.unsettled {
		if err := r.startBudget(opt); err != nil {
			return nil, err
		}
	}
	if opt.MaxKeys > 0 {
		r.shared = newMemShared()
		r.table = filter.NewKeyTable(r.shared, r.dec, "sluice::"+name+":", opt.MaxKeys, 0x5eed)
		r.res.MaxKeys = opt.MaxKeys
	}
	r.classify()
	if err := r.pickProbeKey(); err != nil {
		return nil, err
	}
	for i, rq := range tr.Requests {
		if err := r.decide(i, rq); err != nil {
			return nil, err
		}
	}
	if r.budget != nil {
		if err := r.budget.finish(); err != nil {
			return nil, err
		}
	}
	if err := r.probe(len(r.res.Buckets)); err != nil {
		return nil, err
	}
	if r.table != nil {
		for _, k := range tr.Keys {
			st, err := r.table.State([]byte(k), tr.End)
			if err != nil {
				return nil, err
			}
			r.res.StateBytesEnd += len(st)
		}
		r.res.Evicted, r.res.EvictedUsed = r.table.Evicted, r.table.EvictedUsed
		r.res.Entries, r.res.EntryBytes = r.shared.Len(), r.shared.Bytes()
	}
	for _, s := range r.states {
		r.res.StateBytesEnd += len(s)
	}
	if r.shape != nil {
		r.finishShaping()
		// The same rule as a meter: the same traffic, decided by Decide.
		mopt := opt
		mopt.Delay, mopt.MaxHeld, mopt.meter = 0, 0, true
		m, err := Run(tr, name, lim, mopt)
		if err != nil {
			return nil, err
		}
		r.res.Shaping.Meter = m
	}
	if opt.Settle {
		// The same rule, the same reservations, never settled.
		uopt := opt
		uopt.Settle, uopt.unsettled = false, true
		u, err := Run(tr, name, lim, uopt)
		if err != nil {
			return nil, err
		}
		r.res.Budget.Unsettled = u
	}
	return r.res, nil
}

// checkRun refuses a Run without traffic, limiter or span, or with a bucket
// count out of range; it returns the bucket count asked for, default applied.
func checkRun(tr *Traffic, lim algorithms.Limiter, opt Options) (int, error) {
	if tr == nil || len(tr.Requests) == 0 {
		return 0, errors.New("sim: no traffic")
	}
	if lim == nil {
		return 0, errors.New("sim: no limiter")
	}
	nb := opt.Buckets
	if nb == 0 {
		nb = DefaultBuckets
	}
	if nb < 1 || nb > 100_000 {
		return 0, fmt.Errorf("sim: %d buckets, want 1..100000", nb)
	}
	if opt.MaxKeys < 0 || opt.MaxKeys > 1_000_000 {
		return 0, fmt.Errorf("sim: max_keys %d, want 0..1000000", opt.MaxKeys)
	}
	if tr.End-tr.Start <= 0 {
		return 0, errors.New("sim: traffic span is empty")
	}
	if opt.Delay < 0 || opt.MaxHeld < 0 {
		return 0, fmt.Errorf("sim: delay %s, max_held %d: want >= 0", opt.Delay, opt.MaxHeld)
	}
	if opt.Reserve < 0 {
		return 0, fmt.Errorf("sim: reserve %d: want >= 0", opt.Reserve)
	}
	if opt.Settle && opt.MaxKeys > 0 {
		return 0, errBudgetTable
	}
	if opt.Settle && opt.Delay > 0 {
		return 0, errors.New("sim: a token budget does not hold requests: a settlement would move the slots of the requests held behind it (drop the delay)")
	}
	if tr.Usage != nil && len(tr.Usage) != len(tr.Requests) {
		return 0, fmt.Errorf("sim: %d usages for %d requests", len(tr.Usage), len(tr.Requests))
	}
	return nb, nil
}

// replay is a Run in progress: the result so far and every key's state.
type replay struct {
	tr        *Traffic
	lim       algorithms.Limiter // the rule's limiter: the probe's
	dec       algorithms.Limiter // what decides: lim, or with shaping its queue
	res       *Result
	width     int64    // the limiter's window, for MaxInWindow
	states    [][]byte // each key's encoded state, as the filter would store it
	wins      []window // each key's admitted requests within the last window
	scratch   []byte   // room for one decision's state
	probeKey  int      // index of Result.ProbeKey
	nextProbe int      // the first bucket whose Available is not filled yet

	table  *filter.KeyTable // the filter's key table (Options.MaxKeys > 0), else nil
	shared memShared        // its shared data
	class  []int8           // each key's index in res.Classes, -1: none

	budget  *budgetRun // Options.Settle or its twin, else nil
	reserve int64      // Options.Reserve
	cur     int        // the index of the request being decided

	shape *shapeRun // Options.Delay > 0, else nil
	meter bool      // Options.meter: count every admission into all
	all   window    // admissions of every key within the last window (MaxArrivals)
}

// newReplay sets up a run of tr through lim over at most nb buckets of a
// round width (see BucketWidth), every bucket still without a request.
func newReplay(tr *Traffic, name string, lim algorithms.Limiter, nb int) *replay {
	p := lim.Params()
	span := tr.End - tr.Start
	bw := BucketWidth(span, nb)
	nb = int((span + bw - 1) / bw)
	res := &Result{
		Name: name, Kind: lim.Kind(), Params: p,
		Keys: len(tr.Keys), MaxStateSize: lim.MaxStateSize(),
		Start: tr.Start, BucketWidth: bw,
		Buckets: make([]Bucket, nb),
	}
	for i := range res.Buckets {
		res.Buckets[i].RemainingMin = -1
	}
	return &replay{
		tr: tr, lim: lim, dec: lim, res: res,
		width:   int64(p.Window),
		states:  make([][]byte, len(tr.Keys)),
		wins:    make([]window, len(tr.Keys)),
		scratch: make([]byte, 0, lim.MaxStateSize()),
	}
}

// pickProbeKey checks that every request lies inside the traffic's span and
// keys, and makes the busiest key (the first such) the probe key.
func (r *replay) pickProbeKey() error {
	tr := r.tr
	counts := make([]int, len(tr.Keys))
	probeKey := 0
	for i, rq := range tr.Requests {
		if rq.At < tr.Start || rq.At >= tr.End || int(rq.Key) >= len(tr.Keys) || rq.Key < 0 {
			return fmt.Errorf("sim: request %d lies outside the traffic's span or keys", i)
		}
		counts[rq.Key]++
		if counts[rq.Key] > counts[probeKey] || counts[rq.Key] == counts[probeKey] && int(rq.Key) < probeKey {
			probeKey = int(rq.Key)
		}
	}
	r.probeKey = probeKey
	r.res.ProbeKey = tr.Keys[probeKey]
	return nil
}

// probe fills Available for the buckets before upTo.
func (r *replay) probe(upTo int) error {
	res := r.res
	for ; r.nextProbe < upTo; r.nextProbe++ {
		at := r.tr.Start + int64(r.nextProbe+1)*res.BucketWidth - 1
		state := r.states[r.probeKey]
		if r.table != nil {
			var err error
			if state, err = r.table.State([]byte(res.ProbeKey), at); err != nil {
				return fmt.Errorf("sim: probing key %q: %w", res.ProbeKey, err)
			}
		}
		_, d, err := r.lim.Decide(r.scratch[:0], state, at, 1)
		if err != nil {
			return fmt.Errorf("sim: probing key %q: %w", res.ProbeKey, err)
		}
		if d.Allowed {
			res.Buckets[r.nextProbe].Available = d.Remaining + 1
		}
	}
	return nil
}

// decide runs request i (rq) through the limiter against its key's state,
// after probing the buckets before its own, keeps the state as the filter
// would, and counts the decision.
func (r *replay) decide(i int, rq Request) error {
	res := r.res
	bi := int((rq.At - r.tr.Start) / res.BucketWidth)
	r.cur = i
	if r.reserve > 0 {
		rq.Cost = r.reserve
	}
	if r.budget != nil {
		if err := r.budget.before(rq.At); err != nil {
			return err
		}
	}
	if err := r.probe(bi); err != nil {
		return err
	}
	if r.shape != nil {
		r.shape.before(bi, rq.At)
	}
	if r.table != nil {
		key := []byte(r.tr.Keys[rq.Key])
		d, err := r.table.Decide(key, rq.At, rq.Cost)
		if err != nil {
			return fmt.Errorf("sim: request %d (key %q, cost %d): %w", i, key, rq.Cost, err)
		}
		st, err := r.table.State(key, rq.At)
		if err != nil {
			return fmt.Errorf("sim: request %d (key %q): %w", i, key, err)
		}
		res.StateBytesMax = max(res.StateBytesMax, len(st))
		res.Limit = d.Limit
		r.count(&res.Buckets[bi], rq, d)
		return nil
	}
	ns, d, err := r.dec.Decide(r.scratch[:0], r.states[rq.Key], rq.At, rq.Cost)
	if err != nil {
		return fmt.Errorf("sim: request %d (key %q, cost %d): %w", i, r.tr.Keys[rq.Key], rq.Cost, err)
	}
	if d.Allowed || len(ns) > 0 {
		r.states[rq.Key] = append(r.states[rq.Key][:0], ns...)
	}
	res.StateBytesMax = max(res.StateBytesMax, len(r.states[rq.Key]))
	res.Limit = d.Limit
	r.count(&res.Buckets[bi], rq, d)
	return nil
}

// count adds decision d on rq to its bucket b and the totals, and for an
// admitted request to its key's window (MaxInWindow).
func (r *replay) count(b *Bucket, rq Request, d algorithms.Decision) {
	res := r.res
	b.Offered++
	res.Offered++
	res.OfferedCost += rq.Cost
	if b.RemainingMin < 0 || d.Remaining < b.RemainingMin {
		b.RemainingMin = d.Remaining
	}
	var c *Class
	if ci := r.class[rq.Key]; ci >= 0 {
		c = &res.Classes[ci]
		c.Offered++
	}
	if !d.Allowed {
		res.Denied++
		if c != nil {
			c.Denied++
		}
		return
	}
	if c != nil {
		c.Admitted++
	}
	b.Admitted++
	res.Admitted++
	res.AdmittedCost += rq.Cost
	if r.budget != nil {
		r.budget.admitted(r.cur, rq)
	}
	if r.shape != nil {
		// Upstream at its release: counted in the windows once the
		// releases are in time order (finishShaping).
		r.shape.admitted(rq, d)
		return
	}
	r.arrive(rq.Key, rq.At, rq.Cost, c)
}

// arrive counts cost units of key reaching the upstream at `at` (in time
// order) in the key's window (MaxInWindow, the class's MaxPerKey) and, for
// a shaped run or its meter, in the window of every key (MaxArrivals).
func (r *replay) arrive(key int32, at, cost int64, c *Class) {
	res := r.res
	if r.shape != nil || r.meter {
		res.MaxArrivals = max(res.MaxArrivals, r.all.push(at, cost, r.width))
	}
	w := &r.wins[key]
	sum := w.push(at, cost, r.width)
	if c != nil && sum > c.MaxPerKey {
		c.MaxPerKey = sum
	}
	if sum > res.MaxInWindow {
		res.MaxInWindow = sum
		res.MaxInWindowKey = r.tr.Keys[key]
		res.MaxInWindowFrom, res.MaxInWindowTo = w.at[w.head], at
	}
}

// classify sorts the keys into the flood's classes by name (ClassPrefixes).
func (r *replay) classify() {
	r.class = make([]int8, len(r.tr.Keys))
	index := make([]int8, len(ClassPrefixes))
	for i := range index {
		index[i] = -1
	}
	for k, name := range r.tr.Keys {
		r.class[k] = -1
		for ci, p := range ClassPrefixes {
			if strings.HasPrefix(name, p) {
				if index[ci] < 0 {
					index[ci] = 0 // placed below, in ClassPrefixes order
				}
				r.class[k] = int8(ci)
			}
		}
	}
	for ci, p := range ClassPrefixes {
		if index[ci] >= 0 {
			index[ci] = int8(len(r.res.Classes))
			r.res.Classes = append(r.res.Classes, Class{Name: strings.TrimSuffix(p, "-")})
		}
	}
	for k, ci := range r.class {
		if ci >= 0 {
			r.class[k] = index[ci]
			r.res.Classes[index[ci]].Keys++
		}
	}
}

// memShared is shared data in memory with Envoy's compare-and-swap rule
// (internal/shareddata, the map the embedded host uses) behind the calls
// the key table makes.
type memShared struct{ *shareddata.Map }

func newMemShared() memShared { return memShared{shareddata.New()} }

func (s memShared) GetSharedData(key []byte) ([]byte, uint32, abi.Status) {
	v, cas, ok := s.GetInto(key, nil)
	if !ok {
		return nil, 0, abi.StatusNotFound
	}
	return v, cas, abi.StatusOK
}

func (s memShared) SetSharedData(key, value []byte, cas uint32) abi.Status {
	return s.SetBytes(key, value, cas)
}
