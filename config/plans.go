package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Plans and overrides: a rule's limit, window and burst from a table keyed by a value of the
// request (a plan name in the client's token, an API key). The most specific wins: an
// override for the request's value, else its plan (or the plans' default), else the rule's
// own parameters. Every entry is compiled into its own limiter at parse time; a request looks
// its value up in a map (constant time, no allocation).

// LimitTable is a rule's "plans" or "overrides".
type LimitTable struct {
	// By is where the request's value comes from: one key-part source (header, query,
	// cookie, metadata, attribute).
	By KeyPart
	// Entries maps a value to its parameters.
	Entries map[string]*PlanEntry
	// Default is the entry of a request whose value is missing or not in Entries ("plans"
	// only, optional: without it such a request gets the rule's own parameters).
	Default *PlanEntry
}

// PlanEntry is one set of parameters of a table.
type PlanEntry struct {
	Name    string // the value, as in the table ("pro", an API key)
	Params  algorithms.Params
	Limiter algorithms.Limiter
	// Override is true for an entry of "overrides".
	Override bool
}

// Lookup returns the entry of value v, or t's Default.
func (t *LimitTable) Lookup(v []byte, ok bool) *PlanEntry {
	if t == nil {
		return nil
	}
	if ok {
		if e := t.Entries[string(v)]; e != nil {
			return e
		}
	}
	return t.Default
}

// Bounds of the tables.
const (
	MaxTableEntries = 1_000_000
	MaxTableValue   = 4096 // bytes of a value
)

var (
	tableFields     = []string{"by", "values", "default"}
	planEntryFields = []string{"limit", "window", "burst"}
	selectorFields  = []string{"header", "query", "cookie", "metadata", "attribute"}
)

// limitTables reads a rule's "plans" and "overrides" (f: the rule's fields), once the
// rule's own parameters are known (r.Limiter set when they are good).
func (p *parser) limitTables(path string, f map[string]jsonv.Value, r *Rule) {
	for _, name := range []string{"plans", "overrides"} {
		x, ok := f[name]
		if !ok {
			continue
		}
		if r.Cost != nil || r.Delay.Max > 0 || r.Lease > 0 {
			p.fail(x, path+"."+name, `does not apply with "cost", "count", "delay" or "lease"`)
			continue
		}
		t := p.limitTable(path+"."+name, x, r, name == "overrides")
		if name == "plans" {
			r.Plans = t
		} else {
			r.Overrides = t
		}
	}
}

func (p *parser) limitTable(path string, v jsonv.Value, r *Rule, override bool) *LimitTable {
	f, ok := p.object(path, v, tableFields)
	if !ok {
		return nil
	}
	t := &LimitTable{}
	good := true
	if x, ok := f["by"]; ok {
		t.By, ok = p.selector(path+".by", x)
		good = good && ok
	} else {
		p.failEnd(v, path+".by", `is required: where the request's value comes from (e.g. {"header": "x-api-key"})`)
		good = false
	}
	if x, ok := f["values"]; ok {
		t.Entries, ok = p.tableEntries(path+".values", x, r, override)
		good = good && ok
	} else {
		p.failEnd(v, path+".values", "is required")
		good = false
	}
	if x, ok := f["default"]; ok {
		s, ok := p.str(path+".default", x)
		switch {
		case !ok:
			good = false
		case override:
			p.fail(x, path+".default", `applies only to "plans" (a request without an override gets its plan)`)
			good = false
		case t.Entries != nil && t.Entries[s] == nil:
			p.fail(x, path+".default", show(x)+` is not one of "values"`)
			good = false
		default:
			t.Default = t.Entries[s]
		}
	}
	if !good {
		return nil
	}
	return t
}

// selector reads a table's "by": one source, as a key part names it.
func (p *parser) selector(path string, v jsonv.Value) (KeyPart, bool) {
	var k KeyPart
	f, ok := p.object(path, v, selectorFields)
	if !ok {
		return k, false
	}
	if len(f) != 1 {
		p.failEnd(v, path, `needs exactly one of "header", "query", "cookie", "metadata", "attribute"`)
		return k, false
	}
	good := true
	if x, ok := f["header"]; ok {
		k.Header, good = p.headerName(path+".header", x)
	}
	if x, ok := f["query"]; ok {
		s, ok := p.str(path+".query", x)
		if ok && (s == "" || len(s) > MaxNameLen || hasSpaceOrControl(s) || strings.ContainsAny(s, "&=#?")) {
			p.fail(x, path+".query", show(x)+" is not a query parameter name")
			ok = false
		}
		k.Query, good = s, ok
	}
	if x, ok := f["cookie"]; ok {
		s, ok := p.str(path+".cookie", x)
		if ok && (!isToken(s) || len(s) > MaxNameLen) {
			p.fail(x, path+".cookie", show(x)+" is not a cookie name")
			ok = false
		}
		k.Cookie, good = s, ok
	}
	good = p.keyValueSource(path, f, &k) && good
	return k, good
}

// tableEntries reads "values": each member a value and its parameters — a number (the
// limit) or {"limit", "window", "burst"}, each defaulting to the rule's. Entries with the same
// parameters share one limiter.
func (p *parser) tableEntries(path string, v jsonv.Value, r *Rule, override bool) (map[string]*PlanEntry, bool) {
	if !v.IsObject() {
		p.fail(v, path, show(v)+" is not an object")
		return nil, false
	}
	m := make(map[string]*PlanEntry)
	shared := make(map[algorithms.Params]algorithms.Limiter)
	good, n := true, 0
	v.ForEach(func(k, x jsonv.Value) bool {
		n++
		name := k.String()
		ip := fieldPath(path, name)
		if n > MaxTableEntries {
			if n == MaxTableEntries+1 {
				p.fail(k, path, "has more than "+strconv.Itoa(MaxTableEntries)+" entries")
			}
			good = false
			return true
		}
		if name == "" || len(name) > MaxTableValue {
			p.fail(k, ip, "a value must be 1.."+strconv.Itoa(MaxTableValue)+" bytes")
			good = false
			return true
		}
		if m[name] != nil {
			p.fail(k, ip, "duplicate value")
			good = false
			return true
		}
		e := &PlanEntry{Name: name, Override: override}
		if !p.tableEntry(ip, x, r, e, shared) {
			good = false
			return true
		}
		m[name] = e
		return true
	})
	if n == 0 {
		p.fail(v, path, "must not be empty")
		good = false
	}
	return m, good
}

// tableEntry reads one entry's parameters and builds (or shares) its limiter.
func (p *parser) tableEntry(ip string, x jsonv.Value, r *Rule, e *PlanEntry, shared map[algorithms.Params]algorithms.Limiter) bool {
	par := algorithms.Params{Limit: r.Limit, Window: r.Window, Burst: r.Burst}
	burstGiven := false
	if x.Type == jsonv.KindNumber {
		n, ok := p.integer(ip, x, 1, MaxLimit)
		if !ok {
			return false
		}
		par.Limit = n
	} else {
		f, ok := p.object(ip, x, planEntryFields)
		if !ok {
			return false
		}
		if len(f) == 0 {
			p.failEnd(x, ip, `needs "limit", "window" or "burst"`)
			return false
		}
		good := true
		if y, ok := f["limit"]; ok {
			par.Limit, ok = p.integer(ip+".limit", y, 1, MaxLimit)
			good = good && ok
		}
		if y, ok := f["window"]; ok {
			var d time.Duration
			d, ok = p.duration(ip+".window", y)
			par.Window = d
			good = good && ok
		}
		if y, ok := f["burst"]; ok {
			if r.Algorithm != algorithms.TokenBucket && r.Algorithm != algorithms.LeakyBucket {
				p.fail(y, ip+".burst", "applies only to token_bucket and leaky_bucket, not "+r.Algorithm.String())
				good = false
			} else {
				par.Burst, ok = p.integer(ip+".burst", y, 1, MaxLimit)
				burstGiven = true
				good = good && ok
			}
		}
		if !good {
			return false
		}
	}
	if !burstGiven && r.Burst == r.Limit {
		par.Burst = par.Limit // the rule's burst defaulted to its limit: so does the entry's
	}
	if r.Algorithm != algorithms.TokenBucket && r.Algorithm != algorithms.LeakyBucket {
		par.Burst = par.Limit
	}
	e.Params = par
	if r.Limiter == nil {
		return true // the rule's own parameters are wrong: reported there
	}
	if l, ok := shared[par]; ok {
		e.Limiter = l
		return true
	}
	l, err := algorithms.New(r.Algorithm, par)
	if err != nil {
		p.paramError(ip, x, err, "")
		return false
	}
	shared[par] = l
	e.Limiter = l
	return true
}

// tableString describes a table as in a Summary: "plans=metadata:ns:payload.plan(3,default=free)".
func (t *LimitTable) tableString(name string) string {
	s := name + "=" + t.By.String() + "(" + strconv.Itoa(len(t.Entries))
	if t.Default != nil {
		s += ",default=" + plainText(t.Default.Name, 64)
	}
	return s + ")"
}
