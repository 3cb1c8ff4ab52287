package rlqs

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Actions (label "action" of sluice_rlqs_actions_total).
const (
	actionTokenBucket = "token_bucket" // a new token bucket (a grant)
	actionRepeat      = "repeat"       // the current assignment again (its TTL extended)
	actionDenyAll     = "deny_all"
	actionAllowAll    = "allow_all"
	actionAbandon     = "abandon"
)

// domainStats are one domain's counters.
type domainStats struct {
	streams, buckets     int64  // gauges: on this replica
	assigned             uint64 // tokens granted in new token buckets
	used, denied         uint64 // requests reported allowed / denied on buckets with a limit
	reports              uint64 // bucket usages reported (any bucket)
	actions              map[string]uint64
	unsupported, nolimit uint64 // bucket reports answered ALLOW_ALL for these reasons
}

// Metrics are the RLQS service's counters, per domain: configured domains
// by name, any other as "other".
type Metrics struct {
	known func(string) bool

	mu          sync.Mutex
	domains     map[string]*domainStats
	redisErrors uint64
	noscripts   uint64
	streamErrs  map[string]uint64 // gRPC code of streams the service ended with an error
	continues   map[string]uint64 // continuation outcomes (continue.go), by result
}

// NewMetrics returns empty metrics; known says which domains get their own
// label.
func NewMetrics(known func(string) bool) *Metrics {
	if known == nil {
		known = func(string) bool { return false }
	}
	return &Metrics{known: known, domains: map[string]*domainStats{}, streamErrs: map[string]uint64{}, continues: map[string]uint64{}}
}

func (m *Metrics) label(domain string) string {
	if m.known(domain) {
		return domain
	}
	return "other"
}

// with runs f on domain's stats under the lock.
func (m *Metrics) with(domain string, f func(*domainStats)) {
	l := m.label(domain)
	m.mu.Lock()
	s := m.domains[l]
	if s == nil {
		s = &domainStats{actions: map[string]uint64{}}
		m.domains[l] = s
	}
	f(s)
	m.mu.Unlock()
}

func (m *Metrics) redisError() { m.mu.Lock(); m.redisErrors++; m.mu.Unlock() }
func (m *Metrics) noscript()   { m.mu.Lock(); m.noscripts++; m.mu.Unlock() }
func (m *Metrics) streamError(code string) {
	m.mu.Lock()
	m.streamErrs[code]++
	m.mu.Unlock()
}

func (m *Metrics) continued(result string) {
	m.mu.Lock()
	m.continues[result]++
	m.mu.Unlock()
}

// Continued is the number of continuation outcomes of the result.
func (m *Metrics) Continued(result string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.continues[result]
}

// Snapshot is one domain's counters (for tests and the dashboard).
type Snapshot struct {
	Streams, Buckets     int64
	Assigned, Used       uint64
	Denied, Reports      uint64
	Actions              map[string]uint64
	Unsupported, NoLimit uint64
}

// Domain returns domain's counters ("other" for an unconfigured one).
func (m *Metrics) Domain(domain string) Snapshot {
	var out Snapshot
	m.with(domain, func(s *domainStats) {
		out = Snapshot{Streams: s.streams, Buckets: s.buckets, Assigned: s.assigned, Used: s.used, Denied: s.denied,
			Reports: s.reports, Actions: map[string]uint64{}, Unsupported: s.unsupported, NoLimit: s.nolimit}
		for k, v := range s.actions {
			out.Actions[k] = v
		}
	})
	return out
}

// RedisErrors is the number of allocations Redis did not decide.
func (m *Metrics) RedisErrors() uint64 { m.mu.Lock(); defer m.mu.Unlock(); return m.redisErrors }

// StreamErrors is the number of streams ended with the gRPC code.
func (m *Metrics) StreamErrors(code string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.streamErrs[code]
}

// WritePrometheus writes the counters in the Prometheus text format.
func (m *Metrics) WritePrometheus(w io.Writer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	bw := bufio.NewWriter(w)
	names := make([]string, 0, len(m.domains))
	for d := range m.domains {
		names = append(names, d)
	}
	sort.Strings(names)
	type series struct {
		name, typ, help string
		get             func(*domainStats) string
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	i := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, s := range []series{
		{"sluice_rlqs_streams", "gauge", "RLQS streams open on this replica.", func(s *domainStats) string { return i(s.streams) }},
		{"sluice_rlqs_buckets", "gauge", "Buckets the RLQS streams of this replica report.", func(s *domainStats) string { return i(s.buckets) }},
		{"sluice_rlqs_assigned_total", "counter", "Tokens granted in new token-bucket assignments.", func(s *domainStats) string { return u(s.assigned) }},
		{"sluice_rlqs_used_total", "counter", "Requests reported allowed on buckets with a limit.", func(s *domainStats) string { return u(s.used) }},
		{"sluice_rlqs_denied_total", "counter", "Requests reported denied on buckets with a limit.", func(s *domainStats) string { return u(s.denied) }},
		{"sluice_rlqs_reports_total", "counter", "Bucket usage reports received.", func(s *domainStats) string { return u(s.reports) }},
		{"sluice_rlqs_no_limit_total", "counter", "Bucket reports answered ALLOW_ALL: no limit matches.", func(s *domainStats) string { return u(s.nolimit) }},
		{"sluice_rlqs_unsupported_total", "counter", "Bucket reports answered ALLOW_ALL: the limit's algorithm is not fixed_window.", func(s *domainStats) string { return u(s.unsupported) }},
	} {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", s.name, s.help, s.name, s.typ)
		for _, d := range names {
			fmt.Fprintf(bw, "%s{domain=%s} %s\n", s.name, quote(d), s.get(m.domains[d]))
		}
	}
	fmt.Fprintf(bw, "# HELP sluice_rlqs_actions_total Bucket actions sent, by action.\n# TYPE sluice_rlqs_actions_total counter\n")
	for _, d := range names {
		acts := make([]string, 0, len(m.domains[d].actions))
		for a := range m.domains[d].actions {
			acts = append(acts, a)
		}
		sort.Strings(acts)
		for _, a := range acts {
			fmt.Fprintf(bw, "sluice_rlqs_actions_total{domain=%s,action=%s} %d\n", quote(d), quote(a), m.domains[d].actions[a])
		}
	}
	fmt.Fprintf(bw, "# HELP sluice_rlqs_redis_errors_total Allocations Redis did not decide (no new assignment sent).\n# TYPE sluice_rlqs_redis_errors_total counter\nsluice_rlqs_redis_errors_total %d\n", m.redisErrors)
	fmt.Fprintf(bw, "# HELP sluice_rlqs_noscript_total EVAL fallbacks after NOSCRIPT.\n# TYPE sluice_rlqs_noscript_total counter\nsluice_rlqs_noscript_total %d\n", m.noscripts)
	fmt.Fprintf(bw, "# HELP sluice_rlqs_stream_errors_total Streams the service ended with an error, by gRPC code.\n# TYPE sluice_rlqs_stream_errors_total counter\n")
	writeByLabel(bw, "sluice_rlqs_stream_errors_total", "code", m.streamErrs)
	fmt.Fprintf(bw, "# HELP sluice_rlqs_continued_total Buckets of a named Envoy's new stream, by what became of its previous participant: adopted (continued), own (a participant of its own), duplicate (taken over by another stream of the same name).\n# TYPE sluice_rlqs_continued_total counter\n")
	writeByLabel(bw, "sluice_rlqs_continued_total", "result", m.continues)
	return bw.Flush()
}

// writeByLabel writes one line of name per key of m, labelled, sorted.
func writeByLabel(w io.Writer, name, label string, m map[string]uint64) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "%s{%s=%s} %d\n", name, label, quote(k), m[k])
	}
}

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}
