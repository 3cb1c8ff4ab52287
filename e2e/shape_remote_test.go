package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redisrl"
)

// TestEnvoyShapingRemote: shaping across a fleet. Two Envoys (one worker each) with
// sluice.wasm's backend "rls" share one `sluice serve` on the suite's Redis Cluster and
// one shaped key (leaky_bucket 10/s, burst 1, delay.max 3s). The burst of 50 goes half to
// each Envoy at once; the service's script takes every request's slot in the key's one
// state, so the upstream sees the arrivals of both Envoys spaced by the rate: 31 one
// slot (100 ms) apart, and 19 refused at once.
func TestEnvoyShapingRemote(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		// The script on every node beforehand: the burst's first calls would otherwise
		// be EVALs after a NOSCRIPT, a round trip the later ones do not take.
		for i := range c.Addrs {
			rc := c.Client(i)
			if err := rc.ScriptLoad(context.Background(), redisrl.ScriptFor(algorithms.LeakyBucket).Source).Err(); err != nil {
				t.Fatal(err)
			}
			rc.Close()
		}
		srv := startServe(t, c, "--inline-domains", rlsDomain)
		up := startArrivals(t)
		rule := rlsName(tg, "shape")
		cfg := fmt.Sprintf(`{"rules":[{"name":%q,"match":{"path_prefix":"/db"},"key":[{"header":"x-user"}],"algorithm":"leaky_bucket",
 "limit":10,"window":"1s","burst":1,"backend":"rls","delay":{"max":"3s"}}],"response":{"headers":"none"},
 "failure_mode":"closed","rls":{"cluster":"rls","domain":%q,"timeout_ms":5000,"instances":2}}`, rule, rlsDomain)
		render := renderRLSEnvoy(rlsBootstrap{Name: rule, RLSPort: srv.port, Config: cfg})
		es, urls := startEnvoys(t, tg, 2, 1, func(site EnvoySite) ([]byte, error) {
			site.UpstreamPort = up.port
			return render(site)
		})
		// Half the burst to each Envoy, at once.
		var res []shapeResult
		var mu sync.Mutex
		var first, last time.Time
		var wg sync.WaitGroup
		for _, u := range urls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, f, spread := shapeBurst(t, u, "alice", shapeBurstN/2)
				mu.Lock()
				defer mu.Unlock()
				res = append(res, r...)
				if first.IsZero() || f.Before(first) {
					first = f
				}
				if l := f.Add(spread); l.After(last) {
					last = l
				}
			}()
		}
		wg.Wait()
		checkShapedBurst(t, res, first, last.Sub(first), up.of("alice"))
		admitted := int64(len(up.of("alice")))
		var delayed, refused, held, allowed int64
		for _, e := range es {
			st, err := e.Stats(`wasmcustom\.sluice\.` + rule + `\.`)
			if err != nil {
				t.Fatal(err)
			}
			p := "wasmcustom.sluice." + rule + "."
			delayed += st[p+"delayed"]
			refused += st[p+"delay_refused"]
			held += st[p+"held"]
			allowed += st[p+"allowed"]
			if st[p+"delayed"] == 0 {
				t.Errorf("an Envoy held none of the burst: %v", st)
			}
		}
		if delayed != admitted-1 || refused != shapeBurstN-admitted || held != 0 || allowed != admitted {
			t.Errorf("delayed %d, delay_refused %d, held %d, allowed %d; want %d, %d, 0, %d",
				delayed, refused, held, allowed, admitted-1, shapeBurstN-admitted, admitted)
		}
		for _, e := range es {
			checkEnvoyHealthy(t, e, 1)
		}
	})
}
