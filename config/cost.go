package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Cost is a rule's "cost": what a request reserves before it goes upstream
// and, for token budgets, what its response says it cost (the rule then
// settles: the difference is refunded, or charged if the response cost
// more; filter/cost.go). A rule without "cost" costs 1 per request.
type Cost struct {
	Request CostSource
	// Response is nil when the reservation is the cost (no settlement).
	Response *CostResponse
	// NoUsage is what settles a response that ends without saying what
	// it cost (client gone, upstream reset, no usage in the body).
	NoUsage NoUsage
}

// CostSource is where a request's reservation comes from: Fixed, or a
// request header, query parameter or field of the JSON request body, with
// Default when that is absent, not an integer or below 1.
type CostSource struct {
	Fixed   int64
	Header  string // lower-case
	Query   string
	JSON    string // a dotted path of object keys
	Default int64
	// MaxBody bounds the request body read for JSON (bytes): a body
	// longer than that is decided with what its first MaxBody bytes
	// hold (Default if the field is not among them).
	MaxBody int
	// BodyTimeout bounds the wait for the request body (JSON): a body
	// not in (or not MaxBody bytes long) by then is decided with what
	// has come (Default if the field is not among it). It is also the
	// guard for a host that holds the body with the headers (Envoy
	// without allow_on_headers_stop_iteration): no request waits longer.
	BodyTimeout time.Duration
}

// CostResponse is where a response's cost comes from: one of a response
// header (or trailer), a field of the JSON body (or of each server-sent
// event's data: the last one found), or a provider's usage fields weighted.
type CostResponse struct {
	Header string
	JSON   string
	// Usage is "openai" or "anthropic"; Weights are per UsageFields, the
	// cost ⌈Σ weight × field / Divisor⌉.
	Usage   string
	Weights [len(UsageFields)]int64
	Divisor int64
	// Count, set by a rule's "count" (count.go), makes the cost all or nothing: the
	// reservation when the response matches, else 0.
	Count *Count
}

// UsageFields are the usage fields a "usage" response weighs, in order
// (filter/usage's fields).
var UsageFields = [...]string{"input", "output", "total", "cache_read", "cache_write"}

// UsageProviders are the "usage" formats recognised.
var UsageProviders = [...]string{"openai", "anthropic"}

// NoUsage settles a response without a cost.
type NoUsage uint8

const (
	// NoUsageReservation: the reservation stands (the request cost what it reserved).
	NoUsageReservation NoUsage = iota
	// NoUsageRefund: the reservation is refunded (the request cost nothing).
	NoUsageRefund
)

var noUsageNames = [...]string{NoUsageReservation: "reservation", NoUsageRefund: "refund"}

func (n NoUsage) String() string { return noUsageNames[n] }

// Bounds of "cost".
const (
	DefaultMaxBody     = 64 << 10
	MaxMaxBody         = 1 << 20
	DefaultBodyTimeout = time.Second
	MaxBodyTimeout     = time.Minute
	MaxWeight          = 1 << 32
	maxPathKeys        = 8
	maxPathKey         = 64
)

var (
	costFields         = []string{"request", "response", "no_usage"}
	costSourceFields   = []string{"header", "query", "json", "default", "max_body", "body_timeout"}
	costResponseFields = []string{"header", "json", "usage", "weights", "divisor"}
)

// cost reads a rule's "cost" into r.Cost (nil on an error), refusing it on a
// rule that cannot settle (algOK, backendOK: as for delay). Every backend
// takes a cost: local on shared data, redis in the scripts (the decision's
// cost, a settle op), rls through sluice serve (hits_addend, sluice.settle);
// a remote backend settles at up to one cost unit per µs.
func (p *parser) cost(path string, v jsonv.Value, r *Rule, algOK, backendOK bool) {
	f, ok := p.object(path, v, costFields)
	if !ok {
		return
	}
	c := &Cost{}
	good := true
	if x, ok := f["request"]; ok {
		good = p.costSource(path+".request", x, &c.Request) && good
	} else {
		p.failEnd(v, path+".request", "is required")
		good = false
	}
	if x, ok := f["response"]; ok {
		c.Response = &CostResponse{Divisor: 1}
		good = p.costResponse(path+".response", x, c.Response) && good
	}
	if x, ok := f["no_usage"]; ok {
		if c.Response == nil {
			p.fail(x, path+".no_usage", `applies only with "response": without it the reservation is the cost`)
			good = false
		} else if i, ok := p.enum(path+".no_usage", x, noUsageNames[:]); ok {
			c.NoUsage = NoUsage(i)
		} else {
			good = false
		}
	}
	if r.Lease > 0 {
		p.fail(v, path, `does not apply with "lease": a lease's admissions are spent one unit at a time`)
		good = false
	}
	if c.Response != nil {
		if r.Delay.Max > 0 {
			p.fail(v, path, `"response" does not apply with "delay": a settlement would move the slots of the requests held behind it`)
			good = false
		}
		if algOK {
			ok, why := algorithms.Settles(r.Algorithm)
			if ok && r.Limit > 0 && r.Window > 0 {
				ok, why = algorithms.SettlesWith(r.Algorithm, algorithms.Params{Limit: r.Limit, Window: r.Window, Burst: r.Burst})
			}
			// The remote backends settle in the scripts, on a clock of whole
			// µs: a debt is held exactly at up to one unit per µs.
			if ok && backendOK && r.Backend != BackendLocal && r.Limit > int64(r.Window/time.Microsecond) {
				ok, why = false, r.Algorithm.String()+` settles on backend "`+r.Backend.String()+`" only at a rate of at most one cost unit per microsecond (limit <= window in µs): `+
					"the scripts count time in whole microseconds, so a key in debt could not be held until it is paid back"
			}
			if !ok {
				p.fail(v, path+".response", "cannot be settled: "+why)
				good = false
			}
		}
	}
	if good {
		r.Cost = c
	}
}

func (p *parser) costSource(path string, v jsonv.Value, s *CostSource) bool {
	if v.Type == jsonv.KindNumber {
		n, ok := p.integer(path, v, 1, MaxLimit)
		s.Fixed = n
		return ok
	}
	f, ok := p.object(path, v, costSourceFields)
	if !ok {
		return false
	}
	good := true
	n := 0
	for _, src := range []string{"header", "query", "json"} {
		if _, ok := f[src]; ok {
			n++
		}
	}
	if n != 1 {
		p.failEnd(v, path, `needs exactly one of a number, "header", "query" or "json"`)
		return false
	}
	if x, ok := f["header"]; ok {
		s.Header, ok = p.headerName(path+".header", x)
		good = good && ok
	}
	if x, ok := f["query"]; ok {
		if q, ok := p.str(path+".query", x); ok && q != "" && len(q) <= MaxNameLen && !hasSpaceOrControl(q) && !strings.ContainsAny(q, "&=#?") {
			s.Query = q
		} else {
			if ok {
				p.fail(x, path+".query", show(x)+" is not a query parameter name")
			}
			good = false
		}
	}
	if x, ok := f["json"]; ok {
		// Read from the body while the headers wait (filter/bodycost.go).
		s.JSON, ok = p.jsonPath(path+".json", x)
		s.MaxBody, s.BodyTimeout = DefaultMaxBody, DefaultBodyTimeout
		good = good && ok
	}
	if x, ok := f["max_body"]; ok {
		if !f["json"].Exists() {
			p.fail(x, path+".max_body", `applies only with "json"`)
			good = false
		} else if n, ok := p.integer(path+".max_body", x, 1, MaxMaxBody); ok {
			s.MaxBody = int(n)
		} else {
			good = false
		}
	}
	if x, ok := f["body_timeout"]; ok {
		if !f["json"].Exists() {
			p.fail(x, path+".body_timeout", `applies only with "json"`)
			good = false
		} else if d, ok := p.duration(path+".body_timeout", x); ok && d >= time.Millisecond && d <= MaxBodyTimeout {
			s.BodyTimeout = d
		} else {
			if ok {
				p.fail(x, path+".body_timeout", show(x)+" is not between 1ms and 1m")
			}
			good = false
		}
	}
	if x, ok := f["default"]; ok {
		d, ok := p.integer(path+".default", x, 1, MaxLimit)
		s.Default = d
		good = good && ok
	} else {
		p.failEnd(v, path+".default", "is required: the reservation of a request without the value")
		good = false
	}
	return good
}

func (p *parser) costResponse(path string, v jsonv.Value, c *CostResponse) bool {
	f, ok := p.object(path, v, costResponseFields)
	if !ok {
		return false
	}
	n := 0
	for _, src := range []string{"header", "json", "usage"} {
		if _, ok := f[src]; ok {
			n++
		}
	}
	if n != 1 {
		p.failEnd(v, path, `needs exactly one of "header", "json" or "usage"`)
		return false
	}
	good := true
	if x, ok := f["header"]; ok {
		c.Header, ok = p.headerName(path+".header", x)
		good = good && ok
	}
	if x, ok := f["json"]; ok {
		c.JSON, ok = p.jsonPath(path+".json", x)
		good = good && ok
	}
	if x, ok := f["usage"]; ok {
		if i, ok := p.enum(path+".usage", x, UsageProviders[:]); ok {
			c.Usage = UsageProviders[i]
			c.Weights = defaultWeights(c.Usage)
		} else {
			good = false
		}
	}
	if x, ok := f["weights"]; ok {
		if c.Usage == "" && !f["usage"].Exists() {
			p.fail(x, path+".weights", `applies only with "usage"`)
			good = false
		} else if wf, ok := p.object(path+".weights", x, UsageFields[:]); ok {
			var w [len(UsageFields)]int64
			for i, name := range UsageFields {
				if y, ok := wf[name]; ok {
					n, ok := p.integer(path+".weights."+name, y, -MaxWeight, MaxWeight)
					w[i] = n
					good = good && ok
				}
			}
			c.Weights = w
		} else {
			good = false
		}
	}
	if x, ok := f["divisor"]; ok {
		if c.Usage == "" && !f["usage"].Exists() {
			p.fail(x, path+".divisor", `applies only with "usage"`)
			good = false
		} else if d, ok := p.integer(path+".divisor", x, 1, MaxWeight); ok {
			c.Divisor = d
		} else {
			good = false
		}
	}
	return good
}

// defaultWeights are a provider's weights when "weights" is omitted: every
// token once (OpenAI's total; Anthropic's input, output and cache tokens,
// which it reports apart).
func defaultWeights(provider string) (w [len(UsageFields)]int64) {
	switch provider {
	case "openai":
		w[2] = 1
	case "anthropic":
		w[0], w[1], w[3], w[4] = 1, 1, 1, 1
	}
	return w
}

// jsonPath accepts a dotted path of 1..8 object keys of 1..64 bytes of printable ASCII
// (no array indices), as filter/usage compiles it (filter's TestCostPathsCompile holds
// the two to the same paths).
func (p *parser) jsonPath(path string, v jsonv.Value) (string, bool) {
	s, ok := p.str(path, v)
	if !ok {
		return "", false
	}
	keys := strings.Split(s, ".")
	bad := ""
	switch {
	case len(keys) > maxPathKeys:
		bad = "has more than " + strconv.Itoa(maxPathKeys) + " keys"
	case strings.ContainsAny(s, "[]"):
		bad = "has an array index: a path names object keys only"
	case strings.IndexFunc(s, func(c rune) bool { return c < 0x20 || c > 0x7e }) >= 0:
		bad = "has a key that is not printable ASCII"
	}
	for _, k := range keys {
		if bad == "" && (k == "" || len(k) > maxPathKey) {
			bad = "has an empty key or one longer than " + strconv.Itoa(maxPathKey) + " bytes"
		}
	}
	if bad != "" {
		p.fail(v, path, show(v)+" "+bad)
		return "", false
	}
	return s, true
}

// String describes c for a rule's summary: "cost=header:x-max-tokens|100
// settle=usage:openai no_usage=reservation".
func (c *Cost) String() string {
	var b strings.Builder
	b.WriteString("cost=")
	s := &c.Request
	switch {
	case s.Header != "":
		b.WriteString("header:" + s.Header + "|" + strconv.FormatInt(s.Default, 10))
	case s.Query != "":
		b.WriteString("query:" + s.Query + "|" + strconv.FormatInt(s.Default, 10))
	case s.JSON != "":
		b.WriteString("json:" + s.JSON + "|" + strconv.FormatInt(s.Default, 10) + " body<=" + strconv.Itoa(s.MaxBody) + "B/" + s.BodyTimeout.String())
	default:
		b.WriteString(strconv.FormatInt(s.Fixed, 10))
	}
	if r := c.Response; r != nil {
		b.WriteString(" settle=")
		switch {
		case r.Count != nil:
			b.WriteString(r.Count.String())
		case r.Header != "":
			b.WriteString("header:" + r.Header)
		case r.JSON != "":
			b.WriteString("json:" + r.JSON)
		default:
			b.WriteString("usage:" + r.Usage + "(")
			first := true
			for i, w := range r.Weights {
				if w == 0 {
					continue
				}
				if !first {
					b.WriteByte('+')
				}
				first = false
				if w != 1 {
					b.WriteString(strconv.FormatInt(w, 10) + "*")
				}
				b.WriteString(UsageFields[i])
			}
			b.WriteByte(')')
			if r.Divisor != 1 {
				b.WriteString("/" + strconv.FormatInt(r.Divisor, 10))
			}
		}
		b.WriteString(" no_usage=" + c.NoUsage.String())
	}
	return b.String()
}
