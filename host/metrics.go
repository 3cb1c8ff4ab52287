package host

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
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
	// Family and Labels are Name in Prometheus terms (see "Metrics" in the package doc):
	// the metric family name, sanitised, and the labels of a name of the form
	// base{label="value",...}, sorted by name, values unescaped.
	Family string
	Labels []Label
	// Help is the text of the family's # HELP line: Options.MetricHelp(Name) when that
	// returns one, else "Proxy-Wasm TYPE defined by the module: NAME".
	Help string
}

// Label is one label of a guest metric name.
type Label struct{ Name, Value string }

// HistogramBounds are the upper bounds of histogram buckets (Envoy's defaults).
var HistogramBounds = []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000}

type metric struct {
	name   string
	kind   MetricType
	family string  // parseMetricName(name, kind), computed once
	labels []Label // idem; never modified
	val    atomic.Int64

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
	m.family, m.labels = parseMetricName(name, kind)
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
		// Envoy refuses an offset ≤ 0 on a counter (Context::incrementMetric,
		// source/extensions/common/wasm/context.cc; checked on 1.40.0: 0 and -1 → 2).
		if delta <= 0 {
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
		// Envoy adds the value to a counter (Context::recordMetric: counter->add(value));
		// checked on 1.40.0: recording 5 then 1 on a counter at 2 gives 8.
		m.val.Add(int64(value))
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
	s := Metric{Name: m.name, Type: m.kind, Value: m.val.Load(), Family: m.family, Labels: slices.Clone(m.labels)}
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
		s := m.snapshot()
		s.Help = h.metricHelp(m)
		out = append(out, s)
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
	m := h.metrics.get(id)
	s := m.snapshot()
	s.Help = h.metricHelp(m)
	return s, true
}

// metricHelp is the # HELP text of a guest metric.
func (h *Host) metricHelp(m *metric) string {
	if h.opts.MetricHelp != nil {
		if help := h.opts.MetricHelp(m.name); help != "" {
			return help
		}
	}
	return "Proxy-Wasm " + metricKind(m.kind) + " defined by the module: " + m.name
}

func metricKind(k MetricType) string {
	switch k {
	case MetricGauge:
		return "gauge"
	case MetricHistogram:
		return "histogram"
	}
	return "counter"
}

// parseMetricName gives a guest metric name its Prometheus family name and labels (see
// "Metrics" in the package doc). A name of the form base{label="value",...}, with values
// escaped as in the Prometheus text format (\\, \" and \n), keeps its labels; their names
// are sanitised like the family's (without ':'). A label set that does not parse — an
// unquoted or unterminated value, an unknown escape, a label name that is empty, reserved
// (starting with "__"), repeated, or "le" on a histogram — is not a label set: the whole
// name is then the family name. Label values are made valid UTF-8.
func parseMetricName(name string, kind MetricType) (family string, labels []Label) {
	if i := strings.IndexByte(name, '{'); i > 0 && strings.HasSuffix(name, "}") {
		if l, ok := parseLabelSet(name[i+1:len(name)-1], kind); ok {
			return sanitizeName(name[:i], true), l
		}
	}
	return sanitizeName(name, true), nil
}

// sanitizeName makes s a valid Prometheus metric name (colon true) or label name: every
// character outside [a-zA-Z0-9_] (and ':'), and a leading digit, becomes '_' — one per
// character, or per byte of invalid UTF-8; an empty name becomes "_".
func sanitizeName(s string, colon bool) string {
	var b strings.Builder
	b.Grow(len(s))
	for i, r := range s {
		if r == '_' || (colon && r == ':') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9' && i > 0) {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "_"
	}
	return b.String()
}

// parseLabelSet parses the inside of {...}: label="value" pairs separated by commas, with
// optional blanks around them and an optional trailing comma. The labels come back sorted.
func parseLabelSet(s string, kind MetricType) ([]Label, bool) {
	var labels []Label
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			break
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return nil, false
		}
		raw := strings.TrimRight(s[:eq], " \t")
		if raw == "" {
			return nil, false
		}
		name := sanitizeName(raw, false)
		if strings.HasPrefix(name, "__") || (kind == MetricHistogram && name == "le") {
			return nil, false
		}
		s = strings.TrimLeft(s[eq+1:], " \t")
		if s == "" || s[0] != '"' {
			return nil, false
		}
		var v strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] != '\\' {
				v.WriteByte(s[i])
				continue
			}
			if i++; i == len(s) {
				return nil, false
			}
			switch s[i] {
			case '\\', '"':
				v.WriteByte(s[i])
			case 'n':
				v.WriteByte('\n')
			default:
				return nil, false
			}
		}
		if i == len(s) {
			return nil, false // no closing quote
		}
		labels = append(labels, Label{name, strings.ToValidUTF8(v.String(), "\uFFFD")})
		s = strings.TrimLeft(s[i+1:], " \t")
		if s == "" {
			break
		}
		if s[0] != ',' {
			return nil, false
		}
		s = s[1:]
	}
	sort.Slice(labels, func(i, j int) bool { return labels[i].Name < labels[j].Name })
	for i := 1; i < len(labels); i++ {
		if labels[i].Name == labels[i-1].Name {
			return nil, false
		}
	}
	return labels, true
}

// The Prometheus text format (version 0.0.4): label values escape \, " and newline; HELP
// texts escape \ and newline; both are UTF-8.
var (
	labelValueEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper       = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

// promFamily is one metric family of the Prometheus output.
type promFamily struct {
	name, help, kind string
	host             bool // one of the host's own (sluice_host_*)
	series           []promSeries
	keys             map[string]bool // the series' label keys
}

// promSeries is one series: a guest metric, or one of the host's values.
type promSeries struct {
	labels []Label
	key    string  // the labels rendered: the series' identity and its sort key
	value  string  // counter or gauge
	hist   *Metric // histogram
}

func labelKey(labels []Label) string {
	var b strings.Builder
	for i, l := range labels {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(l.Name)
		b.WriteString(`="`)
		b.WriteString(labelValueEscaper.Replace(l.Value))
		b.WriteByte('"')
	}
	return b.String()
}

func (f *promFamily) add(s promSeries) bool {
	s.key = labelKey(s.labels)
	if f.keys[s.key] {
		return false
	}
	if f.keys == nil {
		f.keys = map[string]bool{}
	}
	f.keys[s.key] = true
	f.series = append(f.series, s)
	return true
}

// sampleNames are the names a family's samples use.
func sampleNames(family, kind string) []string {
	if kind == "histogram" {
		return []string{family, family + "_bucket", family + "_sum", family + "_count"}
	}
	return []string{family}
}

// hostFamilies are the host's own metrics, from s.Stats; unexposed is the count of guest
// metrics left out.
func (s Snapshot) hostFamilies(unexposed int) []*promFamily {
	st := s.Stats
	one := func(name, kind, help, value string) *promFamily {
		f := &promFamily{name: name, kind: kind, help: help, host: true}
		f.add(promSeries{value: value})
		return f
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	memory := &promFamily{name: "sluice_host_worker_memory_bytes", kind: "gauge", help: "Linear memory of each worker's VM.", host: true}
	healthy := &promFamily{name: "sluice_host_worker_healthy", kind: "gauge", help: "1 if the worker has a configured VM.", host: true}
	for _, w := range st.Workers {
		l := []Label{{"worker", strconv.Itoa(w.ID)}}
		memory.add(promSeries{labels: l, value: u(w.MemoryBytes)})
		h := "0"
		if w.Healthy {
			h = "1"
		}
		healthy.add(promSeries{labels: l, value: h})
	}
	return []*promFamily{
		one("sluice_host_workers", "gauge", "Workers (one VM each).", strconv.Itoa(len(st.Workers))),
		one("sluice_host_requests_total", "counter", "Requests run through the filter.", u(st.Requests)),
		one("sluice_host_vm_restarts_total", "counter", "VMs replaced after a trap.", u(st.VMRestarts)),
		one("sluice_host_failed_requests_total", "counter", "Requests whose VM trapped.", u(st.Failed)),
		memory,
		healthy,
		one("sluice_host_shared_data_keys", "gauge", "Keys in shared data.", strconv.Itoa(st.SharedData.Keys)),
		one("sluice_host_shared_data_bytes", "gauge", "Bytes of keys and values in shared data.", strconv.Itoa(st.SharedData.Bytes)),
		one("sluice_host_uptime_seconds", "gauge", "Seconds since the host started.", strconv.FormatFloat(st.Uptime.Seconds(), 'f', 3, 64)),
		one("sluice_host_metrics_unexposed", "gauge", "Guest metrics left out of this output because their Prometheus name or series is another's (listed in /status).", strconv.Itoa(unexposed)),
	}
}

// promFamilies groups the snapshot into metric families: the guest's, sorted by name, then
// the host's. A guest metric whose family name is already used with another type, or by a
// host family, or by a histogram's _bucket, _sum or _count samples (or whose own would be
// another family's), or whose series is already another guest metric's (as "a.b" and
// "a_b" are), is left out; unexposed names them. Metrics are taken in name order, so the
// same metrics always win.
func (s Snapshot) promFamilies() (fams []*promFamily, unexposed []string) {
	claimed := map[string]*promFamily{} // every sample name in use -> its family
	for _, f := range s.hostFamilies(0) {
		claimed[f.name] = f
	}
	var guest []*promFamily
	for i := range s.Metrics {
		m := &s.Metrics[i]
		kind := metricKind(m.Type)
		f := claimed[m.Family]
		if f == nil {
			for _, n := range sampleNames(m.Family, kind) {
				if claimed[n] != nil {
					f = claimed[n]
				}
			}
			if f != nil {
				unexposed = append(unexposed, m.Name)
				continue
			}
			f = &promFamily{name: m.Family, help: m.Help, kind: kind}
			for _, n := range sampleNames(m.Family, kind) {
				claimed[n] = f
			}
			guest = append(guest, f)
		} else if f.host || f.name != m.Family || f.kind != kind {
			unexposed = append(unexposed, m.Name)
			continue
		}
		se := promSeries{labels: m.Labels, value: strconv.FormatInt(m.Value, 10)}
		if m.Type == MetricHistogram {
			se.hist = m
		}
		if !f.add(se) {
			unexposed = append(unexposed, m.Name)
		}
	}
	sort.Slice(guest, func(i, j int) bool { return guest[i].name < guest[j].name })
	for _, f := range guest {
		sort.Slice(f.series, func(i, j int) bool { return f.series[i].key < f.series[j].key })
	}
	return append(guest, s.hostFamilies(len(unexposed))...), unexposed
}

// WritePrometheus writes the snapshot's metrics, the guest's and the host's own, in the
// Prometheus text format (version 0.0.4). Every family has one # HELP and one # TYPE line,
// followed by all its samples; label values and HELP texts are escaped.
func (s Snapshot) WritePrometheus(w io.Writer) error {
	fams, _ := s.promFamilies()
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		help := helpEscaper.Replace(strings.ToValidUTF8(f.help, "\uFFFD"))
		fmt.Fprintf(bw, "# HELP %s %s\n# TYPE %s %s\n", f.name, help, f.name, f.kind)
		for _, se := range f.series {
			if se.hist == nil {
				writeSample(bw, f.name, se.key, "", se.value)
				continue
			}
			m := se.hist
			for i, ub := range HistogramBounds {
				writeSample(bw, f.name+"_bucket", se.key, `le="`+fmtFloat(ub)+`"`, strconv.FormatUint(m.Buckets[i], 10))
			}
			writeSample(bw, f.name+"_bucket", se.key, `le="+Inf"`, strconv.FormatInt(m.Value, 10))
			writeSample(bw, f.name+"_sum", se.key, "", strconv.FormatUint(m.Sum, 10))
			writeSample(bw, f.name+"_count", se.key, "", strconv.FormatInt(m.Value, 10))
		}
	}
	return bw.Flush()
}

// writeSample writes name{labels,extra} value; labels and extra are rendered label pairs.
func writeSample(w *bufio.Writer, name, labels, extra, value string) {
	w.WriteString(name)
	if labels != "" || extra != "" {
		w.WriteByte('{')
		w.WriteString(labels)
		if labels != "" && extra != "" {
			w.WriteByte(',')
		}
		w.WriteString(extra)
		w.WriteByte('}')
	}
	w.WriteByte(' ')
	w.WriteString(value)
	w.WriteByte('\n')
}

func fmtFloat(f float64) string {
	if f == math.Trunc(f) {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
