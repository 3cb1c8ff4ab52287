package filter

import (
	"errors"
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// Top keys as gauges (top_keys.gauges N): per rule and kind, N gauges named by rank —
// sluice.RULE.top_denied_1 … _N and sluice.RULE.top_consumed_1 … _N (Envoy:
// wasmcustom.sluice.RULE.top_denied_1) — whatever the number of keys: a fixed cardinality
// of 2 × N per rule. When a period ends, the worker whose merge ends it (one, by
// compare-and-swap) sets them to the counts of the finished period's top N keys, 0 past
// the last key; which key holds a rank is in the period's log line (log_every) or in
// `sluice run`'s /status. A rule whose period ends with nothing counted sets them to 0:
// with gauges every tick also ends the quiet rules' periods (a shared-data read per rule
// and kind, once a second per worker), so a gauge never keeps an old period's counts.
// Proxy-Wasm's proxy_record_metric sets a gauge (Envoy's Context::recordMetric, and the
// embedded host); Envoy's dynamic module ABI has no such call, so config refuses gauges
// there.

// TopKeysGauge is the name of the gauge of rank (from 1) of rule's kind ("denied" or
// "consumed").
func TopKeysGauge(rule, kind string, rank int) string {
	return RuleMetric(rule, "top_"+kind+"_"+strconv.Itoa(rank))
}

// defineGauges defines top_keys.gauges' gauges of every rule (none without the option).
func (t *topKeys) defineGauges() error {
	n := t.cfg.Gauges
	if n == 0 {
		return nil
	}
	rec, ok := t.p.host.(abi.MetricRecorder)
	if !ok {
		return errors.New(`top_keys.gauges needs a host that sets gauges (proxy_record_metric)`)
	}
	for k := range t.gauges {
		for _, rc := range t.p.cfg.Rules {
			ids := make([]uint32, n)
			for i := range ids {
				if err := defineMetric(t.p.host, abi.MetricGauge, TopKeysGauge(ruleID(t.p.scope, rc.Name), topKindNames[k], i+1), &ids[i]); err != nil {
					return err
				}
			}
			t.gauges[k] = append(t.gauges[k], ids)
		}
	}
	t.rec = rec
	return nil
}

// setGauges sets rule's gauges of kind to the counts of t.merged, the period that just
// ended.
func (t *topKeys) setGauges(rule, kind int) {
	if t.rec == nil {
		return
	}
	ids := t.gauges[kind][rule]
	top := t.merged.Top(len(ids))
	for i, id := range ids {
		var v uint64
		if i < len(top) {
			v = top[i].Count
		}
		t.rec.RecordMetric(id, v)
	}
}

// topGaugeHelp describes a top-keys gauge (rest is RULE.COUNTER of its name); "" for
// another name.
func topGaugeHelp(rule, counter string) string {
	rest, ok := strings.CutPrefix(counter, "top_")
	if !ok {
		return ""
	}
	for _, kind := range topKindNames {
		r, ok := strings.CutPrefix(rest, kind+"_")
		if n, err := strconv.Atoi(r); ok && err == nil && n >= 1 && strconv.Itoa(n) == r {
			what := "denials"
			if kind == "consumed" {
				what = "consumption (cost units)"
			}
			return "sluice rule " + rule + ": the " + what + " of the key ranked " + r + " in the last finished top-keys period (gauge; the key is in the period's log line)"
		}
	}
	return ""
}
