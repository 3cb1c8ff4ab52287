package filter

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Who is limited, and why (config "access_log", "top_keys", response.rule_header and
// response.format): what a decision leaves where the proxy records requests, and what a
// refused client is told. Everything here hangs off Plugin.obs, nil when the configuration
// asks for none of it, so a configuration without these options pays one pointer test.

// The decisions written for the access log (the attribute sluice.decision).
const (
	DecisionDenied       = "denied"        // refused by an enforcing rule
	DecisionShadowDenied = "shadow_denied" // a shadow rule would have refused it; let through
	DecisionDelayed      = "delayed"       // held until its slot, then let through
	DecisionNearLimit    = "near_limit"    // admitted with at most near_limit_percent left
	DecisionFailedOpen   = "failed_open"   // a rule could not decide; failure_mode let it through
	DecisionFailedClosed = "failed_closed" // a rule could not decide; failure_mode closed refused it
)

// The attributes: NAMESPACE.FIELD, as abi.AttributeSetter takes them. In Envoy's Wasm
// filter they are the filter state objects wasm.sluice.rule, …; in the dynamic module the
// fields of the dynamic metadata namespace sluice.
const (
	AttrRule      = "sluice.rule"
	AttrDecision  = "sluice.decision"
	AttrRemaining = "sluice.remaining"
	AttrLimit     = "sluice.limit"
	AttrKey       = "sluice.key"
	AttrDelayMS   = "sluice.delay_ms"
)

// maxShownKey bounds a raw key as written (longer ones are cut and end with "...").
const maxShownKey = 128

// publicKeySeed seeds the hash of a key shown hashed: fixed, so that the same key reads the
// same in every proxy, in the access log and in top keys (the slot tables' seed is secret).
const publicKeySeed = 0x736c756963652e6b // "sluice.k"

// observe is a Plugin's part for these options.
type observe struct {
	alog   *config.AccessLog // nil: no attributes
	setter abi.AttributeSetter
	attrs  []abi.Header
	buf    []byte // the attributes' values; its capacity is never exceeded

	ruleHeader string           // response.rule_header ("": none)
	tmpl       *config.Template // response body template (nil: response.body as is)
	ctype      []byte           // content type of a refusal
	body       []byte           // a refusal's body, rendered from tmpl

	top *topKeys // nil: no top keys
}

// setupObserve prepares p.obs for cfg (nil when cfg asks for none of these options).
func (p *Plugin) setupObserve(cfg *config.Config) {
	p.obs = nil
	r := &cfg.Response
	if cfg.AccessLog == nil && cfg.TopKeys == nil && r.RuleHeader == "" && r.Template == nil {
		return
	}
	o := &observe{ruleHeader: r.RuleHeader, tmpl: r.Template, ctype: textPlain}
	if r.Template != nil {
		o.ctype = []byte(r.ContentType)
		o.body = make([]byte, 0, len(cfg.Response.Body)+len(config.ProblemJSONTemplate)+256)
	}
	if cfg.AccessLog != nil {
		o.alog = cfg.AccessLog
		o.setter, _ = p.host.(abi.AttributeSetter)
		o.attrs = make([]abi.Header, 0, 6)
		o.buf = make([]byte, 0, 64+3*20+maxShownKey*4+8)
	}
	if cfg.TopKeys != nil {
		o.top = newTopKeys(p, cfg.TopKeys)
	}
	p.obs = o
}

// record writes decision for rule r (its decision r.d) where the proxy records the request.
// delay is the time the request will be held (DecisionDelayed).
func (o *observe) record(r *rule, decision string, delay time.Duration) {
	if o.setter == nil {
		return
	}
	o.buf = o.buf[:0]
	o.attrs = append(o.attrs[:0],
		abi.Header{Name: AttrRule, Value: o.str(r.id)},
		abi.Header{Name: AttrDecision, Value: o.str(decision)},
		abi.Header{Name: AttrRemaining, Value: o.num(max(r.d.Remaining, 0))},
		abi.Header{Name: AttrLimit, Value: o.num(r.d.Limit)})
	if o.alog.Key != config.KeyNone {
		n := len(o.buf)
		o.buf = appendShownKey(o.buf, r.key, o.alog.Key)
		o.attrs = append(o.attrs, abi.Header{Name: AttrKey, Value: o.buf[n:len(o.buf):len(o.buf)]})
	}
	if decision == DecisionDelayed {
		o.attrs = append(o.attrs, abi.Header{Name: AttrDelayMS, Value: o.num(ceilMillis(delay))})
	}
	o.setter.SetAttributes(o.attrs)
}

func (o *observe) str(s string) []byte {
	n := len(o.buf)
	o.buf = append(o.buf, s...)
	return o.buf[n:len(o.buf):len(o.buf)]
}

func (o *observe) num(v int64) []byte {
	n := len(o.buf)
	o.buf = appendInt(o.buf, v)
	return o.buf[n:len(o.buf):len(o.buf)]
}

// nearLimit reports whether d leaves at most pct percent of its capacity.
func nearLimit(remaining, limit int64, pct int) bool {
	if remaining <= 0 {
		return true
	}
	return remaining <= limit*int64(pct)/100
}

// recordAdmitted writes the decision of an admitted request: the first of a shadow
// denial, a failed rule (failure_mode open), a hold (the longest), or the most restrictive
// rule near its limit. Nothing is written for a request far from every limit.
func (p *Plugin) recordAdmitted(best *rule, delay time.Duration) {
	o := p.obs
	var shadow, failed, held *rule
	for _, r := range p.rules {
		switch {
		case !r.applies:
		case r.failed:
			if failed == nil {
				failed = r
			}
		case !r.d.Allowed:
			if shadow == nil {
				shadow = r
			}
		case r.delay != nil && r.d.Delay > 0 && r.d.Delay == delay:
			held = r
		}
	}
	switch {
	case shadow != nil:
		o.record(shadow, DecisionShadowDenied, 0)
	case failed != nil:
		o.record(failed, DecisionFailedOpen, 0)
	case held != nil:
		o.record(held, DecisionDelayed, delay)
	case best != nil && nearLimit(best.d.Remaining, best.d.Limit, o.alog.NearLimitPercent):
		o.record(best, DecisionNearLimit, 0)
	}
}

// appendRefusalExtras appends the rule header of a refusal by r, when configured.
func (o *observe) appendRefusalExtras(dst []abi.Header, r *rule) []abi.Header {
	if o.ruleHeader != "" {
		dst = append(dst, abi.Header{Name: o.ruleHeader, Value: r.quoted[1 : len(r.quoted)-1]})
	}
	return dst
}

// refusalBody renders the body template for a refusal by r with retry seconds to wait.
func (o *observe) refusalBody(r *rule, status int, retry int64) []byte {
	t := o.tmpl
	b := o.body[:0]
	for i, lit := range t.Lit {
		b = append(b, lit...)
		if i == len(t.Vars) {
			break
		}
		switch config.TemplateVars[t.Vars[i]] {
		case "rule":
			b = append(b, r.cfg.Name...)
		case "limit":
			b = appendInt(b, r.d.Limit)
		case "window":
			b = appendInt(b, r.window)
		case "retry_after":
			b = appendInt(b, retry)
		case "status":
			b = appendInt(b, int64(status))
		}
	}
	o.body = b
	return b
}

// appendShownKey appends key as show says: hashed (16 hex digits of a fixed hash) or raw
// (its parts as the request gave them, joined by '|', bytes outside printable ASCII
// escaped as \xNN, cut after maxShownKey bytes).
func appendShownKey(dst, key []byte, show config.KeyShow) []byte {
	if show == config.KeyHashed {
		h := hashKey(publicKeySeed, key)
		const hex = "0123456789abcdef"
		for i := 60; i >= 0; i -= 4 {
			dst = append(dst, hex[h>>uint(i)&15])
		}
		return dst
	}
	start := len(dst)
	for i := 0; i < len(key); {
		if len(dst)-start >= maxShownKey {
			return append(dst, "..."...)
		}
		if i > 0 {
			dst = append(dst, '|')
		}
		tag := key[i]
		i++
		if tag == tagMissing {
			dst = append(dst, "(missing)"...)
			continue
		}
		if tag == tagIP {
			if i >= len(key) || (key[i] != 4 && key[i] != 16) || i+1+int(key[i]) > len(key) {
				return append(dst, '?')
			}
			n := int(key[i])
			ip, _ := netip.AddrFromSlice(key[i+1 : i+1+n])
			dst = ip.AppendTo(dst)
			i += 1 + n
			continue
		}
		n, w := binary.Uvarint(key[i:])
		if w <= 0 || n > uint64(len(key)-i-w) {
			return append(dst, '?')
		}
		i += w
		dst = appendPrintable(dst, key[i:i+int(n)], start+maxShownKey)
		i += int(n)
	}
	return dst
}

// appendPrintable appends v with bytes outside printable ASCII (and '|', '\') escaped as
// \xNN, stopping at limit bytes of dst.
func appendPrintable(dst, v []byte, limit int) []byte {
	const hex = "0123456789abcdef"
	for _, c := range v {
		if len(dst) >= limit {
			return dst
		}
		if c < 0x20 || c >= 0x7f || c == '|' || c == '\\' || c == '"' {
			dst = append(dst, '\\', 'x', hex[c>>4], hex[c&15])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// refusal returns the body of a refusal by r: the template rendered, or body.
func (o *observe) refusal(r *rule, status int, retry int64, body []byte) []byte {
	if o.tmpl == nil {
		return body
	}
	return o.refusalBody(r, status, retry)
}

// observeDenied records a refusal by worst: the access log and, for every enforcing or
// shadow rule that denied, its top keys.
func (p *Plugin) observeDenied(worst *rule) {
	o := p.obs
	if o.alog != nil {
		o.record(worst, DecisionDenied, 0)
	}
	if o.top != nil {
		for _, r := range p.rules {
			if r.applies && !r.failed && !r.d.Allowed {
				o.top.denied(r)
			}
		}
		if now := p.host.Now(); now >= o.top.nextFlush {
			o.top.tick(now)
		}
	}
}

// observeAdmitted records an admitted request: the access log, and the top keys of every
// applying rule (consumed, or denied for a shadow rule's denial).
func (p *Plugin) observeAdmitted(best *rule, delay time.Duration, now int64) {
	o := p.obs
	if o.alog != nil {
		p.recordAdmitted(best, delay)
	}
	if o.top != nil {
		for _, r := range p.rules {
			switch {
			case !r.applies || r.failed:
			case r.d.Allowed:
				o.top.consumed(r)
			default:
				o.top.denied(r)
			}
		}
		if now >= o.top.nextFlush {
			o.top.tick(now)
		}
	}
}
