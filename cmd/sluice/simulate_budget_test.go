package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// budgetCSV: a budget of 10 per 10 s; a reservation of 10 that uses 2
// (refunded a second later), one refused meanwhile, one of 5 that uses 20
// (a debt of 11), one refused in debt, one after it whose response gives
// no cost.
const budgetCSV = "timestamp,key,cost,actual,duration\n0,a,10,2,1s\n0.5,a,5,5\n1,a,5,20\n2,a,1,1\n13,a,1\n"

// --settle: the summary and the report show the budget with settlement
// next to the same reservations never settled.
func TestSimulateSettle(t *testing.T) {
	dir := t.TempDir()
	csv, out := filepath.Join(dir, "b.csv"), filepath.Join(dir, "r.html")
	os.WriteFile(csv, []byte(budgetCSV), 0o644)
	args := []string{"--algorithm", "token_bucket", "--limit", "10", "--window", "10s", "--burst", "10", "--csv", csv, "--out", out}
	stdout, stderr, code := runSim(t, append(args, "--settle")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"rule          budget               admitted  refused  reserved  actual  refunded  excess  max debt  max actual in any window",
		"token_bucket  with settlement      3         2        16        23      8         15      11        22",
		"token_bucket  without (estimates)  3         2        12        4       -         -       -         3",
		"token_bucket: actual <= limit + burst (20) + in-flight excess + late refunds holds in all 3 windows (1 beyond 20); 3 settled, 1 without usage (reservation)",
		"simulated 10 decisions",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s := parseReport(t, page)["token_bucket"]
	for m, want := range map[string]int64{"admitted": 3, "denied": 2, "reserved": 16, "actual": 23, "settled": 3, "refunded": 8, "excess": 15,
		"max-debt": 11, "max-actual-in-window": 22, "unsettled-admitted": 3, "unsettled-denied": 2, "unsettled-actual": 4} {
		if s.metrics[m] != want {
			t.Errorf("%s = %d, want %d", m, s.metrics[m], want)
		}
	}
	if s.charts != 4 || s.attrs["data-settles"] != "true" || s.attrs["data-violations"] != "0" || !strings.Contains(string(page), `id="chart-1-budget"`) ||
		!strings.Contains(string(page), `id="chart-1-actual"`) {
		t.Errorf("%d charts, attributes %v", s.charts, s.attrs)
	}

	// --no-usage refund: the last request costs nothing.
	stdout, _, code = runSim(t, append(args, "--settle", "--no-usage", "refund")...)
	if code != 0 || !strings.Contains(stdout, "token_bucket  with settlement      3         2        16        22      9         15") {
		t.Errorf("--no-usage refund: exit %d\n%s", code, stdout)
	}

	// Without --settle: no budget.
	stdout, _, code = runSim(t, args...)
	page, _ = os.ReadFile(out)
	if code != 0 || strings.Contains(stdout, "settlement") || strings.Contains(string(page), "chart-1-budget") {
		t.Errorf("without --settle:\n%s", stdout)
	}
}

// A --config rule settles when it has cost.response; a fixed cost.request
// is every request's reservation.
func TestSimulateConfigCost(t *testing.T) {
	dir := t.TempDir()
	cfg, csv, out := filepath.Join(dir, "c.json"), filepath.Join(dir, "b.csv"), filepath.Join(dir, "r.html")
	os.WriteFile(cfg, []byte(`{"rules": [
		{"name": "tokens", "key": [{"header": "x-team"}], "algorithm": "token_bucket", "limit": 10, "window": "10s", "burst": 10,
		 "cost": {"request": {"header": "x-max-tokens", "default": 1}, "response": {"header": "x-usage"}, "no_usage": "refund"}},
		{"name": "fixed", "key": [{"header": "x-team"}], "algorithm": "token_bucket", "limit": 10, "window": "10s", "burst": 10, "cost": {"request": 4}}
	]}`), 0o644)
	os.WriteFile(csv, []byte(budgetCSV), 0o644)
	stdout, stderr, code := runSim(t, "--config", cfg, "--csv", csv, "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "tokens  with settlement      3         2        16        22      9") || strings.Contains(stdout, "fixed  with") ||
		!strings.Contains(stdout, "1 without usage (refund)") {
		t.Errorf("stdout:\n%s", stdout)
	}
	// fixed reserves 4 each, whatever the CSV's cost: admitted at 0, 0.5, 2
	// and 13 (not at 1: 3 left), 12 units in the first window.
	secs := parseReport(t, mustRead(t, out))
	if f := secs["fixed"]; f.charts != 2 || f.metrics["admitted"] != 4 || f.metrics["max-in-window"] != 12 {
		t.Errorf("fixed: %d charts, %v", f.charts, f.metrics)
	}
}

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSimulateSettleErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.html")
	rule := []string{"--algorithm", "token_bucket", "--limit", "10", "--window", "1s", "--out", out}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{append(rule, "--no-usage", "refund"), 2, "--no-usage needs --settle"},
		{append(rule, "--settle", "--no-usage", "never"), 2, `--no-usage "never": want reservation or refund`},
		{append(rule, "--settle", "--delay", "1s"), 2, "--settle and --delay exclude each other"},
		{append(rule, "--settle", "--max-keys", "10"), 2, "the key table (--max-keys) has no settlement path"},
		{append(rule, "--settle", "--lease", "5"), 2, "--settle does not apply with --lease"},
		{[]string{"--config", "default-config.json", "--settle", "--out", out}, 2, "a --config rule settles when it has cost.response"},
		{[]string{"--algorithm", "sliding_log", "--limit", "10", "--window", "1s", "--settle", "--out", out}, 1, "--settle applies to token_bucket and leaky_bucket"},
		{append(rule, "--settle", "--traffic", "flood"), 1, "key table"},
	} {
		_, stderr, code := runSim(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, firstLine(stderr), tc.code, tc.want)
		}
	}
}
