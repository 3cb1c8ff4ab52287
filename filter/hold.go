package filter

import (
	"bytes"
	"errors"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Shaping: rules with "delay" hold a request that does not fit now until
// its slot, instead of refusing it.
//
//   - The slot is taken when the request arrives, in the rule's shared-data
//     slot (algorithms.Shaper.DecideDelay, charged with compare-and-swap
//     like any admission), so the requests of one key leave spaced by the
//     rate whichever worker holds them. A request whose wait exceeds
//     delay.max is refused at once (429, Retry-After: when a retry would be
//     queued); so is one that would wait while the rule holds
//     delay.max_held requests on this worker already (it is decided
//     without a queue: admitted if it fits now).
//   - A held request is paused in proxy_on_request_headers and released
//     from the root context's proxy_on_tick (proxy_set_effective_context,
//     proxy_continue_stream): the tick period follows the earliest release
//     (whole milliseconds, rounded up), so a request is released no earlier
//     than its slot and within a millisecond and the host's timer slack
//     after it. The remote guards share the tick: the period is the shorter
//     of the two.
//   - A request matching several delaying rules waits for the latest of
//     its slots.
//   - A remote rule (backend redis or rls) takes the slot on the remote
//     side, in the script, so the requests of one key queue across every
//     proxy: its call carries delay.max (none at max_held) and its reply
//     the delay (redis_backend.go, rls_backend.go).
//   - A client that goes away while held (proxy_on_done / proxy_on_delete of
//     a held stream) gives its slot back where the algorithm allows: when
//     its admission is still the key's latest (the state is what it
//     wrote), the state before it is restored; otherwise requests are
//     queued behind it and the slot passes unused (moving them would break
//     their spacing).
//   - When the root context ends (proxy_on_done: the proxy stops) every
//     request still held is refused with the rule's rejection and a
//     Retry-After of its remaining wait, and gives its slot back as above.
//     A configuration reload does not end a held request: the old root
//     context drains, ticking, and releases it at its time.
//   - The response of a released request carries sluice-delay-ms, the time
//     it was held in milliseconds (rounded up).
//
// Held requests live in a binary heap by release time, in records pooled
// by the Plugin: holding, releasing and ticking allocate nothing once the
// pool has grown to the largest number held.

// DelayHeader is the response header that says how long a request was held,
// in milliseconds (rounded up).
const DelayHeader = "sluice-delay-ms"

// maxHoldState bounds a bucket's encoded state (26 bytes) as a hold keeps it.
const maxHoldState = 32

// ruleDelay is a rule's "delay" on this VM.
type ruleDelay struct {
	shaper  algorithms.Shaper
	max     time.Duration
	maxHeld int
	held    int // requests the rule holds on this VM
	m       struct{ delayed, refused, abandoned, held, hist uint32 }
	// The state the request's charge replaced (charge), for a give-back.
	prev  [maxHoldState]byte
	prevN int
	slot  uint64
}

// heldSlot is one rule's admission of a held request, for a give-back
// (local: on the rule's shared-data store; a remote rule's slot, taken on
// the remote side, is not given back).
type heldSlot struct {
	rule        *rule
	local       bool
	slot        uint64
	ident       uint64
	prev, cur   [maxHoldState]byte
	prevN, curN int
}

// heldReq is one held request.
type heldReq struct {
	at    int64 // release time (Unix ns)
	since int64 // when it was decided
	id    uint32
	s     *stream
	idx   int   // position in holds.heap
	worst *rule // the rule with the latest slot: a refusal's response
	slots []heldSlot
}

// holds is a Plugin's held requests.
type holds struct {
	p    *Plugin
	h    resumer
	heap []*heldReq
	free []*heldReq
	nDel int // rules with delay: a record's slots capacity
	rec  abi.MetricRecorder
}

// resumingHost is h as a host that resumes paused requests from the root's tick, or an
// error saying that what (a feature) needs one.
func resumingHost(h abi.Host, what string) (resumer, error) {
	r, ok := h.(resumer)
	if _, ticks := h.(tickHost); !ok || !ticks {
		return nil, errors.New(what + " needs a host that can resume a paused request (proxy_set_effective_context, proxy_continue_stream, proxy_set_tick_period_milliseconds)")
	}
	return r, nil
}

// newHolds prepares the delay of every rule that has one; nil when none has.
func newHolds(p *Plugin, rules []*rule) (*holds, error) {
	n := 0
	for _, r := range rules {
		if r.cfg.Delay.Max <= 0 || r.cfg.Concurrency != nil {
			continue // a concurrency rule's delay is its queue (concurrency.go)
		}
		sh, ok := algorithms.AsShaper(r.cfg.Limiter)
		if !ok {
			return nil, errors.New("rule " + r.id + ": " + r.cfg.Algorithm.String() + " cannot hold requests")
		}
		r.delay = &ruleDelay{shaper: sh, max: r.cfg.Delay.Max, maxHeld: r.cfg.Delay.MaxHeld}
		ids := [5]*uint32{&r.delay.m.delayed, &r.delay.m.refused, &r.delay.m.abandoned, &r.delay.m.held, &r.delay.m.hist}
		kinds := [5]abi.MetricType{abi.MetricCounter, abi.MetricCounter, abi.MetricCounter, abi.MetricGauge, abi.MetricHistogram}
		for i, c := range DelayMetrics {
			if err := defineMetric(p.host, kinds[i], RuleMetric(r.id, c), ids[i]); err != nil {
				return nil, err
			}
		}
		n++
	}
	if n == 0 {
		return nil, nil
	}
	h, err := resumingHost(p.host, `"delay"`)
	if err != nil {
		return nil, err
	}
	hs := &holds{p: p, h: h, nDel: n}
	hs.rec, _ = p.host.(abi.MetricRecorder)
	return hs, nil
}

// maxDelay is the max delay a remote rule's call carries: delay.max while
// the rule holds fewer than max_held requests on this VM, else 0 (a meter).
// 0 for a rule without delay (d nil).
func (d *ruleDelay) maxDelay() time.Duration {
	if d == nil || d.held >= d.maxHeld {
		return 0
	}
	return d.max
}

// decide decides r (a rule with delay, on its own store) against state:
// with a queue while the rule holds fewer than max_held requests on this
// VM, else as a meter.
func (d *ruleDelay) decide(dst, state []byte, now, cost int64) ([]byte, algorithms.Decision, error) {
	if d.held >= d.maxHeld {
		return d.shaper.Decide(dst, state, now, cost)
	}
	return d.shaper.DecideDelay(dst, state, now, cost, d.max)
}

// charged remembers, after r's charge, what a give-back needs: the state
// the charge replaced.
func (d *ruleDelay) charged(e *entry) {
	d.prevN = copy(d.prev[:], e.state)
	d.slot = e.slot
}

// hold pauses s, admitted by every rule, until its latest slot (delay from
// now). It returns the callback's action.
func (hs *holds) hold(s *stream, now int64, delay time.Duration) abi.Action {
	e := hs.get()
	e.at, e.since, e.id, e.s, e.worst = now+int64(delay), now, s.id, s, nil
	e.slots = e.slots[:0]
	for _, r := range hs.p.rules {
		d := r.delay
		if d == nil || !r.applies || r.failed || !r.d.Allowed || r.d.Delay <= 0 {
			continue
		}
		if e.worst == nil || r.d.Delay > e.worst.d.Delay {
			e.worst = r
		}
		sl := heldSlot{rule: r, local: r.by == r.store}
		if sl.local {
			sl.slot, sl.ident = d.slot, r.e.ident
			sl.prevN = copy(sl.prev[:], d.prev[:d.prevN])
			sl.curN = copy(sl.cur[:], r.state)
		}
		e.slots = append(e.slots, sl)
		d.held++
		hs.p.host.IncrementMetric(d.m.delayed, 1)
		hs.p.host.IncrementMetric(d.m.held, 1)
	}
	s.hold = e
	hs.push(e)
	hs.p.rootPlugin().retick(now, e.at)
	return abi.ActionPause
}

// next is the earliest release (0: nothing held).
func (hs *holds) next() int64 {
	if hs == nil || len(hs.heap) == 0 {
		return 0
	}
	return hs.heap[0].at
}

// release resumes every request whose slot has come (proxy_on_tick).
func (hs *holds) release(now int64) {
	for len(hs.heap) > 0 && hs.heap[0].at <= now {
		e := hs.heap[0]
		hs.remove(e)
		s := e.s
		s.hold = nil
		ms := (now - e.since + 999_999) / 1_000_000
		s.heldMS, s.hasHeaders = ms, true
		hs.unhold(e, ms)
		if hs.h.SetEffectiveContext(e.id) == abi.StatusOK {
			hs.h.ContinueStream()
		}
		hs.put(e)
	}
}

// unhold counts e's release (ms: the time held, or < 0 for a request not
// released) on each of its rules.
func (hs *holds) unhold(e *heldReq, ms int64) {
	for i := range e.slots {
		d := e.slots[i].rule.delay
		d.held--
		hs.p.host.IncrementMetric(d.m.held, -1)
		if ms >= 0 && hs.rec != nil {
			hs.rec.RecordMetric(d.m.hist, uint64(ms))
		}
	}
}

// abandon drops the hold of s, whose stream ended while held, and gives
// its slots back where the algorithm allows.
func (hs *holds) abandon(s *stream) {
	e := s.hold
	s.hold = nil
	hs.remove(e)
	hs.unhold(e, -1)
	for i := range e.slots {
		hs.p.host.IncrementMetric(e.slots[i].rule.delay.m.abandoned, 1)
	}
	hs.giveBack(e)
	hs.put(e)
}

// refuseAll refuses every held request (the root context ends): the
// rejection of its latest rule, Retry-After its remaining wait.
func (hs *holds) refuseAll(now int64) {
	for len(hs.heap) > 0 {
		e := hs.heap[0]
		hs.remove(e)
		s := e.s
		s.hold = nil
		hs.unhold(e, -1)
		hs.giveBack(e)
		if r := e.worst; r != nil && hs.h.SetEffectiveContext(e.id) == abi.StatusOK {
			wait := time.Duration(max(e.at-now, 0))
			r.d = algorithms.Decision{Limit: r.cfg.Burst, ResetAfter: wait, RetryAfter: wait}
			hs.p.host.IncrementMetric(r.delay.m.refused, 1)
			hs.p.sendDenied(s, r)
		}
		hs.put(e)
	}
}

// giveBack restores, for each rule of e, the state its admission replaced,
// if the admission is still the key's latest.
func (hs *holds) giveBack(e *heldReq) {
	for i := range e.slots {
		sl := &e.slots[i]
		if !sl.local {
			continue // a remote slot passes unused (redis_backend.go)
		}
		if _, err := sl.rule.store.giveBack(sl.slot, sl.ident, sl.cur[:sl.curN], sl.prev[:sl.prevN]); err != nil {
			hs.p.storeFailed(sl.rule, err)
		}
	}
}

// giveBack writes prev into slot, owned by ident, if its state is still
// cur; false when it is not (or the write lost a race: someone decided
// on cur meanwhile, so it is not given back).
func (s *slotStore) giveBack(slot, ident uint64, cur, prev []byte) (bool, error) {
	si, err := s.read(slot)
	if err != nil || !si.valid || si.ident != ident || !bytes.Equal(si.state, cur) {
		return false, err
	}
	e := entry{slot: slot, cas: si.cas, exists: true, ident: ident}
	return s.store(&e, prev)
}

// The pool and the heap.

func (hs *holds) get() *heldReq {
	if n := len(hs.free); n > 0 {
		e := hs.free[n-1]
		hs.free = hs.free[:n-1]
		return e
	}
	return &heldReq{slots: make([]heldSlot, 0, hs.nDel)}
}

func (hs *holds) put(e *heldReq) {
	e.s, e.worst = nil, nil
	for i := range e.slots {
		e.slots[i].rule = nil
	}
	hs.free = append(hs.free, e)
}

func (hs *holds) push(e *heldReq) {
	e.idx = len(hs.heap)
	hs.heap = append(hs.heap, e)
	hs.up(e.idx)
}

// remove takes e out of the heap (nothing when e is not in it: a record
// the heap does not hold is never moved).
func (hs *holds) remove(e *heldReq) {
	if e.idx < 0 || e.idx >= len(hs.heap) || hs.heap[e.idx] != e {
		return
	}
	i, last := e.idx, len(hs.heap)-1
	if i != last {
		hs.swap(i, last)
	}
	hs.heap[last] = nil
	hs.heap = hs.heap[:last]
	if i < last {
		hs.down(i)
		hs.up(i)
	}
}

func (hs *holds) less(i, j int) bool { return hs.heap[i].at < hs.heap[j].at }

func (hs *holds) swap(i, j int) {
	hs.heap[i], hs.heap[j] = hs.heap[j], hs.heap[i]
	hs.heap[i].idx, hs.heap[j].idx = i, j
}

func (hs *holds) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !hs.less(i, p) {
			return
		}
		hs.swap(i, p)
		i = p
	}
}

func (hs *holds) down(i int) {
	n := len(hs.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && hs.less(r, l) {
			m = r
		}
		if !hs.less(m, i) {
			return
		}
		hs.swap(i, m)
		i = m
	}
}

// The root context's tick: the remote guards' period (baseTick), shortened
// to the time until the earliest release of any of its configurations.

// rootPlugin is the root context's Plugin (p itself, or a scope's root).
func (p *Plugin) rootPlugin() *Plugin {
	if p.root != nil {
		return p.root
	}
	return p
}

// retick sets the root's tick period for a release at `at` (0: after a
// tick, recompute from every configuration's earliest release). Root
// Plugin only.
func (p *Plugin) retick(now, at int64) {
	if at != 0 && p.wake != 0 && p.wake <= at {
		return // an earlier release already has its tick
	}
	if at == 0 {
		for i := 0; i < p.configs(); i++ {
			if t := p.configAt(i).holds.next(); t != 0 && (at == 0 || t < at) {
				at = t
			}
			if t := p.configAt(i).bodies.next(); t != 0 && (at == 0 || t < at) {
				at = t
			}
			if t := p.configAt(i).conc.next(now); t != 0 && (at == 0 || t < at) {
				at = t
			}
		}
	}
	p.wake = at
	period := p.baseTick
	if at != 0 {
		ms := uint32(min((max(at-now, 0)+999_999)/1_000_000, 1000))
		if ms < 1 {
			ms = 1
		}
		if period == 0 || ms < period {
			period = ms
		}
	}
	if period == p.tickMS {
		return
	}
	p.tickMS = period
	if th, ok := p.host.(tickHost); ok {
		if st := th.SetTickPeriod(period); st != abi.StatusOK {
			p.host.Log(abi.LogError, "sluice: proxy_set_tick_period_milliseconds failed: "+st.String())
		}
	}
}
