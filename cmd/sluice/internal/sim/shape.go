package sim

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// Shaping (rules[].delay, filter/hold.go) in virtual time: a rule with a
// delay decides every request with algorithms.Shaper.DecideDelay, so one
// that would fit within the delay is admitted into its slot and reaches
// the upstream then, at its decision's time plus Decision.Delay; one that
// would wait longer is refused. The run records each admission at its
// release, and the same traffic runs a second time through the same rule
// as a meter (Decide: what does not fit now is refused), so the report
// shows both.
//
// What is modelled: the queue of one worker. Every request is decided on
// the same worker, in arrival order, and a held request is released
// exactly at its slot (the filter's tick releases it within a millisecond
// after). delay.max_held bounds the requests held at once: a request
// decided while MaxHeld are held is decided without a queue (admitted
// only if it fits now), as the filter does on a worker that holds
// max_held. A fleet of workers sharing one state, each with its own
// max_held, is not modelled; neither are clients that give up while held
// (delay_abandoned).

// Shaping is what a rule with a delay did with the traffic.
type Shaping struct {
	// Max is delay.max; MaxHeld is delay.max_held (0: no bound).
	Max     time.Duration
	MaxHeld int
	// AtOnce and Held split Result.Admitted: the requests that went
	// upstream at once, and those held until their slot (the filter's
	// delayed counter). Result.Denied are the refused (delay_refused).
	AtOnce, Held int64
	// Metered counts the decisions made without a queue because MaxHeld
	// requests were held at the time.
	Metered int64
	// MostHeld is the most requests held at once.
	MostHeld int64
	// DelayP50, DelayP99 and DelayMax are the median, 99th percentile
	// (nearest rank) and largest delay of the held requests (the filter's
	// delay_ms histogram); zero when none was held.
	DelayP50, DelayP99, DelayMax time.Duration
	// Arrivals[i] is the number of requests that reached the upstream in
	// bucket i (Result.Start, Result.BucketWidth), at their release;
	// MostHeldIn[i] the most held at once in bucket i. Both may extend
	// past the traffic's span: requests decided near its end are released
	// after it. They have the same length.
	Arrivals, MostHeldIn []int64
	// LastArrival is when the last admitted request reached the upstream
	// (Unix ns).
	LastArrival int64
	// Meter is the same traffic through the same rule without a delay:
	// what the rule would admit, at once, and refuse as a meter. Its
	// arrivals are its Buckets' Admitted.
	Meter *Result
}

// bucket returns how many requests went upstream with shaping in bucket
// i, and how many without (the meter's admissions).
func (s *Shaping) bucket(i int) (with, without int64) {
	if i < len(s.Arrivals) {
		with = s.Arrivals[i]
	}
	if i < len(s.Meter.Buckets) {
		without = s.Meter.Buckets[i].Admitted
	}
	return with, without
}

// shaper is a rule's limiter with its queue: Decide is DecideDelay while
// the queue has room (queue), else the meter's Decide. A KeyTable or a
// replay decides through it as through any Limiter.
type shaper struct {
	algorithms.Shaper
	max   time.Duration
	queue bool
}

func (s *shaper) Decide(dst, state []byte, now, cost int64) ([]byte, algorithms.Decision, error) {
	if !s.queue {
		return s.Shaper.Decide(dst, state, now, cost)
	}
	return s.Shaper.DecideDelay(dst, state, now, cost, s.max)
}

// arrival is one admitted request at its release.
type arrival struct {
	at   int64
	key  int32
	cost int64
}

// releases are the release times of the requests held now (a min-heap).
type releases []int64

func (h releases) Len() int           { return len(h) }
func (h releases) Less(i, j int) bool { return h[i] < h[j] }
func (h releases) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *releases) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *releases) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// shapeRun is the queue of a Run with a delay.
type shapeRun struct {
	r        *replay
	sh       *shaper
	maxHeld  int
	held     releases
	arrivals []arrival // every admission at its release, in decision order
	delays   []int64   // each held request's delay
	next     int       // the first bucket whose held-at-start is not noted yet
	res      *Shaping
}

// startShaping makes r decide with a queue of opt.Delay.
func (r *replay) startShaping(opt Options) error {
	s, ok := algorithms.AsShaper(r.lim)
	if !ok {
		_, why := algorithms.Shapes(r.lim.Kind())
		return fmt.Errorf("sim: %s cannot hold requests (delay): %s", r.lim.Kind(), why)
	}
	sh := &shaper{Shaper: s, max: opt.Delay, queue: true}
	r.dec = sh
	r.shape = &shapeRun{r: r, sh: sh, maxHeld: opt.MaxHeld, res: &Shaping{
		Max: opt.Delay, MaxHeld: opt.MaxHeld, MostHeldIn: make([]int64, len(r.res.Buckets)),
	}}
	r.res.Shaping = r.shape.res
	return nil
}

// bucketStart is the start of bucket i (Unix ns).
func (s *shapeRun) bucketStart(i int) int64 { return s.r.res.Start + int64(i)*s.r.res.BucketWidth }

// release drops the requests released at or before now.
func (s *shapeRun) release(now int64) {
	for len(s.held) > 0 && s.held[0] <= now {
		heap.Pop(&s.held)
	}
}

// note records the requests held now as held in bucket i.
func (s *shapeRun) note(i int) {
	for len(s.res.MostHeldIn) <= i {
		s.res.MostHeldIn = append(s.res.MostHeldIn, 0)
	}
	n := int64(len(s.held))
	s.res.MostHeldIn[i] = max(s.res.MostHeldIn[i], n)
	s.res.MostHeld = max(s.res.MostHeld, n)
}

// before prepares the decision of a request at now, in bucket bi: the
// buckets entered since the last decision note what they started with,
// the requests whose slot has come leave, and the queue is open while
// fewer than MaxHeld are held.
func (s *shapeRun) before(bi int, now int64) {
	for ; s.next <= bi; s.next++ {
		s.release(s.bucketStart(s.next))
		s.note(s.next)
	}
	s.release(now)
	s.sh.queue = s.maxHeld == 0 || len(s.held) < s.maxHeld
	if !s.sh.queue {
		s.res.Metered++
	}
}

// admitted records rq, admitted by d: at once, or held until its slot.
func (s *shapeRun) admitted(rq Request, d algorithms.Decision) {
	at := rq.At
	if d.Delay > 0 {
		at += int64(d.Delay)
		s.res.Held++
		s.delays = append(s.delays, int64(d.Delay))
		heap.Push(&s.held, at)
		s.note(s.next - 1) // before ran for this request's bucket
	} else {
		s.res.AtOnce++
	}
	s.arrivals = append(s.arrivals, arrival{at: at, key: rq.Key, cost: rq.Cost})
}

// finishShaping follows the queue until its last release, and counts
// every admission where it reached the upstream: per bucket, and in the
// windows (MaxInWindow, MaxArrivals), in time order.
func (r *replay) finishShaping() {
	s := r.shape
	for ; len(s.held) > 0 || s.next < len(r.res.Buckets); s.next++ {
		s.release(s.bucketStart(s.next))
		s.note(s.next)
	}
	slices.SortStableFunc(s.arrivals, func(a, b arrival) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return 0
	})
	res := s.res
	res.Arrivals = make([]int64, len(res.MostHeldIn))
	for _, a := range s.arrivals {
		i := int((a.at - r.res.Start) / r.res.BucketWidth)
		for len(res.Arrivals) <= i {
			res.Arrivals = append(res.Arrivals, 0)
		}
		res.Arrivals[i]++
		var c *Class
		if ci := r.class[a.key]; ci >= 0 {
			c = &r.res.Classes[ci]
		}
		r.arrive(a.key, a.at, a.cost, c)
		res.LastArrival = a.at
	}
	for len(res.MostHeldIn) < len(res.Arrivals) {
		res.MostHeldIn = append(res.MostHeldIn, 0)
	}
	slices.Sort(s.delays)
	if n := len(s.delays); n > 0 {
		res.DelayP50 = time.Duration(s.delays[nearestRank(n, 50)])
		res.DelayP99 = time.Duration(s.delays[nearestRank(n, 99)])
		res.DelayMax = time.Duration(s.delays[n-1])
	}
	s.arrivals, s.delays = nil, nil
}

// nearestRank is the index, in n sorted values, of the p-th percentile by
// nearest rank: the ⌈p·n/100⌉-th value.
func nearestRank(n, p int) int {
	return max((p*n+99)/100-1, 0)
}
