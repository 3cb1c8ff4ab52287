package host

import "testing"

// proxy_increment_metric and proxy_record_metric on a counter answer as Envoy's
// Context::incrementMetric / recordMetric do (source/extensions/common/wasm/context.cc):
// an increment ≤ 0 is BadArgument, a record adds; a gauge takes any offset.
func TestCounterIncrementsAsEnvoy(t *testing.T) {
	r := newMetricRegistry()
	c, _ := r.define(MetricCounter, "c")
	g, _ := r.define(MetricGauge, "g")
	for _, tc := range []struct {
		id    uint32
		delta int64
		want  Status
	}{{c, 0, StatusBadArgument}, {c, -1, StatusBadArgument}, {c, 2, StatusOK}, {g, 0, StatusOK}, {g, -3, StatusOK}, {99, 1, StatusNotFound}} {
		if st := r.increment(tc.id, tc.delta); st != tc.want {
			t.Errorf("increment(%d, %d) = %v, want %v", tc.id, tc.delta, st, tc.want)
		}
	}
	if st := r.record(c, 5); st != StatusOK {
		t.Errorf("record(counter, 5) = %v", st)
	}
	if st := r.record(c, 1); st != StatusOK {
		t.Errorf("record(counter, 1) = %v", st)
	}
	if v, _ := r.value(c); v != 8 {
		t.Errorf("counter = %d, want 8 (2, then records add 5 and 1)", v)
	}
	if v, _ := r.value(g); int64(v) != -3 {
		t.Errorf("gauge = %d, want -3", int64(v))
	}
}
