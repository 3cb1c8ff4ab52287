package filter

import (
	"errors"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/usage"
)

// Token budgets: rules with "cost" (config.Cost).
//
//   - The reservation: a request costs what cost.request says — a number, or a request
//     header or query parameter holding a whole number from 1 to config.MaxLimit (anything
//     else: its default) — and is admitted only if that much fits (Decide with that cost).
//   - The settlement, for a rule with cost.response (token_bucket, leaky_bucket: an
//     algorithms.Settler): when the stream ends (proxy_on_done, or proxy_on_delete), the
//     request's actual cost — a response header or trailer, or what its body reports (a
//     JSON field, or a provider's usage, from a JSON body or a server-sent-events stream,
//     read chunk by chunk without holding the body: filter/usage) — is settled against
//     the reservation on the key's shared-data slot, with compare-and-swap: the unused part
//     is refunded, an excess is charged even where it does not fit (the key goes into
//     debt: later requests wait until it is paid back). Over-use is never dropped.
//   - A stream that ends without its cost (no such header, no usage in the body, the
//     client or the upstream gone) settles by cost.no_usage: "reservation" (the default:
//     the reservation stands) or "refund" (it is given back). A body that reported usage
//     before it was cut settles with what it reported.
//   - Metrics per rule with cost: reserved (cost units reserved by admitted requests),
//     settled (requests settled), refunded and excess (units), no_usage (requests settled
//     by cost.no_usage).
//
// A rule with cost is not answered from the denial cache: a reservation varies from
// request to request and a refund can reopen a key before its Retry-After.
//
// Remote rules (backend redis, rls) reserve on the remote side: the decision's cost is
// the reservation (redis_backend.go, rls_backend.go). Their settlement goes there too:
// a call of the backend's (the scripts' settle op, sluice serve's sluice.settle), fire
// and forget, counted in the backend's settlements and settlement_failures (a failed
// one leaves the reservation as the cost); the rule's settled, refunded and excess count
// the settlements sent. A remote rule's request admitted by failure_mode "local" settles
// on the local fallback it was decided on (with CAS), one let through by "open" was
// charged nowhere and settles nothing.

// CostMetrics are the metrics a rule with "cost" has besides RuleCounters, named as
// RuleMetric names them.
var CostMetrics = [5]string{"reserved", "settled", "refunded", "excess", "no_usage"}

var costMetricHelp = [...]string{
	"cost units reserved by the requests admitted",
	"requests whose cost was settled when their response ended",
	"cost units given back by settlements (reserved beyond the actual cost)",
	"cost units charged by settlements beyond the reservation (the key may go into debt)",
	"requests settled by cost.no_usage: their response gave no cost",
}

// ruleCost is a rule's "cost" on this VM.
type ruleCost struct {
	src     config.CostSource
	resp    *config.CostResponse
	noUsage config.NoUsage
	settler algorithms.Settler // resp != nil, on a bucket
	// A count on a window algorithm (count_window.go): what gives a response
	// that does not count back to its window; settler is nil then.
	refunder algorithms.Refunder
	m        struct{ reserved, settled, refunded, excess, noUsage uint32 }
	// A reservation read from the request body (src.JSON, bodycost.go): the
	// rule's index in the Plugin's bodyWaits (its rules and its paths), and
	// the body_timeouts metric.
	bodyIdx int
	mBody   uint32
}

// billItem is one rule's pending settlement of a stream.
type billItem struct {
	r        *rule
	ri       int        // r's index in the Plugin's rules
	on       bool       // the rule admitted the stream and settles it
	remote   bool       // admitted by the remote backend: settled there (key)
	by       *slotStore // else the store that admitted it (the rule's, or failure_mode local's fallback)
	key      []byte     // a remote admission's key, as its decision's call named it (remoteResult.key)
	hash     uint64
	reserved int64
	actual   int64
	found    bool         // a header source gave the actual cost
	meter    *usage.Meter // a body source; nil for a header
	giveBack giveBack     // a count on a window algorithm (count_window.go)
}

// bill is a stream's pending settlements: one item per rule of the Plugin with
// cost.response (Plugin.settling), pooled by the Plugin.
type bill struct {
	items []billItem
	body  bool // an item reads the response body
}

// setupCost prepares the cost of each rule that has one.
func (p *Plugin) setupCost(rules []*rule) error {
	p.settling, p.bills = nil, nil
	for _, r := range rules {
		c := r.cfg.Cost
		if c == nil {
			continue
		}
		rc := &ruleCost{src: c.Request, resp: c.Response, noUsage: c.NoUsage}
		if c.Response != nil && c.Response.Count != nil {
			if f, ok := algorithms.AsRefunder(r.cfg.Limiter); ok {
				rc.refunder = f
				p.settling = append(p.settling, r)
			}
		}
		if c.Response != nil && rc.refunder == nil {
			s, ok := algorithms.AsSettler(r.cfg.Limiter)
			if !ok {
				return errors.New("rule " + r.id + ": " + r.cfg.Algorithm.String() + " cannot settle a cost")
			}
			rc.settler = s
			p.settling = append(p.settling, r)
		}
		ids := [5]*uint32{&rc.m.reserved, &rc.m.settled, &rc.m.refunded, &rc.m.excess, &rc.m.noUsage}
		for i, n := range CostMetrics {
			if err := defineMetric(p.host, abi.MetricCounter, RuleMetric(r.id, n), ids[i]); err != nil {
				return err
			}
		}
		r.cost = rc
	}
	return nil
}

// units is what the current request, st, reserves under rule r: 1 without
// cost.
func (p *Plugin) units(st *stream, r *rule) int64 {
	c := r.cost
	if c == nil {
		return 1
	}
	s := &c.src
	var v []byte
	switch {
	case s.JSON != "":
		return p.bodies.units(st, r)
	case s.Header != "":
		h, st := p.host.GetHeader(abi.MapRequestHeaders, s.Header)
		if st != abi.StatusOK {
			return s.Default
		}
		v = h
	case s.Query != "":
		q, ok := queryParam(p.req.getPath(), s.Query)
		if !ok {
			return s.Default
		}
		v = q
	default:
		return s.Fixed
	}
	if n, ok := wholeNumber(v, config.MaxLimit); ok && n >= 1 {
		return n
	}
	return s.Default
}

// fixedUnits is what every request reserves under rule r when that does not
// vary: 1 without cost, cost.request's number; 0 for a header, query or
// body source.
func fixedUnits(r *rule) int64 {
	if r.cost == nil {
		return 1
	}
	return r.cost.src.Fixed
}

// wholeNumber parses decimal digits (no sign, at most max; surrounding
// spaces and tabs allowed, as in a header value).
func wholeNumber(b []byte, max int64) (int64, bool) {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
		if n > max {
			return 0, false
		}
	}
	return n, true
}

// reserve counts what the admitted request reserved and opens its bill for the
// rules that settle (admitted).
func (p *Plugin) reserve(s *stream, now int64) {
	for _, r := range p.rules {
		if r.cost == nil || !r.applies || r.failed || !r.d.Allowed {
			continue
		}
		p.host.IncrementMetric(r.cost.m.reserved, r.units)
		if r.cost.resp == nil {
			continue
		}
		if s.bill == nil {
			s.bill = p.newBill()
		}
		for i := range s.bill.items {
			it := &s.bill.items[i]
			if it.r == r {
				it.on, it.hash, it.reserved, it.actual, it.found = true, r.hash, r.units, 0, false
				it.remote, it.by = r.remote && r.by == nil, r.by
				if it.remote {
					// The key the decision's call named (the rule's scratch
					// key belongs to whichever request came last).
					w := p.remote.current
					if w == nil {
						it.on = false // cannot happen: a remote admission is resumed by its wait
						continue
					}
					it.key = append(it.key[:0], w.res[it.ri].key...)
				}
				if r.cost.refunder != nil {
					p.openGiveBack(it, r, now) // count_window.go
				}
			}
		}
	}
}

func (p *Plugin) newBill() *bill {
	if n := len(p.bills); n > 0 {
		b := p.bills[n-1]
		p.bills = p.bills[:n-1]
		return b
	}
	b := &bill{items: make([]billItem, len(p.settling))}
	for i, r := range p.settling {
		b.items[i].r = r
		for k, q := range p.rules {
			if q == r {
				b.items[i].ri = k
			}
		}
		resp := r.cost.resp
		var err error
		switch {
		case resp.JSON != "":
			b.items[i].meter, err = usage.NewFieldMeter(resp.JSON, usage.Limits{})
		case resp.Usage != "":
			w := usage.Weights{W: resp.Weights, Div: resp.Divisor}
			prov := usage.OpenAI
			if resp.Usage == "anthropic" {
				prov = usage.Anthropic
			}
			b.items[i].meter, err = usage.NewMeter(prov, w, usage.Limits{})
		}
		if err != nil {
			// config validated the path and the weights as usage takes them.
			panic("sluice: rule " + r.id + ": " + err.Error())
		}
	}
	return b
}

func (p *Plugin) freeBill(b *bill) {
	for i := range b.items {
		b.items[i].on, b.items[i].by = false, nil
	}
	b.body = false
	if len(p.bills) < maxFreeStreams {
		p.bills = append(p.bills, b)
	}
}

// billHeaders reads a settling stream's response headers: a header source's value, the
// body's format for a body source.
func (p *Plugin) billHeaders(s *stream) {
	b := s.bill
	var mode usage.Mode
	modeRead := false
	for i := range b.items {
		it := &b.items[i]
		if !it.on {
			continue
		}
		if it.r.cost.resp.Count != nil {
			p.billCount(it) // count.go
			continue
		}
		if it.meter == nil {
			p.billHeader(it, abi.MapResponseHeaders)
			continue
		}
		if !modeRead {
			modeRead = true
			if ct, st := p.host.GetHeader(abi.MapResponseHeaders, hdrContentType); st == abi.StatusOK {
				mode = usage.ModeFor(unsafeString(ct))
			}
		}
		it.meter.Start(mode)
		b.body = b.body || mode != usage.ModeNone
	}
}

func (p *Plugin) billHeader(it *billItem, mt abi.MapType) {
	if it.found || it.r.cost.resp.Header == "" {
		return
	}
	if v, st := p.host.GetHeader(mt, it.r.cost.resp.Header); st == abi.StatusOK {
		if n, ok := wholeNumber(v, algorithms.MaxSettle); ok {
			it.actual, it.found = n, true
		}
	}
}

// billBody reads a chunk of a settling stream's response body.
func (p *Plugin) billBody(s *stream, size int) {
	if size <= 0 {
		return
	}
	chunk, st := p.host.GetBuffer(abi.BufferResponseBody, 0, size)
	if st != abi.StatusOK {
		return
	}
	for i := range s.bill.items {
		if it := &s.bill.items[i]; it.on && it.meter != nil {
			it.meter.Write(chunk)
		}
	}
}

// billTrailers reads a header source from the response trailers.
func (p *Plugin) billTrailers(s *stream) {
	for i := range s.bill.items {
		if it := &s.bill.items[i]; it.on && it.meter == nil {
			p.billHeader(it, abi.MapResponseTrailers)
		}
	}
}

// settle settles a stream's bill when the stream ends (proxy_on_done or
// proxy_on_delete) and frees it.
func (p *Plugin) settle(s *stream) {
	b := s.bill
	s.bill = nil
	now := p.host.Now()
	for i := range b.items {
		it := &b.items[i]
		if !it.on {
			continue
		}
		c := it.r.cost
		if it.meter != nil {
			if res := it.meter.Finish(); res.Seen {
				it.actual, it.found = min(res.Cost, algorithms.MaxSettle), true
			}
		}
		var delta int64
		switch {
		case it.found:
			delta = it.actual - it.reserved
		case c.noUsage == config.NoUsageRefund:
			delta = -it.reserved
			p.host.IncrementMetric(c.m.noUsage, 1)
		default:
			p.host.IncrementMetric(c.m.noUsage, 1)
		}
		delta = max(min(delta, algorithms.MaxSettle), -algorithms.MaxSettle)
		if c.refunder != nil {
			delta = p.giveBackItem(it, delta, now) // count_window.go
		} else if delta != 0 && it.remote {
			p.remote.sendSettle(it.ri, it.key, delta, now)
		} else if delta != 0 {
			var err error
			if delta, err = p.settleOn(it.r, it.by, it.hash, delta, now); err != nil {
				p.storeFailed(it.r, err)
				continue
			}
		}
		p.host.IncrementMetric(c.m.settled, 1)
		if delta < 0 {
			p.host.IncrementMetric(c.m.refunded, -delta)
		} else if delta > 0 {
			p.host.IncrementMetric(c.m.excess, delta)
		}
	}
	p.freeBill(b)
}

// settleOn applies delta to the key hash of rule r on its shared-data slot in st
// (the rule's store, or a remote rule's local fallback), with compare-and-swap
// (deciding again after a lost race), and returns the delta applied: a charge
// deeper than a state can hold charges the deepest debt instead
// (algorithms.SettleCapped: a century's wait), never nothing.
func (p *Plugin) settleOn(r *rule, st *slotStore, hash uint64, delta, now int64) (int64, error) {
	settler := r.cost.settler
	if st != r.store {
		s, ok := algorithms.AsSettler(st.lim)
		if !ok {
			return 0, errors.New("the local fallback cannot settle a cost")
		}
		settler = s
	}
	var e entry
	for i := 0; i < MaxCASRetries; i++ {
		if err := st.load(hash, now, &e); err != nil {
			return 0, err
		}
		ns, applied, err := algorithms.SettleCapped(settler, st.stateBuf(), e.state, now, delta)
		if err != nil && errors.Is(err, algorithms.ErrCorruptState) {
			ns, applied, err = algorithms.SettleCapped(settler, st.stateBuf(), nil, now, delta)
		}
		if err != nil {
			return 0, err
		}
		if len(ns) == 0 {
			return applied, nil // a refund to a key that is fresh again: nothing to write
		}
		ok, err := st.store(&e, ns)
		if err != nil || ok {
			return applied, err
		}
	}
	return 0, errCASExhausted
}
