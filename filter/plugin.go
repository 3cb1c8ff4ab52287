package filter

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// MaxCASRetries bounds the compare-and-swap attempts of one rule for one
// request. When they run out the rule's store is considered failed for that
// request and failure_mode decides (open: the rule does not limit this
// request; closed: 503).
//
// A lost race means another worker wrote the key in between, and only
// admissions (at most limit per window) and slot claims write, so long
// losing streaks need many workers on one hot key. 16 was exhausted once in
// a loaded test run (8 workers, 2,000 concurrent requests on one key,
// sliding_log); 64 keeps that case out of reach at no cost when there is no
// contention.
const MaxCASRetries = 64

// Failure response (failure_mode "closed").
const (
	failureStatus = 503
	failureBody   = "rate limiter unavailable\n"
)

var errCASExhausted = errors.New("compare-and-swap retries exhausted")

// Plugin is one configured root context: a compiled configuration and the
// per-rule stores, metrics and scratch buffers. It is driven by VM; it is
// not safe for concurrent use (a Proxy-Wasm VM is single-threaded).
type Plugin struct {
	host     abi.Host
	id       uint32
	name     string // plugin_name property ("" when the host has none)
	cfg      *config.Config
	rules    []*rule
	seed     uint64
	req      request
	hdrs     []abi.Header
	vals     []byte           // scratch for header values
	selBuf   []byte           // scratch for a decoded query value of plans and overrides (plans.go)
	body     []byte           // rejection body
	grpcMsg  []byte           // rejection body for a gRPC request: body without its trailing newlines (grpc.go)
	errors   uint32           // metric id of sluice.errors
	logNext  int64            // store errors: when the next may be logged (Unix ns)
	logHeld  int              // store errors not logged since the last line
	redis    *redisState      // the Redis codec; nil without Redis rules
	rls      *rlsState        // the rls codec; nil without RLS rules
	remote   *remote          // the remote-call engine of redis or rls (a configuration has at most one); nil without remote rules
	holds    *holds           // the requests held by rules with delay (hold.go); nil without such rules
	conc     *concs           // the concurrency rules' slots and queue (concurrency.go); nil without such rules
	bodies   *bodyWaits       // the requests whose reservation comes from their body (bodycost.go); nil without such rules
	hasCost  bool             // a rule has "cost" (cost.go)
	settling []*rule          // the rules with cost.response, in order (a bill's items)
	bills    []*bill          // free bills
	adder    abi.HeadersAdder // host, when it adds several headers in one call (Imports); else nil
	obs      *observe         // access log, top keys, refusal extras (decision.go); nil: none

	// Scopes (scope.go): a root context's Plugin has one Plugin per entry
	// of "_rules_" (scopes, by index); a scope's Plugin has its entry
	// (scope). props is what selection and match.routes read.
	scopes []*Plugin
	scope  *config.Scope
	props  reqProps

	// The root context's tick (hold.go, remote.go): root is a scope's
	// root context's Plugin (nil for the root itself); baseTick is the
	// remote guards' period, tickMS the period set, wake the release it
	// was set for (root only).
	root             *Plugin
	baseTick, tickMS uint32
	wake             int64
}

// rule is one configured rule plus its per-request scratch state.
type rule struct {
	cfg      *config.Rule
	id       string // the name in keys and metrics (ruleID)
	store    *slotStore
	metrics  ruleMetrics
	window   int64  // window in whole seconds, rounded up, >= 1
	quoted   []byte // `"name"`
	rlPrefix []byte // `"name";r=`
	policy   []byte // `"name";q=LIMIT;w=WINDOW`
	limitVal int64  // the Limit formatted in limitStr
	limitStr []byte
	key      []byte     // key scratch
	redis    *redisRule // the Redis side (backend "redis"); nil for a local rule
	rls      *rlsRule   // the RLS side (backend "rls"); nil for a local rule
	remote   bool       // decided by p.remote (backend "redis" or "rls")
	delay    *ruleDelay // "delay" (hold.go); nil without
	conc     *ruleConc  // "algorithm": "concurrency" (concurrency.go); nil for a rate rule
	cost     *ruleCost  // "cost" (cost.go); nil: 1 per request
	// The denial cache (denycache.go): for a local rule without delay
	// or cost (cacheable), made at its first denial.
	cacheable bool
	dcache    *denyCache
	matchAll  bool // the rule has no match conditions (keyFor skips them)

	// Per request.
	units   int64             // the cost reserved (1 without "cost")
	plan    *config.PlanEntry // the parameters of plans or overrides (plans.go); nil: the rule's
	applies bool
	failed  bool
	by      *slotStore // the shared data deciding r: store, a remote rule's local fallback, or nil (the remote side decides)
	hash    uint64
	e       entry
	d       algorithms.Decision
	state   []byte // new state: in by's value buffer (slotStore.stateBuf)
}

type ruleMetrics struct {
	allowed, denied, shadowDenied, storeErrors, evicted, evictedUsed uint32
}

// MetricNames returns the counter names defined for a rule, in the order
// allowed, denied, shadow_denied, store_errors, evicted, evicted_used:
// evicted counts live keys pushed out of the rule's full slot table,
// evicted_used the quota they had used (what they may regain; see
// store.go). Proxy-Wasm metrics have no labels, so the rule name is part of
// the metric name.
func MetricNames(rule string) [6]string {
	var names [6]string
	for i, c := range RuleCounters {
		names[i] = RuleMetric(rule, c)
	}
	return names
}

// RuleCounters are the counters every rule has, in MetricNames's order.
var RuleCounters = [6]string{"allowed", "denied", "shadow_denied", "store_errors", "evicted", "evicted_used"}

// RuleMetric is the name of the rule's counter: sluice.RULE.COUNTER.
func RuleMetric(rule, counter string) string { return "sluice." + rule + "." + counter }

// ErrorsMetric counts recovered panics and other internal errors.
const ErrorsMetric = "sluice.errors"

// BuildHost is implemented by a host that says which artifact the filter runs as (the
// dynamic module: config.BuildDynamic); without it the build is sluice-redis.wasm's when
// the host has Redis calls, else sluice.wasm's.
type BuildHost interface {
	Build() config.Build
}

// configure compiles data and prepares the rules. The error is the
// configuration error (path-named lines) or a setup failure. The
// configuration is validated by config.ParseFor for this build — the same
// validation as `sluice check` (with --redis for sluice-redis.wasm) — so
// nothing below refuses a configuration for its content.
func (p *Plugin) configure(data []byte) error {
	build := config.BuildLocal
	if b, ok := p.host.(BuildHost); ok {
		build = b.Build()
	} else if hasRedisCalls(p.host) {
		build = config.BuildRedis
	}
	cfg, err := config.ParseFor(data, build)
	if err != nil {
		return err
	}
	if v, st := p.host.GetProperty(propPluginName); st == abi.StatusOK {
		p.name = string(v)
	}
	if err := defineMetric(p.host, abi.MetricCounter, ErrorsMetric, &p.errors); err != nil {
		return err
	}
	p.seed = p.sharedSeed()
	p.scope, p.scopes = nil, nil
	if err := p.setup(cfg); err != nil {
		return err
	}
	if len(cfg.Scopes) > 0 {
		scopes := make([]*Plugin, len(cfg.Scopes))
		for i, sc := range cfg.Scopes {
			q := &Plugin{host: p.host, id: p.id, name: p.name, seed: p.seed, errors: p.errors, scope: sc, root: p}
			if err := q.setup(sc.Config); err != nil {
				return err
			}
			scopes[i] = q
		}
		p.scopes = scopes
	}
	p.setTickPeriod()
	return nil
}

// setup prepares the rules of cfg: p's own configuration, or its scope's.
func (p *Plugin) setup(cfg *config.Config) error {
	rules := make([]*rule, 0, len(cfg.Rules))
	for _, rc := range cfg.Rules {
		r := &rule{cfg: rc, id: ruleID(p.scope, rc.Name)}
		m := &rc.Match
		r.matchAll = m.PathPrefix == "" && len(m.Methods) == 0 && len(m.Headers) == 0 && len(m.Routes) == 0 && len(m.Values) == 0
		prefix := "sluice:" + p.name + ":" + r.id + ":"
		r.store = newSlotStore(p.host, rc.Limiter, prefix, rc.MaxKeys)
		r.window = ceilSeconds(rc.Window)
		if r.window < 1 {
			r.window = 1
		}
		r.quoted = []byte(`"` + rc.Name + `"`)
		r.rlPrefix = []byte(`"` + rc.Name + `";r=`)
		r.policy = []byte(`"` + rc.Name + `";q=` + strconv.FormatInt(rc.Limit, 10) + ";w=" + strconv.FormatInt(r.window, 10))
		r.limitStr = make([]byte, 0, 20)
		r.key = make([]byte, 0, 64)
		names := MetricNames(r.id)
		ids := [6]*uint32{&r.metrics.allowed, &r.metrics.denied, &r.metrics.shadowDenied, &r.metrics.storeErrors, &r.metrics.evicted, &r.metrics.evictedUsed}
		for i, n := range names {
			if err := defineMetric(p.host, abi.MetricCounter, n, ids[i]); err != nil {
				return err
			}
		}
		rules = append(rules, r)
	}
	p.cfg = cfg
	p.rules = rules
	p.hdrs = make([]abi.Header, 0, 8)
	p.adder, _ = p.host.(abi.HeadersAdder) // resolved once: a type assertion is a runtime call
	maxQuoted := 0
	for _, r := range rules {
		maxQuoted = max(maxQuoted, len(r.quoted))
	}
	// Retry-After, grpc-retry-pushback-ms and RateLimit: one quoted name,
	// four numbers of at most 20 digits and separators (the other values
	// are precomputed).
	p.vals = make([]byte, 0, 3*maxQuoted+9*20+48) // a plan's policy: a name and two numbers more (plans.go)
	p.body = []byte(cfg.Response.Body)
	p.grpcMsg = grpcMessage(cfg.Response.Body)
	if err := p.setupObserve(cfg); err != nil {
		return err
	}
	p.redis, p.rls, p.remote = nil, nil, nil
	var err error
	if p.holds, err = newHolds(p, rules); err != nil {
		return err
	}
	if err = p.setupConcurrency(rules); err != nil {
		return err
	}
	if err = p.setupCost(rules); err != nil {
		return err
	}
	if p.bodies, err = newBodyWaits(p, rules); err != nil {
		return err
	}
	switch {
	case cfg.HasRedisRules():
		if p.redis, p.remote, err = newRedisState(p, cfg, rules); err != nil {
			return err
		}
	case cfg.HasRLSRules():
		if p.rls, p.remote, err = newRLSState(p, cfg, rules); err != nil {
			return err
		}
	}
	p.hasCost = false
	for _, r := range rules {
		r.cacheable = !r.remote && r.delay == nil && r.cost == nil && r.conc == nil && r.cfg.Plans == nil && r.cfg.Overrides == nil
		p.hasCost = p.hasCost || r.cost != nil
	}
	return nil
}

// SeedKey is the shared-data key of the hash seed all workers share.
const SeedKey = "sluice:seed"

// sharedSeed returns the process-wide hash seed: read from shared data, or
// created there from the runtime's random source by the first worker to
// configure (create-with-CAS, so racing workers agree on one seed). A
// secret seed keeps clients from computing which slots their keys land in.
// When shared data fails, it falls back to a fixed seed (logged).
func (p *Plugin) sharedSeed() uint64 {
	key := []byte(SeedKey)
	for i := 0; i < 4; i++ {
		v, _, st := p.host.GetSharedData(key)
		if st == abi.StatusOK && len(v) == 8 {
			return binary.LittleEndian.Uint64(v)
		}
		if st != abi.StatusOK && st != abi.StatusNotFound {
			break
		}
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], rand.Uint64())
		cas := uint32(createCAS)
		if st == abi.StatusOK {
			// Unreadable seed (not 8 bytes): replace it.
			_, cas, _ = p.host.GetSharedData(key)
		}
		switch p.host.SetSharedData(key, b[:], cas) {
		case abi.StatusOK, abi.StatusCASMismatch:
			continue // read back what won
		}
		break
	}
	p.host.Log(abi.LogWarn, "sluice: cannot share the hash seed through shared data; using a fixed seed")
	return defaultSeed
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// onRequest decides a request at its headers: the one orchestration for
// local and remote (Redis, RLS) rules.
//
//  1. Each rule whose match holds gets its key (keyFor) and is decided: a
//     local rule on its shared-data slot (evaluate, no write); a remote
//     rule's decision arrives later.
//  2. A local denial (or a local store failure under failure_mode closed)
//     answers at once: no rule is charged and no remote call is made.
//  3. With remote rules applying, the backend sends their calls (dispatch)
//     and the request pauses; resume carries on when every decision is in.
//  4. charge: every admitting local rule is charged (compare-and-swap,
//     re-deciding after a lost race) and the verdict is given; a denial
//     refunds the remote admissions, an admission remembers the most
//     restrictive rule for the response headers.
func (p *Plugin) onRequest(s *stream) abi.Action {
	if p.cfg == nil || len(p.rules) == 0 {
		return abi.ActionContinue
	}
	var now int64 // read once, when the first rule applies
	p.req.reset(p.host)
	if p.bodies != nil && p.bodies.needs(s) {
		// A reservation comes from the body: decided once it is in (bodycost.go).
		return p.bodies.await(s, p.host.Now())
	}
	applied, later := false, false
	for _, r := range p.rules {
		r.applies, r.failed, r.by = false, false, nil
		k := p.keyFor(r)
		if k == keyNone {
			continue
		}
		if !applied {
			now = p.host.Now()
		}
		if k == keyDeny {
			// missing_key "deny": decided here, on no counter and with no
			// remote call. A shadow rule only counts it.
			if r.cfg.Mode == config.ModeShadow {
				p.host.IncrementMetric(r.metrics.shadowDenied, 1)
				continue
			}
			r.applies, applied = true, true
			r.d = keylessDenial(r.cfg)
			continue
		}
		r.applies, applied = true, true
		r.hash = hashKey(p.seed, r.key)
		r.units = 1
		if r.cost != nil {
			r.units = p.units(s, r)
		}
		if r.remote {
			later = true
			r.d = algorithms.Decision{Allowed: true} // undecided: not a denial yet
			continue
		}
		r.by = r.store
		if r.dcache != nil && r.dcache.get(r.hash, now, &r.d) {
			continue // denied until later: nothing to read (denycache.go)
		}
		if err := p.evaluate(r, now); err != nil {
			p.storeFailed(r, err)
		} else if !r.d.Allowed && r.cacheable {
			if r.dcache == nil {
				r.dcache = new(denyCache)
			}
			r.dcache.put(r.hash, now, &r.d)
		}
	}
	if !applied {
		return abi.ActionContinue
	}
	if act, done := p.verdict(s); done {
		return act
	}
	if !later {
		return p.charge(s, nil, now)
	}
	w := p.remote.dispatch(s, now)
	if w.missing > 0 {
		return abi.ActionPause // the engine's complete resumes it
	}
	act := p.resume(s, w, now) // every call failed at once: decide now
	p.remote.release(w)
	return act
}

// resume decides the request of w once its remote decisions are in, with
// w's stream as the effective context. Other requests used the rules'
// scratch state meanwhile: it is restored from w and the local rules are
// decided again; each remote rule takes its reply, or what failure_mode says.
func (p *Plugin) resume(s *stream, w *remoteWait, now int64) abi.Action {
	for i, r := range p.rules {
		r.applies, r.failed, r.by = w.applies[i], false, nil
		if !r.applies {
			continue
		}
		r.hash = w.hashes[i]
		r.by = r.store
		r.units = 1
		if r.cost != nil {
			r.units = p.units(s, r)
		}
		if r.remote {
			var err error
			if r.by, err = p.remote.take(r, w, i); err != nil {
				p.storeFailed(r, err)
				r.failed = r.by == nil // failure_mode local decides it here
			}
			if r.by == nil {
				continue
			}
		}
		if err := p.evaluate(r, now); err != nil {
			p.storeFailed(r, err)
		}
	}
	if act, done := p.verdict(s); done {
		p.remote.refundAdmitted(w, now)
		return act
	}
	return p.charge(s, w, now)
}

// charge charges every admitting rule decided on shared data (a rule the
// remote side decided was charged there) and gives the verdict. A denial
// refunds the remote admissions of w (nil: no remote rule applies).
func (p *Plugin) charge(s *stream, w *remoteWait, now int64) abi.Action {
	recheck := false // a commit failed or decided again to deny: the verdict may change
	for _, r := range p.rules {
		if !r.applies || r.failed || !r.d.Allowed || r.by == nil {
			continue
		}
		if err := p.commit(r, now); err != nil {
			p.storeFailed(r, err)
		}
		if r.failed || !r.d.Allowed {
			recheck = true
			continue
		}
		if r.delay != nil && r.d.Delay > 0 {
			r.delay.charged(&r.e)
		}
		if r.conc != nil {
			p.conc.acquired(s, r, now)
		}
		if r.e.evicted {
			p.host.IncrementMetric(r.metrics.evicted, 1)
			p.host.IncrementMetric(r.metrics.evictedUsed, r.e.evictedUsed)
		}
	}
	if !recheck {
		return p.admitted(s, now)
	}
	if s.conc != nil {
		p.conc.releaseStream(s, now) // acquired again if the request is admitted after all
	}
	if act, done := p.verdict(s); done {
		if w != nil {
			p.remote.refundAdmitted(w, now)
		}
		return act
	}
	return p.admitted(s, now)
}

// admitted finishes an admitted request: counts each applying rule as
// allowed (or shadow-denied), remembers the most restrictive decision for
// the response headers, and holds the request until its latest slot when a
// rule with delay admitted it into the future (hold.go).
func (p *Plugin) admitted(s *stream, now int64) abi.Action {
	var best *rule
	var delay time.Duration
	for _, r := range p.rules {
		if !r.applies || r.failed {
			continue
		}
		if r.delay != nil && r.d.Allowed && r.d.Delay > delay {
			delay = r.d.Delay
		}
		if r.d.Allowed {
			p.host.IncrementMetric(r.metrics.allowed, 1)
		} else {
			p.host.IncrementMetric(r.metrics.shadowDenied, 1)
		}
		if best == nil || moreRestrictive(&r.d, &best.d) {
			best = r
		}
	}
	if p.obs != nil {
		p.observeAdmitted(best, delay, now)
	}
	if best != nil && p.cfg.Response.Headers != config.HeadersNone {
		s.hasHeaders = true
		s.rule = best
		s.d = best.d
		s.plan = best.plan
	}
	if p.conc != nil && p.remote != nil {
		p.conc.acquiredRemote(s, now) // concurrency_remote.go
	}
	if p.hasCost {
		p.reserve(s, now)
	}
	if delay > 0 {
		return p.holds.hold(s, now, delay)
	}
	return abi.ActionContinue
}

// keyState is what keyFor found for a rule.
type keyState uint8

const (
	keyNone  keyState = iota // the rule does not apply
	keyFound                 // the rule applies under the key in r.key
	keyDeny                  // the key is missing and missing_key is "deny"
)

// sharedKey is the key under which a rule with missing_key "shared" counts
// every request missing its key. appendKey starts every key with a part
// tag (tagIP..tagMethod, never 0), so no request's key is this one byte.
var sharedKey = [...]byte{tagMissing}

// keylessDenial is the decision of a rule with missing_key "deny" for a
// request missing its key. Such a request is never admitted, as a cost
// above the capacity: it is refused with the rule's capacity as the limit,
// nothing remaining, and the window as Retry-After and reset (a back-off:
// retrying without the key cannot succeed).
func keylessDenial(rc *config.Rule) algorithms.Decision {
	if rc.Concurrency != nil {
		w := rc.Concurrency.RetryAfter
		return algorithms.Decision{Limit: rc.Limit, ResetAfter: w, RetryAfter: w}
	}
	return algorithms.Decision{Allowed: false, Limit: rc.Burst, Remaining: 0, ResetAfter: rc.Window, RetryAfter: rc.Window}
}

// keyFor says whether r applies to the current request: its match holds,
// and the request has every key part (the key is left in r.key) or misses
// one and r's missing_key decides: "skip", the rule does not apply;
// "shared", it applies under sharedKey; "deny", keyDeny.
func (p *Plugin) keyFor(r *rule) keyState {
	if !r.matchAll {
		// Fetch :method and :path only when the match looks at them.
		m := &r.cfg.Match
		var method, path string
		if len(m.Methods) > 0 {
			method = unsafeString(p.req.getMethod())
		}
		if m.PathPrefix != "" {
			path = unsafeString(p.req.getNormPath())
		}
		if !m.MatchesNormal(method, path, p.req.headerF) || !p.routeMatches(m) || !p.valuesMatch(m) {
			return keyNone
		}
	}
	var ok bool
	r.key, ok = appendKey(r.key[:0], r.cfg.Key, &p.req, p.cfg.ClientIP.XFFPosition())
	r.plan = nil
	if ok {
		r.plan = p.planFor(r) // plans.go
		return keyFound
	}
	switch r.cfg.MissingKey {
	case config.MissingShared:
		r.key = append(r.key[:0], sharedKey[:]...)
		return keyFound
	case config.MissingDeny:
		return keyDeny
	}
	return keyNone
}

// verdict rejects the request when a rule's store failed under
// failure_mode closed, or an enforcing rule denied it. done is false when
// the request may go on.
func (p *Plugin) verdict(s *stream) (abi.Action, bool) {
	if p.cfg.FailureMode == config.FailClosed {
		for _, r := range p.rules {
			if r.applies && r.failed {
				if p.obs != nil && p.obs.alog != nil {
					p.obs.record(r, DecisionFailedClosed, 0)
				}
				return p.sendFailure(s), true
			}
		}
	}
	var worst *rule
	for _, r := range p.rules {
		if r.applies && !r.failed && !r.d.Allowed && r.cfg.Mode == config.ModeEnforce {
			if worst == nil || r.d.RetryAfter > worst.d.RetryAfter {
				worst = r
			}
		}
	}
	if worst == nil {
		return abi.ActionContinue, false
	}
	if p.conc.mayQueue() {
		return p.conc.enqueue(s, worst, p.host.Now()), true // concurrency.go
	}
	for _, r := range p.rules {
		if r.applies && !r.failed && !r.d.Allowed {
			if r.cfg.Mode == config.ModeEnforce {
				p.host.IncrementMetric(r.metrics.denied, 1)
				if r.delay != nil {
					p.host.IncrementMetric(r.delay.m.refused, 1)
				}
				if r.conc != nil {
					p.host.IncrementMetric(r.conc.m.refused, 1)
				}
			} else {
				p.host.IncrementMetric(r.metrics.shadowDenied, 1)
			}
		}
	}
	if p.obs != nil {
		p.observeDenied(worst)
	}
	return p.sendDenied(s, worst), true
}

// moreRestrictive orders decisions for the response headers: fewer
// remaining first, then the longer reset.
func moreRestrictive(a, b *algorithms.Decision) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// evaluate loads r's slot in r.by and decides the request against it with
// that store's limiter (no write).
func (p *Plugin) evaluate(r *rule, now int64) error {
	if err := r.by.load(r.hash, now, &r.e); err != nil {
		return err
	}
	// The new state is written where the store's value will hold it, after
	// the slot header: store then writes it without copying it.
	st, d, err := p.decide(r, r.e.state, now)
	if err != nil && errors.Is(err, algorithms.ErrCorruptState) {
		// A state this limiter cannot read (e.g. the rule changed
		// algorithm under the same name): start the key afresh.
		r.e.state = nil
		st, d, err = p.decide(r, nil, now)
	}
	if err != nil {
		return err
	}
	r.state, r.d = st, d
	return nil
}

// decide decides the request against state with r.by's limiter, into
// r.by's state buffer: with a queue for a rule with delay on its own store.
func (p *Plugin) decide(r *rule, state []byte, now int64) ([]byte, algorithms.Decision, error) {
	if r.delay != nil && r.by == r.store {
		return r.delay.decide(r.by.stateBuf(), state, now, r.units)
	}
	return limiterFor(r).Decide(r.by.stateBuf(), state, now, r.units)
}

// commit writes r's new state to r.by, re-deciding after each lost race.
// When a re-decision denies, r.d says so and nothing is written.
func (p *Plugin) commit(r *rule, now int64) error {
	for i := 0; i < MaxCASRetries; i++ {
		ok, err := r.by.store(&r.e, r.state)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if err := p.evaluate(r, now); err != nil {
			return err
		}
		if !r.d.Allowed {
			return nil
		}
	}
	return errCASExhausted
}

func (p *Plugin) storeFailed(r *rule, err error) {
	r.failed = true
	p.host.IncrementMetric(r.metrics.storeErrors, 1)
	// An outage fails every request: one line per storeErrorLogInterval, saying how many
	// went unlogged since the last (the metric counts each).
	now := p.host.Now()
	if now < p.logNext {
		p.logHeld++
		return
	}
	line := "sluice: rule " + r.id + ": " + logText(err.Error())
	if p.logHeld > 0 {
		line += " (and " + strconv.Itoa(p.logHeld) + " more store errors since the last line)"
	}
	p.logNext, p.logHeld = now+storeErrorLogInterval, 0
	p.host.Log(abi.LogWarn, line)
}

// storeErrorLogInterval is the least time between two store-error log lines of a plugin.
const storeErrorLogInterval = int64(10e9)

// logText returns s for a log line with every byte outside printable ASCII
// escaped as strconv.Quote escapes it (printable non-ASCII runes stay): a
// store error can carry text from the network, a Redis error reply.
func logText(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}

var (
	hdrContentType   = "content-type"
	textPlain        = []byte("text/plain; charset=utf-8")
	failureBodyBytes = []byte(failureBody)
)

// sendFailure rejects the request with 503 (failure_mode closed); a gRPC
// request gets UNAVAILABLE.
func (p *Plugin) sendFailure(s *stream) abi.Action {
	s.denied = true
	if p.isGRPC() {
		return p.sent(p.host.SendLocalResponse(failureStatus, "sluice_store_failure", grpcFailureMsg, p.hdrs[:0], grpcUnavailable))
	}
	p.hdrs = append(p.hdrs[:0], abi.Header{Name: hdrContentType, Value: textPlain})
	return p.sent(p.host.SendLocalResponse(failureStatus, "sluice_store_failure", failureBodyBytes, p.hdrs, abi.NoGRPCStatus))
}

// sendDenied rejects the request for rule r.
func (p *Plugin) sendDenied(s *stream, r *rule) abi.Action {
	s.denied = true
	retry := ceilSeconds(r.d.RetryAfter)
	if retry < 1 {
		retry = 1
	}
	p.vals = appendInt(p.vals[:0], retry)
	n := len(p.vals)
	if p.isGRPC() {
		return p.sendDeniedGRPC(r, p.vals[:n:n])
	}
	ctype, body := textPlain, p.body
	if p.obs != nil {
		ctype, body = p.obs.ctype, p.obs.refusal(r, p.cfg.Response.Status, retry, body)
	}
	p.hdrs = append(p.hdrs[:0],
		abi.Header{Name: hdrContentType, Value: ctype},
		abi.Header{Name: "retry-after", Value: p.vals[:n:n]})
	p.hdrs = p.appendRateLimitHeaders(p.hdrs, r, &r.d, r.plan)
	if p.obs != nil {
		p.hdrs = p.obs.appendRefusalExtras(p.hdrs, r)
	}
	return p.sent(p.host.SendLocalResponse(p.cfg.Response.Status, "sluice_rate_limited", body, p.hdrs, abi.NoGRPCStatus))
}

// sent maps the outcome of proxy_send_local_response to the callback's
// action: Pause once the response is sent; if the host refused it, the
// request continues (a stream paused without a response would hang) and
// the error is logged and counted in sluice.errors.
func (p *Plugin) sent(st abi.Status) abi.Action {
	if st == abi.StatusOK {
		return abi.ActionPause
	}
	p.host.Log(abi.LogError, "sluice: proxy_send_local_response: "+st.String())
	p.host.IncrementMetric(p.errors, 1)
	return abi.ActionContinue
}

// appendRateLimitHeaders appends the configured rate-limit headers for
// decision d of rule r, formatting values into p.vals. configure reserves
// enough capacity in p.vals that it never reallocates while headers built
// from it are in use.
func (p *Plugin) appendRateLimitHeaders(dst []abi.Header, r *rule, d *algorithms.Decision, plan *config.PlanEntry) []abi.Header {
	style := p.cfg.Response.Headers
	if style == config.HeadersNone {
		return dst
	}
	reset := ceilSeconds(d.ResetAfter)
	remaining := max(d.Remaining, 0)
	// RateLimit: "name";r=REMAINING;t=RESET. The legacy remaining and reset
	// values are sub-slices of it: each number is formatted once.
	s := len(p.vals)
	p.vals = append(p.vals, r.rlPrefix...)
	rs := len(p.vals)
	p.vals = appendInt(p.vals, remaining)
	re := len(p.vals)
	p.vals = append(p.vals, ";t="...)
	ts := len(p.vals)
	p.vals = appendInt(p.vals, reset)
	te := len(p.vals)
	if style == config.HeadersDraft || style == config.HeadersBoth {
		dst = append(dst,
			abi.Header{Name: "ratelimit", Value: p.vals[s:te:te]},
			abi.Header{Name: "ratelimit-policy", Value: p.policyFor(r, plan)})
	}
	if style == config.HeadersLegacy || style == config.HeadersBoth {
		if r.limitVal != d.Limit || r.limitStr == nil {
			r.limitVal = d.Limit
			r.limitStr = appendInt(r.limitStr[:0], d.Limit)
		}
		dst = append(dst,
			abi.Header{Name: "x-ratelimit-limit", Value: r.limitStr},
			abi.Header{Name: "x-ratelimit-remaining", Value: p.vals[rs:re:re]},
			abi.Header{Name: "x-ratelimit-reset", Value: p.vals[ts:te:te]})
	}
	return dst
}

// onResponse adds the remembered rate-limit headers to the response.
func (p *Plugin) onResponse(s *stream) abi.Action {
	if s.bill != nil && !s.denied {
		p.billHeaders(s)
	}
	if !s.hasHeaders || s.denied || p.cfg == nil {
		return abi.ActionContinue
	}
	p.responseHeaders(s)
	if p.adder != nil {
		p.adder.AddHeaders(abi.MapResponseHeaders, p.hdrs) // one guest call, not one per header
	} else {
		for i := range p.hdrs {
			p.host.AddHeader(abi.MapResponseHeaders, p.hdrs[i].Name, p.hdrs[i].Value)
		}
	}
	s.hasHeaders = false
	return abi.ActionContinue
}

// responseHeaders puts in p.hdrs (values in p.vals) the headers s's response gets: the
// rate-limit headers of its rule and the delay it was held.
func (p *Plugin) responseHeaders(s *stream) {
	p.vals = p.vals[:0]
	p.hdrs = p.hdrs[:0]
	if s.rule != nil {
		p.hdrs = p.appendRateLimitHeaders(p.hdrs, s.rule, &s.d, s.plan)
	}
	if s.heldMS > 0 {
		n := len(p.vals)
		p.vals = appendInt(p.vals, s.heldMS)
		p.hdrs = append(p.hdrs, abi.Header{Name: DelayHeader, Value: p.vals[n:len(p.vals):len(p.vals)]})
	}
}
