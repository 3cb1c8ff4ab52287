package filter

import (
	"encoding/binary"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Plans and overrides (config.LimitTable): a rule's parameters for the current request come
// from the override its value has, else its plan, else the rule itself. The choice is made
// with the key (keyFor) and held in rule.plan for the request; the key's state is the same
// slot whatever its plan, so a client whose plan changes is decided with the new parameters
// from its next request on, and nobody else's state moves. The choice is one map lookup per
// table on bytes the host returned: no allocation.

// planFor returns the entry of the current request under r's tables; nil: r's own
// parameters.
func (p *Plugin) planFor(r *rule) *config.PlanEntry {
	rc := r.cfg
	if o := rc.Overrides; o != nil {
		if v, ok := p.selectorValue(&o.By); ok {
			if e := o.Entries[unsafeString(v)]; e != nil {
				return e
			}
		}
	}
	if pl := rc.Plans; pl != nil {
		v, ok := p.selectorValue(&pl.By)
		return pl.Lookup(v, ok)
	}
	return nil
}

// selectorValue returns the value a table's "by" names for the current request: a header's
// value, a query parameter's (decoded), a cookie's, a metadata field's or attribute's bytes.
// false when the request has none or it is empty.
func (p *Plugin) selectorValue(k *config.KeyPart) ([]byte, bool) {
	switch {
	case k.Header != "":
		v, st := p.host.GetHeader(abi.MapRequestHeaders, k.Header)
		return v, st == abi.StatusOK && len(v) > 0
	case k.Query != "":
		v, ok := queryParam(p.req.getPath(), k.Query)
		if !ok {
			return nil, false
		}
		p.selBuf = appendUnescaped(p.selBuf[:0], v)
		_, n := binary.Uvarint(p.selBuf)
		return p.selBuf[n:], len(p.selBuf) > n
	case k.Cookie != "":
		return cookieValue(p.req.getCookie(), k.Cookie)
	case !k.Value.IsZero():
		return p.req.value(k.Value.Prop)
	}
	return nil, false
}

// limiterFor is the limiter r decides the current request with on its own store: its
// plan's, or the store's.
func limiterFor(r *rule) algorithms.Limiter {
	if r.plan != nil && r.by == r.store {
		return r.plan.Limiter
	}
	return r.by.lim
}

// policyFor is the RateLimit-Policy value of r under plan: r's own, or formatted into p.vals
// for a plan ("name";q=LIMIT;w=WINDOW).
func (p *Plugin) policyFor(r *rule, plan *config.PlanEntry) []byte {
	if plan == nil {
		return r.policy
	}
	s := len(p.vals)
	p.vals = append(p.vals, r.quoted...)
	p.vals = append(p.vals, ";q="...)
	p.vals = appendInt(p.vals, plan.Params.Limit)
	p.vals = append(p.vals, ";w="...)
	p.vals = appendInt(p.vals, max(ceilSeconds(plan.Params.Window), 1))
	e := len(p.vals)
	return p.vals[s:e:e]
}
