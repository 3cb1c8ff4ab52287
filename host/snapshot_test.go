package host

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// promSample is one sample line read back by checkExposition.
type promSample struct {
	name   string
	labels map[string]string // unescaped values
	value  float64
}

var (
	metricNameRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelNameRE  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// checkExposition reads text strictly as the Prometheus text format 0.0.4 and reports every
// departure from it: the text is UTF-8 and ends with a newline; every family has exactly
// one # HELP and one # TYPE line (HELP first), before its samples, which come in one block;
// a HELP text uses only the escapes \\ and \n; names and label names are valid, label
// names are not reserved or repeated, label values are quoted with only \\, \" and \n
// escaped; a sample's name is its family's (or, for a histogram, _bucket/_sum/_count of
// it, buckets with an le label ending at +Inf); no series appears twice. It returns the
// samples keyed by series ("name{a=\"x\",b=\"y\"}" with labels sorted) and each family's
// HELP text, unescaped.
func checkExposition(t *testing.T, text string) (map[string]promSample, map[string]string) {
	t.Helper()
	if !utf8.ValidString(text) {
		t.Errorf("the output is not valid UTF-8")
	}
	if !strings.HasSuffix(text, "\n") {
		t.Errorf("the output does not end with a newline")
	}
	samples := map[string]promSample{}
	helps := map[string]string{}
	types := map[string]string{}
	done := map[string]bool{} // families whose block has ended
	family := ""
	infSeen := map[string]bool{}
	for n, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		n++
		fail := func(format string, args ...any) {
			t.Errorf("line %d %q: %s", n, line, fmt.Sprintf(format, args...))
		}
		if strings.HasPrefix(line, "#") {
			f := strings.SplitN(line, " ", 4)
			if len(f) < 3 || (f[1] != "HELP" && f[1] != "TYPE") {
				fail("a comment that is neither HELP nor TYPE")
				continue
			}
			name := f[2]
			if !metricNameRE.MatchString(name) {
				fail("invalid metric name")
			}
			if name != family {
				if family != "" {
					done[family] = true
				}
				if done[name] {
					fail("family %s appears in two blocks", name)
				}
				family = name
			}
			switch f[1] {
			case "HELP":
				if _, dup := helps[name]; dup {
					fail("second HELP")
				}
				if _, typed := types[name]; typed {
					fail("HELP after TYPE")
				}
				if len(f) < 4 {
					fail("empty HELP")
					continue
				}
				h, ok := unescape(f[3], false)
				if !ok {
					fail("bad escape in HELP")
				}
				helps[name] = h
			case "TYPE":
				if _, dup := types[name]; dup {
					fail("second TYPE")
				}
				if _, ok := helps[name]; !ok {
					fail("TYPE without HELP")
				}
				if len(f) != 4 || !slices.Contains([]string{"counter", "gauge", "histogram", "summary", "untyped"}, f[3]) {
					fail("bad TYPE")
					continue
				}
				types[name] = f[3]
			}
			continue
		}
		s, ok := parseSampleLine(line)
		if !ok {
			fail("not a sample line")
			continue
		}
		if !metricNameRE.MatchString(s.name) {
			fail("invalid metric name")
		}
		kind, typed := types[family]
		if !typed {
			fail("sample before its family's TYPE")
		}
		belongs := s.name == family
		if kind == "histogram" {
			belongs = s.name == family+"_bucket" || s.name == family+"_sum" || s.name == family+"_count"
			if _, le := s.labels["le"]; le != (s.name == family+"_bucket") {
				fail("le label on a histogram's %s sample: %v", strings.TrimPrefix(s.name, family), le)
			}
		} else if _, le := s.labels["le"]; le {
			fail("le label outside a histogram")
		}
		if !belongs {
			fail("sample of family %s inside the block of %s", s.name, family)
		}
		key := seriesKey(s.name, s.labels)
		if _, dup := samples[key]; dup {
			fail("series %s appears twice", key)
		}
		samples[key] = s
		if s.name == family+"_bucket" && s.labels["le"] == "+Inf" {
			l := maps(s.labels)
			delete(l, "le")
			infSeen[seriesKey(family, l)] = true
		}
	}
	for key, s := range samples {
		if strings.HasSuffix(s.name, "_count") && types[strings.TrimSuffix(s.name, "_count")] == "histogram" {
			if !infSeen[seriesKey(strings.TrimSuffix(s.name, "_count"), s.labels)] {
				t.Errorf("histogram series %s has no +Inf bucket", key)
			}
		}
	}
	return samples, helps
}

func maps(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func seriesKey(name string, labels map[string]string) string {
	if len(labels) == 0 {
		return name
	}
	var names []string
	for k := range labels {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, k := range names {
		parts = append(parts, k+"="+strconv.Quote(labels[k]))
	}
	return name + "{" + strings.Join(parts, ",") + "}"
}

// unescape undoes the text format's escaping: \\ and \n, and \" in label values.
func unescape(s string, quote bool) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i++; i == len(s) {
			return "", false
		}
		switch {
		case s[i] == '\\':
			b.WriteByte('\\')
		case s[i] == 'n':
			b.WriteByte('\n')
		case s[i] == '"' && quote:
			b.WriteByte('"')
		default:
			return "", false
		}
	}
	return b.String(), true
}

// parseSampleLine reads `name{label="value",...} value` strictly: no blanks inside the label
// set, one space before the value, no timestamp (the host writes none).
func parseSampleLine(line string) (promSample, bool) {
	s := promSample{labels: map[string]string{}}
	i := strings.IndexAny(line, "{ ")
	if i <= 0 {
		return s, false
	}
	s.name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		rest = rest[1:]
		for {
			eq := strings.IndexByte(rest, '=')
			if eq <= 0 || !labelNameRE.MatchString(rest[:eq]) || strings.HasPrefix(rest[:eq], "__") {
				return s, false
			}
			name := rest[:eq]
			rest = rest[eq+1:]
			if rest == "" || rest[0] != '"' {
				return s, false
			}
			j := 1
			for ; j < len(rest) && rest[j] != '"'; j++ {
				if rest[j] == '\\' {
					j++
				}
			}
			if j >= len(rest) {
				return s, false
			}
			v, ok := unescape(rest[1:j], true)
			if !ok || !utf8.ValidString(v) {
				return s, false
			}
			if _, dup := s.labels[name]; dup {
				return s, false
			}
			s.labels[name] = v
			rest = rest[j+1:]
			if strings.HasPrefix(rest, ",") {
				rest = rest[1:]
				continue
			}
			if !strings.HasPrefix(rest, "}") {
				return s, false
			}
			rest = rest[1:]
			break
		}
	}
	if !strings.HasPrefix(rest, " ") || strings.Contains(rest[1:], " ") {
		return s, false
	}
	v, err := strconv.ParseFloat(rest[1:], 64)
	if err != nil || math.IsNaN(v) {
		return s, false
	}
	s.value = v
	return s, true
}

// Guest metric names are whatever the guest passes to proxy_define_metric: quotes,
// backslashes, newlines, braces, unicode, invalid UTF-8, names that collide. The output is
// still strict Prometheus text, and well-formed labels keep their exact values.
func TestPrometheusOutputWithHostileMetricNames(t *testing.T) {
	h, _ := newHost(t, "minimal", Options{Workers: 2, MetricHelp: func(name string) string {
		switch name {
		case "helped":
			return "a HELP with a \\ backslash,\na newline and \"quotes\""
		case "sluice.a.allowed":
			return "sluice rule a: requests allowed"
		}
		return ""
	}})
	type def struct {
		kind  MetricType
		name  string
		value uint64
	}
	defs := []def{
		{MetricCounter, `q{path="/a\"b\\c\nd",method="GET"}`, 3},
		{MetricCounter, `q{method="POST"}`, 4},
		{MetricCounter, "evil\nname 1\n# TYPE x gauge", 5},
		{MetricCounter, `inj{v="a"} 99` + "\n" + `other{b="c"}`, 6},
		{MetricGauge, "sluice.ünï.allowed", 7},
		{MetricGauge, `u{city="Zürich ☃"}`, 8},
		{MetricGauge, "日本", 9},
		{MetricGauge, "bad\xff{v=\"\xfe\"}", 10},
		{MetricCounter, `l{"weird name"="v",  x = "y" ,}`, 11},
		{MetricHistogram, `h{le="1"}`, 12},
		{MetricCounter, `r{__name__="x"}`, 13},
		{MetricCounter, `bad_escape{a="\t"}`, 14},
		{MetricCounter, `unterminated{a="x}`, 15},
		{MetricCounter, `twice{a="1",a="2"}`, 16},
		{MetricCounter, `{a="b"}`, 17},
		{MetricCounter, "", 18},
		{MetricCounter, "9lives", 19},
		{MetricCounter, "dup.a", 20},
		{MetricCounter, "dup_a", 21}, // the same series as dup.a: left out
		{MetricCounter, "kind.clash", 22},
		{MetricGauge, "kind_clash", 23}, // the same family, another type: left out
		{MetricHistogram, "hh", 24},
		{MetricCounter, "hh_count", 25},           // one of hh's sample names: left out
		{MetricGauge, "sluice.host.workers", 26},  // a host family: left out
		{MetricHistogram, `lat{route="/x"}`, 100}, // a histogram with labels
		{MetricCounter, "helped", 27},
		{MetricCounter, "sluice.a.allowed", 28},
	}
	for _, d := range defs {
		id, st := h.metrics.define(d.kind, d.name)
		if st != StatusOK {
			t.Fatalf("define %q: %v", d.name, st)
		}
		if st := h.metrics.record(id, d.value); st != StatusOK {
			t.Fatalf("record %q: %v", d.name, st)
		}
	}
	var b strings.Builder
	if err := h.Snapshot().WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	samples, helps := checkExposition(t, out)
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}

	want := map[string]float64{
		`q{method="GET",path="/a\"b\\c\nd"}`:     3,
		`q{method="POST"}`:                       4,
		"evil_name_1___TYPE_x_gauge":             5,
		"inj_v__a___99_other_b__c__":             6,
		"sluice__n__allowed":                     7,
		`u{city="Zürich ☃"}`:                     8,
		"__":                                     9,
		`bad_{v="` + "\uFFFD" + `"}`:             10,
		`l{_weird_name_="v",x="y"}`:              11,
		`h_le__1___count`:                        1,
		`r___name____x__`:                        13,
		`bad_escape_a___t__`:                     14,
		`unterminated_a__x_`:                     15,
		`twice_a__1__a__2__`:                     16,
		`_a__b__`:                                17,
		"_":                                      18,
		"_lives":                                 19,
		"dup_a":                                  20,
		"kind_clash":                             22,
		"hh_count":                               1,
		"hh_sum":                                 24,
		`lat_bucket{le="100",route="/x"}`:        1,
		`lat_bucket{le="50",route="/x"}`:         0,
		`lat_bucket{le="+Inf",route="/x"}`:       1,
		`lat_sum{route="/x"}`:                    100,
		"helped":                                 27,
		"sluice_a_allowed":                       28,
		"sluice_host_workers":                    2,
		"sluice_host_metrics_unexposed":          4,
		`sluice_host_worker_healthy{worker="1"}`: 1,
	}
	for k, v := range want {
		if s, ok := samples[k]; !ok || s.value != v {
			t.Errorf("%s = %v (present %v), want %v", k, s.value, ok, v)
		}
	}
	for k, v := range map[string]string{
		"helped":                     "a HELP with a \\ backslash,\na newline and \"quotes\"",
		"sluice_a_allowed":           "sluice rule a: requests allowed",
		"q":                          `Proxy-Wasm counter defined by the module: q{method="POST"}`,
		"evil_name_1___TYPE_x_gauge": "Proxy-Wasm counter defined by the module: evil\nname 1\n# TYPE x gauge",
		"sluice_host_workers":        "Workers (one VM each).",
	} {
		if helps[k] != v {
			t.Errorf("HELP of %s = %q, want %q", k, helps[k], v)
		}
	}
	st := h.Snapshot().Status()
	if got := strings.Join(st.MetricsUnexposed, " "); got != "dup_a hh_count kind_clash sluice.host.workers" {
		t.Errorf("unexposed %q", got)
	}
	// The parsed names are in the snapshot too.
	m, ok := h.Metric(`q{path="/a\"b\\c\nd",method="GET"}`)
	if !ok || m.Family != "q" || !slices.Equal(m.Labels, []Label{{"method", "GET"}, {"path", "/a\"b\\c\nd"}}) {
		t.Errorf("snapshot of q: %+v", m)
	}
}

// A metric name's label set: what parses and what is part of the name instead.
func TestParseMetricName(t *testing.T) {
	for _, c := range []struct {
		name, kind string
		family     string
		labels     []Label
	}{
		{"a.b-c", "counter", "a_b_c", nil},
		{`a{x="1"}`, "counter", "a", []Label{{"x", "1"}}},
		{`a{ y = "2" , x="1", }`, "counter", "a", []Label{{"x", "1"}, {"y", "2"}}},
		{`a{}`, "counter", "a", nil},
		{`a{x-y="1"}`, "counter", "a", []Label{{"x_y", "1"}}},
		{`a{9x="1"}`, "counter", "a", []Label{{"_x", "1"}}},
		{`a{x:y="1"}`, "counter", "a", []Label{{"x_y", "1"}}},
		{`a{le="1"}`, "counter", "a", []Label{{"le", "1"}}},
		{`a{le="1"}`, "histogram", "a_le__1__", nil},
		{`a{x="1" y="2"}`, "counter", `a_x__1__y__2__`, nil},
		{`a{x=1}`, "counter", `a_x_1_`, nil},
		{`a{x="\q"}`, "counter", `a_x___q__`, nil},
		{`a{x="1"`, "counter", `a_x__1_`, nil},
		{`a:b{x="}"}`, "counter", "a:b", []Label{{"x", "}"}}},
		{"ünï", "counter", "_n_", nil},
	} {
		kind := MetricCounter
		if c.kind == "histogram" {
			kind = MetricHistogram
		}
		f, l := parseMetricName(c.name, kind)
		if f != c.family || !slices.Equal(l, c.labels) {
			t.Errorf("parseMetricName(%q, %s) = %q %v, want %q %v", c.name, c.kind, f, l, c.family, c.labels)
		}
	}
}

// The snapshot carries the configuration in force on each worker, which follows
// Reconfigure, and whether the host is closed; /status and /healthz say the same.
func TestSnapshotConfigsAndClosed(t *testing.T) {
	h, _ := newHost(t, "kitchen", Options{Workers: 2, PluginConfig: []byte("v1"), MorePlugins: [][]byte{[]byte("p1")}})
	ctx := testCtx(t)
	configs := func(p int) string {
		var parts []string
		for _, c := range h.Snapshot().Plugins[p].Configs {
			parts = append(parts, fmt.Sprintf("%s@%v", c.Config, c.Workers))
		}
		return strings.Join(parts, " ")
	}
	if got := configs(0) + " | " + configs(1); got != "v1@[0 1] | p1@[0 1]" {
		t.Fatalf("at start: %s", got)
	}
	if err := h.Reconfigure(ctx, 0, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	if got := configs(0) + " | " + configs(1); got != "v2@[0 1] | p1@[0 1]" {
		t.Errorf("after Reconfigure: %s", got)
	}
	if err := h.Reconfigure(ctx, 0, []byte("reject-me")); err == nil {
		t.Fatal("the guest accepted reject-me")
	}
	if got := configs(0); got != "v2@[0 1]" {
		t.Errorf("after a refused Reconfigure: %s", got)
	}
	// Workers that disagree (as when a reconfiguration reaches a worker without a VM).
	done := make(chan struct{})
	if err := h.workers[1].post(ctx, job{fn: func(w *worker) { w.setConfig(0, []byte("v3")); close(done) }}); err != nil {
		t.Fatal(err)
	}
	<-done
	s := h.Snapshot()
	if got := configs(0); got != "v2@[0] v3@[1]" || string(s.Plugins[0].Config()) != "v2" {
		t.Errorf("workers disagreeing: %s", got)
	}
	srv := httptest.NewServer(h.AdminHandler())
	defer srv.Close()
	_, body := get(t, srv.Client(), "GET", srv.URL+"/status", nil)
	var st AdminStatus
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatal(err)
	}
	if st.Closed || st.PluginConfig != "v2" || len(st.Plugins) != 2 || len(st.Plugins[0].Configs) != 2 ||
		st.Plugins[0].Configs[1].Config != "v3" || !slices.Equal(st.Plugins[0].Configs[1].Workers, []int{1}) || st.Plugins[1].Configs[0].Config != "p1" {
		t.Errorf("/status: %s", body)
	}
	if s.Closed {
		t.Error("closed before Close")
	}
	if ok, reason := s.Health(); !ok || reason != "ok" {
		t.Errorf("health %v %q", ok, reason)
	}

	h.Close(context.Background())
	s = h.Snapshot()
	if !s.Closed || len(s.Stats.Workers) != 2 {
		t.Errorf("after Close: closed %v, %d workers", s.Closed, len(s.Stats.Workers))
	}
	resp, body := get(t, srv.Client(), "GET", srv.URL+"/healthz", nil)
	if resp.StatusCode != 503 || body != "closed\n" {
		t.Errorf("/healthz after Close: %d %q", resp.StatusCode, body)
	}
	_, body = get(t, srv.Client(), "GET", srv.URL+"/status", nil)
	if !strings.Contains(body, `"closed": true`) {
		t.Errorf("/status after Close: %s", body)
	}
}
