package rls

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/rlswire"
)

// IsInline reports whether d is an inline (sluice) descriptor: its first
// entry's key is sluice.rule.
func IsInline(d *ratelimitv3.RateLimitDescriptor) bool {
	e := d.GetEntries()
	return len(e) > 0 && e[0].GetKey() == rlswire.Rule
}

// inline is a parsed inline descriptor.
type inline struct {
	rule   string
	kind   algorithms.Kind
	params algorithms.Params // normalised by algorithms.New
	key    string            // the filter's (escaped) key, opaque
	refund bool
	stamp  int64 // refund, return
	ref    int64
	// A lease call (sluice.lease: acquire n; sluice.return: give back n).
	lease, ret bool
	n, inst    int64
	// A shaped decision (sluice.max_delay_us): the longest wait for a slot.
	maxDelay time.Duration
	// A settlement (sluice.settle): actual − reserved, not zero.
	settle int64
}

// leaseCall reports whether the descriptor is a lease acquire or return.
func (in *inline) leaseCall() bool { return in.lease || in.ret }

// inlineError is a malformed inline descriptor: gRPC INVALID_ARGUMENT.
type inlineError struct {
	desc, entry int
	name, msg   string
}

func (e *inlineError) Error() string {
	if e.entry < 0 {
		return fmt.Sprintf("descriptor %d: %s", e.desc, e.msg)
	}
	return fmt.Sprintf("descriptor %d: entry %d (%s): %s", e.desc, e.entry, e.name, e.msg)
}

// parseInline parses descriptor i, whose first entry is sluice.rule. It
// re-validates the parameters as the filter did: algorithms.New's bounds
// and config.RedisParams (the scripts' exactness bounds).
func parseInline(i int, d *ratelimitv3.RateLimitDescriptor) (*inline, error) {
	es := d.GetEntries()
	if n := len(es); n != rlswire.FixedEntries && n != rlswire.FixedEntries+1 {
		return nil, &inlineError{desc: i, entry: -1, msg: "an inline descriptor has 6 entries (7 for a refund, a lease, a return, a max delay or a settlement), not " + strconv.Itoa(n) +
			"; the order is " + strings.Join(rlswire.Fixed[:], ", ") + " and then " + rlswire.Optional}
	}
	if d.GetLimit() != nil {
		return nil, &inlineError{desc: i, entry: -1, msg: "an inline descriptor carries its limit in its entries; a limit override is not allowed"}
	}
	for j, e := range es {
		if j == rlswire.FixedEntries {
			if k := e.GetKey(); k != rlswire.Refund && k != rlswire.Lease && k != rlswire.Return && k != rlswire.MaxDelayUS && k != rlswire.Settle {
				return nil, &inlineError{desc: i, entry: j, name: strconv.Quote(k), msg: "expected " + rlswire.Optional + " here"}
			}
			break
		}
		if e.GetKey() != rlswire.Fixed[j] {
			return nil, &inlineError{desc: i, entry: j, name: strconv.Quote(e.GetKey()), msg: "expected " + rlswire.Fixed[j] + " here"}
		}
	}
	p := inlineParser{i: i, es: es}
	in, err := p.fixed()
	if err != nil || len(es) == rlswire.FixedEntries {
		return in, err
	}
	if err := p.optional(in); err != nil {
		return nil, err
	}
	return in, nil
}

// inlineParser reads the entries es of inline descriptor i, whose keys
// are checked.
type inlineParser struct {
	i  int
	es []*ratelimitv3.RateLimitDescriptor_Entry
}

// bad is the error of entry j.
func (p inlineParser) bad(j int, msg string) error {
	name := rlswire.Fixed[min(j, rlswire.FixedEntries-1)]
	if j == rlswire.FixedEntries {
		name = p.es[j].GetKey()
	}
	return &inlineError{desc: p.i, entry: j, name: name, msg: msg}
}

// num is entry j's value, a decimal integer >= min written without a sign
// or leading zeros.
func (p inlineParser) num(j int, min int64) (int64, error) {
	s := p.es[j].GetValue()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < min || (len(s) > 1 && s[0] == '0') || s[0] == '+' {
		return 0, p.bad(j, "must be a decimal integer >= "+strconv.FormatInt(min, 10)+", not "+strconv.Quote(s))
	}
	return n, nil
}

// fixed reads the six fixed entries: the rule, its algorithm and
// parameters, and the key.
func (p inlineParser) fixed() (*inline, error) {
	es := p.es
	in := &inline{rule: es[0].GetValue(), key: es[5].GetValue()}
	if msg := config.CheckRuleID(in.rule); msg != "" {
		return nil, p.bad(0, "rule name "+msg)
	}
	k, ok := algorithms.ParseKind(es[1].GetValue())
	if !ok {
		return nil, p.bad(1, "unknown algorithm "+strconv.Quote(es[1].GetValue()))
	}
	in.kind = k
	limit, err := p.num(2, 1)
	if err != nil {
		return nil, err
	}
	wus, err := p.num(3, 1)
	if err != nil {
		return nil, err
	}
	if wus > int64(algorithms.MaxWindow/time.Microsecond) {
		return nil, p.bad(3, "window longer than "+algorithms.MaxWindow.String())
	}
	burst, err := p.num(4, 0)
	if err != nil {
		return nil, err
	}
	if burst != 0 && k != algorithms.TokenBucket && k != algorithms.LeakyBucket {
		return nil, p.bad(4, "must be 0 for "+k.String()+" (only token_bucket and leaky_bucket have a burst)")
	}
	lim, err := algorithms.New(k, algorithms.Params{Limit: limit, Window: time.Duration(wus) * time.Microsecond, Burst: burst})
	if err != nil {
		return nil, &inlineError{desc: p.i, entry: -1, msg: err.Error()}
	}
	in.params = lim.Params()
	if err := config.RedisParams(k, in.params); err != nil {
		return nil, &inlineError{desc: p.i, entry: -1, msg: err.Error()}
	}
	return in, nil
}

// optional reads the seventh entry into in: a max delay, a settlement, a
// refund, a lease or a return.
func (p inlineParser) optional(in *inline) error {
	const j = rlswire.FixedEntries
	e, k := p.es[j], in.kind
	switch e.GetKey() {
	case rlswire.MaxDelayUS:
		if k != algorithms.TokenBucket && k != algorithms.LeakyBucket {
			return p.bad(j, "applies only to token_bucket and leaky_bucket, not "+k.String())
		}
		us, err := p.num(j, 1)
		if err != nil {
			return err
		}
		if us > rlswire.MaxDelayLimitUS {
			return p.bad(j, "must be at most "+strconv.Itoa(rlswire.MaxDelayLimitUS)+" (one minute), not "+strconv.FormatInt(us, 10))
		}
		in.maxDelay = time.Duration(us) * time.Microsecond
		return nil
	case rlswire.Settle:
		if ok, why := algorithms.Settles(k); !ok {
			return p.bad(j, why)
		}
		if in.params.Limit > int64(in.params.Window/time.Microsecond) {
			return p.bad(j, "settles only at a rate of at most one cost unit per microsecond (limit <= window in µs)")
		}
		d, ok := rlswire.ParseDelta(e.GetValue())
		if !ok {
			return p.bad(j, "must be a non-zero decimal integer of at most "+strconv.FormatInt(rlswire.MaxSettle, 10)+" in magnitude, not "+strconv.Quote(e.GetValue()))
		}
		in.settle = d
		return nil
	}
	s := e.GetValue()
	x, y, ok := rlswire.ParsePair(s)
	switch e.GetKey() {
	case rlswire.Refund:
		if !ok {
			return p.bad(j, "must be <stamp>:<ref> (two non-negative decimal integers), not "+strconv.Quote(s))
		}
		in.refund, in.stamp, in.ref = true, x, y
	case rlswire.Lease:
		if !ok || x < 1 || y < 1 || y > config.MaxRedisInstances {
			return p.bad(j, "must be <n>:<instances> (n >= 1, instances 1.."+strconv.Itoa(config.MaxRedisInstances)+"), not "+strconv.Quote(s))
		}
		in.lease, in.n, in.inst = true, x, y
	case rlswire.Return:
		if !ok || x < 1 {
			return p.bad(j, "must be <n>:<stamp> (n >= 1, stamp >= 0), not "+strconv.Quote(s))
		}
		in.ret, in.n, in.stamp = true, x, y
	}
	if !in.leaseCall() {
		return nil
	}
	if !redisrl.LeaseSupported(k) {
		return p.bad(j, "leases apply only to token_bucket and fixed_window, not "+k.String())
	}
	capacity := in.params.Limit
	if k == algorithms.TokenBucket && in.params.Burst > 0 {
		capacity = in.params.Burst
	}
	if in.n > capacity {
		return p.bad(j, "n ("+strconv.FormatInt(in.n, 10)+") must not exceed the capacity ("+strconv.FormatInt(capacity, 10)+")")
	}
	return nil
}

// leaseRequest is the lease script's call of a lease descriptor of domain.
func (in *inline) leaseRequest(domain string) *redisrl.LeaseRequest {
	return &redisrl.LeaseRequest{Kind: in.kind, Params: in.params, Key: redisrl.AppendLeaseKey(nil, in.kind, domain+"/"+in.rule, in.key),
		N: in.n, Instances: max(in.inst, 1), Return: in.ret, Stamp: in.stamp}
}
