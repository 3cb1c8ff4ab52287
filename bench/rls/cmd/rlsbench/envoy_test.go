package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// TestEnvoyBootstrap: a round's bootstrap is a valid Envoy v3 configuration (parsed
// strictly, every Any unpacked and validated): every address loopback; the upstream a
// direct response on the port its cluster names; the three services HTTP/2 clusters on their
// ports; one listener per configuration, the ratelimit ones calling their service's
// cluster with the variant's descriptor key and failures denied, the wasm ones a V8 VM of
// their own whose configuration sluice.wasm accepts (the local rule, and the same rule
// through the service with the lease).
func TestEnvoyBootstrap(t *testing.T) {
	const up, peerPort, sluicePort, chargedPort, wasm = 18200, 18201, 18202, 18203, "/tmp/rlsbench/sluice.wasm"
	y, err := renderEnvoy(envoySpec{round: 3, upstreamPort: up, peerPort: peerPort, sluicePort: sluicePort, chargedPort: chargedPort, wasm: wasm, lease: 50, configs: envoyConfigs})
	if err != nil {
		t.Fatal(err)
	}
	b, err := envoyproc.ParseBootstrap(y)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if a := b.GetAdmin().GetAddress().GetSocketAddress(); a.GetAddress() != "127.0.0.1" || a.GetPortValue() != 0 {
		t.Errorf("admin on %s:%d, want 127.0.0.1:0", a.GetAddress(), a.GetPortValue())
	}
	clusters := map[string]uint32{}
	for _, c := range b.GetStaticResources().GetClusters() {
		ep := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if ep.GetAddress() != "127.0.0.1" {
			t.Errorf("cluster %s on %s", c.GetName(), ep.GetAddress())
		}
		clusters[c.GetName()] = ep.GetPortValue()
		if c.GetName() == "upstream" {
			continue
		}
		var opts httpv3.HttpProtocolOptions
		if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil {
			t.Fatalf("cluster %s: %v", c.GetName(), err)
		}
		if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s is not HTTP/2 (gRPC needs it)", c.GetName())
		}
	}
	if want := map[string]uint32{"upstream": up, "rls_peer": peerPort, "rls_sluice": sluicePort, "rls_charged": chargedPort}; fmt.Sprint(clusters) != fmt.Sprint(want) {
		t.Errorf("clusters %v, want %v", clusters, want)
	}
	var names []string
	for _, l := range b.GetStaticResources().GetListeners() {
		a := l.GetAddress().GetSocketAddress()
		if a.GetAddress() != "127.0.0.1" {
			t.Errorf("listener %s on %s", l.GetName(), a.GetAddress())
		}
		var hcm hcmv3.HttpConnectionManager
		if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
			t.Fatal(err)
		}
		filters := hcm.GetHttpFilters()
		if last := filters[len(filters)-1]; last.GetName() != "envoy.filters.http.router" {
			t.Errorf("%s: last filter %s, want the router", l.GetName(), last.GetName())
		}
		route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
		if l.GetName() == "upstream" {
			if a.GetPortValue() != up || route.GetDirectResponse().GetStatus() != 200 || len(filters) != 1 {
				t.Errorf("upstream: port %d, route %v, %d filters", a.GetPortValue(), route, len(filters))
			}
			continue
		}
		names = append(names, l.GetName())
		if a.GetPortValue() != 0 || route.GetRoute().GetCluster() != "upstream" || len(filters) != 2 {
			t.Errorf("%s: port %d, route to %q, %d filters; want a free port, the upstream, one filter and the router",
				l.GetName(), a.GetPortValue(), route.GetRoute().GetCluster(), len(filters))
		}
		var c envoyConfig
		for _, x := range envoyConfigs {
			if x.name == l.GetName() {
				c = x
			}
		}
		switch c.kind {
		case "ratelimit":
			var rl ratelimitv3.RateLimit
			if err := filters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			svc := rl.GetRateLimitService()
			if rl.GetDomain() != domain || !rl.GetFailureModeDeny() || svc.GetTransportApiVersion() != corev3.ApiVersion_V3 ||
				svc.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "rls_"+c.service || rl.GetTimeout().AsDuration() < time.Second {
				t.Errorf("%s: ratelimit filter %v; want domain %s, failures denied, V3 to rls_%s, a timeout ≥ 1 s", c.name, &rl, domain, c.service)
			}
			rls := route.GetRoute().GetRateLimits()
			if len(rls) != 1 || len(rls[0].GetActions()) != 1 {
				t.Fatalf("%s: rate_limits %v, want one action", c.name, rls)
			}
			h := rls[0].GetActions()[0].GetRequestHeaders()
			if h.GetHeaderName() != keyHeader || h.GetDescriptorKey() != c.variant {
				t.Errorf("%s: action %v, want %s → descriptor key %s", c.name, h, keyHeader, c.variant)
			}
		case "wasm":
			if len(route.GetRoute().GetRateLimits()) != 0 {
				t.Errorf("%s: rate_limits on a wasm route", c.name)
			}
			var w wasmv3.Wasm
			if err := filters[0].GetTypedConfig().UnmarshalTo(&w); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			vm := w.GetConfig().GetVmConfig()
			if vm.GetRuntime() != "envoy.wasm.runtime.v8" || vm.GetCode().GetLocal().GetFilename() != wasm || vm.GetVmId() != c.variant {
				t.Errorf("%s: vm %v; want V8, %s, vm_id %s", c.name, vm, wasm, c.variant)
			}
			var cfg wrapperspb.StringValue
			if err := w.GetConfig().GetConfiguration().UnmarshalTo(&cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.GetValue() != pluginConfig(c, 3, 50) {
				t.Errorf("%s: plugin configuration changed in rendering:\n%s", c.name, cfg.GetValue())
			}
			pc, err := config.ParseFor([]byte(cfg.GetValue()), config.BuildLocal)
			if err != nil {
				t.Fatalf("%s: sluice.wasm refuses its configuration: %v", c.name, err)
			}
			r := pc.Rules[0]
			if len(pc.Rules) != 1 || r.Algorithm != algorithms.FixedWindow || r.Limit != wasmLimit || r.Window != time.Hour ||
				len(r.Key) != 1 || r.Key[0].Header != keyHeader || r.Name != c.name+"-r3" {
				t.Errorf("%s: rule %+v", c.name, r)
			}
			if c.variant == "lease" {
				if r.Backend != config.BackendRLS || r.Lease != 50 || pc.RLS == nil || pc.RLS.Cluster != "rls_sluice" || pc.RLS.Domain != wasmDomain {
					t.Errorf("lease: backend %v, lease %d, rls %+v; want rls, 50, rls_sluice/%s", r.Backend, r.Lease, pc.RLS, wasmDomain)
				}
			} else if r.Backend != config.BackendLocal || r.Lease != 0 || pc.RLS != nil {
				t.Errorf("local: backend %v, lease %d, rls %+v", r.Backend, r.Lease, pc.RLS)
			}
		default:
			t.Errorf("listener %s is no configuration", l.GetName())
		}
	}
	var want []string
	for _, c := range envoyConfigs {
		want = append(want, c.name)
	}
	if !slices.Equal(names, want) {
		t.Errorf("listeners %v, want %v", names, want)
	}
}

// TestRoundOrder: every round runs each configuration once; no configuration runs first
// in two of the first len(envoyConfigs) rounds; the order is reversed every other round.
func TestRoundOrder(t *testing.T) {
	first := map[string]int{}
	for r := 0; r < len(envoyConfigs); r++ {
		o := roundOrder(envoyConfigs, r)
		var names []string
		for _, c := range o {
			names = append(names, c.name)
		}
		sorted := slices.Clone(names)
		slices.Sort(sorted)
		var want []string
		for _, c := range envoyConfigs {
			want = append(want, c.name)
		}
		slices.Sort(want)
		if !slices.Equal(sorted, want) {
			t.Fatalf("round %d: %v is not a permutation", r, names)
		}
		first[names[0]]++
	}
	for n, k := range first {
		if k > 1 {
			t.Errorf("%s runs first in %d rounds", n, k)
		}
	}
	if a, b := roundOrder(envoyConfigs, 0), roundOrder(envoyConfigs, 1); b[0].name != a[1].name || b[1].name != a[0].name || b[2].name != a[len(a)-1].name {
		t.Errorf("round 2 is not round 1 walked backwards from its second: %v, %v", a, b)
	}
}

// sample builds a clean sample of c in round r with the given req/s, p99 and Redis CPU
// per decision (µs).
func sample(c envoyConfig, r int, rps, p99, redisUS float64) envoySample {
	s := envoySample{cfg: c, round: r, rps: rps, p50: p99 / 4, p99: p99, requests: 1000, served: 1000, decisions: 1000,
		statuses: map[string]int{"200": 1000}, redisCPU: redisUS * 1000 / 1e6, svcCPU: 0.05, envoyCPU: 0.1, reads: 500}
	if c.variant == "denied" {
		s.statuses = map[string]int{"200": 20, "429": 980}
	}
	if c.kind == "wasm" {
		s.redisCPU, s.svcCPU, s.reads = 0, 0, 0
	}
	return s
}

func cfgNamed(n string) envoyConfig {
	for _, c := range envoyConfigs {
		if c.name == n {
			return c
		}
	}
	panic(n)
}

// goodRun is three rounds in which sluice serve beats the peer on every figure and the
// lease keeps 0.9× of the local rule's req/s.
func goodRun() []envoySample {
	var ss []envoySample
	for r := 1; r <= 3; r++ {
		for _, v := range []string{"ok", "denied"} {
			ss = append(ss, sample(cfgNamed("rl-peer-"+v), r, 1000, 10, 30), sample(cfgNamed("rl-sluice-"+v), r, 1100+float64(r), 8, 20))
		}
		ss = append(ss, sample(cfgNamed("wasm-local"), r, 2000, 5, 0), sample(cfgNamed("wasm-lease"), r, 1800, 6, 0))
	}
	return ss
}

func TestEnvoyGoals(t *testing.T) {
	gs := envoyGoals(goodRun())
	if len(gs) != 7 {
		t.Fatalf("%d goals, want 7", len(gs))
	}
	for _, g := range gs {
		if !g.met() || len(g.ratios) != 3 {
			t.Errorf("%s: not met on a good run (%v)", g.what, g.ratios)
		}
	}
	if got := spreadOf(gs[1].ratios).med; got < 0.666 || got > 0.667 {
		t.Errorf("Redis CPU ratio %v, want 20/30", got)
	}

	// Each bound, crossed, fails its goal alone.
	for _, c := range []struct {
		name  string
		goal  int
		tweak func(*envoySample)
	}{
		{"rl-sluice-ok", 0, func(s *envoySample) { s.rps = 900 }},
		{"rl-sluice-ok", 1, func(s *envoySample) { s.redisCPU = 31e-3 }},
		{"rl-sluice-ok", 2, func(s *envoySample) { s.p99 = 10.5 }},
		{"rl-sluice-denied", 3, func(s *envoySample) { s.rps = 999 }},
		{"rl-sluice-denied", 4, func(s *envoySample) { s.redisCPU = 40e-3 }},
		{"rl-sluice-denied", 5, func(s *envoySample) { s.p99 = 11 }},
		{"wasm-lease", 6, func(s *envoySample) { s.rps = 1500 }},
	} {
		ss := goodRun()
		for i := range ss {
			if ss[i].cfg.name == c.name && ss[i].round <= 2 {
				c.tweak(&ss[i])
			}
		}
		for i, g := range envoyGoals(ss) {
			if g.met() == (i == c.goal) {
				t.Errorf("%s tweaked: goal %d (%s) met=%v", c.name, i, g.what, g.met())
			}
		}
	}
	// The bound itself is met (≥ and ≤ are inclusive).
	ss := goodRun()
	for i := range ss {
		if ss[i].cfg.name == "wasm-lease" {
			ss[i].rps = 1600
		}
	}
	if g := envoyGoals(ss)[6]; !g.met() {
		t.Errorf("lease at exactly 0.80×: not met (%v)", g.ratios)
	}

	// A run that went wrong fails the goals resting on it, whatever the ratios.
	for _, c := range []struct {
		name  string
		goals []int
		tweak func(*envoySample)
	}{
		{"rl-peer-ok", []int{0, 1, 2}, func(s *envoySample) { s.errors = 3 }},
		{"rl-sluice-denied", []int{3, 4, 5}, func(s *envoySample) { s.statuses = map[string]int{"200": 500, "429": 500} }},
		{"wasm-lease", []int{6}, func(s *envoySample) { s.statuses = map[string]int{"200": 999, "503": 1} }},
	} {
		ss := goodRun()
		for i := range ss {
			if ss[i].cfg.name == c.name && ss[i].round == 2 {
				c.tweak(&ss[i])
			}
		}
		for i, g := range envoyGoals(ss) {
			if g.met() == slices.Contains(c.goals, i) {
				t.Errorf("%s gone wrong: goal %d (%s) met=%v", c.name, i, g.what, g.met())
			}
			if slices.Contains(c.goals, i) && !strings.Contains(g.row(), "round 2 "+c.name) {
				t.Errorf("goal %d's row does not say why: %s", i, g.row())
			}
		}
	}
	if (goal{what: "x", bound: 1, clean: true}).met() {
		t.Error("a goal without ratios is met")
	}
}

func TestEnvoyReport(t *testing.T) {
	ss := goodRun()
	for i := range ss {
		if ss[i].cfg.name == "wasm-lease" {
			ss[i].rps, ss[i].rlsCalls = 1000, 20
		}
	}
	r := envoyReport{date: time.Date(2026, 12, 2, 3, 4, 0, 0, time.UTC), commit: "abc1234", command: "make bench-rls-envoy (go run ./cmd/rlsbench -envoy)",
		envoy: "1.40.0", rounds: 3, conns: 32, cpus: 2, warmup: time.Second, duration: 5 * time.Second, okKeys: 1000, deniedKeys: 100,
		leaseKeys: 100, lease: 50, load0: "1.00 2.00 3.00", load1: "1.50 2.00 3.00", took: 200 * time.Second, samples: ss}
	var b strings.Builder
	r.write(&b)
	out := b.String()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if want := "# 2026-12-02 03:04 UTC · abc1234 · make bench-rls-envoy (go run ./cmd/rlsbench -envoy)  (load average 1.00 2.00 3.00 at start, 1.50 2.00 3.00 at end; 3m20s)"; lines[0] != want {
		t.Errorf("header\n%s\nwant\n%s", lines[0], want)
	}
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, "# ") || l == "" {
			t.Errorf("a line that would end the block in results.txt: %q", l)
		}
	}
	for _, want := range []string{
		"| ok, req/s, sluice serve / envoyproxy/ratelimit ≥ 1.00× | 1.10 (1.10–1.10) | ✓ |",
		"| ok, Redis CPU per decision, sluice serve / envoyproxy/ratelimit ≤ 1.00× | 0.67 (0.67–0.67) | ✓ |",
		"| denied, p99, sluice serve / envoyproxy/ratelimit ≤ 1.00× | 0.80 (0.80–0.80) | ✓ |",
		"| sluice.wasm req/s, rls + lease / local ≥ 0.80× | 0.50 (0.50–0.50) | ✗ |",
		"| ratelimit filter → envoyproxy/ratelimit, ok | 1,000 (1,000–1,000) | 2.50 | 10.00 (10.00–10.00) | 100.0% | 30.0 (30.0–30.0) | 0.500 | 50.0 µs | 100.0 µs | – | 0 |",
		"| ratelimit filter → sluice serve, denied | 1,102 (1,101–1,103) |",
		"| sluice.wasm rls + lease, lease | 1,000 (1,000–1,000) | 1.50 | 6.00 (6.00–6.00) | 100.0% | 0.0 (0.0–0.0) | 0.000 | 0.0 µs | 100.0 µs | 0.020 | 0 |",
		"| sluice.wasm local, local | 2,000 (2,000–2,000) | 1.25 | 5.00 (5.00–5.00) | 100.0% | 0.0 (0.0–0.0) | 0.000 | – | 100.0 µs | 0.000 | 0 |",
		"| denied, sluice serve / envoyproxy/ratelimit | 1.10 (1.10–1.10) | 0.80 (0.80–0.80) | 0.80 (0.80–0.80) | 0.67 (0.67–0.67) | 1.00 (1.00–1.00) | 1.00 (1.00–1.00) |",
		"| sluice.wasm, rls + lease / local | 0.50 (0.50–0.50) | 1.20 (1.20–1.20) | 1.20 (1.20–1.20) | – | – | 1.00 (1.00–1.00) |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks\n%s\n---\n%s", want, out)
		}
	}
	if n := strings.Count(out, "✓") + strings.Count(out, "✗"); n != 7 {
		t.Errorf("%d marks, want one per goal (7)", n)
	}
}

func TestInsertResults(t *testing.T) {
	pre := "Results of make bench-rls, newest first.\nOne header line per run.\n\n"
	old := "# 2026-12-01 · ceb1396 · make bench-rls\nfigures\n"
	block := "# 2026-12-02 · abc1234 · make bench-rls-envoy\nnew figures\n"
	if got, want := insertResults(pre+old, block), pre+block+"\n"+old; got != want {
		t.Errorf("into a file with a preamble:\n%q\nwant\n%q", got, want)
	}
	if got, want := insertResults(old, block+"\n\n"), block+"\n"+old; got != want {
		t.Errorf("into a file without a preamble:\n%q\nwant\n%q", got, want)
	}
	if got := insertResults("", block); got != block {
		t.Errorf("into an empty file: %q", got)
	}
	if got, want := insertResults("preamble only\n", block), "preamble only\n\n"+block; got != want {
		t.Errorf("after a bare preamble: %q, want %q", got, want)
	}
}

func TestRedisPID(t *testing.T) {
	info := "# Server\r\nredis_version:7.0.15\r\nprocess_id:4242\r\nrun_id:abc\r\n"
	if got, err := redisPID(info); err != nil || got != 4242 {
		t.Errorf("redisPID = %d, %v; want 4242", got, err)
	}
	for _, bad := range []string{"# Server\r\nredis_version:7\r\n", "process_id:x\r\n", "process_id:0\r\n"} {
		if _, err := redisPID(bad); err == nil {
			t.Errorf("redisPID(%q): no error", bad)
		}
	}
}

func TestSampleFigures(t *testing.T) {
	s := envoySample{served: 2000, decisions: 1000, redisCPU: 0.03, svcCPU: 0.1, envoyCPU: 0.2, rlsCalls: 40,
		requests: 2000, statuses: map[string]int{"200": 500, "429": 1500}}
	near := func(a, b float64) bool { return a > b-1e-9 && a < b+1e-9 }
	if !near(s.redisPerDecision(), 30) || s.svcPerDecision() != 100 || s.envoyPerRequest() != 100 || s.callsPerRequest() != 0.02 || s.admittedShare() != 0.25 {
		t.Errorf("figures: redis %v, service %v, envoy %v, calls %v, admitted %v", s.redisPerDecision(), s.svcPerDecision(),
			s.envoyPerRequest(), s.callsPerRequest(), s.admittedShare())
	}
	var zero envoySample
	if zero.redisPerDecision() != 0 || zero.callsPerRequest() != 0 || zero.admittedShare() != 0 {
		t.Error("an empty sample divides by zero")
	}
	if got := thousandsF(1234567.4); got != "1,234,567" {
		t.Errorf("thousandsF = %q", got)
	}
	if got := thousandsF(999); got != "999" {
		t.Errorf("thousandsF = %q", got)
	}
}
