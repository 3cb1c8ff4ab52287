package rls

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
)

// Descriptor outcomes (label "outcome" of sluice_rls_descriptors_total).
const (
	outcomeOK        = "ok"
	outcomeOver      = "over_limit"
	outcomeShadow    = "shadow_over_limit" // over its limit in shadow mode: answered OK
	outcomeUnlimited = "unlimited"
	outcomeNoLimit   = "no_limit"
	outcomeRefund    = "refund"           // an inline refund descriptor
	outcomeLease     = "lease"            // a lease acquire that was granted admissions
	outcomeLeaseOver = "lease_over_limit" // a lease acquire that got none
	outcomeReturn    = "return"           // a lease return
	outcomeNegative  = "negative_hits"    // is_negative_hits: units given back
	outcomeSettle    = "settle"           // an inline settlement (sluice.settle)
)

// latencyBounds are the upper bounds (seconds) of the call latency
// histogram.
var latencyBounds = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// Metrics are the service's counters, written in the Prometheus text
// format by WritePrometheus. Domain labels are the configured or inline
// domains; any other domain is counted as "other".
type Metrics struct {
	known func(string) bool

	mu           sync.Mutex
	calls        map[[2]string]uint64 // domain, code (OK, OVER_LIMIT or a gRPC code)
	descriptors  map[[2]string]uint64 // domain, outcome
	redisErrors  uint64
	noscripts    uint64
	expireFails  uint64
	refunds      uint64
	refundFails  uint64
	leasedN      uint64 // admissions granted to lease acquires
	returnedN    uint64 // admissions given back by lease returns
	globalShadow uint64
	buckets      []uint64
	sum          float64
	count        uint64
	// Per-limit statistics (limitstats.go): by stat key; fromRequest
	// counts the keys holding request values, at most maxFromRequest.
	limits         map[string]*[numLimitStats]uint64
	fromRequest    map[string]bool
	maxFromRequest int
	limitOverflow  uint64
}

func newMetrics(known func(string) bool, maxFromRequest int) *Metrics {
	return &Metrics{known: known, calls: map[[2]string]uint64{}, descriptors: map[[2]string]uint64{},
		buckets: make([]uint64, len(latencyBounds)), limits: map[string]*[numLimitStats]uint64{},
		fromRequest: map[string]bool{}, maxFromRequest: maxFromRequest}
}

func (m *Metrics) label(domain string) string {
	if m.known(domain) {
		return domain
	}
	return "other"
}

func (m *Metrics) call(domain string, r *pb.RateLimitResponse, err error, d time.Duration) {
	code := "OK"
	switch {
	case err != nil:
		code = status.Code(err).String()
	case r.GetOverallCode() == pb.RateLimitResponse_OVER_LIMIT:
		code = "OVER_LIMIT"
	}
	k := [2]string{m.label(domain), code}
	sec := d.Seconds()
	m.mu.Lock()
	m.calls[k]++
	for i, b := range latencyBounds {
		if sec <= b {
			m.buckets[i]++
		}
	}
	m.sum += sec
	m.count++
	m.mu.Unlock()
}

func (m *Metrics) descriptor(domain, outcome string) {
	k := [2]string{m.label(domain), outcome}
	m.mu.Lock()
	m.descriptors[k]++
	m.mu.Unlock()
}

func (m *Metrics) add(p *uint64) {
	m.mu.Lock()
	*p++
	m.mu.Unlock()
}

func (m *Metrics) redisError() { m.add(&m.redisErrors) }
func (m *Metrics) noscript()   { m.add(&m.noscripts) }

// expireFailed counts a fixed-window counter's PEXPIREAT that failed.
func (m *Metrics) expireFailed() { m.add(&m.expireFails) }
func (m *Metrics) refund(ok bool) {
	if ok {
		m.add(&m.refunds)
	} else {
		m.add(&m.refundFails)
	}
}

func (m *Metrics) leased(granted, returned int64) {
	m.mu.Lock()
	m.leasedN += uint64(max(granted, 0))
	m.returnedN += uint64(max(returned, 0))
	m.mu.Unlock()
}

// Leases returns the admissions granted to lease acquires and given back
// by lease returns.
func (m *Metrics) Leases() (leased, returned uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leasedN, m.returnedN
}

// Calls returns the number of calls answered with code (OK, OVER_LIMIT or
// a gRPC status code name) for a domain label.
func (m *Metrics) Calls(domain, code string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls[[2]string{domain, code}]
}

// Descriptors returns the number of descriptors with an outcome for a
// domain label.
func (m *Metrics) Descriptors(domain, outcome string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.descriptors[[2]string{domain, outcome}]
}

// RedisErrors returns the number of descriptors Redis could not decide.
func (m *Metrics) RedisErrors() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.redisErrors
}

// GlobalShadow returns the calls over a limit answered OK by
// Options.GlobalShadow.
func (m *Metrics) GlobalShadow() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.globalShadow
}

// Refunds returns the refunds sent after denials that succeeded and failed.
func (m *Metrics) Refunds() (ok, failed uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refunds, m.refundFails
}

// WritePrometheus writes the metrics in the Prometheus text format 0.0.4.
func (m *Metrics) WritePrometheus(w io.Writer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	bw := bufio.NewWriter(w)
	family := func(name, kind, help string) {
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
	}
	labelled := func(name, l1, l2 string, vals map[[2]string]uint64) {
		keys := make([][2]string, 0, len(vals))
		for k := range vals {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
		})
		for _, k := range keys {
			fmt.Fprintf(bw, "%s{%s=%s,%s=%s} %d\n", name, l1, quoteLabel(k[0]), l2, quoteLabel(k[1]), vals[k])
		}
	}
	family("sluice_rls_calls_total", "counter", "ShouldRateLimit calls by domain and answer (OK, OVER_LIMIT or the gRPC error code).")
	labelled("sluice_rls_calls_total", "domain", "code", m.calls)
	family("sluice_rls_descriptors_total", "counter", "Descriptors decided, by domain and outcome (ok, over_limit, shadow_over_limit, unlimited, no_limit, refund, lease, lease_over_limit, return, negative_hits).")
	labelled("sluice_rls_descriptors_total", "domain", "outcome", m.descriptors)
	for _, c := range []struct {
		name, help string
		v          uint64
	}{
		{"sluice_rls_redis_errors_total", "Descriptors Redis could not decide (no reply, timeout, error reply); the call is answered UNAVAILABLE.", m.redisErrors},
		{"sluice_rls_redis_noscript_total", "Scripts re-sent with EVAL after NOSCRIPT.", m.noscripts},
		{"sluice_rls_redis_expire_errors_total", "Fixed-window counters (window counters, and --charge-denied's) whose PEXPIREAT failed after INCRBY counted the hits: the decision stands, the key may outlive its window.", m.expireFails},
		{"sluice_rls_refunds_total", "Admissions refunded because another descriptor of the call denied it (or the call failed).", m.refunds},
		{"sluice_rls_refund_failures_total", "Refunds that failed, and denials whose units a window counter could not take back: those units stay charged until their window passes.", m.refundFails},
		{"sluice_rls_leased_total", "Admissions granted to lease acquires (sluice.lease descriptors).", m.leasedN},
		{"sluice_rls_returned_total", "Admissions given back by lease returns (sluice.return descriptors).", m.returnedN},
		{"sluice_rls_global_shadow_total", "Calls over a limit answered OK because of --shadow-mode.", m.globalShadow},
	} {
		family(c.name, "counter", c.help)
		fmt.Fprintf(bw, "%s %d\n", c.name, c.v)
	}
	m.writeLimits(bw, family)
	family("sluice_rls_call_duration_seconds", "histogram", "ShouldRateLimit latency, Redis round trips included.")
	for i, b := range latencyBounds {
		fmt.Fprintf(bw, "sluice_rls_call_duration_seconds_bucket{le=\"%s\"} %d\n", strconv.FormatFloat(b, 'g', -1, 64), m.buckets[i])
	}
	fmt.Fprintf(bw, "sluice_rls_call_duration_seconds_bucket{le=\"+Inf\"} %d\n", m.count)
	fmt.Fprintf(bw, "sluice_rls_call_duration_seconds_sum %s\n", strconv.FormatFloat(m.sum, 'g', -1, 64))
	fmt.Fprintf(bw, "sluice_rls_call_duration_seconds_count %d\n", m.count)
	return bw.Flush()
}

func quoteLabel(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

// Handler serves /metrics (Prometheus text) and /healthz (200 "ok" while
// healthy() returns nil, else 503 with the reason).
func (m *Metrics) Handler(healthy func() error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		m.WritePrometheus(w)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := healthy(); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "unhealthy:", err)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return mux
}
