package config

import (
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Who is limited, and why: the decision for the proxy's access log ("access_log"), the
// heavy hitters of each rule ("top_keys"), and what a refused client is told beyond the
// status and body ("response.rule_header", "response.format").

// KeyShow says how a key appears outside the proxy: in the access log and in top keys.
type KeyShow uint8

const (
	// KeyHashed shows a key as 16 hexadecimal digits of a fixed 64-bit hash of its bytes:
	// the same key gives the same digits in every proxy and across restarts (a pseudonym,
	// not an anonymisation: a key from a small space can be found by trying them all).
	KeyHashed KeyShow = iota
	// KeyRaw shows the key as the request gave it (its parts joined by '|').
	KeyRaw
	// KeyNone leaves the key out.
	KeyNone
)

var keyShowNames = [...]string{KeyHashed: "hashed", KeyRaw: "raw", KeyNone: "none"}

func (k KeyShow) String() string {
	if int(k) < len(keyShowNames) {
		return keyShowNames[k]
	}
	return "KeyShow(" + strconv.Itoa(int(k)) + ")"
}

// AccessLog is "access_log": which decisions the filter writes where the proxy records
// requests (Envoy's filter state for sluice.wasm, dynamic metadata for libsluice.so).
type AccessLog struct {
	// Key is how the key is written (default KeyHashed).
	Key KeyShow
	// NearLimitPercent: an admitted request is written when the most restrictive rule has
	// at most this percent of its capacity remaining (0: only when nothing remains);
	// default DefaultNearLimitPercent.
	NearLimitPercent int
}

// DefaultNearLimitPercent is access_log.near_limit_percent's default.
const DefaultNearLimitPercent = 10

// TopKeys is "top_keys": a bounded heavy-hitter summary per rule of the keys it denied and
// of the keys that consumed most of it.
type TopKeys struct {
	// Size is the summary's capacity: counters per rule and kind (denied, consumed).
	Size int
	// Key is how keys are shown (default KeyHashed).
	Key KeyShow
	// LogEvery is the period of the log line per rule with the top LogTop keys (0: none).
	LogEvery time.Duration
	LogTop   int
}

// Bounds of top_keys.
const (
	DefaultTopKeysSize = 64
	MinTopKeysSize     = 4
	MaxTopKeysSize     = 1024
	DefaultTopKeysLog  = 10
	MinTopKeysLogEvery = time.Second
)

// BodyFormat is response.format: how the rejection body is made.
type BodyFormat uint8

const (
	// FormatText sends response.body as it is (text/plain).
	FormatText BodyFormat = iota
	// FormatProblemJSON sends an RFC 9457 problem-details object
	// (application/problem+json) naming the rule, its limit and window, and the retry time.
	FormatProblemJSON
	// FormatTemplate sends response.body with its placeholders filled in, as
	// response.content_type.
	FormatTemplate
)

var bodyFormatNames = [...]string{FormatText: "text", FormatProblemJSON: "problem_json", FormatTemplate: "template"}

// ProblemJSONTemplate is the body of response.format "problem_json", a template as
// "template" reads them.
const ProblemJSONTemplate = `{"type":"about:blank","title":"Too Many Requests","status":{status},` +
	`"detail":"rule {rule} allows {limit} per {window}s; retry in {retry_after}s",` +
	`"rule":"{rule}","limit":{limit},"window":{window},"retry_after":{retry_after}}` + "\n"

// ProblemJSONContentType is the content type of a problem-details body.
const ProblemJSONContentType = "application/problem+json"

// TemplateVars are the placeholders a body template may use, each written {NAME}: the
// refusing rule's name, its limit (the capacity, as X-RateLimit-Limit), its window in whole
// seconds, the Retry-After seconds, and the response status.
var TemplateVars = [...]string{"rule", "limit", "window", "retry_after", "status"}

// Template is a body template compiled into literal text and placeholders.
type Template struct {
	// Parts alternate: Lit[i], then Vars[i] (an index into TemplateVars), ..., then the
	// last Lit. len(Lit) == len(Vars)+1.
	Lit  []string
	Vars []int
}

// CompileTemplate splits s at its placeholders. A '{' that does not open a known
// placeholder is literal text (JSON bodies are full of braces).
func CompileTemplate(s string) *Template {
	t := new(Template)
	lit := 0
	for i := 0; i < len(s); i++ {
		if s[i] != '{' {
			continue
		}
		for v, name := range TemplateVars {
			if strings.HasPrefix(s[i+1:], name+"}") {
				t.Lit = append(t.Lit, s[lit:i])
				t.Vars = append(t.Vars, v)
				i += len(name) + 1
				lit = i + 1
				break
			}
		}
	}
	t.Lit = append(t.Lit, s[lit:])
	return t
}

var (
	accessLogFields = []string{"key", "near_limit_percent"}
	topKeysFields   = []string{"size", "key", "log_every", "log_top"}
)

// observe parses the top-level "access_log" and "top_keys".
func (p *parser) observe(fields map[string]jsonv.Value, c *Config) {
	if v, ok := fields["access_log"]; ok {
		c.AccessLog = p.accessLog("access_log", v)
	}
	if v, ok := fields["top_keys"]; ok {
		c.TopKeys = p.topKeys("top_keys", v)
	}
}

func (p *parser) accessLog(path string, v jsonv.Value) *AccessLog {
	f, ok := p.object(path, v, accessLogFields)
	if !ok {
		return nil
	}
	a := &AccessLog{NearLimitPercent: DefaultNearLimitPercent}
	if x, ok := f["key"]; ok {
		if i, ok := p.enum(path+".key", x, keyShowNames[:]); ok {
			a.Key = KeyShow(i)
		}
	}
	if x, ok := f["near_limit_percent"]; ok {
		if n, ok := p.integer(path+".near_limit_percent", x, 0, 100); ok {
			a.NearLimitPercent = int(n)
		}
	}
	return a
}

func (p *parser) topKeys(path string, v jsonv.Value) *TopKeys {
	f, ok := p.object(path, v, topKeysFields)
	if !ok {
		return nil
	}
	t := &TopKeys{Size: DefaultTopKeysSize, LogTop: DefaultTopKeysLog}
	if x, ok := f["size"]; ok {
		if n, ok := p.integer(path+".size", x, MinTopKeysSize, MaxTopKeysSize); ok {
			t.Size = int(n)
		}
	}
	if x, ok := f["key"]; ok {
		if i, ok := p.enum(path+".key", x, keyShowNames[:len(keyShowNames)-1]); ok {
			t.Key = KeyShow(i)
		}
	}
	if x, ok := f["log_every"]; ok {
		if d, ok := p.duration(path+".log_every", x); ok {
			if d < MinTopKeysLogEvery {
				p.fail(x, path+".log_every", show(x)+" is shorter than the minimum "+FormatDuration(MinTopKeysLogEvery))
			} else {
				t.LogEvery = d
			}
		}
	}
	if x, ok := f["log_top"]; ok {
		if _, given := f["log_every"]; !given {
			p.fail(x, path+".log_top", `applies only with "log_every"`)
		} else if n, ok := p.integer(path+".log_top", x, 1, int64(t.Size)); ok {
			t.LogTop = int(n)
		}
	}
	if t.LogTop > t.Size {
		t.LogTop = t.Size
	}
	return t
}

// responseExtras parses response.rule_header, response.format and response.content_type.
func (p *parser) responseExtras(path string, f map[string]jsonv.Value, r *Response) {
	if x, ok := f["rule_header"]; ok {
		if name, ok := p.headerName(path+".rule_header", x); ok {
			if strings.HasPrefix(name, ":") {
				p.fail(x, path+".rule_header", show(x)+" is a pseudo-header")
			} else {
				r.RuleHeader = name
			}
		}
	}
	if x, ok := f["format"]; ok {
		if i, ok := p.enum(path+".format", x, bodyFormatNames[:]); ok {
			r.Format = BodyFormat(i)
		}
	}
	if x, ok := f["content_type"]; ok {
		if s, ok := p.str(path+".content_type", x); ok {
			switch {
			case r.Format != FormatTemplate:
				p.fail(x, path+".content_type", `applies only with "format": "template"`)
			case s == "" || len(s) > 256 || !printableASCII(s):
				p.fail(x, path+".content_type", show(x)+" is not 1-256 printable ASCII characters")
			default:
				r.ContentType = s
			}
		}
	}
	switch r.Format {
	case FormatProblemJSON:
		if _, given := f["body"]; given {
			p.fail(f["body"], path+".body", `does not apply with "format": "problem_json" (its body is fixed; use "template")`)
		}
		r.Template = CompileTemplate(ProblemJSONTemplate)
		r.ContentType = ProblemJSONContentType
	case FormatTemplate:
		r.Template = CompileTemplate(r.Body)
		if r.ContentType == "" {
			r.ContentType = "application/json"
		}
	}
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
