// Package config parses, validates and compiles the sluice plugin
// configuration (the JSON contract in DESIGN.md / README.md).
//
// Parsing is pure and strict: unknown fields, wrong types and out-of-range
// values are errors naming their JSON path. This package imports nothing from
// the filter or the host; it runs inside the Wasm guest.
package config

import (
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// Config is a parsed, validated and compiled plugin configuration.
// It is immutable after Parse returns.
type Config struct {
	Rules       []*Rule
	Response    Response
	FailureMode FailureMode
	ClientIP    ClientIP
	Redis       *Redis // nil when absent
	RLS         *RLS   // nil when absent
	// Scopes are the entries of "_rules_" (Higress's matchRules), in order:
	// each selects requests (Config.Select) and has its own configuration,
	// which applies to them instead of this one (scopes.go).
	Scopes []*Scope
	// AccessLog writes decisions where the proxy records requests; nil: off (observe.go).
	AccessLog *AccessLog
	// TopKeys keeps each rule's heavy hitters; nil: off (observe.go).
	TopKeys *TopKeys
}

// Rule is one compiled rule.
type Rule struct {
	Index     int    // position in "rules"
	Name      string // unique
	Match     Match
	Key       []KeyPart // at least one part
	Algorithm algorithms.Kind
	Limit     int64
	Window    time.Duration
	Burst     int64 // defaulted to Limit when omitted; always Limit for the window algorithms
	Backend   Backend
	Mode      Mode
	// MaxKeys bounds the live keys this rule keeps in shared data (extension;
	// default DefaultMaxKeys).
	MaxKeys int
	// MissingKey says what happens to a request the rule matches but whose
	// key is missing (KeyPart: a part the request does not have): skip,
	// shared or deny (missing_key, default MissingSkip).
	MissingKey MissingKey
	// Lease is the number of admissions a proxy reserves from the remote
	// state at once and spends locally (backend "redis" or "rls", token_bucket and
	// fixed_window; 0 = no lease: one remote call per request). See
	// filter/lease.go.
	Lease int64
	// Delay makes the rule hold a request that does not fit now but would
	// fit within Delay.Max, and release it at its slot (shaping; zero
	// Max: no delay). token_bucket and leaky_bucket, enforce mode, not
	// with Lease. On a remote backend the slot is taken in the remote
	// state (the script decides with the max delay); under failure_mode
	// "local" the fallback decides without a queue. See filter/hold.go.
	Delay Delay
	// Cost is what a request reserves and, for token budgets, what its
	// response says it cost (cost.go); nil: 1 per request.
	Cost *Cost
	// Plans and Overrides give the limit, window and burst from a table keyed by a value of
	// the request (plans.go): an override wins over a plan, a plan over the rule's own.
	// nil: none.
	Plans, Overrides *LimitTable
	// Concurrency is set on a rule with "algorithm": "concurrency" (an
	// in-flight limit: concurrency.go); nil for a rate rule. Its Limiter
	// is an *algorithms.ConcurrencyLimiter, Window is 0 and Burst Limit.
	Concurrency *Concurrency
	// Limiter is the algorithm built from Algorithm/Limit/Window/Burst.
	Limiter algorithms.Limiter
	// Fallback is a remote rule's local limiter, used while Redis (or the
	// rate-limit service) cannot decide under failure_mode "local":
	// FallbackParams of Limiter's parameters and redis.instances (or
	// rls.instances). Nil for local rules.
	Fallback algorithms.Limiter
}

// Delay is a rule's "delay": how long it may hold a request (Max), and
// how many requests it may hold at once on one worker (MaxHeld; beyond,
// a request that would be held is refused at once).
type Delay struct {
	Max     time.Duration
	MaxHeld int
}

// Bounds of "delay".
const (
	// MaxDelay is the longest delay.max: well within Envoy's default
	// stream_idle_timeout (5 minutes), which a held request is subject to.
	MaxDelay = time.Minute
	// DefaultMaxHeld is delay.max_held when omitted; MaxMaxHeld its bound.
	DefaultMaxHeld = 1000
	MaxMaxHeld     = 100_000
)

// DefaultMaxKeys is the default bound on live keys per rule.
const DefaultMaxKeys = 10000

// Backend selects where a rule's counters live.
type Backend uint8

const (
	BackendLocal Backend = iota // Proxy-Wasm shared data (one Envoy process)
	BackendRedis                // Redis Cluster through Higress's host calls
	BackendRLS                  // a rate-limit service (sluice serve) through proxy_grpc_call
)

// MissingKey is what a rule does with a request missing its key: one of
// the parts (KeyPart) absent or empty, so the request has no key of its own.
type MissingKey uint8

const (
	// MissingSkip: the rule does not apply to the request (the default).
	MissingSkip MissingKey = iota
	// MissingShared: every such request of the rule is counted under one
	// key of its own, an encoding no request's key can have.
	MissingShared
	// MissingDeny: the request is refused with the rule's rejection (in
	// shadow mode: counted as shadow_denied and let through), without
	// consulting any counter or remote backend.
	MissingDeny
)

// Mode is enforce or shadow.
type Mode uint8

const (
	ModeEnforce Mode = iota
	ModeShadow       // decide, emit headers and metrics, never reject
)

// FailureMode says what happens when the store cannot decide.
type FailureMode uint8

const (
	FailOpen   FailureMode = iota // let the request through
	FailClosed                    // reject (503)
	FailLocal                     // fall back to the local store (Redis rules)
)

// HeaderStyle selects the rate-limit response headers.
type HeaderStyle uint8

const (
	HeadersBoth HeaderStyle = iota
	HeadersDraft
	HeadersLegacy
	HeadersNone
)

// Response is the rejection response.
type Response struct {
	Status  int    // default 429
	Body    string // default "rate limited\n"
	Headers HeaderStyle
	// GRPCStatus is the gRPC status of a rejection of a gRPC request
	// (content-type application/grpc or application/grpc+…), 1..16,
	// default DefaultGRPCStatus (RESOURCE_EXHAUSTED). It is passed as
	// proxy_send_local_response's grpc_status; the proxy turns the reply
	// into a trailers-only gRPC response (HTTP 200, grpc-status, and Body
	// as grpc-message).
	GRPCStatus int
	// RuleHeader, when set, names a header of every refusal carrying the refusing rule's
	// name (off by default).
	RuleHeader string
	// Format says how the body is made; with FormatProblemJSON and FormatTemplate,
	// Template is the compiled body and ContentType its content type (observe.go).
	Format      BodyFormat
	Template    *Template
	ContentType string
}

// ClientIP says how the client address is derived.
type ClientIP struct {
	// XFFTrustedHops is the number of trusted proxies in front of this one
	// that append to X-Forwarded-For (Envoy's xff_num_trusted_hops): the
	// client is the XFFTrustedHops-th entry from the right of the header as
	// this proxy received it. 0: the client is source.address.
	XFFTrustedHops int
	// ProxyAppendsXFF says that this proxy appends its own peer to
	// X-Forwarded-For before filters run (Envoy with use_remote_address:
	// true and skip_xff_append: false), so the header the filter reads has
	// one more entry on the right, which is skipped. Only with
	// XFFTrustedHops >= 1. Nothing is inferred from address values.
	ProxyAppendsXFF bool
}

// XFFPosition returns which X-Forwarded-For entry, counted from the right of
// the header the filter reads (1 = right-most), is the client; 0 when the
// client is source.address.
func (c ClientIP) XFFPosition() int {
	if c.XFFTrustedHops == 0 {
		return 0
	}
	if c.ProxyAppendsXFF {
		return c.XFFTrustedHops + 1
	}
	return c.XFFTrustedHops
}

// Redis is the optional Redis Cluster configuration.
type Redis struct {
	Cluster   string // the Envoy cluster of the Redis service (required)
	TimeoutMS int    // bound on one Redis round trip; default DefaultRedisTimeoutMS
	// Instances is the number of proxy instances sharing the Redis limits
	// (extension, default 1). With failure_mode "local" each instance
	// enforces Limit/Instances (at least 1) while Redis is unavailable.
	Instances int
	// Username and Password are passed to the Redis init host call
	// (extension; both optional).
	Username string
	Password string
}

// RLS is the optional rate-limit service configuration (backend "rls"):
// sluice.wasm calls envoy.service.ratelimit.v3.RateLimitService/
// ShouldRateLimit with proxy_grpc_call (the wire contract is in README).
type RLS struct {
	// Cluster is the host's name of the service: an Envoy cluster (HTTP/2),
	// or a `sluice run --cluster NAME=URL` name (required).
	Cluster string
	// Domain is the request's domain; the service must enable inline
	// limits for it (sluice serve --inline-domains) (required).
	Domain string
	// TimeoutMS bounds one call; default DefaultRLSTimeoutMS.
	TimeoutMS int
	// Instances is the number of proxy instances sharing the limits
	// (extension, default 1): with failure_mode "local" each enforces
	// Limit/Instances (at least 1) while the service cannot decide.
	Instances int
}

// KeyPart is one element of a rule's key. Exactly one of the fields selects
// the source. A part is missing from a request (and so is the request's key,
// see MissingKey) when: RemoteIP, the client address cannot be read; Header,
// the header is absent or its value is empty; Query, the path has no
// parameter of that name or the first one has an empty value ("?k=" or
// "?k"); Cookie, no cookie of that name or the first one is empty ("k=",
// `k=""`); Path and Method, the request has no :path or :method.
type KeyPart struct {
	RemoteIP   bool
	IPv6Prefix int // with RemoteIP; 0 = full address
	Header     string
	Query      string
	Cookie     string
	Path       bool
	Method     bool
	// Value is a dynamic-metadata field or an attribute (metadata.go);
	// missing when the proxy does not have it or it is empty.
	Value ValueRef
}

// Match selects the requests a rule applies to. The zero Match matches every
// request.
type Match struct {
	PathPrefix string
	Methods    []string
	Headers    []HeaderMatch
	// Routes are route names (match.routes): the request's route, as the
	// proxy names it, must be one of them (Match.MatchesRoute).
	Routes []string
	// Values are conditions on dynamic metadata and attributes
	// (match.metadata, match.attributes; Match.MatchesValues).
	Values []ValueMatch
}

// HeaderMatch matches one request header: its value is Exact, or with
// Absent the request does not have it (absent, or present with an empty
// value: what a header key part treats as missing).
type HeaderMatch struct {
	Name   string // lower-cased
	Exact  string
	Absent bool
}
