package main

import (
	"fmt"
	"testing"
	"time"
)

// The checks for leases through the rate-limit service: three
// `sluice run` proxies with the standard sluice.wasm and backend "rls",
// one `sluice serve` (a child process) on the 3-master Redis Cluster.
// Admissions are counted from the responses, calls from each proxy's
// /metrics (sluice_rls_calls counts decisions, acquires and returns).
func TestRunThreeProxiesRLSLeases(t *testing.T) {
	c := testCluster(t)
	replica := startServeReplica(t, c.Addrs, "mesh")
	wasm := buildWasm(t, "../sluice-wasm")
	cache := t.TempDir() // one compilation for every proxy
	start3 := func(t *testing.T, rule string, limit, lease int) (addrs, admins []string) {
		cfgPath := writeFile(t, "sluice.json", fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-api-key"}],
"algorithm":"fixed_window","limit":%d,"window":"1h","backend":"rls","lease":%d}],
"failure_mode":"closed","rls":{"cluster":"rls","domain":"mesh","timeout_ms":5000,"instances":3}}`, rule, limit, lease))
		for i := 0; i < 3; i++ {
			rs, _ := startLoggedRun(t, runConfig{wasm: wasm, configPath: cfgPath, clusters: clusterFlag{"rls": "http://" + replica},
				workers: 2, cacheDir: cache, admin: "127.0.0.1:0"})
			addrs, admins = append(addrs, rs.listenAddr), append(admins, rs.adminAddr)
		}
		return addrs, admins
	}
	sum := func(admins []string, name string) int64 {
		var n int64
		for _, a := range admins {
			n += metricValue(t, a, name)
		}
		return n
	}
	stamp := time.Now().UnixNano()

	// Limit 100/h, lease 10, 3,000 concurrent requests on one key: between
	// 70 and 100 admitted, never more.
	t.Run("burst", func(t *testing.T) {
		addrs, admins := start3(t, fmt.Sprintf("rls-lease-%d", stamp), 100, 10)
		const requests = 3000
		begin := time.Now()
		r := fire(t, addrs, requests, 0, "k1")
		calls, leased := sum(admins, "sluice_rls_calls"), sum(admins, "sluice_rls_leased")
		t.Logf("%d HTTP requests through 3 sluice run instances (backend rls, lease 10) in %v: %d admitted, %d denied, %d other; %d RLS calls, %d leased",
			requests, time.Since(begin).Round(time.Millisecond), r.ok, r.denied, r.other, calls, leased)
		if r.ok < 70 || r.ok > 100 || r.ok+r.denied != requests {
			t.Fatalf("admitted %d denied %d other %d (%q), want 70..100 admitted and the rest denied", r.ok, r.denied, r.other, r.others)
		}
		if calls <= 0 || calls > requests/10 || leased > 100 || leased < r.ok {
			t.Fatalf("%d RLS calls, %d leased for %d requests (%d admitted)", calls, leased, requests, r.ok)
		}
	})

	// Limit 100,000/h, lease 50: at most 0.1 RLS calls per request at
	// steady state (after a warm-up that fills the pools).
	t.Run("steady", func(t *testing.T) {
		addrs, admins := start3(t, fmt.Sprintf("rls-steady-%d", stamp), 100000, 50)
		if r := fire(t, addrs, 300, 0, "bob"); r.ok != 300 {
			t.Fatalf("warm-up: %+v", r)
		}
		calls0 := sum(admins, "sluice_rls_calls")
		const rounds, per = 20, 300
		var admitted int64
		for i := 0; i < rounds; i++ {
			r := fire(t, addrs, per, 0, "bob")
			admitted += r.ok
		}
		calls := sum(admins, "sluice_rls_calls") - calls0
		ratio := float64(calls) / float64(rounds*per)
		t.Logf("%d requests at steady state: %d admitted, %d RLS calls (%.3f per request; leased %d, returned %d)",
			rounds*per, admitted, calls, ratio, sum(admins, "sluice_rls_leased"), sum(admins, "sluice_rls_returned"))
		if admitted != rounds*per || ratio > 0.1 {
			t.Fatalf("admitted %d of %d, %.3f RLS calls per request (want <= 0.1)", admitted, rounds*per, ratio)
		}
	})
}

// A proxy that stops with an open lease returns it, and never duplicates
// it. Its root context's proxy_on_done sends the return and answers false
// (a root that ends has its gRPC calls cancelled, as in Envoy); it calls
// proxy_done once the service has answered, and only then does the host
// delete it. So the 7 unspent come back and another proxy admits exactly
// 97 of 100; 90 would mean the return was lost, more than 97 a duplicate.
func TestRunRLSLeaseStopReturnsPool(t *testing.T) {
	c := testCluster(t)
	replica := startServeReplica(t, c.Addrs, "mesh")
	wasm := buildWasm(t, "../sluice-wasm")
	cache := t.TempDir()
	cfgPath := writeFile(t, "sluice.json", fmt.Sprintf(`{"rules":[{"name":"rls-stop-%d","key":[{"header":"x-api-key"}],
"algorithm":"fixed_window","limit":100,"window":"1h","backend":"rls","lease":10}],
"failure_mode":"closed","rls":{"cluster":"rls","domain":"mesh","timeout_ms":5000,"instances":2}}`, time.Now().UnixNano()))
	cfg := runConfig{wasm: wasm, configPath: cfgPath, clusters: clusterFlag{"rls": "http://" + replica}, workers: 1, cacheDir: cache, admin: "127.0.0.1:0", drainTimeout: 5 * time.Second}
	a, _, stopA := startTestRun(t, cfg)
	spend(t, a.listenAddr, "k", 3)
	if leased := metricValue(t, a.adminAddr, "sluice_rls_leased"); leased != 10 {
		t.Fatalf("the first proxy leased %d, want 10", leased)
	}
	begin := time.Now()
	stopA()
	if err := a.wait(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(begin)
	b, _, _ := startTestRun(t, cfg)
	r := fire(t, []string{b.listenAddr}, 300, 0, "k")
	t.Logf("the first proxy spent 3 of its lease of 10 and stopped in %v; the second then admitted %d, denied %d, other %d",
		stopped.Round(time.Millisecond), r.ok, r.denied, r.other)
	if r.ok != 97 || r.ok+r.denied != 300 {
		t.Fatalf("admitted %d denied %d other %d (%q) after the stop, want 97 (the 7 unspent returned), never more", r.ok, r.denied, r.other, r.others)
	}
}
