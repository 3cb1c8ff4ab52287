package config

import (
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Concurrency is what a rule with "algorithm": "concurrency" has besides
// its limit: the most requests of one key in flight at once (Rule.Limit),
// acquired at admission and given back when the request's stream ends.
type Concurrency struct {
	// RetryAfter is the Retry-After a refusal carries ("retry_after",
	// default DefaultConcurrencyRetryAfter): when a slot frees is unknown,
	// so it is a hint the operator chooses.
	RetryAfter time.Duration
}

// DefaultConcurrencyRetryAfter is a concurrency rule's retry_after when
// omitted.
const DefaultConcurrencyRetryAfter = time.Second

// IsConcurrency reports whether r limits requests in flight rather than a
// rate.
func (r *Rule) IsConcurrency() bool { return r.Concurrency != nil }

// concurrencyAlgorithm reports whether a rule's "algorithm" field is
// "concurrency".
func concurrencyAlgorithm(f map[string]jsonv.Value) bool {
	x, ok := f["algorithm"]
	return ok && x.Type == jsonv.KindString && x.Str == algorithms.Concurrency.String()
}

// concurrencyRule reads the fields of a concurrency rule that a rate rule
// reads differently (name, match, key and missing_key are read already):
// limit, retry_after, backend, mode, max_keys and delay; window, burst,
// lease and cost are refused.
func (p *parser) concurrencyRule(path string, v jsonv.Value, f map[string]jsonv.Value, r *Rule) {
	r.Algorithm = algorithms.Concurrency
	c := &Concurrency{RetryAfter: DefaultConcurrencyRetryAfter}
	good := true
	for _, name := range []string{"window", "burst", "lease", "cost", "count", "plans", "overrides"} {
		if x, ok := f[name]; ok {
			p.fail(x, path+"."+name, concurrencyRefusal[name])
			good = false
		}
	}
	if x, ok := f["limit"]; ok {
		if n, ok := p.integer(path+".limit", x, 1, MaxLimit); ok {
			r.Limit, r.Burst = n, n
		} else {
			good = false
		}
	} else {
		p.failEnd(v, path+".limit", "is required")
		good = false
	}
	if x, ok := f["retry_after"]; ok {
		if d, ok := p.duration(path+".retry_after", x); ok {
			c.RetryAfter = d
		} else {
			good = false
		}
	}
	if x, ok := f["backend"]; ok {
		if i, ok := p.enum(path+".backend", x, backendNames[:]); !ok {
			good = false
		} else {
			r.Backend = Backend(i)
		}
	}
	if _, ok := f["delay"]; ok && r.Backend != BackendLocal {
		p.fail(f["delay"], path+".delay", `does not apply to a concurrency rule on backend "`+r.Backend.String()+`": requests queue on one proxy only`)
		good = false
	}
	if x, ok := f["mode"]; ok {
		if i, ok := p.enum(path+".mode", x, modeNames[:]); ok {
			r.Mode = Mode(i)
		}
	}
	if x, ok := f["max_keys"]; ok {
		if n, ok := p.integer(path+".max_keys", x, 1, MaxMaxKeys); ok {
			r.MaxKeys = int(n)
		}
	}
	if x, ok := f["delay"]; ok && r.Backend == BackendLocal {
		good = p.concurrencyDelay(path+".delay", x, r) && good
	}
	r.Concurrency = c
	if !good {
		return
	}
	l, err := algorithms.NewConcurrency(r.Limit, c.RetryAfter)
	if err != nil {
		p.paramError(path, v, err, "")
		return
	}
	r.Limiter = l
}

// concurrencyDelay reads a concurrency rule's "delay": a refused request
// waits up to max for a slot of its key, in a queue of at most max_held
// requests per worker.
func (p *parser) concurrencyDelay(path string, v jsonv.Value, r *Rule) bool {
	d, good, ok := p.delayObject(path, v, "queued")
	if !ok {
		return false
	}
	if r.Mode == ModeShadow {
		p.fail(v, path, `does not apply in mode "shadow": a shadow rule lets every request through at once, so it has nothing to queue`)
		good = false
	}
	if good {
		r.Delay = d
	}
	return good
}

var concurrencyRefusal = map[string]string{
	"window":    `does not apply to "concurrency": an in-flight limit has no window (a slot is held until the request ends)`,
	"burst":     `does not apply to "concurrency": the limit is the most requests in flight at once`,
	"lease":     `does not apply to "concurrency"`,
	"cost":      `does not apply to "concurrency": each request holds one slot`,
	"count":     `does not apply to "concurrency": a slot is held while the request is in flight, whatever its response`,
	"plans":     `does not apply to "concurrency" (plans and overrides give rate limits)`,
	"overrides": `does not apply to "concurrency" (plans and overrides give rate limits)`,
}

// concurrencySummary writes what `sluice check` says of a concurrency
// rule after its limit: " in flight retry_after=D".
func (r *Rule) concurrencySummary(b *strings.Builder) {
	b.WriteString(" in flight, retry_after=")
	b.WriteString(FormatDuration(r.Concurrency.RetryAfter))
}
