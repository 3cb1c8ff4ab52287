package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
)

// peakGate is a gated upstream that also keeps the peak of requests it held at once, and
// counts them by the proxy that sent them (the query parameter p).
type peakGate struct {
	gatedUpstream
	peak int
	byP  map[string]int
}

func (u *peakGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Query().Get("p")
	u.mu.Lock()
	u.peak = max(u.peak, u.held+1)
	u.byP[p]++
	u.mu.Unlock()
	u.gatedUpstream.ServeHTTP(w, r)
	u.mu.Lock()
	u.byP[p]--
	u.mu.Unlock()
}

// from is how many requests of proxies ps the upstream holds.
func (u *peakGate) from(ps ...string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, p := range ps {
		n += u.byP[p]
	}
	return n
}

// Three proxies (sluice-redis.wasm, two workers each) on one Redis Cluster, an in-flight
// limit of 10 on one key: of 60 requests at once spread over them, exactly 10 reach the
// upstream while it holds them, the others are refused at once; every slot is released
// when they end. Then a proxy dies holding slots: the others are held to what is left
// until its lease lapses on the Redis clock, and get its slots back after it.
func TestRedisConcurrencyAcrossProxies(t *testing.T) {
	testCluster(t)
	const proxies, workers, limit, requests = 3, 2, 10, 60
	rule := unique("conc")
	cfg := fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-user"}],"algorithm":"concurrency","limit":%d,"backend":"redis"}],
"failure_mode":"closed","redis":{"cluster":%q,"timeout_ms":5000}}`, rule, limit, redisService)
	up := &peakGate{gatedUpstream: gatedUpstream{gate: make(chan struct{})}, byP: map[string]int{}}
	var ps []*redisProxy
	var urls []string
	for i := 0; i < proxies; i++ {
		p := startRedisProxy(t, cfg, workers)
		srv := httptest.NewServer(p.h.Handler(up))
		t.Cleanup(srv.Close)
		ps, urls = append(ps, p), append(urls, srv.URL+"/api?p="+fmt.Sprint(i))
	}
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: requests}}
	var sendTo func(url string, n int, statuses chan int)
	statuses := make(chan int, requests)
	dead := make(chan int, 8) // the killed proxy's clients
	send := func(url string, n int) { sendTo(url, n, statuses) }
	sendTo = func(url string, n int, statuses chan int) {
		for i := 0; i < n; i++ {
			go func() {
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("x-user", "alice")
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					statuses <- 0
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				statuses <- resp.StatusCode
			}()
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s\n%s", what, ps[0].Logs())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	inFlight := func() int64 { return sum(ps, "sluice."+rule+".in_flight") }
	for _, u := range urls {
		send(u, requests/proxies)
	}
	for i := 0; i < requests-limit; i++ {
		if s := <-statuses; s != 429 {
			t.Fatalf("while %d are in flight: status %d", limit, s)
		}
	}
	waitFor("10 requests at the upstream", func() bool { return up.count() == limit })
	if n := inFlight(); n != limit {
		t.Fatalf("in_flight over the proxies %d, want %d", n, limit)
	}
	up.open()
	for i := 0; i < limit; i++ {
		if s := <-statuses; s != 200 {
			t.Fatalf("admitted request: %d", s)
		}
	}
	waitFor("every slot released", func() bool { return inFlight() == 0 })
	if up.peak != limit {
		t.Errorf("the upstream saw %d at once, want %d", up.peak, limit)
	}
	t.Logf("%d requests over %d proxies: peak %d at the upstream, %d refused; redis calls %d",
		requests, proxies, up.peak, sum(ps, "sluice."+rule+".refused"), sum(ps, filter.MetricRedisCalls))

	// Proxy 0 takes 4 slots and dies.
	sendTo(urls[0], 4, dead)
	waitFor("proxy 0's 4 at the upstream", func() bool { return up.count() == 4 })
	died := time.Now()
	ps[0].h.Kill()
	// The others get the 6 left, not more, until the lease lapses.
	send(urls[1], 8)
	for i := 0; i < 2; i++ {
		if s := <-statuses; s != 429 {
			t.Fatalf("with the dead proxy's slots taken: %d", s)
		}
	}
	waitFor("6 more at the upstream", func() bool { return up.from("1", "2") == 6 })
	if time.Since(died) >= filter.ConcurrencyLeaseTTL {
		t.Fatal("the machine was too slow to observe the lease")
	}
	// After the lease: the 4 come back. A probe refused is sent again; one admitted
	// waits at the upstream.
	var back time.Duration
	send(urls[2], 1)
	for deadline := time.Now().Add(20 * time.Second); up.from("1", "2") < 7; {
		select {
		case s := <-statuses:
			if s != 429 {
				t.Fatalf("probe: %d", s)
			}
			send(urls[2], 1)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dead proxy's slots were not reclaimed\n%s", ps[1].Logs())
		}
	}
	back = time.Since(died)
	if back < filter.ConcurrencyLeaseTTL-time.Second {
		t.Errorf("the dead proxy's slots came back after %v, before its lease", back)
	}
	if n := ps[1].metric("sluice."+rule+".reclaimed") + ps[2].metric("sluice."+rule+".reclaimed"); n != 4 {
		t.Errorf("reclaimed %d, want 4", n)
	}
	t.Logf("a dead proxy's 4 slots came back %v after it died (lease %v)", back.Round(10*time.Millisecond), filter.ConcurrencyLeaseTTL)
	up.open()
	for i := 0; i < 7; i++ {
		if s := <-statuses; s != 200 {
			t.Fatalf("admitted request: %d", s)
		}
	}
	waitFor("every slot released", func() bool {
		return ps[1].metric("sluice."+rule+".in_flight")+ps[2].metric("sluice."+rule+".in_flight") == 0
	})
}
