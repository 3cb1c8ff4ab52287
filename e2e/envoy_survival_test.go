package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/filter"
)

// The hostile-header stage in real Envoy: TestSurvivalHostileHeaders's traffic (survival_test.go)
// through Envoy's HTTP/1.1 codec into one VM — key headers of 33, 60 and 96 KiB, repeated key
// headers, 60 filler headers, 201 cookies, 200 query parameters, a tenth of the requests on
// three keys whose limit of 1 denies them — for every algorithm at once (the path picks the
// algorithm's rules).

const (
	// envoySurvivalRequests are sent to one VM: 800 per algorithm.
	envoySurvivalRequests = 4000
	// envoySurvivalClients are the concurrent client connections.
	envoySurvivalClients = 4
	// envoySurvivalHeadersKB is the stage's max_request_headers_kb: its largest request
	// carries about 210 KiB of headers (96 KiB key, 48 KiB tenant, 60 KiB of fillers, the
	// cookies); the test's upstream accepts 256 KiB.
	envoySurvivalHeadersKB = 256
)

var envoySurvivalSizes = []int{33 << 10, 60 << 10, 96 << 10}

// envoySurvivalConfig is survival_test.go's rulesFor for every algorithm at once, each
// algorithm's three rules matched by the path prefix /<algorithm>/, with a window that does
// not roll during the stage (so exactly 3 x-deny requests per algorithm are admitted).
//
// The key rules see a new key on every request (the repeated X-Api-Key's second value),
// 800 per rule: with the default max_keys (10,000 slots, 4 candidates per key) a key whose
// 4 candidates are all taken, and so an eviction, comes in about one run of ten across the
// ten rules and two Envoys (Σ (k/10,000)⁴ over k < 800, per rule; seen:
// key-fixed_window.evicted = 1). max_keys 1,000,000 (slots are created on first use) makes
// that about 10⁻⁹, so checkSurvivalMetrics can ask for no eviction.
func envoySurvivalConfig(window time.Duration) string {
	var rules []string
	for _, alg := range Algorithms {
		w := strconv.Itoa(int(window/time.Hour)) + "h"
		rules = append(rules, fmt.Sprintf(`
  {"name":"key-%[1]s","match":{"path_prefix":"/%[1]s/"},"key":[{"header":"x-api-key"}],"algorithm":%[1]q,"limit":10000,"window":%[2]q,"max_keys":1000000},
  {"name":"key-tenant-%[1]s","match":{"path_prefix":"/%[1]s/"},"key":[{"header":"x-api-key"},{"header":"x-tenant"},{"cookie":"session"},{"query":"q7"}],"algorithm":%[1]q,"limit":10000,"window":%[2]q,"max_keys":1000000},
  {"name":"deny-%[1]s","match":{"path_prefix":"/%[1]s/","headers":[{"name":"x-deny","exact":"1"}]},"key":[{"header":"x-api-key"}],"algorithm":%[1]q,"limit":1,"window":%[2]q}`, alg, w))
	}
	return `{"rules":[` + strings.Join(rules, ",") + `
 ],"failure_mode":"closed"}`
}

// renderEnvoySurvivalStage renders the stage's bootstrap for a module (wasm; empty: the
// shipped one).
func renderEnvoySurvivalStage(wasm string, window time.Duration) func(EnvoySite) ([]byte, error) {
	return func(site EnvoySite) ([]byte, error) {
		if wasm != "" {
			site.WasmPath = wasm
		}
		return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "survival (hostile headers)", Config: envoySurvivalConfig(window),
			MaxRequestHeadersKB: envoySurvivalHeadersKB, CatchAll: true})
	}
}

// survivalResult is what the stage's traffic got back.
type survivalResult struct {
	statuses map[int]int
	errors   int
	firstErr error
	// first is the index of the first request answered neither 200 nor 429 (-1: none),
	// and firstStatus its status (0: a transport error).
	first, firstStatus int
	// sent is the number of requests sent; maxHeaderBytes the largest request's header
	// bytes (names, values, ": " and CRLF).
	sent, maxHeaderBytes int
	elapsed              time.Duration
	firstBody            string
	// perClient are each client's statuses in the order it got them (0: a transport error).
	perClient [][]int
}

// wantDenied is how many of n stage requests are denied: the x-deny ones (every tenth)
// past the first of each of their 3 keys, per algorithm.
func envoySurvivalWantDenied(n int) int {
	deny := make(map[string]int)
	for i := 0; i < n; i += 10 {
		deny[Algorithms[(i/10)%len(Algorithms)]]++
	}
	d := 0
	for _, k := range deny {
		d += k - 3
	}
	return d
}

// checkSurvivalMetrics checks the guest's own counters after n stage requests: per
// algorithm, the two key rules admitted every request but the denied ones, the deny rule
// admitted 3 and denied the rest of the x-deny requests, and no rule had a store error or an
// eviction. It returns the guest's collection count.
func checkSurvivalMetrics(t *testing.T, e *envoyproc.Envoy, a artifact, n int) int64 {
	t.Helper()
	st, err := e.Stats(strings.TrimSuffix(a.stats, "."))
	if err != nil {
		t.Errorf("admin /stats: %v", err)
		return 0
	}
	total, deny := map[string]int64{}, map[string]int64{}
	for i := 0; i < n; i++ {
		alg := Algorithms[(i/10)%len(Algorithms)]
		total[alg]++
		if i%10 == 0 {
			deny[alg]++
		}
	}
	for _, alg := range Algorithms {
		want := map[string]int64{
			"key-" + alg + ".allowed":        total[alg] - (deny[alg] - 3),
			"key-" + alg + ".denied":         0,
			"key-tenant-" + alg + ".allowed": total[alg] - (deny[alg] - 3),
			"deny-" + alg + ".allowed":       3,
			"deny-" + alg + ".denied":        deny[alg] - 3,
		}
		for _, rule := range []string{"key-", "key-tenant-", "deny-"} {
			for _, m := range []string{".store_errors", ".evicted", ".shadow_denied"} {
				want[rule+alg+m] = 0
			}
		}
		for name, w := range want {
			if got, ok := st[a.stats+"sluice."+name]; !ok || got != w {
				t.Errorf("%ssluice.%s = %d (present: %v), want %d", a.stats, name, got, ok, w)
			}
		}
	}
	return st[a.stats+filter.GCCyclesMetric]
}

// sendSurvivalTraffic sends n hostile requests to base over envoySurvivalClients
// connections (each client its requests in sequence), bounded by timeout.
//
// stop, if not nil, is asked after each response (with the result so far): true sends no
// further request (those in flight complete).
func sendSurvivalTraffic(t *testing.T, base string, n int, timeout time.Duration, stop func(*survivalResult) bool) survivalResult {
	t.Helper()
	filler := strings.Repeat("f", 1024)
	var cookie, query strings.Builder
	for i := 0; i < 200; i++ {
		fmt.Fprintf(&cookie, "c%d=%d; ", i, i)
		fmt.Fprintf(&query, "q%d=%d&", i, i)
	}
	cookie.WriteString("session=s")
	pad := map[int]string{}
	for _, s := range envoySurvivalSizes {
		pad[s] = strings.Repeat("k", s)
		pad[s/2] = strings.Repeat("t", s/2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := newClient(envoySurvivalClients)
	defer c.CloseIdleConnections()

	res := survivalResult{statuses: map[int]int{}, first: -1, perClient: make([][]int, envoySurvivalClients)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var stopped atomic.Bool
	start := time.Now()
	for g := 0; g < envoySurvivalClients; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < n; i += envoySurvivalClients {
				if ctx.Err() != nil || stopped.Load() {
					return
				}
				size := envoySurvivalSizes[i%len(envoySurvivalSizes)]
				alg := Algorithms[(i/10)%len(Algorithms)]
				key := strconv.Itoa(i%97) + pad[size]
				if i%10 == 0 {
					key = "deny-" + strconv.Itoa(i%3) + pad[size]
				}
				h := http.Header{}
				h.Add("X-Api-Key", key)
				h.Add("X-Api-Key", "second-"+strconv.Itoa(i))
				h.Add("X-Api-Key", "third")
				h.Set("X-Tenant", pad[size/2])
				h.Set("Cookie", cookie.String())
				for f := 0; f < 60; f++ {
					h.Set("X-Filler-"+strconv.Itoa(f), filler)
				}
				if i%10 == 0 {
					h.Set("X-Deny", "1")
				}
				hb := 0
				for k, vs := range h {
					for _, v := range vs {
						hb += len(k) + len(v) + 4
					}
				}
				r, err := do(ctx, c, base, Request{Path: "/" + alg + "/api?" + query.String(), Header: h})
				mu.Lock()
				res.sent++
				st := 0
				if err == nil {
					st = r.status
				}
				res.perClient[g] = append(res.perClient[g], st)
				res.maxHeaderBytes = max(res.maxHeaderBytes, hb)
				bad := false
				if err != nil {
					res.errors++
					if res.firstErr == nil {
						res.firstErr = fmt.Errorf("request %d: %v", i, err)
					}
					bad = true
				} else {
					res.statuses[r.status]++
					bad = r.status != 200 && r.status != 429
				}
				if bad && (res.first < 0 || i < res.first) {
					res.first = i
					if err == nil {
						res.firstStatus = r.status
						res.firstBody = string(r.body)
					}
				}
				if stop != nil && stop(&res) {
					stopped.Store(true)
				}
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// checkSurvived asserts that the stage's traffic was answered as it must be while every VM
// lives: all envoySurvivalRequests sent and answered, only 200 and 429, exactly the x-deny
// requests past their key's limit denied; the guest's counters agree; checkEnvoyHealthy
// (one worker) finds no failure.
func checkSurvived(t *testing.T, e *envoyproc.Envoy, a artifact, res survivalResult) {
	t.Helper()
	if res.maxHeaderBytes > (envoySurvivalHeadersKB-8)<<10 {
		t.Errorf("a request carried %d header bytes: more than max_request_headers_kb %d allows with room for Envoy's own", res.maxHeaderBytes, envoySurvivalHeadersKB)
	}
	if res.sent != envoySurvivalRequests || res.errors != 0 {
		t.Errorf("%d of %d requests sent, %d transport errors (first: %v)", res.sent, envoySurvivalRequests, res.errors, res.firstErr)
	}
	want := envoySurvivalWantDenied(envoySurvivalRequests)
	if res.statuses[200] != envoySurvivalRequests-want || res.statuses[429] != want || len(res.statuses) != 2 {
		t.Errorf("statuses %v, want %d × 200 and %d × 429 and nothing else (first other: request %d, status %d, body %q)",
			res.statuses, envoySurvivalRequests-want, want, res.first, res.firstStatus, res.firstBody)
	}
	checkHealthyAs(t, e, a, 1)
	if !a.dynmod {
		if sig, _ := envoyFailureSignals(e, 1); len(sig) != 0 {
			t.Errorf("envoyFailureSignals: %v, where checkEnvoyHealthy sees none", sig)
		}
	}
	gc := checkSurvivalMetrics(t, e, a, envoySurvivalRequests)
	t.Logf("%d requests (largest %d header bytes) in %v: statuses %v; the guest ran %d collections",
		res.sent, res.maxHeaderBytes, res.elapsed.Round(time.Millisecond), res.statuses, gc)
}

// TestEnvoySurvival: the hostile-header stage through each Envoy with the shipped module,
// one worker (one VM takes all 4,000 requests): every response is 200 or 429, exactly the
// x-deny requests past their key's limit are denied, and afterwards no VM failed by any
// signal checkEnvoyHealthy reads.
func TestEnvoySurvival(t *testing.T) {
	window := steadyWindow(30 * time.Minute)
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		t.Parallel()
		e := startEnvoyAs(t, tg, a, 1, renderEnvoySurvivalStage("", window))
		p := envoyProxy(t, e)
		res := sendSurvivalTraffic(t, p.url, envoySurvivalRequests, 3*time.Minute, nil)
		checkSurvived(t, e, a, res)
	})
}
