// Package e2e holds sluice's black-box end-to-end scenarios: each one is a plugin
// configuration and a list of HTTP requests with the responses they must get. They talk to
// a proxy only over HTTP, so the same scenarios run against `sluice run` (the embedded
// Proxy-Wasm host, the default, built and started by the tests themselves) and against Envoy
// as a local process (envoy_run_test.go). See target_test.go for the targets.
package e2e

import (
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"time"
)

// Scenario is one plugin configuration and the requests that exercise it.
type Scenario struct {
	Name string
	// Config is the plugin configuration (the JSON contract of the README).
	Config string
	// Workers is the number of VMs (sluice run --workers, Envoy --concurrency); 0: 2.
	Workers int
	// HostOnly scenarios need the embedded host (e.g. its exit status); the Envoy target
	// skips them.
	HostOnly bool
	// StartFails, when set, says the proxy must refuse to start with this configuration
	// and what its error output must contain. Steps are then empty.
	StartFails *StartFailure
	// Routes name the proxy's routes (sluice run --route NAME=PATH_PREFIX; named routes in
	// the Envoy bootstrap): the route name the filter sees (xds.route_name). The longest
	// matching prefix wins; a request none matches has no route name. Empty: one unnamed
	// route.
	Routes []Route
	Steps  []Step
}

// Route is a named route of a scenario's proxy.
type Route struct {
	Name, PathPrefix string
}

// StartFailure is the expected outcome of a configuration the proxy must refuse.
type StartFailure struct {
	// StderrContains are substrings the error output (sluice run's stderr, Envoy's log)
	// must contain: the guest's own message.
	StderrContains []string
	// HostContains and EnvoyContains are more substrings, each proxy's own words.
	HostContains, EnvoyContains []string
}

// Request is one HTTP request, relative to the proxy's base URL.
type Request struct {
	Method string // default GET
	Path   string // default "/"
	Header http.Header
	// HTTP2 sends the request over HTTP/2 cleartext with prior knowledge (h2c), as gRPC
	// clients do; the response must come back over HTTP/2.
	HTTP2 bool
}

// Step sends a request (Times times in sequence, or until it matches when Poll is set, or
// Burst.N times at once) and checks every response.
type Step struct {
	Desc string
	Req  Request
	// Times sends the request this many times in sequence; every response must match
	// Want. 0 means 1.
	Times int
	// Poll, when nonzero, resends the request every 50 ms until a response matches Want,
	// failing when none has after Poll. Responses that do not match must still be one of
	// the statuses in PollWhile (a request recovering from a limit may get 429 meanwhile).
	Poll      time.Duration
	PollWhile []int
	Want      Expect
	// Burst, when set, replaces the single request: N concurrent requests, each of which
	// must get one of Want.Status or Burst.DeniedStatus, exactly Admitted of them Want.Status.
	Burst *Burst
	// Flood, when set, replaces the single request: a key flood (see Flood) on Req's path.
	Flood *Flood
}

// Flood is a key flood sent over Conns connections in one seeded random order:
// Attackers keys sending AttackerRequests each, Innocents clients sending InnocentRequests
// and Heavy keys sending HeavyRequests, the key in header KeyHeader. Every response must be
// Want.Status or DeniedStatus; at most MaxInnocentDenied innocent requests may be denied,
// at most MaxHeavyAdmitted requests of one heavy key admitted; on the embedded host, the
// proxy's shared-data entries (admin /status) must be at most MaxSharedKeys afterwards.
type Flood struct {
	KeyHeader                           string
	Attackers, AttackerRequests         int
	Innocents, InnocentRequests         int
	Heavy, HeavyRequests                int
	Conns                               int
	MaxInnocentDenied, MaxHeavyAdmitted int
	MaxSharedKeys                       int
	DeniedStatus                        int
}

// Burst is N concurrent identical requests with an exact expected admission count. The
// runner first opens N connections (with requests that carry no rule's key, path /e2e-warm)
// and then releases all N requests at once, so that they race on every worker.
type Burst struct {
	N            int
	Admitted     int
	DeniedStatus int
}

// Expect is what a response must look like.
type Expect struct {
	Status int
	// Body, when non-empty, must equal the response body.
	Body string
	// Header checks, by header name.
	Header map[string]Check
}

// Check is a condition on one response header.
type Check struct {
	kind       checkKind
	s          string
	re         *regexp.Regexp
	min, max   int64
	hasMaximum bool
}

type checkKind int

const (
	checkExact checkKind = iota
	checkAbsent
	checkRegexp
	checkInt
)

// Exact requires the header to have exactly the value v (one value).
func Exact(v string) Check { return Check{kind: checkExact, s: v} }

// Absent requires the header not to be present.
func Absent() Check { return Check{kind: checkAbsent} }

// Matches requires the header's value to match the regular expression (anchored by the
// caller).
func Matches(re string) Check { return Check{kind: checkRegexp, re: regexp.MustCompile(re)} }

// IntIn requires the header to be a decimal integer in [lo, hi].
func IntIn(lo, hi int64) Check { return Check{kind: checkInt, min: lo, max: hi, hasMaximum: true} }

// IntAtLeast requires the header to be a decimal integer ≥ lo.
func IntAtLeast(lo int64) Check { return Check{kind: checkInt, min: lo} }

// String describes the check for error messages.
func (c Check) String() string {
	switch c.kind {
	case checkExact:
		return strconv.Quote(c.s)
	case checkAbsent:
		return "absent"
	case checkRegexp:
		return "matching /" + c.re.String() + "/"
	default:
		if c.hasMaximum {
			return fmt.Sprintf("an integer in [%d, %d]", c.min, c.max)
		}
		return fmt.Sprintf("an integer >= %d", c.min)
	}
}

// verify checks the values of one header (nil: absent).
func (c Check) verify(values []string) error {
	if c.kind == checkAbsent {
		if len(values) != 0 {
			return fmt.Errorf("is %q, want absent", values)
		}
		return nil
	}
	if len(values) != 1 {
		return fmt.Errorf("has %d values %q, want one value %s", len(values), values, c)
	}
	v := values[0]
	switch c.kind {
	case checkExact:
		if v != c.s {
			return fmt.Errorf("is %q, want %s", v, c)
		}
	case checkRegexp:
		if !c.re.MatchString(v) {
			return fmt.Errorf("is %q, want %s", v, c)
		}
	case checkInt:
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < c.min || (c.hasMaximum && n > c.max) {
			return fmt.Errorf("is %q, want %s", v, c)
		}
	}
	return nil
}

// Verify returns an error describing the first way status, header and body differ from e.
func (e Expect) Verify(status int, h http.Header, body []byte) error {
	if status != e.Status {
		return fmt.Errorf("status %d, want %d (body %q)", status, e.Status, truncate(body))
	}
	for name, c := range e.Header {
		if err := c.verify(h.Values(name)); err != nil {
			return fmt.Errorf("header %s %v", name, err)
		}
	}
	if e.Body != "" && string(body) != e.Body {
		return fmt.Errorf("body %q, want %q", truncate(body), e.Body)
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + "…"
	}
	return string(b)
}
