package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// gate is an upstream that holds every request until the test opens it, and counts the
// requests it holds and the most it held at once.
type gate struct {
	mu         sync.Mutex
	held, peak int
	open       chan struct{}
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.held++
	g.peak = max(g.peak, g.held)
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
	case <-r.Context().Done():
	}
	g.mu.Lock()
	g.held--
	g.mu.Unlock()
}

func (g *gate) count() (held, peak int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held, g.peak
}

func (g *gate) release() {
	g.mu.Lock()
	close(g.open)
	g.open = make(chan struct{})
	g.mu.Unlock()
}

// Three sluice run instances (backend rls) on one sluice serve and Redis Cluster, an
// in-flight limit of 10 on one key: of 60 requests at once, exactly 10 reach the upstream
// while it holds them and 50 are refused; when they end every slot is given back (the
// next burst again gets exactly 10), and no proxy counts a request in flight.
func TestRunThreeProxiesRLSConcurrency(t *testing.T) {
	c := testCluster(t)
	replica := startServeReplica(t, c.Addrs, "mesh")
	wasm := buildWasm(t, "../sluice-wasm")
	up := &gate{open: make(chan struct{})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: up}
	go srv.Serve(l)
	t.Cleanup(func() { up.release(); srv.Close() })
	rule := fmt.Sprintf("rls_conc_%d", time.Now().UnixNano())
	cfgPath := writeFile(t, "sluice.json", fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-api-key"}],
"algorithm":"concurrency","limit":10,"retry_after":"3s","backend":"rls"}],
"failure_mode":"closed","rls":{"cluster":"rls","domain":"mesh","timeout_ms":5000}}`, rule))
	cache := t.TempDir()
	var addrs, admins []string
	for i := 0; i < 3; i++ {
		rs, _ := startLoggedRun(t, runConfig{wasm: wasm, configPath: cfgPath, clusters: clusterFlag{"rls": "http://" + replica},
			workers: 2, cacheDir: cache, admin: "127.0.0.1:0", upstream: "http://" + l.Addr().String()})
		addrs, admins = append(addrs, rs.listenAddr), append(admins, rs.adminAddr)
	}
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 64}, Timeout: 60 * time.Second}
	burst := func(n int) {
		t.Helper()
		type answer struct {
			status int
			retry  string
		}
		answers := make(chan answer, n)
		for i := 0; i < n; i++ {
			go func() {
				req, _ := http.NewRequest("GET", "http://"+addrs[i%len(addrs)]+"/", nil)
				req.Header.Set("x-api-key", "k1")
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					answers <- answer{}
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After")}
			}()
		}
		for i := 0; i < n-10; i++ {
			if a := <-answers; a.status != 429 || a.retry != "3" {
				t.Fatalf("while 10 are in flight: %+v", a)
			}
		}
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if held, _ := up.count(); held == 10 {
				break
			}
			if time.Now().After(deadline) {
				held, _ := up.count()
				t.Fatalf("%d at the upstream, want 10", held)
			}
		}
		up.release()
		for i := 0; i < 10; i++ {
			if a := <-answers; a.status != 200 {
				t.Fatalf("admitted request: %+v", a)
			}
		}
	}
	inFlight := func() int64 {
		var n int64
		for _, a := range admins {
			n += metricValue(t, a, "sluice_"+rule+"_in_flight")
		}
		return n
	}
	for round := 0; round < 2; round++ {
		burst(60)
		for deadline := time.Now().Add(20 * time.Second); inFlight() != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				for _, a := range admins {
					t.Logf("%s: in_flight %d acquired %d refused %d allowed %d denied %d rls calls %d refunds %d", a,
						metricValue(t, a, "sluice_"+rule+"_in_flight"), metricValue(t, a, "sluice_"+rule+"_acquired"),
						metricValue(t, a, "sluice_"+rule+"_refused"), metricValue(t, a, "sluice_"+rule+"_allowed"),
						metricValue(t, a, "sluice_"+rule+"_denied"), metricValue(t, a, "sluice_rls_calls"), metricValue(t, a, "sluice_rls_refunds"))
				}
				t.Fatalf("round %d: %d in flight after every request ended", round, inFlight())
			}
		}
	}
	_, peak := up.count()
	var refused, failures int64
	for _, a := range admins {
		refused += metricValue(t, a, "sluice_"+rule+"_refused")
		failures += metricValue(t, a, "sluice_rls_failures")
	}
	t.Logf("2 × 60 requests over 3 proxies through sluice serve: peak %d at the upstream, %d refused, %d rls failures", peak, refused, failures)
	if peak != 10 || refused != 100 || failures != 0 {
		t.Errorf("peak %d, refused %d, failures %d; want 10, 100, 0", peak, refused, failures)
	}
}
