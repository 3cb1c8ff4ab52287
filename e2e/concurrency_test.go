package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// In-flight limits ("algorithm": "concurrency") end to end, in `sluice run` and real Envoy
// with 8 workers: an upstream of the test's own counts the requests of each key it is
// serving at once and keeps the peak; it holds every request until the test opens its gate
// (or, for the queue, for a fixed service time).

const concurrencyConfig = `{"rules":[
 {"name":"inflight","match":{"path_prefix":"/slow"},"key":[{"header":"x-user"}],"algorithm":"concurrency","limit":10,"retry_after":"2s"},
 {"name":"queued","match":{"path_prefix":"/queue"},"key":[{"header":"x-user"}],"algorithm":"concurrency","limit":10,
  "delay":{"max":"30s"}}]}`

const (
	concWorkers = 8
	concLimit   = 10
	concBurst   = 200
)

// peakUpstream serves /slow when its gate opens and /queue after service; it counts per
// x-user the requests it serves at once.
type peakUpstream struct {
	port    int
	service time.Duration
	mu      sync.Mutex
	gate    chan struct{}
	now     map[string]int
	peak    map[string]int
	served  map[string]int
}

func startPeakUpstream(t *testing.T, service time.Duration) *peakUpstream {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &peakUpstream{port: l.Addr().(*net.TCPAddr).Port, service: service, gate: make(chan struct{}),
		now: map[string]int{}, peak: map[string]int{}, served: map[string]int{}}
	srv := &http.Server{Handler: http.HandlerFunc(u.serve)}
	go srv.Serve(l)
	t.Cleanup(func() { u.open(); srv.Close() })
	return u
}

func (u *peakUpstream) serve(w http.ResponseWriter, r *http.Request) {
	user := r.Header.Get("X-User")
	u.mu.Lock()
	u.now[user]++
	u.peak[user] = max(u.peak[user], u.now[user])
	gate := u.gate
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.now[user]--
		u.mu.Unlock()
	}()
	if strings.HasPrefix(r.URL.Path, "/queue") && r.URL.Query().Get("hold") == "" {
		t := time.NewTimer(u.service) // the upstream's service time
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return
		}
	} else {
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
	}
	u.mu.Lock()
	u.served[user]++
	u.mu.Unlock()
	io.WriteString(w, "served\n")
}

// open lets every request held at the gate (and every later one) through; close makes a
// new gate.
func (u *peakUpstream) open() {
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-u.gate:
	default:
		close(u.gate)
	}
}

func (u *peakUpstream) close() {
	u.mu.Lock()
	u.gate = make(chan struct{})
	u.mu.Unlock()
}

func (u *peakUpstream) stats(user string) (now, peak, served int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.now[user], u.peak[user], u.served[user]
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// concResult is one request as the client saw it.
type concResult struct {
	status int
	retry  string
	err    error
}

// concClient sends requests on connections of its own.
func concClient(n int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n, DisableCompression: true}, Timeout: 60 * time.Second}
}

// concSend sends n requests of user to url at once; results arrive on the channel.
func concSend(ctx context.Context, c *http.Client, url, user string, n int) <-chan concResult {
	out := make(chan concResult, n)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
			req.Header.Set("X-User", user)
			<-start
			resp, err := c.Do(req)
			if err != nil {
				out <- concResult{err: err}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out <- concResult{status: resp.StatusCode, retry: resp.Header.Get("Retry-After")}
		}()
	}
	close(start)
	return out
}

// concurrencyStages runs the checks against a proxy on base; inFlight reads the rule's
// in_flight gauge ("inflight" or "queued").
func concurrencyStages(t *testing.T, base string, up *peakUpstream, inFlight func(rule string) int64) {
	c := concClient(concBurst + 40)
	// 1. 200 at once on one key and 30 on another, the gate closed: 10 of each reach the
	// upstream, the rest are refused at once with the configured Retry-After.
	res := concSend(context.Background(), c, base+"/slow", "alice", concBurst)
	other := concSend(context.Background(), c, base+"/slow", "bob", 30)
	refused := 0
	for refused < concBurst-concLimit+30-concLimit {
		var r concResult
		select {
		case r = <-res:
		case r = <-other:
		}
		if r.err != nil || r.status != 429 || r.retry != "2" {
			t.Fatalf("while 10 of each key are in flight: %+v", r)
		}
		refused++
	}
	waitFor(t, "10 requests of each key at the upstream", 20*time.Second, func() bool {
		a, _, _ := up.stats("alice")
		b, _, _ := up.stats("bob")
		return a == concLimit && b == concLimit
	})
	if n := inFlight("inflight"); n != 2*concLimit {
		t.Fatalf("in_flight %d, want %d", n, 2*concLimit)
	}
	// 2. Open the gate: the 20 admitted are served, and every slot is given back.
	up.open()
	for i := 0; i < concLimit; i++ {
		if r := <-res; r.err != nil || r.status != 200 {
			t.Fatalf("admitted request: %+v", r)
		}
		if r := <-other; r.err != nil || r.status != 200 {
			t.Fatalf("admitted request: %+v", r)
		}
	}
	waitFor(t, "in_flight back to 0", 10*time.Second, func() bool { return inFlight("inflight") == 0 })
	up.close()
	// 3. 10 requests in flight whose clients go away: their slots come back.
	ctx, cancel := context.WithCancel(context.Background())
	gone := concSend(ctx, c, base+"/slow", "carol", concLimit)
	waitFor(t, "carol's 10 at the upstream", 20*time.Second, func() bool { n, _, _ := up.stats("carol"); return n == concLimit })
	cancel()
	for i := 0; i < concLimit; i++ {
		if r := <-gone; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("aborted request: %+v", r)
		}
	}
	waitFor(t, "the aborted requests' slots released", 10*time.Second, func() bool { return inFlight("inflight") == 0 })
	again := concSend(context.Background(), c, base+"/slow", "carol", concLimit)
	waitFor(t, "carol's next 10 at the upstream", 20*time.Second, func() bool { n, _, _ := up.stats("carol"); return n == concLimit })
	up.open()
	for i := 0; i < concLimit; i++ {
		if r := <-again; r.err != nil || r.status != 200 {
			t.Fatalf("after the aborted ones: %+v", r)
		}
	}
	// 4. The queue: 200 at once with delay.max 30s and a 50 ms service: all served, never
	// more than 10 at once.
	q := concSend(context.Background(), c, base+"/queue", "dave", concBurst)
	for i := 0; i < concBurst; i++ {
		if r := <-q; r.err != nil || r.status != 200 {
			t.Fatalf("queued request: %+v", r)
		}
	}
	waitFor(t, "every slot released", 10*time.Second, func() bool { return inFlight("inflight") == 0 && inFlight("queued") == 0 })
	// 5. 10 of erin's requests hold every slot (at the upstream's gate); 240 more queue
	// behind them, and 60 others whose clients go away at random moments while queued. Then
	// the gate opens: the 250 that stayed are all served, never more than 10 at once, the 60
	// never reach the upstream, and every slot comes back.
	const staying, leaving = 240, 60
	up.close()
	held := concSend(context.Background(), c, base+"/queue?hold=1", "erin", concLimit)
	waitFor(t, "erin's 10 at the upstream", 10*time.Second, func() bool { n, _, _ := up.stats("erin"); return n == concLimit })
	stay := concSend(context.Background(), c, base+"/queue", "erin", staying)
	leave := make(chan concResult, leaving)
	for i := 0; i < leaving; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+rand.IntN(400))*time.Millisecond)
		go func() {
			defer cancel()
			leave <- <-concSend(ctx, c, base+"/queue", "erin", 1)
		}()
	}
	for i := 0; i < leaving; i++ {
		if r := <-leave; !errors.Is(r.err, context.DeadlineExceeded) {
			t.Fatalf("a client that left while queued: %+v", r)
		}
	}
	up.open()
	for i := 0; i < concLimit; i++ {
		if r := <-held; r.err != nil || r.status != 200 {
			t.Fatalf("a request that held a slot: %+v", r)
		}
	}
	for i := 0; i < staying; i++ {
		if r := <-stay; r.err != nil || r.status != 200 {
			t.Fatalf("queued request whose client stayed: %+v", r)
		}
	}
	up.close()
	if _, _, served := up.stats("erin"); served != concLimit+staying {
		t.Errorf("the upstream served %d of erin's requests, want the %d that stayed", served, concLimit+staying)
	}
	waitFor(t, "every slot released after the leavers", 10*time.Second, func() bool { return inFlight("queued") == 0 })
	for _, user := range []string{"alice", "bob", "carol", "dave", "erin"} {
		_, peak, served := up.stats(user)
		if peak > concLimit {
			t.Errorf("%s: the upstream saw %d at once, limit %d", user, peak, concLimit)
		}
		t.Logf("%s: peak %d at the upstream, %d served", user, peak, served)
	}
	if _, peak, _ := up.stats("dave"); peak != concLimit {
		t.Errorf("the queue never filled the 10 slots: peak %d", peak)
	}
}

// TestRunConcurrency: through `sluice run` with 8 workers.
func TestRunConcurrency(t *testing.T) {
	up := startPeakUpstream(t, 50*time.Millisecond)
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(concurrencyConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := sluiceCmd(t, path, concWorkers)
	cmd.Args = append(cmd.Args, "--upstream", "http://127.0.0.1:"+strconv.Itoa(up.port))
	p := startHostCmd(t, cmd)
	inFlight := func(rule string) int64 {
		return promValue(t, adminGet(t, p.admin+"/metrics"), "sluice_"+rule+"_in_flight")
	}
	concurrencyStages(t, p.url, up, inFlight)
	m := adminGet(t, p.admin+"/metrics")
	for name, want := range map[string]int64{
		"sluice_inflight_acquired":  2*concLimit + 2*concLimit,
		"sluice_inflight_refused":   concBurst - concLimit + 30 - concLimit,
		"sluice_inflight_reclaimed": 0,
		"sluice_queued_acquired":    concBurst + concLimit + 240,
		"sluice_queued_refused":     0,
	} {
		if got := promValue(t, m, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	t.Logf("queued %d; queue waits recorded %d", promValue(t, m, "sluice_queued_queued"), promValue(t, m, "sluice_queued_queue_ms_count"))
	checkHostHealthy(t, p)
}

// TestEnvoyConcurrency: through real Envoy with 8 workers (exact connection balance), both
// artifacts.
func TestEnvoyConcurrency(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		up := startPeakUpstream(t, 50*time.Millisecond)
		render := func(site EnvoySite) ([]byte, error) {
			site.UpstreamPort = up.port
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "concurrency", Config: concurrencyConfig, ExactBalance: true, CatchAll: true})
		}
		e := startEnvoyAs(t, tg, a, concWorkers, render)
		p := envoyProxy(t, e)
		inFlight := func(rule string) int64 {
			name := a.stats + "sluice." + rule + ".in_flight"
			st, err := e.Stats(strings.ReplaceAll(name, ".", `\.`))
			if err != nil {
				t.Fatal(err)
			}
			return st[name]
		}
		concurrencyStages(t, p.url, up, inFlight)
		prefix := a.stats + "sluice.inflight."
		st, err := e.Stats(strings.ReplaceAll(prefix, ".", `\.`))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := st[prefix+"refused"], int64(concBurst-concLimit+30-concLimit); got != want {
			t.Errorf("refused %d, want %d", got, want)
		}
		if got := st[prefix+"acquired"]; got != 4*concLimit {
			t.Errorf("acquired %d, want %d", got, 4*concLimit)
		}
		checkHealthyAs(t, e, a, concWorkers)
	})
}

// TestEnvoyRLSConcurrency: two Envoys (4 workers each) with sluice.wasm's backend "rls" on
// one `sluice serve`, limit 10 in flight on one key: of 100 requests at once, 10 reach the
// upstream while it holds them and 90 are refused at once; when they end every slot is back
// (a second round gets exactly 10 again) and no Envoy counts a request in flight.
func TestEnvoyRLSConcurrency(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		srv := startServe(t, c, "--inline-domains", rlsDomain)
		up := startPeakUpstream(t, 50*time.Millisecond)
		rule := strings.ReplaceAll(rlsName(tg, "inflight"), "-", "_")
		cfg := fmt.Sprintf(`{"rules":[{"name":%q,"match":{"path_prefix":"/slow"},"key":[{"header":"x-user"}],
"algorithm":"concurrency","limit":%d,"retry_after":"2s","backend":"rls"}],
"failure_mode":"closed","rls":{"cluster":"rls","domain":%q,"timeout_ms":5000}}`, rule, concLimit, rlsDomain)
		render := func(site EnvoySite) ([]byte, error) {
			site.UpstreamPort = up.port
			return renderRLSEnvoy(rlsBootstrap{Name: rule, RLSPort: srv.port, Config: cfg})(site)
		}
		es, urls := startEnvoys(t, tg, 2, 4, render)
		stat := artWasm.stats + "sluice." + rule + "."
		sum := func(name string) (n int64) {
			for _, e := range es {
				st, err := e.Stats(strings.ReplaceAll(stat+name, ".", `\.`))
				if err != nil {
					t.Fatal(err)
				}
				n += st[stat+name]
			}
			return n
		}
		cl := concClient(120)
		for round := 0; round < 2; round++ {
			user := "round" + strconv.Itoa(round)
			a := concSend(context.Background(), cl, urls[0]+"/slow", user, 50)
			b := concSend(context.Background(), cl, urls[1]+"/slow", user, 50)
			for i := 0; i < 100-concLimit; i++ {
				var r concResult
				select {
				case r = <-a:
				case r = <-b:
				}
				if r.err != nil || r.status != 429 || r.retry != "2" {
					t.Fatalf("round %d, while %d are in flight: %+v", round, concLimit, r)
				}
			}
			waitFor(t, "10 at the upstream", 20*time.Second, func() bool { n, _, _ := up.stats(user); return n == concLimit })
			up.open()
			for i := 0; i < concLimit; i++ {
				var r concResult
				select {
				case r = <-a:
				case r = <-b:
				}
				if r.err != nil || r.status != 200 {
					t.Fatalf("round %d, admitted: %+v", round, r)
				}
			}
			up.close()
			waitFor(t, "in_flight back to 0", 10*time.Second, func() bool { return sum("in_flight") == 0 })
			if _, peak, _ := up.stats(user); peak != concLimit {
				t.Errorf("round %d: the upstream saw %d at once, want %d", round, peak, concLimit)
			}
		}
		if refused, acquired := sum("refused"), sum("acquired"); refused != 2*(100-concLimit) || acquired != 2*concLimit {
			t.Errorf("refused %d acquired %d", refused, acquired)
		}
		t.Logf("envoy %s: 2 × 100 requests over 2 Envoys × 4 workers through sluice serve: 10 at once at the upstream each round, %d refused", tg.Version, sum("refused"))
		for _, e := range es {
			checkEnvoyHealthy(t, e, 4)
		}
	})
}
