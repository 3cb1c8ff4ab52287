package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/cmd/sluice/internal/svgchart"
)

// In-flight limits ("algorithm": "concurrency"): each request holds a slot of its key from
// its admission for its duration (the CSV's duration column, Usage.In; 0 without one), and
// a request that finds its key's limit in flight is refused — or, with a delay, waits in
// its key's queue (first in, first out, at most MaxHeld waiting in all) until a slot frees
// within the delay, as the filter's queue does on one worker.

// InFlight is what a concurrency rule did with the traffic.
type InFlight struct {
	// Peak is the most requests of one key in flight at once (never above the limit),
	// PeakKey that key and PeakAt when (Unix ns).
	Peak    int64
	PeakKey string
	PeakAt  int64
	// Probe[i] is the most requests of ProbeKey (the key with the most requests) in flight
	// at once in bucket i; Total[i] the most of all keys together.
	Probe, Total []int64
	ProbeKey     string
	// Delay is the rule's delay.max (0: no queue), MaxHeld its max_held (0: no bound);
	// Queued the requests that waited, of which Expired were refused at the delay, and
	// WaitMax the longest wait of one admitted.
	Delay           time.Duration
	MaxHeld         int
	Queued, Expired int64
	WaitMax         time.Duration
	// Durations says whether the traffic gave the requests a duration.
	Durations bool
}

// ends is a min-heap of slot releases.
type ends []concEnd

type concEnd struct {
	at  int64
	key int32
}

func (h ends) Len() int           { return len(h) }
func (h ends) Less(i, j int) bool { return h[i].at < h[j].at }
func (h ends) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *ends) Push(x any)        { *h = append(*h, x.(concEnd)) }
func (h *ends) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// waiter is a queued request.
type waiter struct {
	i        int
	deadline int64
}

// concRun is the state of one RunConcurrency.
type concRun struct {
	tr       *Traffic
	res      *Result
	f        *InFlight
	limit    int64
	inFlight []int64
	total    int64
	probe    int32 // the key Probe follows
	lastB    int   // the bucket the levels were carried to
	ends     ends
	queues   map[int32][]waiter
	waiting  int
	bucketOf func(t int64) int
}

// RunConcurrency runs traffic through an in-flight limit of limit per key (opt.Delay and
// opt.MaxHeld: the queue). The Result's Buckets count offered and admitted requests (a
// queued one at its admission), MaxInWindow is the peak in flight (its bound the limit),
// and InFlight says the rest.
func RunConcurrency(tr *Traffic, name string, limit int64, opt Options) (*Result, error) {
	if limit < 1 {
		return nil, errors.New("sim: an in-flight limit must be at least 1")
	}
	if len(tr.Requests) == 0 {
		return nil, errors.New("sim: no requests")
	}
	nb := opt.Buckets
	if nb <= 0 {
		nb = DefaultBuckets
	}
	width := BucketWidth(tr.End-tr.Start, nb)
	n := int((tr.End-tr.Start)/width) + 1
	res := &Result{Name: name, Kind: algorithms.Concurrency, Params: algorithms.Params{Limit: limit, Burst: limit}, Limit: limit,
		Keys: len(tr.Keys), Start: tr.Start, BucketWidth: width, Buckets: make([]Bucket, n)}
	f := &InFlight{Probe: make([]int64, n), Total: make([]int64, n), Delay: opt.Delay, MaxHeld: opt.MaxHeld, Durations: tr.Usage != nil}
	res.InFlight = f
	for i := range res.Buckets {
		res.Buckets[i].RemainingMin = -1
	}
	c := &concRun{tr: tr, res: res, f: f, limit: limit, inFlight: make([]int64, len(tr.Keys)), queues: map[int32][]waiter{},
		bucketOf: func(t int64) int { return min(max(int((t-tr.Start)/width), 0), n-1) }}
	counts := make([]int, len(tr.Keys))
	for _, rq := range tr.Requests {
		if counts[rq.Key]++; counts[rq.Key] > counts[c.probe] {
			c.probe = rq.Key
		}
	}
	f.ProbeKey = tr.Keys[c.probe]
	for i, rq := range tr.Requests {
		c.releaseUntil(rq.At)
		b := &res.Buckets[c.bucketOf(rq.At)]
		b.Offered++
		res.Offered++
		res.OfferedCost += rq.Cost
		switch {
		case c.inFlight[rq.Key] < limit && len(c.queues[rq.Key]) == 0:
			c.admit(i, rq.At)
		case opt.Delay > 0 && (opt.MaxHeld == 0 || c.waiting < opt.MaxHeld):
			c.queues[rq.Key] = append(c.queues[rq.Key], waiter{i, rq.At + int64(opt.Delay)})
			c.waiting++
			f.Queued++
		default:
			res.Denied++
		}
	}
	c.releaseUntil(1<<62 - 1)
	c.carry(n - 1)
	res.MaxInWindow, res.MaxInWindowKey, res.MaxInWindowFrom, res.MaxInWindowTo = f.Peak, f.PeakKey, f.PeakAt, f.PeakAt
	return res, nil
}

// admit gives request i a slot at t (its arrival, or when a queued one got its slot).
func (c *concRun) admit(i int, t int64) {
	rq := c.tr.Requests[i]
	k := c.bucketOf(t)
	c.carry(k)
	c.inFlight[rq.Key]++
	c.total++
	c.res.Admitted++
	c.res.AdmittedCost += rq.Cost
	c.res.Buckets[k].Admitted++
	c.res.Buckets[k].RemainingMin = c.remainingMin(k, c.limit-c.inFlight[rq.Key])
	if n := c.inFlight[rq.Key]; n > c.f.Peak {
		c.f.Peak, c.f.PeakKey, c.f.PeakAt = n, c.tr.Keys[rq.Key], t
	}
	c.f.Probe[k] = max(c.f.Probe[k], c.inFlight[c.probe])
	c.f.Total[k] = max(c.f.Total[k], c.total)
	if w := time.Duration(t - rq.At); w > c.f.WaitMax {
		c.f.WaitMax = w
	}
	heap.Push(&c.ends, concEnd{t + c.tr.usage(i).In, rq.Key})
}

// carry records the levels in flight now in every bucket from the last one recorded up to
// k: they hold until the next change.
func (c *concRun) carry(k int) {
	for b := c.lastB; b <= k; b++ {
		c.f.Probe[b] = max(c.f.Probe[b], c.inFlight[c.probe])
		c.f.Total[b] = max(c.f.Total[b], c.total)
	}
	c.lastB = k
}

func (c *concRun) remainingMin(k int, r int64) int64 {
	if cur := c.res.Buckets[k].RemainingMin; cur >= 0 && cur < r {
		return cur
	}
	return r
}

// releaseUntil ends the requests whose duration is over by t (inclusive), in time order;
// each freed slot goes to its key's first waiter still within its delay, and waiters past
// their delay are refused.
func (c *concRun) releaseUntil(t int64) {
	for len(c.ends) > 0 && c.ends[0].at <= t {
		e := heap.Pop(&c.ends).(concEnd)
		c.carry(c.bucketOf(e.at))
		c.inFlight[e.key]--
		c.total--
		c.expire(e.key, e.at)
		if q := c.queues[e.key]; len(q) > 0 {
			c.queues[e.key] = q[1:]
			c.waiting--
			c.admit(q[0].i, e.at)
		}
	}
	for k := range c.queues {
		c.expire(k, t)
	}
}

// expire refuses the waiters of key whose delay ran out before t.
func (c *concRun) expire(key int32, t int64) {
	q := c.queues[key]
	for len(q) > 0 && q[0].deadline < t {
		q = q[1:]
		c.waiting--
		c.f.Expired++
		c.res.Denied++
	}
	if len(q) == 0 {
		delete(c.queues, key)
	} else {
		c.queues[key] = q
	}
}

// inFlightChart fills sd's numbers of an in-flight limit and returns its chart: the most
// requests in flight at once per bucket, of one key and of all keys, against the limit.
func inFlightChart(n int, res *Result, sd *sectionData) *svgchart.Chart {
	f := res.InFlight
	sd.IF, sd.Window = f, "in flight"
	nb := len(res.Buckets)
	sec := func(i int) float64 { return float64(int64(i)*res.BucketWidth) / 1e9 }
	one := make([]svgchart.Point, nb)
	all := make([]svgchart.Point, nb)
	for i := 0; i < nb; i++ {
		one[i] = svgchart.Point{X: sec(i), Y: float64(f.Probe[i])}
		all[i] = svgchart.Point{X: sec(i), Y: float64(f.Total[i])}
	}
	return &svgchart.Chart{
		ID:    fmt.Sprintf("chart-%d-inflight", n),
		Title: "Requests in flight", Width: 560, Height: 200,
		XLabel: "time since start", YLabel: "in flight (most in " + fmtBucketWidth(res.BucketWidth) + ")",
		XMin: 0, XMax: sec(nb), XTicks: svgchart.DurationTicks(0, sec(nb), 6), XFormat: svgchart.FormatDuration,
		Series: []svgchart.Series{
			{Name: "all keys", Class: "inflight-total", Color: "#bbbbbb", Kind: svgchart.StepArea, Points: all},
			{Name: "key " + f.ProbeKey, Class: "inflight-key", Color: "#2f7ed8", Kind: svgchart.Step, Points: one},
		},
		Rules: []svgchart.Rule{{Y: float64(res.Limit), Label: "limit " + strconv.FormatInt(res.Limit, 10), Class: "limit"}},
	}
}
