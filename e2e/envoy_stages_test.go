package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Stages of the Envoy suite that only a real Envoy can run: exactness when the
// burst races on every worker, the hostile-header survival stage, and (envoy_grpc_test.go)
// grpc-go through Envoy.

// exactWorkers is the --concurrency of TestEnvoyExactAcrossWorkers.
const exactWorkers = 4

// steadyWindow returns a window (a whole number of hours, at least a day) whose next
// epoch-aligned boundary is more than lead away: a fixed window of that length cannot roll
// during the next lead, and a bucket refilling limit per window gains less than one
// admission in it while limit ≤ window/lead.
func steadyWindow(lead time.Duration) time.Duration {
	for h := 24; ; h++ {
		w := time.Duration(h) * time.Hour
		left := w - time.Duration(time.Now().UnixNano()%int64(w))
		if left > lead {
			return w
		}
	}
}

// TestEnvoyExactAcrossWorkers: --concurrency 4 with exact connection balance, one rule per
// algorithm (limit and burst 100 on one key, a window that cannot roll during the test),
// 2,000 concurrent requests on one new key per algorithm: exactly 100 admitted and 1,900
// denied with 429. Envoy's per-worker listener counters must show that every worker
// accepted connections of every burst (so the VMs of all four raced on the key's shared
// data), and afterwards no VM failed by any signal.
func TestEnvoyExactAcrossWorkers(t *testing.T) {
	const lead = 30 * time.Minute
	window := steadyWindow(lead)
	var rules []string
	for _, alg := range Algorithms {
		burst := ""
		if alg == "token_bucket" || alg == "leaky_bucket" {
			// The bucket starts full at burst and admits 100 at once; it refills 100 per
			// window, less than one during the test.
			burst = fmt.Sprintf(`,"burst":%d`, BurstLimit)
		}
		rules = append(rules, fmt.Sprintf(`  {"name":"exact-%[1]s","match":{"path_prefix":"/%[1]s/"},"key":[{"header":"x-key"}],"algorithm":%[1]q,"limit":%[2]d,"window":"%[3]dh"%[4]s}`,
			alg, BurstLimit, int(window/time.Hour), burst))
	}
	cfg := "{\"rules\":[\n" + strings.Join(rules, ",\n") + "\n ],\n \"response\":{\"headers\":\"none\"}}"
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		t.Parallel()
		render := func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "exact-across-workers", Config: cfg, ExactBalance: true, CatchAll: true})
		}
		e := startEnvoyAs(t, tg, a, exactWorkers, render)
		p := envoyProxy(t, e)
		began := time.Now()
		before, err := e.WorkerConnections()
		if err != nil {
			t.Fatal(err)
		}
		for _, alg := range Algorithms {
			st := Step{Desc: alg, Req: get("/"+alg+"/x", "X-Key", "one"), Want: ok(),
				Burst: &Burst{N: BurstRequests, Admitted: BurstLimit, DeniedStatus: 429}}
			t0 := time.Now()
			if err := runBurst(context.Background(), p, st); err != nil {
				t.Fatalf("%s: %v", alg, err)
			}
			after, err := e.WorkerConnections()
			if err != nil {
				t.Fatal(err)
			}
			per := make([]int64, exactWorkers)
			var sum int64
			for w := range exactWorkers {
				per[w] = after[w] - before[w]
				sum += per[w]
			}
			if len(after) != exactWorkers {
				t.Errorf("%s: per-worker connection counters for workers %v, want 0..%d", alg, after, exactWorkers-1)
			}
			// runBurst opens up to N connections before it releases the requests (Go's
			// transport may hand a connection a warm-up request has finished with to another
			// warm-up request still dialling, so fewer under load): most of them, and every
			// worker must have taken some.
			if sum < BurstRequests/2 {
				t.Errorf("%s: the workers accepted %d connections during the burst, want at least %d", alg, sum, BurstRequests/2)
			}
			for w, n := range per {
				if n == 0 {
					t.Errorf("%s: worker %d accepted no connection during the burst (per worker: %v): the burst did not race on every VM", alg, w, per)
				}
			}
			t.Logf("%s: %d admitted, %d denied of %d in %v; connections per worker %v", alg, BurstLimit, BurstRequests-BurstLimit, BurstRequests,
				time.Since(t0).Round(time.Millisecond), per)
			before = after
		}
		checkHealthyAs(t, e, a, exactWorkers)
		t.Logf("window %v; five bursts in %v", window, time.Since(began).Round(time.Millisecond))
	})
}
