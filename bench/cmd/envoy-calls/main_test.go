package main

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

func TestParseOptions(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := options{rounds: 5, duration: 3 * time.Second, warmup: time.Second, n: 8, conc: 32, keys: 1000, version: "1.40.0"}
	if o != want {
		t.Errorf("defaults %+v, want %+v", o, want)
	}
	o, err = parseOptions([]string{"-rounds", "1", "-d", "1s", "-out", "-", "-n", "16", "-envoy", "/x/envoy"})
	if err != nil {
		t.Fatal(err)
	}
	if o.rounds != 1 || o.duration != time.Second || o.out != "-" || o.n != 16 || o.envoy != "/x/envoy" {
		t.Errorf("parsed %+v", o)
	}
	for _, bad := range [][]string{
		{"-rounds", "0"}, {"-d", "0s"}, {"-warmup", "-1s"}, {"-c", "0"}, {"-n", "0"}, {"-n", "10001"},
		{"-keys", "0"}, {"-bogus"}, {"extra"},
	} {
		if _, err := parseOptions(bad); err == nil {
			t.Errorf("parseOptions(%q): no error", bad)
		}
	}
}

// The configuration each variant's guest reads: "<call> <n>", n 0 for none.
func TestPluginConfig(t *testing.T) {
	for _, c := range []struct {
		call string
		n    int
		want string
		per  int
	}{
		{"none", 8, "none 0", 0},
		{"get_header", 8, "get_header 8", 8},
		{"metric", 1, "metric 1", 1},
	} {
		if got := pluginConfig(c.call, c.n); got != c.want {
			t.Errorf("pluginConfig(%q, %d) = %q, want %q", c.call, c.n, got, c.want)
		}
		if got := callsPerRequest(c.call, c.n); got != c.per {
			t.Errorf("callsPerRequest(%q, %d) = %d, want %d", c.call, c.n, got, c.per)
		}
	}
	for _, c := range calls {
		if callWhat[c] == "" {
			t.Errorf("call %s: no description", c)
		}
	}
}

// The bootstrap passes Envoy's v3 schema, with one listener and VM per call, each
// configured for its call.
func TestBootstrap(t *testing.T) {
	y, err := renderBootstrap("/tmp/guest.wasm", 8, 18080)
	if err != nil {
		t.Fatal(err)
	}
	b, err := envoyproc.ParseBootstrap(y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if err := envoyproc.ValidateAnys(b); err != nil {
		t.Fatal(err)
	}
	if got, want := len(b.StaticResources.Listeners), len(calls)+1; got != want {
		t.Errorf("%d listeners, want %d (the upstream and one per call)", got, want)
	}
	s := string(y)
	for _, c := range calls {
		for _, want := range []string{"name: " + listenerName(c), "vm_id: " + vmID(c), `value: "` + pluginConfig(c, 8) + `"`} {
			if !strings.Contains(s, want) {
				t.Errorf("%s: no %q in the bootstrap", c, want)
			}
		}
	}
}

func TestPerCall(t *testing.T) {
	if got := perCall(sample{cpuPerReq: 52.4}, sample{cpuPerReq: 48.4}, 8); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("perCall = %v, want 0.5", got)
	}
	// A call cheaper than the noise can come out negative: kept as measured.
	if got := perCall(sample{cpuPerReq: 48}, sample{cpuPerReq: 48.8}, 8); math.Abs(got+0.1) > 1e-9 {
		t.Errorf("perCall = %v, want -0.1", got)
	}
}

// The report pairs each call's round with none's of the same round.
func TestReport(t *testing.T) {
	res := results{"none": {{rps: 9000, cpuPerReq: 40}, {rps: 8000, cpuPerReq: 44}, {rps: 8500, cpuPerReq: 42}}}
	for i, c := range calls[1:] {
		// round r: none's + (i+1)·(r+1)·0.1 per call, n = 8
		for r, none := range res["none"] {
			res[c] = append(res[c], sample{rps: 7000, cpuPerReq: none.cpuPerReq + 8*float64(i+1)*float64(r+1)*0.1})
		}
	}
	var b bytes.Buffer
	report(&b, res, 8)
	out := b.String()
	for _, want := range []string{
		"| none | (base) | 42.00 (40.00–44.00) | 8500 (8000–9000) |",
		"| get_header | 0.200 (0.100–0.300) |",
		"| metric | 1.200 (0.600–1.800) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if got := strings.Count(out, "\n"); got != len(calls)+2 {
		t.Errorf("%d lines, want %d:\n%s", got, len(calls)+2, out)
	}
}

func TestCountsCheck(t *testing.T) {
	st := map[string]int64{
		"wasmcustom.envoy_calls.none.requests":       1000,
		"http.calls-none.downstream_rq_total":        1200,
		"wasmcustom.envoy_calls.get_header.requests": 1024,
		"wasmcustom.envoy_calls.get_header.ok":       8192,
		"http.calls-get_header.downstream_rq_total":  1100,
		"wasmcustom.envoy_calls.metric.requests":     512,
		"wasmcustom.envoy_calls.metric.ok":           4096,
		"wasmcustom.envoy_calls.metric.target":       4200,
		"http.calls-metric.downstream_rq_total":      600,
	}
	m := callCounts(st)
	for _, c := range []string{"none", "get_header", "metric"} {
		if err := m[c].check(c, 8); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
	for name, k := range map[string]counts{
		"a failed call":          {requests: 512, ok: 4095, failed: 1, served: 512},
		"too few calls":          {requests: 512, ok: 4000, served: 512},
		"too many calls":         {requests: 512, ok: 4104, served: 512},
		"nothing served":         {},
		"more requests counted":  {requests: 768, ok: 6144, served: 700},
		"too few requests":       {requests: 256, ok: 2048, served: 256 + 2*255 + 1},
		"metric counter too low": {requests: 512, ok: 4096, target: 4000, served: 512},
	} {
		call := "get_header"
		if name == "metric counter too low" {
			call = "metric"
		}
		if err := k.check(call, 8); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// none makes no call: any ok count is wrong.
	if err := (counts{requests: 256, ok: 8, served: 256}).check("none", 8); err == nil {
		t.Error("none with calls counted: no error")
	}
}

func TestLogProblems(t *testing.T) {
	log := "[2026-12-02 10:00:00.000][42][warning][main] [source/server/server.cc:1] a warning\n" +
		"[2026-12-02 10:00:01.000][43][error][wasm] [source/extensions/common/wasm/context.cc:1] wasm log: bad\n" +
		"[2026-12-02 10:00:02.000][43][critical][main] [source/server/server.cc:2] worse\n"
	got := logProblems(log)
	if len(got) != 2 || !strings.Contains(got[0], "wasm log: bad") || !strings.Contains(got[1], "worse") {
		t.Errorf("logProblems = %q", got)
	}
	if got := logProblems(""); len(got) != 0 {
		t.Errorf("logProblems(\"\") = %q", got)
	}
}
