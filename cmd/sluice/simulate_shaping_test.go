package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// burstArgs are 50 requests at the same instant (idle 1 s, then a burst
// spread over 1 ns) at a leaky bucket of 10/s, burst 1.
var burstArgs = []string{"--algorithm", "leaky_bucket", "--limit", "10", "--window", "1s", "--burst", "1",
	"--traffic", "idle-burst", "--idle", "1s", "--burst-size", "50", "--spread", "1ns", "--duration", "2s"}

// A rule with --delay: the summary and the report show the upstream with
// shaping next to the same rule as a meter.
func TestSimulateShaping(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.html")
	stdout, stderr, code := runSim(t, append(burstArgs, "--delay", "3s", "--out", out)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{
		"leaky_bucket  with shaping (delay<=3s)  31        1        30    19       1.5s       3s   3s   10                          30",
		"leaky_bucket  without (meter)           1         1        -     49       -          -    -    1                           -",
		"simulated 100 decisions",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout)
		}
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s := parseReport(t, page)["leaky_bucket"]
	for m, want := range map[string]int64{"admitted": 31, "denied": 19, "at-once": 1, "held": 30, "most-held": 30, "max-arrivals": 10,
		"meter-admitted": 1, "meter-denied": 49} {
		if s.metrics[m] != want {
			t.Errorf("%s = %d, want %d", m, s.metrics[m], want)
		}
	}
	if s.charts != 4 || s.attrs["data-delay-ns"] != "3000000000" || s.attrs["data-max-held"] != "1000" {
		t.Errorf("%d charts, attributes %v", s.charts, s.attrs)
	}

	// --max-held 10: ten held, the rest refused without a queue.
	stdout, stderr, code = runSim(t, append(burstArgs, "--delay", "3s", "--max-held", "10", "--out", out)...)
	if code != 0 || !strings.Contains(stdout, "with shaping (delay<=3s)  11        1        10    39       500ms      1s   1s   10                          10") {
		t.Errorf("--max-held 10: exit %d %s\n%s", code, stderr, stdout)
	}

	// Without --delay the same rule reports nothing about shaping.
	stdout, _, code = runSim(t, append(burstArgs, "--out", out)...)
	page, _ = os.ReadFile(out)
	if code != 0 || strings.Contains(stdout, "shaping") || strings.Contains(string(page), "arrivals") || parseReport(t, page)["leaky_bucket"].charts != 2 {
		t.Errorf("a rule without delay shows shaping:\n%s", stdout)
	}
}

// A --config rule shapes with its own delay; the other rules do not.
func TestSimulateConfigDelay(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.json")
	os.WriteFile(cfg, []byte(`{"rules": [
		{"name": "queue", "key": [{"remote_ip": true}], "algorithm": "token_bucket", "limit": 10, "window": "1s", "burst": 5, "delay": {"max": "3s", "max_held": 20}},
		{"name": "plain", "key": [{"remote_ip": true}], "algorithm": "token_bucket", "limit": 10, "window": "1s", "burst": 5}
	]}`), 0o644)
	out := filepath.Join(dir, "r.html")
	stdout, stderr, code := runSim(t, "--config", cfg, "--traffic", "idle-burst", "--idle", "1s", "--burst-size", "50", "--spread", "1ns", "--duration", "2s", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	// burst 5 at once, then 20 held (max_held), 25 refused; the meter admits 5.
	if !strings.Contains(stdout, "queue  with shaping (delay<=3s)  25        5        20    25") || !strings.Contains(stdout, "queue  without (meter)           5") ||
		strings.Contains(stdout, "plain  with") {
		t.Errorf("stdout:\n%s", stdout)
	}
	page, _ := os.ReadFile(out)
	secs := parseReport(t, page)
	if q, p := secs["queue"], secs["plain"]; q.charts != 4 || p.charts != 2 || q.metrics["held"] != 20 || q.attrs["data-max-held"] != "20" || p.metrics["admitted"] != 5 {
		t.Errorf("queue %v %v; plain %v", q.attrs, q.metrics, p.metrics)
	}
}

func TestSimulateDelayErrors(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.html")
	rule := []string{"--algorithm", "leaky_bucket", "--limit", "10", "--window", "1s", "--out", out}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{append(rule, "--max-held", "5"), 2, "--max-held needs --delay"},
		{append(rule, "--delay", "0s"), 2, "--delay 0: want more than 0, at most 1m"},
		{append(rule, "--delay", "2m"), 2, "--delay 2m: want more than 0, at most 1m"},
		{append(rule, "--delay", "1s", "--max-held", "0"), 2, "--max-held 0: want 1..100000"},
		{[]string{"--compare", "--limit", "10", "--window", "1s", "--delay", "1s", "--out", out}, 2, "--delay shapes a rule given with --algorithm"},
		{[]string{"--config", "default-config.json", "--delay", "1s", "--out", out}, 2, "a --config rule has its own delay"},
		{[]string{"--algorithm", "fixed_window", "--limit", "10", "--window", "1s", "--delay", "1s", "--out", out}, 1, "--delay applies to token_bucket and leaky_bucket"},
	} {
		_, stderr, code := runSim(t, tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, firstLine(stderr), tc.code, tc.want)
		}
	}
}
