package dashboard

import "strings"

// ruleMetricHelp describes the counters the filter defines per rule (RuleMetric).
var ruleMetricHelp = map[string]string{
	"allowed":       "requests allowed",
	"denied":        "requests denied",
	"shadow_denied": "requests the rule, in shadow mode, would have denied (let through)",
	"store_errors":  "requests whose counter store (shared data or Redis) failed",
	"evicted":       "live keys pushed out of the rule's full key table (raise max_keys if it grows)",
	"evicted_used":  "quota the evicted keys had used, which they may regain (see Bounded memory)",
}

// filterMetricHelp describes the filter's other metrics.
var filterMetricHelp = map[string]string{
	ErrorsMetric:                   "sluice: internal errors of the filter (recovered panics, refused local responses)",
	"sluice.guest.gc_cycles":       "sluice: garbage collections the module has run",
	"sluice.guest.heap_bytes":      "sluice: bytes of heap objects in the module",
	"sluice.debug.guest_allocs":    "sluice (debug build): heap allocations of the module",
	"sluice.redis.calls":           "sluice Redis: EVALSHA/EVAL sent for decisions",
	"sluice.redis.noscript":        "sluice Redis: NOSCRIPT answers, retried with EVAL",
	"sluice.redis.failures":        "sluice Redis: decisions Redis could not make",
	"sluice.redis.timeouts":        "sluice Redis: failures that were timeouts (a timeout status, or the guest's guard)",
	"sluice.redis.fail_open":       "sluice Redis: failures let through (failure_mode open)",
	"sluice.redis.fail_closed":     "sluice Redis: failures rejected with 503 (failure_mode closed)",
	"sluice.redis.fail_local":      "sluice Redis: failures decided locally (failure_mode local)",
	"sluice.redis.refunds":         "sluice Redis: refunds sent for denied multi-rule requests",
	"sluice.redis.refund_failures": "sluice Redis: refunds that did not land",
}

// MetricHelp is the # HELP text of the filter's metrics, for host.Options.MetricHelp:
// "sluice rule per-client: requests allowed" for sluice.per-client.allowed, a description
// of the filter's other metrics, and "" for a name the filter does not define.
func MetricHelp(name string) string {
	if h, ok := filterMetricHelp[name]; ok {
		return h
	}
	rest, ok := strings.CutPrefix(name, "sluice.")
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return ""
	}
	if h, ok := ruleMetricHelp[rest[i+1:]]; ok {
		return "sluice rule " + rest[:i] + ": " + h
	}
	return ""
}
