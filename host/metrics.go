package host

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Metric is a snapshot of one guest-defined metric.
type Metric struct {
	Name  string // as the guest defined it
	Type  MetricType
	Value int64 // counter or gauge value; for a histogram, the number of observations
	Sum   uint64
	// Buckets are cumulative counts for histogram upper bounds HistogramBounds.
	Buckets []uint64
}

// HistogramBounds are the upper bounds of histogram buckets (Envoy's defaults).
var HistogramBounds = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

type metric struct {
	name string
	kind MetricType
	val  atomic.Int64

	mu      sync.Mutex
	count   uint64
	sum     uint64
	buckets []uint64 // non-cumulative, len(HistogramBounds)+1
}

// metricRegistry is process-wide for a Host: ids are the same on every worker.
type metricRegistry struct {
	mu     sync.Mutex
	byName map[string]uint32
	list   atomic.Pointer[[]*metric] // id-1 -> metric; copy-on-write
}

func newMetricRegistry() *metricRegistry {
	r := &metricRegistry{byName: map[string]uint32{}}
	empty := []*metric{}
	r.list.Store(&empty)
	return r
}

func (r *metricRegistry) define(kind MetricType, name string) (uint32, Status) {
	if kind > MetricHistogram {
		return 0, StatusBadArgument
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if id, ok := r.byName[name]; ok {
		if (*r.list.Load())[id-1].kind != kind {
			return 0, StatusBadArgument
		}
		return id, StatusOK
	}
	old := *r.list.Load()
	m := &metric{name: name, kind: kind}
	if kind == MetricHistogram {
		m.buckets = make([]uint64, len(HistogramBounds)+1)
	}
	nl := make([]*metric, len(old), len(old)+1)
	copy(nl, old)
	nl = append(nl, m)
	r.list.Store(&nl)
	id := uint32(len(nl))
	r.byName[name] = id
	return id, StatusOK
}

func (r *metricRegistry) get(id uint32) *metric {
	l := *r.list.Load()
	if id == 0 || int(id) > len(l) {
		return nil
	}
	return l[id-1]
}

func (r *metricRegistry) increment(id uint32, delta int64) Status {
	m := r.get(id)
	if m == nil {
		return StatusNotFound
	}
	switch m.kind {
	case MetricCounter:
		if delta < 0 {
			return StatusBadArgument
		}
		m.val.Add(delta)
	case MetricGauge:
		m.val.Add(delta)
	default:
		return StatusBadArgument
	}
	return StatusOK
}

func (r *metricRegistry) record(id uint32, value uint64) Status {
	m := r.get(id)
	if m == nil {
		return StatusNotFound
	}
	switch m.kind {
	case MetricCounter:
		for {
			cur := m.val.Load()
			if int64(value) < cur {
				return StatusBadArgument
			}
			if m.val.CompareAndSwap(cur, int64(value)) {
				return StatusOK
			}
		}
	case MetricGauge:
		m.val.Store(int64(value))
	case MetricHistogram:
		i := sort.SearchFloat64s(HistogramBounds, float64(value))
		m.mu.Lock()
		m.count++
		m.sum += value
		m.buckets[i]++
		m.mu.Unlock()
	}
	return StatusOK
}

func (r *metricRegistry) value(id uint32) (uint64, Status) {
	m := r.get(id)
	if m == nil {
		return 0, StatusNotFound
	}
	if m.kind == MetricHistogram {
		return 0, StatusBadArgument
	}
	return uint64(m.val.Load()), StatusOK
}

func (m *metric) snapshot() Metric {
	s := Metric{Name: m.name, Type: m.kind, Value: m.val.Load()}
	if m.kind == MetricHistogram {
		m.mu.Lock()
		s.Value = int64(m.count)
		s.Sum = m.sum
		s.Buckets = make([]uint64, len(HistogramBounds))
		var c uint64
		for i := range HistogramBounds {
			c += m.buckets[i]
			s.Buckets[i] = c
		}
		m.mu.Unlock()
	}
	return s
}

// Metrics returns a snapshot of the guest's metrics, sorted by name.
func (h *Host) Metrics() []Metric {
	l := *h.metrics.list.Load()
	out := make([]Metric, 0, len(l))
	for _, m := range l {
		out = append(out, m.snapshot())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Metric returns the named guest metric.
func (h *Host) Metric(name string) (Metric, bool) {
	h.metrics.mu.Lock()
	id, ok := h.metrics.byName[name]
	h.metrics.mu.Unlock()
	if !ok {
		return Metric{}, false
	}
	return h.metrics.get(id).snapshot(), true
}

// promName splits a guest metric name into a Prometheus name and label set. A name of the
// form `base{label="v",...}` keeps its labels; any character of base outside [a-zA-Z0-9_:]
// becomes '_' (so Envoy-style "a.b.c" becomes "a_b_c").
func promName(name string) (base, labels string) {
	base = name
	if i := strings.IndexByte(name, '{'); i > 0 && strings.HasSuffix(name, "}") {
		base, labels = name[:i], name[i+1:len(name)-1]
	}
	b := []byte(base)
	for i, c := range b {
		ok := c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9' && i > 0)
		if !ok {
			b[i] = '_'
		}
	}
	return string(b), labels
}

func withLabel(labels, extra string) string {
	switch {
	case labels == "" && extra == "":
		return ""
	case labels == "":
		return "{" + extra + "}"
	case extra == "":
		return "{" + labels + "}"
	}
	return "{" + labels + "," + extra + "}"
}

// WritePrometheus writes the guest's metrics and the host's own in the Prometheus text format.
func (h *Host) WritePrometheus(w io.Writer) error {
	bw := bufio.NewWriter(w)
	type row struct {
		base, labels string
		m            Metric
	}
	var rows []row
	for _, m := range h.Metrics() {
		b, l := promName(m.Name)
		rows = append(rows, row{b, l, m})
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].base < rows[j].base })
	lastBase := ""
	for _, r := range rows {
		if r.base != lastBase {
			kind := "counter"
			switch r.m.Type {
			case MetricGauge:
				kind = "gauge"
			case MetricHistogram:
				kind = "histogram"
			}
			fmt.Fprintf(bw, "# TYPE %s %s\n", r.base, kind)
			lastBase = r.base
		}
		if r.m.Type != MetricHistogram {
			fmt.Fprintf(bw, "%s%s %d\n", r.base, withLabel(r.labels, ""), r.m.Value)
			continue
		}
		for i, ub := range HistogramBounds {
			fmt.Fprintf(bw, "%s_bucket%s %d\n", r.base, withLabel(r.labels, fmt.Sprintf("le=%q", fmtFloat(ub))), r.m.Buckets[i])
		}
		fmt.Fprintf(bw, "%s_bucket%s %d\n", r.base, withLabel(r.labels, `le="+Inf"`), r.m.Value)
		fmt.Fprintf(bw, "%s_sum%s %d\n", r.base, withLabel(r.labels, ""), r.m.Sum)
		fmt.Fprintf(bw, "%s_count%s %d\n", r.base, withLabel(r.labels, ""), r.m.Value)
	}
	st := h.Stats()
	fmt.Fprintf(bw, "# HELP sluice_host_workers Workers (one VM each).\n# TYPE sluice_host_workers gauge\nsluice_host_workers %d\n", len(st.Workers))
	fmt.Fprintf(bw, "# HELP sluice_host_requests_total Requests run through the filter.\n# TYPE sluice_host_requests_total counter\nsluice_host_requests_total %d\n", st.Requests)
	fmt.Fprintf(bw, "# HELP sluice_host_vm_restarts_total VMs replaced after a trap.\n# TYPE sluice_host_vm_restarts_total counter\nsluice_host_vm_restarts_total %d\n", st.VMRestarts)
	fmt.Fprintf(bw, "# HELP sluice_host_failed_requests_total Requests whose VM trapped.\n# TYPE sluice_host_failed_requests_total counter\nsluice_host_failed_requests_total %d\n", st.Failed)
	fmt.Fprintf(bw, "# HELP sluice_host_worker_memory_bytes Linear memory of each worker's VM.\n# TYPE sluice_host_worker_memory_bytes gauge\n")
	for _, w := range st.Workers {
		fmt.Fprintf(bw, "sluice_host_worker_memory_bytes{worker=\"%d\"} %d\n", w.ID, w.MemoryBytes)
	}
	fmt.Fprintf(bw, "# HELP sluice_host_worker_healthy 1 if the worker has a configured VM.\n# TYPE sluice_host_worker_healthy gauge\n")
	for _, w := range st.Workers {
		fmt.Fprintf(bw, "sluice_host_worker_healthy{worker=\"%d\"} %d\n", w.ID, b2u(w.Healthy))
	}
	fmt.Fprintf(bw, "# HELP sluice_host_shared_data_keys Keys in shared data.\n# TYPE sluice_host_shared_data_keys gauge\nsluice_host_shared_data_keys %d\n", st.SharedData.Keys)
	fmt.Fprintf(bw, "# HELP sluice_host_shared_data_bytes Bytes of keys and values in shared data.\n# TYPE sluice_host_shared_data_bytes gauge\nsluice_host_shared_data_bytes %d\n", st.SharedData.Bytes)
	fmt.Fprintf(bw, "# HELP sluice_host_uptime_seconds Seconds since the host started.\n# TYPE sluice_host_uptime_seconds gauge\nsluice_host_uptime_seconds %.3f\n", st.Uptime.Seconds())
	return bw.Flush()
}

func fmtFloat(f float64) string {
	if f == math.Trunc(f) {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%g", f)
}
