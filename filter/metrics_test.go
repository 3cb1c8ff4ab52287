package filter

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// metricConstants are the names of this package's metric constants (an identifier with
// Metric in it, declared const in a non-test file) and the files that declare them.
func metricConstants(t *testing.T) map[string]string {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, spec := range g.Specs {
				for _, id := range spec.(*ast.ValueSpec).Names {
					if strings.Contains(id.Name, "Metric") {
						out[id.Name] = name
					}
				}
			}
		}
	}
	return out
}

// tableNames are the identifiers that name the metrics of the help table in metrics.go.
func tableNames(t *testing.T) map[string]bool {
	src, err := os.ReadFile("metrics.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "metrics.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "metricHelp" {
			return true
		}
		for _, e := range vs.Values[0].(*ast.CompositeLit).Elts {
			if id, ok := e.(*ast.CompositeLit).Elts[0].(*ast.Ident); ok {
				out[id.Name] = true
			} else {
				t.Errorf("metricHelp: the entry at %d names its metric by a literal, not by its constant", e.Pos())
			}
		}
		return false
	})
	return out
}

// Every metric the filter defines has a # HELP text, next to the others in metricHelp.
func TestEveryMetricHasHelp(t *testing.T) {
	consts, table := metricConstants(t), tableNames(t)
	if len(consts) < 20 {
		t.Fatalf("found only %d metric constants: %v", len(consts), consts)
	}
	for name, file := range consts {
		if !table[name] {
			t.Errorf("metric %s (%s) has no help text in metrics.go's metricHelp", name, file)
		}
	}
	for name := range table {
		if _, ok := consts[name]; !ok {
			t.Errorf("metricHelp names %s, which is no metric constant", name)
		}
	}
	seen := map[string]bool{}
	for _, m := range metricHelp {
		if m.help == "" || !strings.HasPrefix(m.name, "sluice.") || seen[m.name] {
			t.Errorf("metricHelp entry %q: %q", m.name, m.help)
		}
		seen[m.name] = true
		if got := MetricHelp(m.name); got != m.help {
			t.Errorf("MetricHelp(%q) = %q", m.name, got)
		}
	}
	for _, name := range MetricNames("per-client") {
		if !strings.HasPrefix(MetricHelp(name), "sluice rule per-client: ") {
			t.Errorf("MetricHelp(%q) = %q", name, MetricHelp(name))
		}
	}
}

func TestMetricHelp(t *testing.T) {
	for name, want := range map[string]string{
		"sluice.per-client.allowed":       "sluice rule per-client: requests allowed",
		"sluice.a.b.shadow_denied":        "sluice rule a.b: requests the rule, in shadow mode, would have denied (let through)",
		"sluice.redis.denied":             "sluice rule redis: requests denied",
		"sluice.rls.evicted_used":         "sluice rule rls: quota the evicted keys had used, which they may regain (see Bounded memory)",
		"sluice.redis.calls":              "sluice Redis: EVALSHA/EVAL sent for decisions",
		"sluice.rls.leased":               "sluice RLS: admissions the rate-limit service granted to this proxy's leases",
		"sluice.errors":                   "sluice: internal errors of the filter (recovered panics, refused local responses)",
		"sluice.per-client.something":     "",
		"sluice.allowed":                  "",
		"sluice..allowed":                 "",
		"other.per-client.allowed":        "",
		"kitchen_requests_total":          "",
		"sluice.redis.refund_failures.xx": "",
		"sluice.per-client.store_errors":  "sluice rule per-client: requests whose counter store (shared data or Redis) failed",
		"sluice.per-client.evicted":       "sluice rule per-client: live keys pushed out of the rule's full key table (raise max_keys if it grows)",
		"sluice.per-client.evicted_used":  "sluice rule per-client: quota the evicted keys had used, which they may regain (see Bounded memory)",
		"sluice.guest.heap_bytes":         "sluice: bytes of heap objects in the module",
		"sluice.redis.refund_failures":    "sluice Redis: refunds that did not land",
		"sluice.db.held":                  "sluice rule db: requests held now (gauge)",
		"sluice.llm.excess":               "sluice rule llm: cost units charged by settlements beyond the reservation (the key may go into debt)",
		"sluice.db.delay_ms":              "sluice rule db: time each request was held, in milliseconds (histogram)",
		"sluice.db.delay_refused":         "sluice rule db: requests refused at once: their wait exceeded delay.max, or the rule held delay.max_held on the worker",
	} {
		if got := MetricHelp(name); got != want {
			t.Errorf("MetricHelp(%q) = %q, want %q", name, got, want)
		}
	}
}

// One help text per rule metric: the test does not compile when the two arrays differ in length.
var _ [len(ruleMetricHelp)]string = MetricNames("")
var _ [len(delayMetricHelp)]string = DelayMetrics
var _ [len(costMetricHelp)]string = CostMetrics
