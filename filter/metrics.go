package filter

import (
	"errors"
	"strings"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// The help texts of the metrics the filter defines, for the # HELP lines of a Prometheus
// exposition (the embedded host's /metrics, through host.Options.MetricHelp; Envoy writes
// none). The names are defined where they are counted; TestEveryMetricHasHelp fails when
// a metric constant of this package has no line here.
//
// Plain data of constant strings: a build that never calls MetricHelp (the module) links
// none of it.
var metricHelp = [...]struct{ name, help string }{
	{ErrorsMetric, "sluice: internal errors of the filter (recovered panics, refused local responses)"},
	{GCCyclesMetric, "sluice: garbage collections the module has run"},
	{HeapBytesMetric, "sluice: bytes of heap objects in the module"},
	{DebugAllocsMetric, "sluice (debug build): heap allocations of the module"},

	{MetricRedisCalls, "sluice Redis: EVALSHA/EVAL sent for decisions"},
	{MetricRedisNoScript, "sluice Redis: NOSCRIPT answers, retried with EVAL"},
	{MetricRedisFailures, "sluice Redis: decisions Redis could not make"},
	{MetricRedisTimeouts, "sluice Redis: failures that were timeouts (a timeout status, or the guest's guard)"},
	{MetricRedisFailOpen, "sluice Redis: failures let through (failure_mode open)"},
	{MetricRedisFailClosed, "sluice Redis: failures rejected with 503 (failure_mode closed)"},
	{MetricRedisFailLocal, "sluice Redis: failures decided locally (failure_mode local)"},
	{MetricRedisRefunds, "sluice Redis: refunds sent for denied multi-rule requests"},
	{MetricRedisRefundFailures, "sluice Redis: refunds that did not land"},
	{MetricRedisLeased, "sluice Redis: admissions granted to this proxy's leases"},
	{MetricRedisReturned, "sluice Redis: unspent leased admissions sent back to Redis"},
	{MetricRedisSettlements, "sluice Redis: token-budget settlements sent (cost.response: actual - reserved charged or refunded)"},
	{MetricRedisSettleFailures, "sluice Redis: settlements that did not land (the reservation stands as the cost)"},

	{MetricRLSCalls, "sluice RLS: ShouldRateLimit calls sent for decisions and leases (acquires, returns)"},
	{MetricRLSFailures, "sluice RLS: rule decisions the rate-limit service could not make"},
	{MetricRLSTimeouts, "sluice RLS: failures that were timeouts (DEADLINE_EXCEEDED, or the guest's guard)"},
	{MetricRLSFailOpen, "sluice RLS: failures let through (failure_mode open)"},
	{MetricRLSFailClosed, "sluice RLS: failures rejected with 503 (failure_mode closed)"},
	{MetricRLSFailLocal, "sluice RLS: failures decided locally (failure_mode local)"},
	{MetricRLSRefunds, "sluice RLS: refund descriptors sent (an admission each, undone for a denied multi-rule request)"},
	{MetricRLSRefundFailures, "sluice RLS: admissions not refunded (no refund token, or the call failed)"},
	{MetricRLSLeased, "sluice RLS: admissions the rate-limit service granted to this proxy's leases"},
	{MetricRLSReturned, "sluice RLS: unspent leased admissions sent back through the rate-limit service"},
	{MetricRLSSettlements, "sluice RLS: token-budget settlements sent (sluice.settle descriptors)"},
	{MetricRLSSettleFailures, "sluice RLS: settlements that did not land (the reservation stands as the cost)"},
}

// ruleMetricHelp describes a rule's counters, in MetricNames's order.
var ruleMetricHelp = [...]string{
	"requests allowed",
	"requests denied",
	"requests the rule, in shadow mode, would have denied (let through)",
	"requests whose counter store (shared data or Redis) failed",
	"live keys pushed out of the rule's full key table (raise max_keys if it grows)",
	"quota the evicted keys had used, which they may regain (see Bounded memory)",
}

// DelayMetrics are the metrics a rule with "delay" has besides RuleCounters
// (hold.go), named as RuleMetric names them: counters of the requests it
// held, refused because their wait exceeded delay.max (or the rule held
// delay.max_held on the worker already), and abandoned while held (the
// client went away); a gauge of the requests held now (summed over
// workers); a histogram of the time held, in milliseconds.
var DelayMetrics = [5]string{"delayed", "delay_refused", "delay_abandoned", "held", "delay_ms"}

var delayMetricHelp = [...]string{
	"requests held until their slot and then released upstream",
	"requests refused at once: their wait exceeded delay.max, or the rule held delay.max_held on the worker",
	"held requests whose client went away before their slot",
	"requests held now (gauge)",
	"time each request was held, in milliseconds (histogram)",
}

// defineMetric defines (or looks up) metric name of type mt and puts its id in *id; the
// error names the metric and the host's status.
func defineMetric(h abi.Host, mt abi.MetricType, name string, id *uint32) error {
	v, st := h.DefineMetric(mt, name)
	if st != abi.StatusOK {
		return errors.New("defining metric " + name + ": " + st.String())
	}
	*id = v
	return nil
}

// MetricHelp returns the # HELP text of a metric the filter defines: a description of
// its other metrics, "sluice rule R: requests allowed" for rule R's sluice.R.allowed (and
// so on, MetricNames), and "" for a name the filter does not define. For
// host.Options.MetricHelp.
func MetricHelp(name string) string {
	for i := range metricHelp {
		if metricHelp[i].name == name {
			return metricHelp[i].help
		}
	}
	rest, ok := strings.CutPrefix(name, "sluice.")
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return ""
	}
	rule, counter := rest[:i], rest[i+1:]
	for k, c := range RuleCounters {
		if c == counter {
			return "sluice rule " + rule + ": " + ruleMetricHelp[k]
		}
	}
	for k, c := range DelayMetrics {
		if c == counter {
			return "sluice rule " + rule + ": " + delayMetricHelp[k]
		}
	}
	for k, c := range ConcurrencyMetrics {
		if c == counter {
			return "sluice rule " + rule + ": " + concurrencyMetricHelp[k]
		}
	}
	for k, c := range CostMetrics {
		if c == counter {
			return "sluice rule " + rule + ": " + costMetricHelp[k]
		}
	}
	return topGaugeHelp(rule, counter)
}
