package filter

import (
	"errors"
	"math/rand/v2"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// In-flight (concurrency) limits: rules with "algorithm": "concurrency".
//
//   - A slot is acquired when the request is admitted, in the rule's
//     shared-data slot for the key, with compare-and-swap like any charge
//     (Plugin.charge), so every worker of the proxy sees one count per key.
//     It is given back exactly once, when the stream ends for any reason
//     (VM.release: proxy_on_done, proxy_on_log or proxy_on_delete, whichever
//     comes first; the dynamic module's stream destroy). A request admitted
//     by the rule but refused by a later rule's re-decision gives it back at
//     once.
//   - The key's state lists the slots per holder — this Plugin, with a
//     random 64-bit id — and a lease on them (algorithms.ConcurrencyLimiter).
//     The root context's tick renews the leases of the keys this holder has
//     slots in every ConcurrencyRenewEvery; a holder that stops renewing (its
//     VM trapped, or was replaced with its streams) loses its slots
//     ConcurrencyLeaseTTL after its last renewal: the next write of the key
//     drops them and counts them in reclaimed. The dynamic module's holders
//     cannot disappear without the process, and its tick runs only while a
//     request is paused: its leases never lapse.
//   - A key with requests in flight is never evicted from the rule's slot
//     table (that would forget its slots): a new key whose candidate slots are
//     all held by such keys fails the rule (failure_mode decides).
//   - With "delay", a request refused only by concurrency rules with delay
//     waits (paused) in a FIFO per worker, at most delay.max_held per rule,
//     and is decided again — every rule, on the hashes it had — when a slot of
//     the worker's is released (on the next tick, 1 ms later) and every
//     ConcurrencyPoll; one still refused at delay.max is refused with the
//     rule's response.

// The lease of a holder's slots, how often it is renewed, and how often a
// queue is polled for slots freed on other workers.
const (
	ConcurrencyLeaseTTL   = 10 * time.Second
	ConcurrencyRenewEvery = 2 * time.Second
	ConcurrencyPoll       = 10 * time.Millisecond
)

// ConcurrencyMetrics are the metrics a concurrency rule adds, after the
// counters every rule has: in_flight is a gauge, queue_ms a histogram,
// the others counters.
var ConcurrencyMetrics = [...]string{"in_flight", "acquired", "refused", "queued", "reclaimed", "queue_ms"}

var concurrencyMetricHelp = [...]string{
	"requests in flight (slots held)",
	"slots acquired",
	"requests refused for want of a slot",
	"requests queued for a slot",
	"slots of lapsed holders recovered",
	"time queued requests waited for their slot (ms)",
}

// errKeysInFlight fails a concurrency rule whose key finds every
// candidate slot held by keys with requests in flight.
var errKeysInFlight = errors.New("every candidate slot holds a key with requests in flight (raise max_keys)")

// ruleConc is a concurrency rule on this Plugin.
type ruleConc struct {
	lim *algorithms.ConcurrencyLimiter
	m   struct{ inFlight, acquired, refused, queued, reclaimed, hist uint32 }
	// queue: delay.max and max_held (0: refused at once), and how many
	// requests wait on this VM.
	max     time.Duration
	maxHeld int
	waiting int
}

// concKey names a key this holder has slots in.
type concKey struct {
	rule  *rule
	ident uint64
}

// concHeld is what this holder has in one key.
type concHeld struct {
	k concKey
	n int64
	// A remote rule's (concurrency_remote.go): its index and Redis key.
	remote bool
	rule   int
	key    []byte
}

// concAcqs is the slots one stream holds, one per concurrency rule.
type concAcqs struct{ held []*concHeld }

// concWait is a queued request.
type concWait struct {
	s               *stream
	id              uint32
	since, deadline int64
	worst           *rule
	applies         []bool
	counted         []bool // the rules whose waiting counts it
	hashes          []uint64
	units           []int64
}

// concs is a Plugin's concurrency rules' state.
type concs struct {
	p         *Plugin
	holder    uint64  // this Plugin's id in the keys' states
	h         resumer // nil without queues
	rec       abi.MetricRecorder
	held      map[concKey]*concHeld
	nextRenew int64
	queue     []*concWait
	poke      bool // a slot was released: pump the queue on the next tick
	freeAcq   []*concAcqs
	freeWait  []*concWait
	freeHeld  []*concHeld
	nrules    int
}

// setupConcurrency binds the concurrency rules' limiters to this Plugin as
// a holder and defines their metrics; p.conc is nil without such rules.
func (p *Plugin) setupConcurrency(rules []*rule) error {
	p.conc = nil
	ttl := ConcurrencyLeaseTTL
	if b, ok := p.host.(BuildHost); ok && b.Build() == config.BuildDynamic {
		ttl = 0
	}
	holder := rand.Uint64()
	var cs *concs
	for _, r := range rules {
		l, ok := r.cfg.Limiter.(*algorithms.ConcurrencyLimiter)
		if !ok {
			continue
		}
		if cs == nil {
			cs = &concs{p: p, holder: holder, held: make(map[concKey]*concHeld), nrules: len(rules)}
			cs.rec, _ = p.host.(abi.MetricRecorder)
		}
		c := &ruleConc{lim: l.Bind(holder, ttl), max: r.cfg.Delay.Max, maxHeld: r.cfg.Delay.MaxHeld}
		r.conc = c
		r.store.lim, r.store.noEvict = c.lim, true
		r.policy = []byte(`"` + r.cfg.Name + `";q=` + itoa(r.cfg.Limit))
		ids := [6]*uint32{&c.m.inFlight, &c.m.acquired, &c.m.refused, &c.m.queued, &c.m.reclaimed, &c.m.hist}
		kinds := [6]abi.MetricType{abi.MetricGauge, abi.MetricCounter, abi.MetricCounter, abi.MetricCounter, abi.MetricCounter, abi.MetricHistogram}
		for i, n := range ConcurrencyMetrics {
			if err := defineMetric(p.host, kinds[i], RuleMetric(r.id, n), ids[i]); err != nil {
				return err
			}
		}
		if c.max > 0 && cs.h == nil {
			h, err := resumingHost(p.host, `"delay" on a concurrency rule`)
			if err != nil {
				return err
			}
			cs.h = h
		}
	}
	p.conc = cs
	return nil
}

func itoa(n int64) string { return string(appendInt(nil, n)) }

// acquired records, after r's charge, that s holds a slot of r's key.
func (cs *concs) acquired(s *stream, r *rule, now int64) {
	k := concKey{r, r.e.ident}
	h := cs.held[k]
	if h == nil {
		h = cs.newHeld(k)
		cs.scheduleRenew(now)
	}
	h.n++
	if s.conc == nil {
		s.conc = cs.getAcqs()
	}
	s.conc.held = append(s.conc.held, h)
	host := cs.p.host
	host.IncrementMetric(r.conc.m.acquired, 1)
	host.IncrementMetric(r.conc.m.inFlight, 1)
	if n := r.conc.lim.Reclaimed(r.e.state, now); n > 0 {
		cs.reclaimed(r, n)
	}
}

// scheduleRenew makes the root's tick renew the leases when they are due.
func (cs *concs) scheduleRenew(now int64) {
	if cs.nextRenew == 0 {
		cs.nextRenew = now + int64(ConcurrencyRenewEvery)
		cs.p.rootPlugin().retick(now, cs.nextRenew)
	}
}

func (cs *concs) reclaimed(r *rule, n int64) {
	cs.p.host.IncrementMetric(r.conc.m.reclaimed, n)
	cs.p.host.IncrementMetric(r.conc.m.inFlight, -n)
}

// releaseStream gives back every slot s holds.
func (cs *concs) releaseStream(s *stream, now int64) {
	a := s.conc
	if a == nil {
		return
	}
	s.conc = nil
	for i, h := range a.held {
		cs.release(h, now)
		a.held[i] = nil
	}
	a.held = a.held[:0]
	cs.freeAcq = append(cs.freeAcq, a)
}

// release gives one slot of h back (compare-and-swap, reading again after a
// lost race).
func (cs *concs) release(h *concHeld, now int64) {
	r, ident := h.k.rule, h.k.ident
	h.n--
	cs.p.host.IncrementMetric(r.conc.m.inFlight, -1)
	if h.remote {
		cs.releaseRemote(h, now)
	}
	if h.n <= 0 {
		delete(cs.held, h.k)
		cs.putHeld(h)
	}
	if h.remote {
		return
	}
	if r.conc.max > 0 && r.conc.waiting > 0 {
		cs.poke = true
		cs.p.rootPlugin().retick(now, now)
	}
	if err := cs.rewrite(r, ident, now, algorithms.ConcurrencyRelease, 1); err != nil {
		cs.p.storeFailed(r, err)
	}
}

// rewrite releases n slots of ident's key (op ConcurrencyRelease) or renews
// this holder's n (ConcurrencyRenew), reading again after a lost race;
// nothing when the key has no slot (its state was lost).
func (cs *concs) rewrite(r *rule, ident uint64, now int64, op algorithms.ConcurrencyOp, n int64) error {
	st := r.store
	for i := 0; i < MaxCASRetries; i++ {
		var e entry
		if err := st.load(ident, now, &e); err != nil {
			if errors.Is(err, errKeysInFlight) {
				return nil // not its slot any more
			}
			return err
		}
		if e.state == nil {
			return nil
		}
		lapsed := r.conc.lim.Reclaimed(e.state, now)
		var ns []byte
		var err error
		if op == algorithms.ConcurrencyRelease {
			ns, _, err = r.conc.lim.Release(st.stateBuf(), e.state, now, n)
		} else {
			ns, err = r.conc.lim.Renew(st.stateBuf(), e.state, now, n)
		}
		if err != nil {
			return err
		}
		ok, err := st.store(&e, ns)
		if err != nil {
			return err
		}
		if ok {
			if lapsed > 0 {
				cs.reclaimed(r, lapsed)
			}
			return nil
		}
	}
	return errCASExhausted
}

// renew renews this holder's leases (the root's tick).
func (cs *concs) renew(now int64) {
	if len(cs.held) == 0 {
		cs.nextRenew = 0
		return
	}
	if now < cs.nextRenew {
		return
	}
	cs.nextRenew = now + int64(ConcurrencyRenewEvery)
	for k, h := range cs.held {
		if h.remote {
			cs.renewRemote(h, now)
			continue
		}
		if err := cs.rewrite(k.rule, k.ident, now, algorithms.ConcurrencyRenew, h.n); err != nil {
			cs.p.storeFailed(k.rule, err)
		}
	}
}

// next is when the root's tick is next needed (0: not).
func (cs *concs) next(now int64) int64 {
	if cs == nil {
		return 0
	}
	at := cs.nextRenew
	if len(cs.queue) > 0 {
		t := now + int64(ConcurrencyPoll)
		if cs.poke {
			t = now
		}
		for _, w := range cs.queue {
			t = min(t, w.deadline)
		}
		if at == 0 || t < at {
			at = t
		}
	}
	return at
}

// tick renews leases and decides the queued requests again.
func (cs *concs) tick(now int64) {
	cs.renew(now)
	if len(cs.queue) > 0 {
		cs.pump(now)
	}
}

// The queue.

// mayQueue reports whether s, refused, waits instead: every enforcing
// rule that refuses it is a concurrency rule with delay deciding on its
// store, no remote rule applies, and each such rule queues fewer than its
// max_held on this VM.
func (cs *concs) mayQueue() bool {
	if cs == nil || cs.h == nil {
		return false
	}
	any := false
	for _, r := range cs.p.rules {
		if !r.applies {
			continue
		}
		if r.remote {
			return false
		}
		if r.failed || r.d.Allowed || r.cfg.Mode != config.ModeEnforce {
			continue
		}
		if r.conc == nil || r.conc.max <= 0 || r.by != r.store || r.conc.waiting >= r.conc.maxHeld {
			return false
		}
		any = true
	}
	return any
}

// queue pauses s (refused by worst) until a slot frees or delay.max.
func (cs *concs) enqueue(s *stream, worst *rule, now int64) abi.Action {
	w := cs.getWait()
	first := s.cqSince == 0 // not queued before (a retry that lost a race comes back)
	if first {
		s.cqSince = now
	}
	w.s, w.id, w.since, w.worst = s, s.id, s.cqSince, worst
	w.deadline = now + int64(24*time.Hour)
	for i, r := range cs.p.rules {
		w.applies[i], w.hashes[i], w.units[i] = r.applies, r.hash, r.units
		w.counted[i] = r.applies && !r.failed && !r.d.Allowed && r.conc != nil
		if w.counted[i] {
			w.deadline = min(w.deadline, w.since+int64(r.conc.max))
			r.conc.waiting++
			if first {
				cs.p.host.IncrementMetric(r.conc.m.queued, 1)
			}
		}
	}
	s.cwait = w
	cs.queue = append(cs.queue, w)
	cs.p.rootPlugin().retick(now, now+int64(ConcurrencyPoll))
	return abi.ActionPause
}

// unqueue takes w out of the queue and its rules' counts.
func (cs *concs) unqueue(w *concWait) {
	for i, x := range cs.queue {
		if x == w {
			cs.queue = append(cs.queue[:i], cs.queue[i+1:]...)
			break
		}
	}
	for i, r := range cs.p.rules {
		if w.counted[i] {
			r.conc.waiting--
			w.counted[i] = false
		}
	}
	w.s.cwait = nil
}

// pump decides the queued requests again, in order.
func (cs *concs) pump(now int64) {
	cs.poke = false
	for i := 0; i < len(cs.queue); {
		w := cs.queue[i]
		if cs.h.SetEffectiveContext(w.id) != abi.StatusOK {
			cs.unqueue(w)
			cs.putWait(w)
			continue
		}
		if now >= w.deadline {
			cs.unqueue(w)
			cs.refuse(w, now)
			cs.putWait(w)
			continue
		}
		if !cs.retry(w, now) {
			i++
			continue
		}
		cs.putWait(w)
	}
}

// refuse answers w with its rule's refusal (delay.max passed).
func (cs *concs) refuse(w *concWait, now int64) {
	r := w.worst
	r.d = algorithms.Decision{Limit: r.cfg.Limit, ResetAfter: r.conc.lim.RetryAfter(), RetryAfter: r.conc.lim.RetryAfter()}
	cs.p.host.IncrementMetric(r.metrics.denied, 1)
	cs.p.host.IncrementMetric(r.conc.m.refused, 1)
	cs.p.sendDenied(w.s, r)
}

// retry decides w's request again on the hashes it had; false when it
// still waits.
func (cs *concs) retry(w *concWait, now int64) bool {
	p, s := cs.p, w.s
	for i, r := range p.rules {
		r.applies, r.failed, r.by = w.applies[i], false, nil
		if !r.applies {
			continue
		}
		r.hash, r.units = w.hashes[i], w.units[i]
		r.by = r.store
		if err := p.evaluate(r, now); err != nil {
			p.storeFailed(r, err)
		}
	}
	if cs.mayQueueAgain() {
		return false
	}
	cs.unqueue(w)
	if _, done := p.verdict(s); done {
		return true
	}
	s.heldMS = (now - w.since + 999_999) / 1_000_000
	act := p.charge(s, nil, now)
	if s.cwait != nil || s.denied {
		return true
	}
	ms := uint64(s.heldMS)
	for i, r := range p.rules {
		if w.applies[i] && r.conc != nil && cs.rec != nil {
			cs.rec.RecordMetric(r.conc.m.hist, ms)
		}
	}
	s.hasHeaders = true
	if act == abi.ActionContinue {
		cs.h.ContinueStream()
	}
	return true
}

// mayQueueAgain: a queued request is still refused only by concurrency
// rules with delay (it keeps its place; max_held is not counted again).
func (cs *concs) mayQueueAgain() bool {
	any := false
	for _, r := range cs.p.rules {
		if !r.applies || r.failed || r.d.Allowed || r.cfg.Mode != config.ModeEnforce {
			continue
		}
		if r.conc == nil || r.conc.max <= 0 || r.by != r.store {
			return false
		}
		any = true
	}
	return any
}

// abandon drops the wait of s, whose stream ended while queued.
func (cs *concs) abandon(s *stream) {
	w := s.cwait
	cs.unqueue(w)
	cs.putWait(w)
}

// refuseAll refuses every queued request (the root context ends).
func (cs *concs) refuseAll(now int64) {
	for len(cs.queue) > 0 {
		w := cs.queue[0]
		cs.unqueue(w)
		if cs.h.SetEffectiveContext(w.id) == abi.StatusOK {
			cs.refuse(w, now)
		}
		cs.putWait(w)
	}
}

// newHeld records, from the pool, that this holder has slots of k.
func (cs *concs) newHeld(k concKey) *concHeld {
	var h *concHeld
	if n := len(cs.freeHeld); n > 0 {
		h = cs.freeHeld[n-1]
		cs.freeHeld = cs.freeHeld[:n-1]
		*h = concHeld{key: h.key[:0]}
	} else {
		h = new(concHeld)
	}
	h.k = k
	cs.held[k] = h
	return h
}

func (cs *concs) putHeld(h *concHeld) {
	h.k.rule = nil
	if len(cs.freeHeld) < maxFreeStreams {
		cs.freeHeld = append(cs.freeHeld, h)
	}
}

func (cs *concs) getAcqs() *concAcqs {
	if n := len(cs.freeAcq); n > 0 {
		a := cs.freeAcq[n-1]
		cs.freeAcq = cs.freeAcq[:n-1]
		return a
	}
	return &concAcqs{held: make([]*concHeld, 0, 2)}
}

func (cs *concs) getWait() *concWait {
	if n := len(cs.freeWait); n > 0 {
		w := cs.freeWait[n-1]
		cs.freeWait = cs.freeWait[:n-1]
		return w
	}
	return &concWait{applies: make([]bool, cs.nrules), hashes: make([]uint64, cs.nrules), units: make([]int64, cs.nrules), counted: make([]bool, cs.nrules)}
}

func (cs *concs) putWait(w *concWait) {
	w.s, w.worst = nil, nil
	cs.freeWait = append(cs.freeWait, w)
}
