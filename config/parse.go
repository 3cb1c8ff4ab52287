package config

import (
	"errors"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Bounds and defaults of the configuration. They are part of the documented
// contract (README "Configuration reference").
const (
	MaxConfigSize         = 16 << 20 // bytes of JSON (large plans and overrides tables)
	MaxRuleNameLen        = 64
	MaxLimit              = algorithms.MaxLimit  // limit and burst
	MaxWindow             = algorithms.MaxWindow // 366d
	MaxMaxKeys            = 1_000_000
	MaxKeyParts           = 8
	MaxNameLen            = 256 // header, query and cookie names
	MaxBodyLen            = 64 << 10
	MaxXFFTrustedHops     = 64
	DefaultRedisTimeoutMS = 50
	MaxRedisTimeoutMS     = 60_000
	MaxRedisInstances     = 10_000
	DefaultRLSTimeoutMS   = 100
	MaxRLSTimeoutMS       = 60_000
	MaxRLSDomainLen       = 256
	DefaultStatus         = 429
	DefaultBody           = "rate limited\n"
	DefaultGRPCStatus     = 8 // RESOURCE_EXHAUSTED
	minGRPCStatus         = 1 // 0 (OK) would tell a gRPC client the call succeeded
	maxGRPCStatus         = 16
	minStatus, maxStatus  = 200, 599
	defaultRedisInstances = 1
)

// Parse parses, validates and compiles a plugin configuration.
//
// It is strict: unknown or repeated fields, wrong types, out-of-range values,
// duplicate rule names, empty or ambiguous keys are all errors. On failure it
// returns Errors listing every problem found (up to MaxErrors), each naming
// its JSON path, e.g. `rules[2].window: "10x" is not a duration`. On success
// every Rule has its Limiter built and its Match compiled (methods
// upper-cased, header names lower-cased).
//
// Decisions the contract leaves open: "rules" must hold at least one rule (a
// rate limiter with none is a mistake); "algorithm", "limit", "window",
// "name" and "key" are required in every rule; "burst" is accepted only for
// token_bucket and leaky_bucket (1..MaxLimit, default limit); failure_mode
// "local" requires at least one rule with backend "redis" or "rls"; a
// "redis" (or "rls") object without such rules is accepted and unused. Errors are reported in
// document order.
//
// Parse validates for sluice-redis.wasm, the build with both backends;
// ParseFor(data, BuildLocal) is what sluice.wasm loads.
func Parse(data []byte) (*Config, error) {
	return parseFor(data, BuildRedis)
}

func parseFor(data []byte, build Build) (*Config, error) {
	p := &parser{build: build}
	c := p.parse(data)
	if len(p.errs) == 0 {
		return c, nil
	}
	// Report in document order: top-level objects are checked before the
	// rules that depend on them, whatever their place in the file.
	sort.SliceStable(p.errs, func(i, j int) bool { return p.errs[i].at < p.errs[j].at })
	errs := make(Errors, 0, min(len(p.errs), MaxErrors+1))
	for i, e := range p.errs {
		if i == MaxErrors {
			errs = append(errs, &Error{Msg: "and " + strconv.Itoa(len(p.errs)-MaxErrors) + " more errors"})
			break
		}
		errs = append(errs, &Error{Path: e.path, Msg: e.msg})
	}
	return nil, errs
}

type parser struct {
	build Build
	errs  []located
	part  docPart // which part of a document with "_rules_" (scopes.go)
}

// located is an error with the offset in the document it is about.
type located struct {
	at        int
	path, msg string
}

// fail records an error about the value v.
func (p *parser) fail(v jsonv.Value, path, msg string) {
	p.errs = append(p.errs, located{v.Index, path, msg})
}

// failEnd records an error about the object obj as a whole (a missing
// field): it sorts after the errors inside obj.
func (p *parser) failEnd(obj jsonv.Value, path, msg string) {
	p.errs = append(p.errs, located{obj.Index + len(obj.Raw), path, msg})
}

// paramError records err, an error of algorithms.New or RedisParams about
// the rule object at path, on the field it names (or on the rule), with
// the note appended to its reason.
func (p *parser) paramError(path string, rule jsonv.Value, err error, note string) {
	var pe *algorithms.ParamError
	if !errors.As(err, &pe) {
		p.failEnd(rule, path, err.Error()+note)
		return
	}
	// The value the error is about: the field when the rule gives it (its
	// first occurrence; a repeated one is an error already), else the end
	// of the rule.
	at := jsonv.Value{Index: rule.Index + len(rule.Raw)}
	rule.ForEach(func(k, x jsonv.Value) bool {
		if k.String() == pe.Field {
			at = x
			return false
		}
		return true
	})
	p.fail(at, path+"."+pe.Field, pe.Reason+note)
}

func (p *parser) parse(data []byte) *Config {
	if len(data) > MaxConfigSize {
		p.fail(jsonv.Value{}, "", strconv.Itoa(len(data))+" bytes is more than the limit of "+strconv.Itoa(MaxConfigSize))
		return nil
	}
	data = TrimByteOrderMark(data)
	switch {
	case len(bytesTrimSpace(data)) == 0:
		p.fail(jsonv.Value{}, "", "is empty")
		return nil
	case !jsonv.Valid(data):
		p.fail(jsonv.Value{}, "", "is not valid JSON")
		return nil
	case !utf8.Valid(data):
		p.fail(jsonv.Value{}, "", "is not valid UTF-8")
		return nil
	}
	root := jsonv.Parse(data)
	if p.part == partWhole && hasScopes(root) {
		return p.scoped(data, root)
	}
	fields, ok := p.object("", root, p.topFields())
	if !ok {
		return nil
	}
	c := &Config{
		Response: Response{Status: DefaultStatus, Body: DefaultBody, Headers: HeadersBoth, GRPCStatus: DefaultGRPCStatus},
	}

	// Top-level objects first: rules refer to "redis".
	backends := p.topLevel(fields, c)
	failureLocal := c.FailureMode == FailLocal

	v, ok := fields["rules"]
	if !ok {
		p.failEnd(root, "rules", "is required")
		return c
	}
	items, ok := p.array("rules", v)
	if !ok {
		return c
	}
	if len(items) == 0 {
		if p.part != partEntry { // an empty "_rules_" entry exempts its requests
			p.fail(v, "rules", "must contain at least one rule")
		}
		return c
	}
	names := make(map[string]int, len(items))
	for i, item := range items {
		path := "rules[" + strconv.Itoa(i) + "]"
		r := p.rule(path, item)
		if r == nil {
			continue
		}
		r.Index = i
		if r.Name != "" {
			if j, dup := names[r.Name]; dup {
				p.fail(item.Get("name"), path+".name", "duplicate rule name "+Quote(r.Name, maxShownValue)+" (also rules["+strconv.Itoa(j)+"])")
			} else {
				names[r.Name] = i
			}
		}
		p.remoteRule(c, backends, path, item, r)
		c.Rules = append(c.Rules, r)
	}
	if failureLocal && !c.HasRedisRules() && !c.HasRLSRules() && len(c.Rules) == len(items) {
		p.fail(fields["failure_mode"], "failure_mode", `"local" needs at least one rule with backend "redis" or "rls"`)
	}
	return c
}

// backendsParsed says whether the top-level "redis" and "rls" objects, when
// present, parsed.
type backendsParsed struct{ redis, rls bool }

// topLevel reads the top-level objects other than "rules" into c.
func (p *parser) topLevel(fields map[string]jsonv.Value, c *Config) backendsParsed {
	ok := backendsParsed{redis: true, rls: true}
	if v, found := fields["redis"]; found {
		c.Redis, ok.redis = p.redis("redis", v)
	}
	if v, found := fields["rls"]; found {
		c.RLS, ok.rls = p.rls("rls", v)
	}
	if v, found := fields["response"]; found {
		p.response("response", v, &c.Response)
	}
	if v, found := fields["client_ip"]; found {
		p.clientIP("client_ip", v, &c.ClientIP)
	}
	p.observe(fields, c)
	if v, found := fields["failure_mode"]; found {
		if i, found := p.enum("failure_mode", v, failureModeNames[:]); found {
			c.FailureMode = FailureMode(i)
		}
	}
	return ok
}

// remoteRule checks rule r (at path, from item) against its remote backend:
// the build has it, the configuration has its object and no rule of the
// other backend, and the rule's bounds fit it. Each problem is its own
// error: a Redis rule in sluice.wasm without a "redis" object gets both,
// and its bounds are checked whatever the build (every error at once).
func (p *parser) remoteRule(c *Config, parsed backendsParsed, path string, item jsonv.Value, r *Rule) {
	switch r.Backend {
	case BackendRedis:
		if c.HasRLSRules() {
			p.fail(item.Get("backend"), path+".backend", `"redis" and "rls" rules cannot be mixed in one configuration (one remote backend per configuration)`)
		}
		if p.build != BuildRedis {
			p.fail(item.Get("backend"), path+".backend", `"redis" needs sluice-redis.wasm (a host with Higress's Redis calls); `+p.build.String()+` has `+p.build.backends())
		}
		if c.Redis == nil && parsed.redis {
			p.fail(item.Get("backend"), path+".backend", `"redis" needs a top-level "redis" object`)
		}
		if c.Redis != nil {
			p.redisRule(path, item, r, c.Redis.Instances, "redis.instances")
		}
	case BackendRLS:
		if c.HasRedisRules() {
			p.fail(item.Get("backend"), path+".backend", `"rls" and "redis" rules cannot be mixed in one configuration (one remote backend per configuration)`)
		}
		if p.build == BuildDynamic {
			p.fail(item.Get("backend"), path+".backend", `"rls" needs sluice.wasm (a host with Proxy-Wasm's gRPC calls); `+p.build.String()+` has `+p.build.backends())
		}
		if c.RLS == nil && parsed.rls {
			p.fail(item.Get("backend"), path+".backend", `"rls" needs a top-level "rls" object`)
		}
		if c.RLS != nil {
			p.redisRule(path, item, r, c.RLS.Instances, "rls.instances")
		}
	}
}

// HasRedisRules reports whether any rule uses the Redis backend.
func (c *Config) HasRedisRules() bool {
	for _, r := range c.Rules {
		if r.Backend == BackendRedis {
			return true
		}
	}
	return false
}

// HasRLSRules reports whether any rule uses the rate-limit service.
func (c *Config) HasRLSRules() bool {
	for _, r := range c.Rules {
		if r.Backend == BackendRLS {
			return true
		}
	}
	return false
}

var (
	topFields      = []string{"rules", "response", "failure_mode", "client_ip", "redis", "rls", "access_log", "top_keys"}
	ruleFields     = []string{"name", "match", "key", "missing_key", "algorithm", "limit", "window", "burst", "backend", "mode", "max_keys", "lease", "delay", "cost", "count", "plans", "overrides", "retry_after"}
	delayFields    = []string{"max", "max_held"}
	matchFields    = []string{"path_prefix", "methods", "headers", "routes", "metadata", "attributes"}
	headerFields   = []string{"name", "exact", "absent"}
	keySources     = []string{"remote_ip", "header", "query", "cookie", "path", "method", "metadata", "attribute"}
	keyFields      = []string{"remote_ip", "ipv6_prefix", "header", "query", "cookie", "path", "method", "metadata", "attribute"}
	responseFields = []string{"status", "body", "headers", "grpc_status", "rule_header", "format", "content_type"}
	clientIPFields = []string{"xff_trusted_hops", "proxy_appends_xff"}
	redisFields    = []string{"cluster", "timeout_ms", "instances", "username", "password"}
	rlsFields      = []string{"cluster", "domain", "timeout_ms", "instances"}

	backendNames     = [...]string{BackendLocal: "local", BackendRedis: "redis", BackendRLS: "rls"}
	modeNames        = [...]string{ModeEnforce: "enforce", ModeShadow: "shadow"}
	missingKeyNames  = [...]string{MissingSkip: "skip", MissingShared: "shared", MissingDeny: "deny"}
	failureModeNames = [...]string{FailOpen: "open", FailClosed: "closed", FailLocal: "local"}
	headerStyleNames = [...]string{HeadersBoth: "both", HeadersDraft: "draft", HeadersLegacy: "legacy", HeadersNone: "none"}
)

func (p *parser) rule(path string, v jsonv.Value) *Rule {
	f, ok := p.object(path, v, ruleFields)
	if !ok {
		return nil
	}
	r := &Rule{MaxKeys: DefaultMaxKeys}
	p.ruleIdentity(path, v, f, r)
	if concurrencyAlgorithm(f) {
		p.concurrencyRule(path, v, f, r) // concurrency.go
		return r
	}
	if x, ok := f["retry_after"]; ok {
		p.fail(x, path+".retry_after", `applies only to "algorithm": "concurrency"`)
	}
	good := p.rateFields(path, v, f, r)
	p.ruleOptions(path, f, r, &good)
	if good.alg && good.limit {
		p.limiter(path, v, r, good)
	}
	p.limitTables(path, f, r) // plans.go
	return r
}

// fieldsOK says which of the fields the limiter needs are good: a bad one
// is reported where it is, and the checks that need it are skipped, but
// every check that does not is still made (every error at once).
type fieldsOK struct{ alg, limit, window, burst, backend bool }

// ruleIdentity reads what every rule has: its name, match, key and
// missing_key.
func (p *parser) ruleIdentity(path string, v jsonv.Value, f map[string]jsonv.Value, r *Rule) {
	if x, ok := f["name"]; ok {
		if s, ok := p.str(path+".name", x); ok {
			if msg := CheckRuleName(s); msg != "" {
				p.fail(x, path+".name", show(x)+" "+msg)
			} else {
				r.Name = s
			}
		}
	} else {
		p.failEnd(v, path+".name", "is required")
	}
	if x, ok := f["match"]; ok {
		p.match(path+".match", x, &r.Match)
	}
	if x, ok := f["key"]; ok {
		r.Key = p.key(path+".key", x)
	} else {
		p.failEnd(v, path+".key", "is required")
	}
	if x, ok := f["missing_key"]; ok {
		if i, ok := p.enum(path+".missing_key", x, missingKeyNames[:]); ok {
			r.MissingKey = MissingKey(i)
		}
	}
}

// rateFields reads a rate rule's algorithm, limit, window and burst.
func (p *parser) rateFields(path string, v jsonv.Value, f map[string]jsonv.Value, r *Rule) fieldsOK {
	good := fieldsOK{alg: true, limit: true, window: true, burst: true, backend: true}
	if x, ok := f["algorithm"]; ok {
		names := make([]string, len(algorithms.Kinds), len(algorithms.Kinds)+1)
		for i, k := range algorithms.Kinds {
			names[i] = k.String()
		}
		names = append(names, algorithms.Concurrency.String()) // read by concurrencyRule
		if i, ok := p.enum(path+".algorithm", x, names); ok {
			r.Algorithm = algorithms.Kinds[i]
		} else {
			good.alg = false
		}
	} else {
		p.failEnd(v, path+".algorithm", "is required")
		good.alg = false
	}
	if x, ok := f["limit"]; ok {
		if n, ok := p.integer(path+".limit", x, 1, MaxLimit); ok {
			r.Limit = n
		} else {
			good.limit = false
		}
	} else {
		p.failEnd(v, path+".limit", "is required")
		good.limit = false
	}
	if x, ok := f["window"]; ok {
		if d, ok := p.duration(path+".window", x); ok {
			r.Window = d
		} else {
			good.window = false
		}
	} else {
		p.failEnd(v, path+".window", "is required")
		good.window = false
	}
	if x, ok := f["burst"]; ok {
		if good.alg && r.Algorithm != algorithms.TokenBucket && r.Algorithm != algorithms.LeakyBucket {
			// Reported, and otherwise ignored: the window algorithms have
			// no burst, so their other bounds are still checked.
			p.fail(x, path+".burst", "applies only to token_bucket and leaky_bucket, not "+r.Algorithm.String())
		} else if n, ok := p.integer(path+".burst", x, 1, MaxLimit); ok {
			r.Burst = n
		} else {
			good.burst = false
		}
	}
	if r.Burst == 0 {
		r.Burst = r.Limit
	}
	return good
}

// ruleOptions reads a rate rule's backend, mode, max_keys, lease, delay,
// cost and count.
func (p *parser) ruleOptions(path string, f map[string]jsonv.Value, r *Rule, good *fieldsOK) {
	if x, ok := f["backend"]; ok {
		if i, ok := p.enum(path+".backend", x, backendNames[:]); ok {
			r.Backend = Backend(i)
		} else {
			good.backend = false
		}
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
	if x, ok := f["lease"]; ok {
		if n, ok := p.integer(path+".lease", x, 1, MaxLimit); ok {
			if msg := leaseRefusal(r, n, good.backend, good.alg, good.limit && good.burst); msg != "" {
				p.fail(x, path+".lease", msg)
			} else {
				r.Lease = n
			}
		}
	}
	if x, ok := f["delay"]; ok {
		_, lease := f["lease"]
		p.delay(path+".delay", x, r, good.alg, lease)
	}
	if x, ok := f["cost"]; ok {
		p.cost(path+".cost", x, r, good.alg, good.backend)
	}
	if x, ok := f["count"]; ok {
		p.count(path+".count", x, r, good.alg) // count.go
	}
}

// limiter builds the rule's limiter, checking the bounds between fields.
func (p *parser) limiter(path string, v jsonv.Value, r *Rule, good fieldsOK) {
	// The bounds between fields. With a bad window or burst the
	// limiter is not built, but the bound of the limit alone (sliding_log:
	// at most 10,000) is still checked, with a window and burst that
	// cannot fail.
	par := algorithms.Params{Limit: r.Limit, Window: r.Window, Burst: r.Burst}
	complete := good.window && good.burst
	if !good.window {
		par.Window = time.Second
	}
	if !good.burst {
		par.Burst = 0
	}
	l, err := algorithms.New(r.Algorithm, par)
	var pe *algorithms.ParamError
	switch {
	case err == nil && complete:
		r.Limiter = l
	case err != nil && (complete || errors.As(err, &pe) && pe.Field == "limit"):
		p.paramError(path, v, err, "")
	}
}

// delay reads a rule's "delay" into r.Delay, and refuses it on a rule
// that cannot hold requests (the check on a bad algorithm is skipped:
// that field's own error says what is wrong); lease: the rule has "lease".
func (p *parser) delay(path string, v jsonv.Value, r *Rule, algOK, lease bool) {
	d, good, ok := p.delayObject(path, v, "held")
	if !ok {
		return
	}
	if algOK {
		if ok, why := algorithms.Shapes(r.Algorithm); !ok {
			p.fail(v, path, "applies only to token_bucket and leaky_bucket: "+why)
			good = false
		}
	}
	if lease {
		p.fail(v, path, `does not apply with "lease": a lease's admissions are taken ahead and spent at once by whoever holds them, so there is no slot to hold a request until`)
		good = false
	}
	if r.Mode == ModeShadow {
		p.fail(v, path, `does not apply in mode "shadow": a shadow rule lets every request through at once, so it has nothing to hold`)
		good = false
	}
	if good {
		r.Delay = d
	}
}

// delayObject reads a "delay" object: its max (required, at most MaxDelay)
// and max_held. what names a request it holds ("held", "queued") in the
// errors; ok is false when v is not an object, good when every field is.
func (p *parser) delayObject(path string, v jsonv.Value, what string) (d Delay, good, ok bool) {
	f, ok := p.object(path, v, delayFields)
	if !ok {
		return d, false, false
	}
	d, good = Delay{MaxHeld: DefaultMaxHeld}, true
	if x, ok := f["max"]; ok {
		if m, ok := p.duration(path+".max", x); !ok {
			good = false
		} else if m > MaxDelay {
			p.fail(x, path+".max", show(x)+" is longer than the maximum "+FormatDuration(MaxDelay)+
				": a "+what+" request is subject to the proxy's stream idle timeout (Envoy's default: 5m)")
			good = false
		} else {
			d.Max = m
		}
	} else {
		p.failEnd(v, path+".max", "is required")
		good = false
	}
	if x, ok := f["max_held"]; ok {
		if n, ok := p.integer(path+".max_held", x, 1, MaxMaxHeld); ok {
			d.MaxHeld = int(n)
		} else {
			good = false
		}
	}
	return d, good, true
}

// leaseRefusal says why a rule cannot have "lease": n, or "" when it can.
// The checks on a field that is bad (backendOK, algOK, sizeOK: limit and
// burst) are skipped: that field's own error says what is wrong.
func leaseRefusal(r *Rule, n int64, backendOK, algOK, sizeOK bool) string {
	switch {
	case backendOK && r.Backend != BackendRedis && r.Backend != BackendRLS:
		return `applies only to backend "redis" or "rls": a local rule is decided in this proxy's shared data already`
	case !algOK:
	case r.Algorithm != algorithms.TokenBucket && r.Algorithm != algorithms.FixedWindow:
		return "applies only to token_bucket and fixed_window, not " + r.Algorithm.String() +
			": a reserved admission of leaky_bucket, sliding_window or sliding_log would be spent at a later time than the one its script charged, which these algorithms do not allow"
	case !sizeOK:
	case r.Algorithm == algorithms.TokenBucket && r.Burst > 0 && n > r.Burst:
		return "must not exceed the burst (" + strconv.FormatInt(r.Burst, 10) + "): no lease can be larger than the bucket"
	case r.Algorithm == algorithms.FixedWindow && r.Limit > 0 && n > r.Limit:
		return "must not exceed the limit (" + strconv.FormatInt(r.Limit, 10) + "): no lease can be larger than the window's quota"
	}
	return ""
}

func (p *parser) match(path string, v jsonv.Value, m *Match) {
	f, ok := p.object(path, v, matchFields)
	if !ok {
		return
	}
	if x, ok := f["routes"]; ok {
		p.routes(path+".routes", x, m) // scopes.go
	}
	if x, ok := f["path_prefix"]; ok {
		p.pathPrefix(path+".path_prefix", x, m)
	}
	if x, ok := f["methods"]; ok {
		p.methods(path+".methods", x, m)
	}
	p.valueMatches(path, f, m) // metadata.go
	if x, ok := f["headers"]; ok {
		if items, ok := p.array(path+".headers", x); ok {
			if len(items) == 0 {
				p.fail(x, path+".headers", "must not be empty (omit it to match any headers)")
			}
			for i, it := range items {
				if h, ok := p.headerMatch(path+".headers["+strconv.Itoa(i)+"]", it, m.Headers); ok {
					m.Headers = append(m.Headers, h)
				}
			}
		}
	}
}

// pathPrefix reads a match's "path_prefix": a path in normal form.
func (p *parser) pathPrefix(path string, x jsonv.Value, m *Match) {
	s, ok := p.str(path, x)
	switch {
	case !ok:
	case !strings.HasPrefix(s, "/"):
		p.fail(x, path, show(x)+` must start with "/"`)
	case hasSpaceOrControl(s):
		p.fail(x, path, show(x)+" must not contain spaces or control characters")
	case strings.ContainsAny(s, "?#"):
		p.fail(x, path, show(x)+` must not contain "?" or "#" (the query string is not matched)`)
	case NormalizePath(s) != s:
		p.fail(x, path, show(x)+" is not in normal form, and requests are matched in normal form (Envoy's normalize_path and merge_slashes): write "+Quote(NormalizePath(s), 256))
	default:
		m.PathPrefix = s
	}
}

// methods reads a match's "methods": HTTP methods, each once.
func (p *parser) methods(path string, x jsonv.Value, m *Match) {
	items, ok := p.array(path, x)
	if !ok {
		return
	}
	if len(items) == 0 {
		p.fail(x, path, "must not be empty (omit it to match every method)")
	}
	for i, it := range items {
		ip := path + "[" + strconv.Itoa(i) + "]"
		s, ok := p.str(ip, it)
		if !ok {
			continue
		}
		if !isToken(s) {
			p.fail(it, ip, show(it)+" is not an HTTP method")
			continue
		}
		s = strings.ToUpper(s)
		if containsString(m.Methods, s) {
			p.fail(it, ip, "duplicate method "+Quote(s, maxShownValue))
			continue
		}
		m.Methods = append(m.Methods, s)
	}
}

// headerMatch reads one of a match's "headers" (at path ip, from it): a
// name not among earlier's, and "exact" or "absent".
func (p *parser) headerMatch(ip string, it jsonv.Value, earlier []HeaderMatch) (HeaderMatch, bool) {
	var h HeaderMatch
	hf, ok := p.object(ip, it, headerFields)
	if !ok {
		return h, false
	}
	good := true
	if n, ok := hf["name"]; ok {
		if s, ok := p.headerName(ip+".name", n); ok {
			h.Name = s
			for _, o := range earlier {
				if o.Name == s {
					p.fail(n, ip+".name", "duplicate header "+Quote(s, maxShownValue))
					good = false
				}
			}
		} else {
			good = false
		}
	} else {
		p.failEnd(it, ip+".name", "is required")
		good = false
	}
	e, hasExact := hf["exact"]
	if hasExact {
		if s, ok := p.str(ip+".exact", e); ok {
			h.Exact = s
		} else {
			good = false
		}
	}
	if a, ok := hf["absent"]; ok {
		if b, ok := p.boolean(ip+".absent", a); !ok {
			good = false
		} else if !b {
			p.fail(a, ip+".absent", `must be true (use "exact" to match a value)`)
			good = false
		} else if hasExact {
			p.fail(a, ip+".absent", `cannot be combined with "exact": a header that is absent has no value; give one of them`)
			good = false
		} else {
			h.Absent = true
		}
	} else if !hasExact {
		p.failEnd(it, ip+".exact", `is required (or "absent": true to match a request without the header)`)
		good = false
	}
	return h, good
}

// boundedArray is array for a list that must hold 1..max items (noun names them in the
// error: "parts", "values"); empty says what is wrong with an empty one. A list
// longer than max is reported and still returned, so that its items are
// checked too.
func (p *parser) boundedArray(path string, v jsonv.Value, max int, noun, empty string) ([]jsonv.Value, bool) {
	items, ok := p.array(path, v)
	if !ok {
		return nil, false
	}
	if len(items) == 0 {
		p.fail(v, path, empty)
		return nil, false
	}
	if len(items) > max {
		p.fail(v, path, "has "+strconv.Itoa(len(items))+" "+noun+", more than the limit of "+strconv.Itoa(max))
	}
	return items, true
}

func (p *parser) key(path string, v jsonv.Value) []KeyPart {
	items, ok := p.boundedArray(path, v, MaxKeyParts, "parts", "must not be empty")
	if !ok {
		return nil
	}
	parts := make([]KeyPart, 0, len(items))
	for i, it := range items {
		ip := path + "[" + strconv.Itoa(i) + "]"
		f, ok := p.object(ip, it, keyFields)
		if !ok {
			continue
		}
		var given []string
		for _, s := range keySources {
			if _, ok := f[s]; ok {
				given = append(given, `"`+s+`"`)
			}
		}
		if len(given) == 0 {
			p.failEnd(it, ip, "needs one of "+allKeySourceText)
			continue // (an "ipv6_prefix" here is part of the same mistake)
		}
		var k KeyPart
		good := true
		if len(given) > 1 {
			// Reported; each source's value is still checked below.
			p.failEnd(it, ip, "has several sources ("+strings.Join(given, ", ")+"); use one per key part")
			good = false
		}
		trueFlag := func(name string) bool {
			x := f[name]
			b, ok := p.boolean(ip+"."+name, x)
			if ok && !b {
				p.fail(x, ip+"."+name, "must be true (remove the key part instead)")
				ok = false
			}
			good = good && ok
			return ok
		}
		if f["remote_ip"].Exists() {
			k.RemoteIP = trueFlag("remote_ip")
		}
		if f["header"].Exists() {
			var ok bool
			k.Header, ok = p.headerName(ip+".header", f["header"])
			good = good && ok
		}
		if f["query"].Exists() {
			x := f["query"]
			if s, ok := p.str(ip+".query", x); ok {
				if s == "" || len(s) > MaxNameLen || hasSpaceOrControl(s) || strings.ContainsAny(s, "&=#?") {
					p.fail(x, ip+".query", show(x)+" is not a query parameter name")
					good = false
				} else {
					k.Query = s
				}
			} else {
				good = false
			}
		}
		if f["cookie"].Exists() {
			x := f["cookie"]
			if s, ok := p.str(ip+".cookie", x); ok {
				if !isToken(s) || len(s) > MaxNameLen {
					p.fail(x, ip+".cookie", show(x)+" is not a cookie name")
					good = false
				} else {
					k.Cookie = s
				}
			} else {
				good = false
			}
		}
		if f["path"].Exists() {
			k.Path = trueFlag("path")
		}
		if f["method"].Exists() {
			k.Method = trueFlag("method")
		}
		good = p.keyValueSource(ip, f, &k) && good // metadata.go
		if x, ok := f["ipv6_prefix"]; ok {
			if !k.RemoteIP && !f["remote_ip"].Exists() {
				p.fail(x, ip+".ipv6_prefix", `is valid only with "remote_ip"`)
				good = false
			} else if n, ok := p.integer(ip+".ipv6_prefix", x, 1, 128); ok {
				k.IPv6Prefix = int(n)
			} else {
				good = false
			}
		}
		if good {
			parts = append(parts, k)
		}
	}
	return parts
}

func (p *parser) response(path string, v jsonv.Value, r *Response) {
	f, ok := p.object(path, v, responseFields)
	if !ok {
		return
	}
	if x, ok := f["status"]; ok {
		if n, ok := p.integer(path+".status", x, minStatus, maxStatus); ok {
			r.Status = int(n)
		}
	}
	if x, ok := f["body"]; ok {
		if s, ok := p.str(path+".body", x); ok {
			if len(s) > MaxBodyLen {
				p.fail(x, path+".body", "is "+strconv.Itoa(len(s))+" bytes, more than the limit of "+strconv.Itoa(MaxBodyLen))
			} else {
				r.Body = s
			}
		}
	}
	if x, ok := f["headers"]; ok {
		if i, ok := p.enum(path+".headers", x, headerStyleNames[:]); ok {
			r.Headers = HeaderStyle(i)
		}
	}
	if x, ok := f["grpc_status"]; ok {
		if n, ok := p.integer(path+".grpc_status", x, minGRPCStatus, maxGRPCStatus); ok {
			r.GRPCStatus = int(n)
		}
	}
	p.responseExtras(path, f, r)
}

func (p *parser) clientIP(path string, v jsonv.Value, c *ClientIP) {
	f, ok := p.object(path, v, clientIPFields)
	if !ok {
		return
	}
	if x, ok := f["xff_trusted_hops"]; ok {
		if n, ok := p.integer(path+".xff_trusted_hops", x, 0, MaxXFFTrustedHops); ok {
			c.XFFTrustedHops = int(n)
		}
	}
	if x, ok := f["proxy_appends_xff"]; ok {
		if b, ok := p.boolean(path+".proxy_appends_xff", x); ok {
			if b && c.XFFTrustedHops == 0 {
				p.fail(x, path+".proxy_appends_xff", "true has no effect without xff_trusted_hops >= 1 (the client is then source.address, which X-Forwarded-For does not change)")
			}
			c.ProxyAppendsXFF = b
		}
	}
}

// redis parses the "redis" object. ok is false when the object was given but
// is not an object (so rules are not also blamed for its absence).
func (p *parser) redis(path string, v jsonv.Value) (*Redis, bool) {
	f, ok := p.object(path, v, redisFields)
	if !ok {
		return nil, false
	}
	r := &Redis{TimeoutMS: DefaultRedisTimeoutMS, Instances: defaultRedisInstances}
	if x, ok := f["cluster"]; ok {
		if s, ok := p.str(path+".cluster", x); ok {
			if s == "" {
				p.fail(x, path+".cluster", "must not be empty")
			}
			r.Cluster = s
		}
	} else {
		p.failEnd(v, path+".cluster", "is required")
	}
	if x, ok := f["timeout_ms"]; ok {
		if n, ok := p.integer(path+".timeout_ms", x, 1, MaxRedisTimeoutMS); ok {
			r.TimeoutMS = int(n)
		}
	}
	if x, ok := f["instances"]; ok {
		if n, ok := p.integer(path+".instances", x, 1, MaxRedisInstances); ok {
			r.Instances = int(n)
		}
	}
	if x, ok := f["username"]; ok {
		r.Username, _ = p.str(path+".username", x)
	}
	if x, ok := f["password"]; ok {
		r.Password, _ = p.str(path+".password", x)
	}
	return r, true
}

// rls parses the "rls" object. ok is false when the object was given but
// is not an object (so rules are not also blamed for its absence).
func (p *parser) rls(path string, v jsonv.Value) (*RLS, bool) {
	f, ok := p.object(path, v, rlsFields)
	if !ok {
		return nil, false
	}
	r := &RLS{TimeoutMS: DefaultRLSTimeoutMS, Instances: defaultRedisInstances}
	for _, name := range []string{"cluster", "domain"} {
		x, ok := f[name]
		if !ok {
			p.failEnd(v, path+"."+name, "is required")
			continue
		}
		s, ok := p.str(path+"."+name, x)
		if !ok {
			continue
		}
		switch {
		case s == "":
			p.fail(x, path+"."+name, "must not be empty")
		case name == "domain" && len(s) > MaxRLSDomainLen:
			p.fail(x, path+".domain", "is longer than "+strconv.Itoa(MaxRLSDomainLen)+" bytes")
		case name == "domain" && !utf8.ValidString(s):
			p.fail(x, path+".domain", "is not valid UTF-8 (a protobuf string)")
		}
		if name == "cluster" {
			r.Cluster = s
		} else {
			r.Domain = s
		}
	}
	if x, ok := f["timeout_ms"]; ok {
		if n, ok := p.integer(path+".timeout_ms", x, 1, MaxRLSTimeoutMS); ok {
			r.TimeoutMS = int(n)
		}
	}
	if x, ok := f["instances"]; ok {
		if n, ok := p.integer(path+".instances", x, 1, MaxRedisInstances); ok {
			r.Instances = int(n)
		}
	}
	return r, true
}

// object checks that v is a JSON object whose field names are all in known
// and unique, and returns its fields by name.
func (p *parser) object(path string, v jsonv.Value, known []string) (map[string]jsonv.Value, bool) {
	if !v.IsObject() {
		p.fail(v, path, show(v)+" is not an object")
		return nil, false
	}
	f := make(map[string]jsonv.Value, len(known))
	v.ForEach(func(k, x jsonv.Value) bool {
		name := k.String()
		fp := fieldPath(path, name)
		if !containsString(known, name) {
			msg := "unknown field"
			if s := suggest(name, known); s != "" {
				msg += ` (did you mean "` + s + `"?)`
			}
			p.fail(k, fp, msg)
			return true
		}
		if _, dup := f[name]; dup {
			p.fail(k, fp, "duplicate field")
			return true
		}
		f[name] = x
		return true
	})
	return f, true
}

func (p *parser) array(path string, v jsonv.Value) ([]jsonv.Value, bool) {
	if !v.IsArray() {
		p.fail(v, path, show(v)+" is not a list")
		return nil, false
	}
	return v.Array(), true
}

func (p *parser) str(path string, v jsonv.Value) (string, bool) {
	if v.Type != jsonv.KindString {
		p.fail(v, path, show(v)+" is not a string")
		return "", false
	}
	return v.Str, true
}

func (p *parser) boolean(path string, v jsonv.Value) (bool, bool) {
	if v.Type != jsonv.KindTrue && v.Type != jsonv.KindFalse {
		p.fail(v, path, show(v)+" is not a boolean")
		return false, false
	}
	return v.Type == jsonv.KindTrue, true
}

// integer accepts a JSON number written as an integer literal (no fraction,
// no exponent) in [lo, hi].
func (p *parser) integer(path string, v jsonv.Value, lo, hi int64) (int64, bool) {
	if v.Type != jsonv.KindNumber || !isIntLiteral(v.Raw) {
		p.fail(v, path, show(v)+" is not an integer")
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	if err != nil || n < lo || n > hi {
		p.fail(v, path, show(v)+" is out of range "+strconv.FormatInt(lo, 10)+".."+strconv.FormatInt(hi, 10))
		return 0, false
	}
	return n, true
}

func (p *parser) duration(path string, v jsonv.Value) (time.Duration, bool) {
	s, ok := p.str(path, v)
	if !ok {
		return 0, false
	}
	d, ok := ParseDuration(s)
	switch {
	case !ok:
		p.fail(v, path, show(v)+" is not a duration")
	case d == 0:
		p.fail(v, path, show(v)+" is not longer than zero")
	case d > MaxWindow:
		p.fail(v, path, show(v)+" is longer than the maximum "+FormatDuration(MaxWindow))
	default:
		return d, true
	}
	return 0, false
}

func (p *parser) enum(path string, v jsonv.Value, names []string) (int, bool) {
	s, ok := p.str(path, v)
	if !ok {
		return 0, false
	}
	for i, n := range names {
		if s == n {
			return i, true
		}
	}
	p.fail(v, path, show(v)+" is not one of "+strings.Join(names, ", "))
	return 0, false
}

// headerName accepts an HTTP header name (an RFC 9110 token, or a pseudo-header
// such as ":authority") and returns it lower-cased.
func (p *parser) headerName(path string, v jsonv.Value) (string, bool) {
	s, ok := p.str(path, v)
	if !ok {
		return "", false
	}
	t := strings.TrimPrefix(s, ":")
	if !isToken(t) || len(s) > MaxNameLen {
		p.fail(v, path, show(v)+" is not a header name")
		return "", false
	}
	return strings.ToLower(s), true
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if strings.IndexByte("!#$%&'*+-.^_`|~", c) < 0 {
			return false
		}
	}
	return true
}

// hasSpaceOrControl reports whether s has a byte that never appears raw in
// a request path or query: a space, a control character or DEL.
func hasSpaceOrControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}

func isIntLiteral(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// show renders a JSON value for a message, escaped and cut to
// maxShownValue bytes: a string quoted (Quote), a number, true, false or null
// as written, an object or a list as compact JSON whose strings escape every
// non-printing rune (\u0085, \u2028) and "..." when cut.
func show(v jsonv.Value) string {
	switch v.Type {
	case jsonv.KindString:
		return Quote(v.Str, maxShownValue)
	case jsonv.KindJSON:
		return showJSON(v.Raw, maxShownValue)
	}
	s := strings.TrimSpace(v.Raw)
	if s == "" {
		return "nothing"
	}
	// A number, true, false or null: JSON's grammar leaves no room for
	// anything but ASCII letters, digits and signs. Long numbers are cut.
	if len(s) > maxShownValue {
		s = s[:maxShownValue-3] + "..."
	}
	return s
}

// showJSON compacts raw (valid JSON, an object or a list) for a message:
// whitespace between tokens removed, non-printing runes inside strings
// escaped as \uXXXX, cut at limit bytes with "...".
func showJSON(raw string, limit int) string {
	b := make([]byte, 0, limit)
	inString, escaped := false, false
	for i := 0; i < len(raw); {
		r, n := utf8.DecodeRuneInString(raw[i:])
		i += n
		var piece string
		switch {
		case !inString && (r == ' ' || r == '\t' || r == '\n' || r == '\r'):
			continue
		case r == utf8.RuneError && n == 1, !strconv.IsPrint(r):
			piece = escapeRune(r)
		default:
			piece = raw[i-n : i]
		}
		switch {
		case escaped:
			escaped = false
		case inString && r == '\\':
			escaped = true
		case r == '"':
			inString = !inString
		}
		if len(b)+len(piece) > limit-3 && (len(b)+len(piece) > limit || i < len(raw)) {
			return string(b) + "..."
		}
		b = append(b, piece...)
	}
	return string(b)
}

// escapeRune is the JSON escape of r (a UTF-16 surrogate pair above
// U+FFFF); invalid UTF-8 is shown as U+FFFD.
func escapeRune(r rune) string {
	const hex = "0123456789abcdef"
	if r == utf8.RuneError || r < 0 || r > utf8.MaxRune {
		r = utf8.RuneError
	}
	if r > 0xffff {
		r1, r2 := utf16.EncodeRune(r)
		return escapeRune(r1) + escapeRune(r2)
	}
	return string([]byte{'\\', 'u', hex[r>>12&15], hex[r>>8&15], hex[r>>4&15], hex[r&15]})
}

// suggest returns the known name name is most likely a typo of, or "": one
// within a small edit distance (1, or 2 for names of 6 bytes and more), or
// one that name is a prefix of ("timeout" for "timeout_ms").
func suggest(name string, known []string) string {
	name = strings.ToLower(name)
	limit := 1
	if len(name) >= 6 {
		limit = 2
	}
	best, bestD := "", limit+1
	for _, k := range known {
		if d := editDistance(name, k, bestD); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" && len(name) >= 4 {
		for _, k := range known {
			if strings.HasPrefix(k, name) {
				return k
			}
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, or max when it is
// at least max.
func editDistance(a, b string, max int) int {
	if len(a) > 64 || len(b) > 64 {
		return max
	}
	d := max
	if diff := len(a) - len(b); diff >= max || -diff >= max {
		return max
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	if prev[len(b)] < d {
		return prev[len(b)]
	}
	return max
}

// ByteOrderMark is U+FEFF in UTF-8. An editor may write one before a
// configuration as a signature of the encoding; RFC 8259 (section 8.1)
// lets a JSON parser ignore it, and Parse does: one mark at the very start,
// nothing else (a second one, or one after whitespace, is not valid JSON).
const ByteOrderMark = "\ufeff"

// TrimByteOrderMark returns data without the ByteOrderMark it starts with,
// if any: what Parse reads. `sluice check` decides on what it returns
// whether a file is a JSON configuration.
func TrimByteOrderMark(data []byte) []byte {
	if len(data) >= len(ByteOrderMark) && string(data[:len(ByteOrderMark)]) == ByteOrderMark {
		return data[len(ByteOrderMark):]
	}
	return data
}

func bytesTrimSpace(b []byte) []byte {
	i, j := 0, len(b)
	for i < j && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	for j > i && (b[j-1] == ' ' || b[j-1] == '\t' || b[j-1] == '\n' || b[j-1] == '\r') {
		j--
	}
	return b[i:j]
}
