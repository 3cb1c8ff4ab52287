package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Count is a rule's "count": the rule charges a request only when its response matches
// (a failed login: status 401 or 403). It is built on the reserve-and-settle machinery of
// "cost" (filter/cost.go): the request reserves its cost at its headers — refused while
// the key has no room, so a client locked out stays out — and when the response comes it
// either stands (the response matches) or is refunded. A stream that ends without a
// response (reset, timeout, client gone) keeps its reservation: an attacker cannot escape
// the count by cutting the connection.
type Count struct {
	// statuses has bit s set for each status s (100..599) that matches; all zero: any
	// status.
	statuses [10]uint64
	// Codes are the "status" entries as written ("401", "5xx"), for the summary.
	Codes []string
	// Header, when set, must be present in the response (non-empty), or equal to
	// HeaderExact when HeaderHasExact.
	Header         string
	HeaderExact    string
	HeaderHasExact bool
}

// MatchesStatus reports whether status is one of the counted ones (any, without
// "status").
func (c *Count) MatchesStatus(status int) bool {
	if c.Codes == nil {
		return true
	}
	if status < 0 || status >= 640 {
		return false
	}
	return c.statuses[status/64]&(1<<(status%64)) != 0
}

// MatchesHeader reports whether the header condition holds for a response header value
// (ok: the response has it).
func (c *Count) MatchesHeader(v []byte, ok bool) bool {
	if c.Header == "" {
		return true
	}
	if c.HeaderHasExact {
		return ok && string(v) == c.HeaderExact
	}
	return ok && len(v) > 0
}

func (c *Count) set(s int) { c.statuses[s/64] |= 1 << (s % 64) }

// String is "count=status:401,403 header:x-login=\"failed\"".
func (c *Count) String() string {
	var parts []string
	if c.Codes != nil {
		parts = append(parts, "status:"+strings.Join(c.Codes, ","))
	}
	if c.Header != "" {
		h := "header:" + c.Header
		if c.HeaderHasExact {
			h += "=" + strconv.Quote(c.HeaderExact)
		}
		parts = append(parts, h)
	}
	return "count=" + strings.Join(parts, "+")
}

var (
	countFields       = []string{"status", "header"}
	countHeaderFields = []string{"name", "exact"}
)

// count reads a rule's "count" and turns it into the rule's cost (reservation: cost.request,
// or 1); refused with a cost.response, on an algorithm that cannot settle, with delay or
// lease.
func (p *parser) count(path string, v jsonv.Value, r *Rule, algOK bool) {
	f, ok := p.object(path, v, countFields)
	if !ok {
		return
	}
	c := &Count{}
	good := true
	if x, ok := f["status"]; ok {
		good = p.countStatuses(path+".status", x, c) && good
	}
	if x, ok := f["header"]; ok {
		if hf, ok := p.object(path+".header", x, countHeaderFields); ok {
			if n, ok := hf["name"]; ok {
				c.Header, ok = p.headerName(path+".header.name", n)
				good = good && ok
			} else {
				p.failEnd(x, path+".header.name", "is required")
				good = false
			}
			if e, ok := hf["exact"]; ok {
				c.HeaderExact, c.HeaderHasExact = p.str(path+".header.exact", e)
				good = good && c.HeaderHasExact
			}
		} else {
			good = false
		}
	}
	if len(f) == 0 {
		p.failEnd(v, path, `needs "status" or "header": what a counted response is`)
		good = false
	}
	if algOK {
		good = p.countAlgorithm(path, v, r) && good
	}
	if r.Cost != nil && r.Cost.Response != nil {
		p.fail(v, path, `does not apply with "cost.response": the response either costs the reservation or nothing`)
		good = false
	}
	if r.Delay.Max > 0 || r.Lease > 0 {
		p.fail(v, path, `does not apply with "delay" or "lease"`)
		good = false
	}
	if !good {
		return
	}
	if r.Cost == nil {
		r.Cost = &Cost{Request: CostSource{Fixed: 1}}
	}
	r.Cost.Response = &CostResponse{Count: c, Divisor: 1}
}

// countAlgorithm checks that r's algorithm can take back a response that does not count:
// a bucket settles (its rate permitting), fixed_window and sliding_window give the
// admission back to its window (algorithms.Refunder) on every backend; sliding_log cannot.
func (p *parser) countAlgorithm(path string, v jsonv.Value, r *Rule) bool {
	if ok, _ := algorithms.Refunds(r.Algorithm); ok {
		return true
	}
	ok, why := algorithms.Settles(r.Algorithm)
	if !ok {
		_, why = algorithms.Refunds(r.Algorithm)
		if r.Algorithm != algorithms.SlidingLog {
			why = "count applies to token_bucket, leaky_bucket, fixed_window and sliding_window, not " + r.Algorithm.String()
		}
	}
	if ok && r.Limit > 0 && r.Window > 0 {
		ok, why = algorithms.SettlesWith(r.Algorithm, algorithms.Params{Limit: r.Limit, Window: r.Window, Burst: r.Burst})
	}
	if ok && r.Backend != BackendLocal && r.Limit > int64(r.Window/time.Microsecond) {
		ok, why = false, `on backend "`+r.Backend.String()+`" a refund needs a rate of at most one unit per microsecond (limit <= window in µs)`
	}
	if !ok {
		p.fail(v, path, "cannot be refunded: "+why)
	}
	return ok
}

// countStatuses reads "status": 1..64 entries, each a status 100..599 or a class "1xx".."5xx".
func (p *parser) countStatuses(path string, v jsonv.Value, c *Count) bool {
	items, ok := p.boundedArray(path, v, 64, "entries", "must not be empty (omit it to count any status)")
	if !ok {
		return false
	}
	good := true
	for i, it := range items {
		ip := path + "[" + strconv.Itoa(i) + "]"
		if it.Type == jsonv.KindNumber {
			n, ok := p.integer(ip, it, 100, 599)
			if ok {
				c.set(int(n))
				c.Codes = append(c.Codes, strconv.FormatInt(n, 10))
			}
			good = good && ok
			continue
		}
		s, ok := p.str(ip, it)
		if ok && len(s) == 3 && s[0] >= '1' && s[0] <= '5' && s[1:] == "xx" {
			base := int(s[0]-'0') * 100
			for k := base; k < base+100; k++ {
				c.set(k)
			}
			c.Codes = append(c.Codes, s)
			continue
		}
		if ok {
			p.fail(it, ip, show(it)+` is not a status (100..599) or a class ("4xx")`)
		}
		good = false
	}
	return good
}
