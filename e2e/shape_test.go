package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/filter"
)

// Shaping (rules[].delay) end to end, in `sluice run` and real Envoy with two workers: a
// burst of 50 concurrent requests at a 10/s leaky bucket (burst 1) with delay.max 3s. An
// upstream of the test's own records when each request reaches it.

const shapeConfig = `{"rules":[{"name":"db","match":{"path_prefix":"/db"},"key":[{"header":"x-user"}],"algorithm":"leaky_bucket",
 "limit":10,"window":"1s","burst":1,"delay":{"max":"3s"}}],"response":{"headers":"none"}}`

const (
	shapeBurstN  = 50
	shapeSpacing = 100 * time.Millisecond
	shapeMax     = 3 * time.Second
	// shapeEarly is how much earlier than its slot measured from the first arrival the
	// upstream may see a request: the first request's own trip through the proxy, which
	// the others do not repeat (the slot is taken at the proxy, the arrival recorded at
	// the upstream). checkShapedBurst holds each arrival to no earlier than its slot
	// measured from the burst's first send, which no slot can precede.
	shapeEarly = 15 * time.Millisecond
	// shapeLate bounds how much later than its slot a request may arrive: a tick (1 ms)
	// plus the proxy's and the machine's scheduling, on 2 loaded cores.
	shapeLate = 250 * time.Millisecond
)

// arrivals is an upstream that records when each request reaches it, by x-user.
type arrivals struct {
	port int
	mu   sync.Mutex
	at   map[string][]time.Time
}

func startArrivals(t *testing.T) *arrivals {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &arrivals{port: l.Addr().(*net.TCPAddr).Port, at: map[string][]time.Time{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		a.mu.Lock()
		a.at[r.Header.Get("X-User")] = append(a.at[r.Header.Get("X-User")], now)
		a.mu.Unlock()
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "shaped upstream\n")
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *arrivals) of(user string) []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.at[user]...)
}

// shapeResult is one request of the burst as the client saw it.
type shapeResult struct {
	status  int
	took    time.Duration
	delayMS string // the sluice-delay-ms response header
	err     error
}

// shapeBurst sends n concurrent requests for user, each on a connection of its own opened
// beforehand, released together; it returns their results and when the first was sent.
func shapeBurst(t *testing.T, base, user string, n int) ([]shapeResult, time.Time, time.Duration) {
	t.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: n, DisableCompression: true}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	// Warm one connection per request, so the burst is not spread by dialling.
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", base+"/warm", nil)
			req.Header.Set("X-User", "warm-"+user+"-"+strconv.Itoa(i))
			if resp, err := c.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	res := make([]shapeResult, n)
	start := make(chan struct{})
	sent := make([]time.Time, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", base+"/db", nil)
			req.Header.Set("X-User", user)
			<-start
			sent[i] = time.Now()
			resp, err := c.Do(req)
			if err != nil {
				res[i] = shapeResult{err: err}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			res[i] = shapeResult{status: resp.StatusCode, took: time.Since(sent[i]), delayMS: resp.Header.Get(filter.DelayHeader)}
		}()
	}
	close(start)
	wg.Wait()
	first, last := sent[0], sent[0]
	for _, s := range sent {
		if s.Before(first) {
			first = s
		}
		if s.After(last) {
			last = s
		}
	}
	return res, first, last.Sub(first)
}

// checkShapedBurst checks the burst of shapeBurst: how many reached the upstream, their
// spacing as the upstream saw it, the held time each response reports, and how fast the
// rest were refused.
//
// start is when the burst's first request was sent: the first slot cannot be earlier, so
// the k-th arrival can be no earlier than start + k spacings. The first arrival is the
// reference for lateness (at most shapeLate after its slot).
func checkShapedBurst(t *testing.T, res []shapeResult, start time.Time, spread time.Duration, at []time.Time) {
	t.Helper()
	admitted, refused := 0, 0
	var slowestRefusal time.Duration
	for i, r := range res {
		switch {
		case r.err != nil:
			t.Fatalf("request %d: %v", i, r.err)
		case r.status == 200:
			admitted++
		case r.status == 429:
			refused++
			slowestRefusal = max(slowestRefusal, r.took)
			if r.delayMS != "" {
				t.Errorf("a refused request says it was held %s ms", r.delayMS)
			}
		default:
			t.Fatalf("request %d: status %d", i, r.status)
		}
	}
	// All 50 arrive within one spacing of each other on an idle machine: 1 at once and 30
	// held (slots +100 ms … +3 s). A request that reaches the proxy later than the first
	// waits less for the same slot, so a burst spread over s admits up to s/100ms more.
	lo, hi := 31, 31+int(spread/shapeSpacing)+1
	if admitted < lo || admitted > hi || admitted+refused != shapeBurstN {
		t.Fatalf("%d admitted, %d refused (the burst spread over %v); want %d..%d admitted and the rest refused",
			admitted, refused, spread, lo, hi)
	}
	if len(at) != admitted {
		t.Fatalf("the upstream saw %d requests, %d were admitted", len(at), admitted)
	}
	// Refused at once: well before the first held request's slot.
	if slowestRefusal > shapeSpacing*5 {
		t.Errorf("the slowest refusal took %v: refusals must not be held", slowestRefusal)
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	minGap, maxGap := time.Hour, time.Duration(0)
	var early, late time.Duration // the furthest an arrival was from its slot, each way
	for k := 1; k < len(at); k++ {
		slot := at[0].Add(time.Duration(k) * shapeSpacing)
		if earliest := start.Add(time.Duration(k) * shapeSpacing); at[k].Before(earliest) {
			t.Errorf("arrival %d at +%v of the burst's start, before its slot (at least +%v)", k, at[k].Sub(start), earliest.Sub(start))
		}
		if at[k].After(slot.Add(shapeLate)) {
			t.Errorf("arrival %d at +%v of the first arrival, its slot +%v", k, at[k].Sub(at[0]), slot.Sub(at[0]))
		}
		early, late = max(early, slot.Sub(at[k])), max(late, at[k].Sub(slot))
		gap := at[k].Sub(at[k-1])
		minGap, maxGap = min(minGap, gap), max(maxGap, gap)
	}
	held := 0
	for _, r := range res {
		if r.status == 200 && r.delayMS != "" {
			held++
			ms, err := strconv.Atoi(r.delayMS)
			if err != nil || ms < 1 || time.Duration(ms)*time.Millisecond > shapeMax+shapeLate {
				t.Errorf("%s: %q", filter.DelayHeader, r.delayMS)
			}
		}
	}
	if held != admitted-1 {
		t.Errorf("%d responses carry %s, want %d (every admitted request but the first)", held, filter.DelayHeader, admitted-1)
	}
	t.Logf("%d admitted (%d held), %d refused, burst spread %v; upstream gaps %v..%v, arrivals %v early..%v late of their slots, last at +%v; slowest refusal %v",
		admitted, held, refused, spread, minGap.Round(time.Millisecond), maxGap.Round(time.Millisecond),
		early.Round(100*time.Microsecond), late.Round(100*time.Microsecond),
		at[len(at)-1].Sub(at[0]).Round(time.Millisecond), slowestRefusal.Round(time.Millisecond))
}

// shapeAbandon holds three requests of a fresh key behind a first one and lets the
// clients of the last two go away while held: the upstream sees only the first two,
// and delay_abandoned counts the two that left.
func shapeAbandon(t *testing.T, base string, up *arrivals) {
	t.Helper()
	const user = "leaver"
	c := &http.Client{Timeout: 30 * time.Second}
	get := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/db", nil)
		req.Header.Set("X-User", user)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := get(context.Background()); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { errs <- get(context.Background()) }() // slot +100 ms: kept
	time.Sleep(20 * time.Millisecond)
	for i := 0; i < 2; i++ {
		go func() { errs <- get(ctx) }() // slots +200, +300 ms: the clients leave
	}
	time.Sleep(50 * time.Millisecond)
	cancel()
	var kept, left int
	for i := 0; i < 3; i++ {
		err := <-errs
		switch {
		case err == nil:
			kept++
		case errors.Is(err, context.Canceled):
			left++
		default:
			t.Errorf("held request: %v", err)
		}
	}
	if kept != 1 || left != 2 {
		t.Fatalf("%d held requests completed and %d were cancelled, want 1 and 2", kept, left)
	}
	// Past every slot the leavers had.
	time.Sleep(400 * time.Millisecond)
	if n := len(up.of(user)); n != 2 {
		t.Errorf("the upstream saw %d requests of the leaving key, want 2 (the first and the one kept)", n)
	}
}

// TestRunShaping: the burst through `sluice run` with two workers.
func TestRunShaping(t *testing.T) {
	up := startArrivals(t)
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(shapeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := sluiceCmd(t, path, 2)
	cmd.Args = append(cmd.Args, "--upstream", "http://127.0.0.1:"+strconv.Itoa(up.port))
	p := startHostCmd(t, cmd)
	res, start, spread := shapeBurst(t, p.url, "alice", shapeBurstN)
	checkShapedBurst(t, res, start, spread, up.of("alice"))
	shapeAbandon(t, p.url, up)
	m := adminGet(t, p.admin+"/metrics")
	admitted := int64(len(up.of("alice")))
	for name, want := range map[string]int64{
		"sluice_db_delayed":         admitted - 1 + 3, // the burst's held, and the leaver's three
		"sluice_db_delay_abandoned": 2,
		"sluice_db_delay_refused":   shapeBurstN - admitted,
		"sluice_db_held":            0,
		"sluice_db_allowed":         admitted + 4,
	} {
		if got := promValue(t, m, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	if got := promValue(t, m, "sluice_db_delay_ms_count"); got != admitted {
		t.Errorf("sluice_db_delay_ms_count = %d, want %d (one per released request)", got, admitted)
	}
	checkHostHealthy(t, p)
}

// TestEnvoyShaping: the burst through real Envoy with two workers (exact connection
// balance: both VMs hold requests of the one key).
func TestEnvoyShaping(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		up := startArrivals(t)
		render := func(site EnvoySite) ([]byte, error) {
			site.UpstreamPort = up.port
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "shaping", Config: shapeConfig, ExactBalance: true, CatchAll: true})
		}
		e := startEnvoyAs(t, tg, a, 2, render)
		p := envoyProxy(t, e)
		before, err := e.WorkerConnections()
		if err != nil {
			t.Fatal(err)
		}
		res, start, spread := shapeBurst(t, p.url, "alice", shapeBurstN)
		after, err := e.WorkerConnections()
		if err != nil {
			t.Fatal(err)
		}
		for w := range after {
			if after[w] == before[w] {
				t.Errorf("worker %d accepted no connection of the burst (%v → %v)", w, before, after)
			}
		}
		checkShapedBurst(t, res, start, spread, up.of("alice"))
		shapeAbandon(t, p.url, up)
		admitted := int64(len(up.of("alice")))
		prefix := a.stats + "sluice.db."
		st, err := e.Stats(strings.ReplaceAll(prefix, ".", `\.`))
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]int64{
			"delayed":         admitted - 1 + 3,
			"delay_abandoned": 2,
			"delay_refused":   shapeBurstN - admitted,
			"held":            0,
			"allowed":         admitted + 4,
		} {
			if got := st[prefix+name]; got != want {
				t.Errorf("%s%s = %d, want %d", prefix, name, got, want)
			}
		}
		// Envoy merges histograms at its stats flush (every 5 s by default): poll.
		var hist string
		for deadline := time.Now().Add(20 * time.Second); ; {
			if hist, err = e.Get("/stats?filter=" + strings.ReplaceAll(prefix, ".", `\.`) + "delay_ms"); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(hist, "No recorded values") || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		checkDelayHistogram(t, hist)
		checkHealthyAs(t, e, a, 2)
	})
}

// promValue is the value of an unlabelled sample in a Prometheus exposition.
func promValue(t *testing.T, text, name string) int64 {
	t.Helper()
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %q", name, l)
			}
			return int64(f)
		}
	}
	t.Fatalf("no %s in /metrics:\n%s", name, text)
	return 0
}

// checkDelayHistogram checks Envoy's summary of the delay_ms histogram: its cumulative
// quantiles run from the first held request's 100 ms to the last's 3 s.
func checkDelayHistogram(t *testing.T, stat string) {
	t.Helper()
	q := map[string]float64{}
	for _, m := range regexp.MustCompile(`P(0|100)\(([^,]+),([^)]+)\)`).FindAllStringSubmatch(stat, -1) {
		v, err := strconv.ParseFloat(m[3], 64)
		if err == nil {
			q[m[1]] = v
		}
	}
	lo, hi := q["0"], q["100"]
	if lo < 90 || lo > 150 || hi < 2900 || hi > 3300 {
		t.Errorf("delay_ms histogram P0 %v, P100 %v; want about 100 and 3000:\n%s", lo, hi, stat)
	}
	t.Logf("%s", strings.TrimSpace(stat))
}
