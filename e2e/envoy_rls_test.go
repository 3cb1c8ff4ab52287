package e2e

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// The rate-limit service in real Envoy: `sluice serve` (the binary, as a child
// process) on a 3-master Redis Cluster, called by every Envoy of forEachEnvoy either through
// sluice.wasm's backend "rls" (proxy_grpc_call) or through Envoy's own
// envoy.filters.http.ratelimit (the drop-in for envoyproxy/ratelimit). Limits are fixed
// windows of 365 days (unit year), so no window rolls during a test; rule names, keys and
// domains carry the Envoy version and a stamp, so runs never share a counter.

//go:embed envoy/rls.yaml.tmpl
var rlsTemplate string

// The template uses envoy.yaml.tmpl's functions (quote, indent).
var rlsTmpl = template.Must(template.Must(envoyTmpl.Clone()).New("rls.yaml").Parse(rlsTemplate))

// rlsBootstrap is what envoy/rls.yaml.tmpl renders: sluice.wasm with Config, or (RateLimit
// set) Envoy's rate-limit filter; either way the cluster "rls" is `sluice serve` on RLSPort.
type rlsBootstrap struct {
	EnvoySite
	Name      string
	RLSPort   int
	Config    string
	RateLimit *rateLimitFilter
}

// rateLimitFilter configures envoy.filters.http.ratelimit.
type rateLimitFilter struct {
	Domain          string
	FailureModeDeny bool
	Headers         bool // enable_x_ratelimit_headers: DRAFT_VERSION_03
}

func renderRLSEnvoy(b rlsBootstrap) func(EnvoySite) ([]byte, error) {
	return func(site EnvoySite) ([]byte, error) {
		b.EnvoySite = site
		var out bytes.Buffer
		if err := rlsTmpl.Execute(&out, b); err != nil {
			return nil, err
		}
		return out.Bytes(), nil
	}
}

// rlsWindow is the window of every limit here: 365 days, envoyproxy/ratelimit's unit year
// (Envoy's x-ratelimit-limit says w=31536000), aligned to the epoch.
const rlsWindow = 365 * 24 * time.Hour

// rlsStamp makes rule names, keys and domains unique to this test binary's run.
var rlsStamp = strconv.FormatInt(time.Now().UnixNano(), 36)

// rlsName is a name unique to the run and the Envoy version.
func rlsName(tg envoyproc.Target, what string) string {
	return what + "-" + strings.NewReplacer(".", "_", ":", "_", "/", "_").Replace(tg.Version) + "-" + rlsStamp
}

// serveProc is a running `sluice serve`.
type serveProc struct {
	addr, admin string // gRPC and admin addresses (127.0.0.1:PORT)
	port        int
	cmd         *exec.Cmd
	log         *syncBuffer
	done        chan struct{}
}

var serveAddrRE = regexp.MustCompile(`grpc=(127\.0\.0\.1:(\d+)) admin=(127\.0\.0\.1:\d+)`)

// startServe runs the built `sluice serve` on the cluster, gRPC and admin on free ports, a
// Redis timeout of 5 s (a loaded machine must not turn a slow Redis reply into UNAVAILABLE),
// and stops it when the test ends (its log goes to the test's output when it failed).
func startServe(t *testing.T, c *redistest.Cluster, args ...string) *serveProc {
	t.Helper()
	_, bin := buildArtifacts(t)
	args = append([]string{"serve", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
		"--redis-cluster", strings.Join(c.Addrs, ","), "--redis-timeout", "5s"}, args...)
	s := &serveProc{cmd: exec.Command(bin, args...), log: &syncBuffer{}, done: make(chan struct{})}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	s.cmd.Stdout, s.cmd.Stderr = s.log, pw
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s.cmd.Wait()
		pw.Close()
		close(s.done)
	}()
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			s.log.Write([]byte(line + "\n"))
			if m := serveAddrRE.FindStringSubmatch(line); m != nil {
				select {
				case found <- m:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		s.stop(t)
		if t.Failed() {
			t.Logf("sluice serve log:\n%s", boundedLog(s.log.String()))
		}
	})
	select {
	case m := <-found:
		s.addr, s.admin = m[1], m[3]
		s.port, _ = strconv.Atoi(m[2])
	case <-s.done:
		t.Fatalf("sluice serve exited before serving:\n%s", s.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("sluice serve did not serve within 30 s:\n%s", s.log.String())
	}
	return s
}

// stop ends the service as an operator does (SIGTERM: graceful), SIGKILL after 15 s.
func (s *serveProc) stop(t *testing.T) {
	select {
	case <-s.done:
		return
	default:
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		t.Errorf("sluice serve did not stop within 15 s of SIGTERM; killed")
		s.cmd.Process.Kill()
		<-s.done
	}
}

// metric sums the samples of one family of the service's /metrics (all labels).
// metricsText is s's /metrics page.
func (s *serveProc) metricsText(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + s.admin + "/metrics")
	if err != nil {
		t.Fatalf("sluice serve /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (s *serveProc) metric(t *testing.T, name string) int64 {
	t.Helper()
	var sum float64
	for _, l := range strings.Split(s.metricsText(t), "\n") {
		if !strings.HasPrefix(l, name) || strings.HasPrefix(l, "#") {
			continue
		}
		rest := l[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			t.Fatalf("sluice serve /metrics: %q: %v", l, err)
		}
		sum += v
	}
	return int64(sum)
}

// rlsAnswer is one response of a burst.
type rlsAnswer struct {
	status int
	h      http.Header
}

// rlsBurst sends n GETs with x-api-key: key (and x-mode: mode, when set), request i to
// urls[i%len(urls)], at most inFlight at once (as many connections per Envoy), and returns
// the answers in order.
func rlsBurst(t *testing.T, urls []string, n, inFlight int, key string) []rlsAnswer {
	return rlsModeBurst(t, urls, n, inFlight, "", key)
}

func rlsModeBurst(t *testing.T, urls []string, n, inFlight int, mode, key string) []rlsAnswer {
	t.Helper()
	tr := &http.Transport{MaxConnsPerHost: inFlight, MaxIdleConnsPerHost: inFlight}
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	defer tr.CloseIdleConnections()
	out := make([]rlsAnswer, n)
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			req, _ := http.NewRequest("GET", urls[i%len(urls)]+"/items", nil)
			req.Header.Set("x-api-key", key)
			if mode != "" {
				req.Header.Set("x-mode", mode)
			}
			resp, err := client.Do(req)
			if err != nil {
				if failed.Add(1) <= 3 {
					t.Errorf("request %d: %v", i, err)
				}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			out[i] = rlsAnswer{status: resp.StatusCode, h: resp.Header}
		}(i)
	}
	wg.Wait()
	return out
}

// tally counts answers by status.
func tally(as []rlsAnswer) map[int]int {
	m := map[int]int{}
	for _, a := range as {
		m[a.status]++
	}
	return m
}

// get sends one GET with x-api-key: key and returns the status and headers.
func rlsGet(t *testing.T, url, key string) rlsAnswer {
	t.Helper()
	return rlsBurst(t, []string{url}, 1, 1, key)[0]
}

// envoyStat is one stat of an Envoy (0 when absent).
func envoyStat(t *testing.T, e *envoyproc.Envoy, name string) int64 {
	t.Helper()
	st, err := e.Stats("^" + regexp.QuoteMeta(name) + "$")
	if err != nil {
		t.Fatalf("envoy /stats: %v", err)
	}
	return st[name]
}

// rlsRule is one RLS rule on x-api-key, a fixed window of 365 days, limit, lease (0: none),
// applying only to requests with x-mode: mode when mode is set.
func rlsRule(name, mode string, limit, lease int) string {
	m, l := "", ""
	if mode != "" {
		m = fmt.Sprintf(`"match":{"headers":[{"name":"x-mode","exact":%q}]},`, mode)
	}
	if lease > 0 {
		l = fmt.Sprintf(`,"lease":%d`, lease)
	}
	return fmt.Sprintf(`{"name":%q,%s"key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":%d,"window":"365d","backend":"rls"%s}`, name, m, limit, l)
}

// rlsPluginConfig is a sluice.wasm configuration of rules against the cluster "rls", with
// rls.instances and failure_mode.
func rlsPluginConfig(domain string, instances int, failureMode string, rules ...string) string {
	return fmt.Sprintf(`{"rules":[%s],
 "failure_mode":%q,"rls":{"cluster":"rls","domain":%q,"timeout_ms":5000,"instances":%d}}`, strings.Join(rules, ",\n  "), failureMode, domain, instances)
}

const rlsDomain = "e2e-rls"

// startRLSEnvoys starts n Envoys (workers each) with sluice.wasm configured by cfg against
// the service srv, and returns them with their ingress URLs.
func startRLSEnvoys(t *testing.T, tg envoyproc.Target, n, workers int, srv *serveProc, name, cfg string) ([]*envoyproc.Envoy, []string) {
	t.Helper()
	return startEnvoys(t, tg, n, workers, renderRLSEnvoy(rlsBootstrap{Name: name, RLSPort: srv.port, Config: cfg}))
}

// startEnvoys starts n Envoys at once (each compiles the module in V8: seconds on a loaded
// machine) and returns them with their ingress URLs.
func startEnvoys(t *testing.T, tg envoyproc.Target, n, workers int, render func(EnvoySite) ([]byte, error)) ([]*envoyproc.Envoy, []string) {
	t.Helper()
	// What tryStartEnvoy would fail the test for, on this goroutine.
	if _, err := shippedWasm(); err != nil {
		t.Fatal(err)
	}
	up, err := sharedUpstream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := render(EnvoySite{UpstreamPort: up.port}); err != nil {
		t.Fatal(err)
	}
	es := make([]*envoyproc.Envoy, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range es {
		wg.Add(1)
		go func() {
			defer wg.Done()
			es[i], errs[i] = tryStartEnvoy(t, tg, workers, render)
		}()
	}
	wg.Wait()
	urls := make([]string, n)
	for i, e := range es {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		urls[i] = envoyProxy(t, e).url
	}
	return es, urls
}

// TestEnvoyRLSShared: two Envoys (2 workers each) with sluice.wasm's backend "rls" share one
// `sluice serve`; 3,000 requests on one key with limit 100, spread over both Envoys 64 at a
// time, for each of two rules of one configuration (x-mode picks the rule):
//
//   - "request" (no lease, one call per request): exactly 100 admitted and 2,900 denied, one
//     RLS call per request.
//   - "lease" ("lease": 10, rls.instances 2): the burst never admits more than 100 and
//     nothing is answered but 200 or 429, with at most a fifth of the calls; what it leaves in
//     a pool (under-admission, bounded by the pools) goes back after 1 s idle and is admitted
//     by the requests that follow, until exactly 100 are admitted in all and every further
//     request is denied; the service has then granted, net of returns, exactly those 100.
func TestEnvoyRLSShared(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		srv := startServe(t, c, "--inline-domains", rlsDomain)
		rule := rlsName(tg, "shared")
		cfg := rlsPluginConfig(rlsDomain, 2, "closed", rlsRule(rule+"-request", "request", 100, 0), rlsRule(rule+"-lease", "lease", 100, 10))
		es, urls := startRLSEnvoys(t, tg, 2, 2, srv, rule, cfg)
		calls := func() (n int64) {
			for _, e := range es {
				n += envoyStat(t, e, "wasmcustom.sluice.rls.calls")
			}
			return n
		}
		for _, mode := range []string{"request", "lease"} {
			t.Run(mode, func(t *testing.T) {
				const requests, limit = 3000, 100
				calls0 := calls()
				begin := time.Now()
				as := rlsModeBurst(t, urls, requests, 64, mode, "k")
				took := time.Since(begin)
				n, used := tally(as), calls()-calls0
				t.Logf("envoy %s, %s: %d requests over 2 Envoys x 2 workers in %v: %d admitted, %d denied, other %v; %d RLS calls",
					tg.Version, mode, requests, took.Round(time.Millisecond), n[200], n[429], n, used)
				if n[200]+n[429] != requests {
					t.Fatalf("answers %v: want only 200 and 429", n)
				}
				for _, a := range as {
					if a.status == 429 && a.h.Get("Retry-After") == "" {
						t.Fatalf("a 429 without Retry-After: %v", a.h)
					}
				}
				if mode == "request" {
					if n[200] != limit {
						t.Fatalf("admitted %d, denied %d: want exactly %d admitted", n[200], n[429], limit)
					}
					if used != requests {
						t.Errorf("%d RLS calls for %d requests: want one per request", used, requests)
					}
					return
				}
				if n[200] > limit {
					t.Fatalf("admitted %d of %d requests: more than the limit %d", n[200], requests, limit)
				}
				if used > requests/5 {
					t.Errorf("%d RLS calls for %d requests with leases", used, requests)
				}
				admitted := int64(n[200])
				after, total := drainLeases(t, urls, mode, "k", limit-admitted)
				t.Logf("after the burst: %d more admitted in %v (what the pools held, returned); %d in all", after, total.Round(time.Millisecond), admitted+after)
				if admitted+after != limit {
					t.Fatalf("%d admitted in the burst and %d after: want exactly %d in all", admitted, after, limit)
				}
				if extra := tally(rlsModeBurst(t, urls, 20, 4, mode, "k")); extra[429] != 20 {
					t.Fatalf("after the limit was reached: %v, want 20 denied", extra)
				}
				granted, back := srv.metric(t, "sluice_rls_leased_total"), srv.metric(t, "sluice_rls_returned_total")
				t.Logf("service: %d leased, %d returned", granted, back)
				if granted-back != limit {
					t.Errorf("the service leased %d and got %d back: %d spent, want %d", granted, back, granted-back, limit)
				}
			})
		}
		for _, e := range es {
			checkEnvoyHealthy(t, e, 2)
		}
	})
}

// drainLeases sends one request (x-mode: mode, x-api-key: key) to each Envoy every 50 ms
// until want more are admitted or 15 s have passed, and returns how many were admitted (an
// over-admission shows in it: a round is at most one request per Envoy) and how long it
// took.
func drainLeases(t *testing.T, urls []string, mode, key string, want int64) (int64, time.Duration) {
	t.Helper()
	begin := time.Now()
	var got int64
	for got < want && time.Since(begin) < 15*time.Second {
		for _, u := range urls {
			a := rlsModeBurst(t, []string{u}, 1, 1, mode, key)[0]
			switch a.status {
			case 200:
				got++
			case 429:
			default:
				t.Fatalf("while the pools drain: status %d", a.status)
			}
		}
		if got < want {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return got, time.Since(begin)
}

// TestEnvoyRLSServiceDown: failure_mode when `sluice serve` has gone (stopped with SIGTERM
// after one decision went through it): "open" lets every request through, "closed"
// answers 503, "local" decides on the Envoy's shared data with limit / rls.instances (10/5:
// 2 admitted, then 429). Each Envoy counts the failures.
func TestEnvoyRLSServiceDown(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		for _, tc := range []struct {
			mode string
			want []int
		}{{"open", []int{200, 200, 200}}, {"closed", []int{503, 503, 503}}, {"local", []int{200, 200, 429}}} {
			t.Run(tc.mode, func(t *testing.T) {
				t.Parallel()
				srv := startServe(t, c, "--inline-domains", rlsDomain)
				rule := rlsName(tg, "down-"+tc.mode)
				es, urls := startRLSEnvoys(t, tg, 1, 2, srv, rule, rlsPluginConfig(rlsDomain, 5, tc.mode, rlsRule(rule, "", 10, 0)))
				e := es[0]
				if a := rlsGet(t, urls[0], "up"); a.status != 200 || envoyStat(t, e, "wasmcustom.sluice.rls.calls") != 1 || envoyStat(t, e, "wasmcustom.sluice.rls.failures") != 0 {
					t.Fatalf("with the service up: status %d, rls stats %v", a.status, rlsStats(t, e))
				}
				srv.stop(t)
				var got []int
				for i := 0; i < len(tc.want); i++ {
					got = append(got, rlsGet(t, urls[0], "k").status)
				}
				st := rlsStats(t, e)
				t.Logf("envoy %s, failure_mode %s, service stopped: statuses %v; %v", tg.Version, tc.mode, got, st)
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("statuses %v, want %v", got, tc.want)
				}
				if st["wasmcustom.sluice.rls.failures"] != int64(len(tc.want)) || st["wasmcustom.sluice.rls.fail_"+tc.mode] != int64(len(tc.want)) {
					t.Errorf("rls stats %v: want %d failures, all fail_%s", st, len(tc.want), tc.mode)
				}
				// The guest logs each failed call at warn (Envoy shows it as "wasm log"): those
				// lines are this test's point, any other failure line is not.
				checkEnvoyHealthyExcept(t, e, 2, regexp.MustCompile(`wasm log sluice sluice sluice: sluice: rule `+regexp.QuoteMeta(rule)+`: rls: ShouldRateLimit: gRPC status 14 UNAVAILABLE`))
			})
		}
	})
}

// checkEnvoyHealthyExcept is checkEnvoyHealthy for an Envoy whose log is expected to hold
// the lines allowed matches (a failure the test provokes): every other signal of
// envoyFailureSignals fails the test, as there.
func checkEnvoyHealthyExcept(t *testing.T, e *envoyproc.Envoy, workers int, allowed *regexp.Regexp) {
	t.Helper()
	signals, lines := envoyFailureSignals(e, workers)
	for _, s := range signals {
		if !strings.HasSuffix(s, " failure lines in the log") {
			t.Errorf("envoy shows a VM failure: %s", s)
		}
	}
	for _, l := range lines {
		if !allowed.MatchString(l) {
			t.Errorf("envoy log: %s", l)
		}
	}
}

// rlsStats are an Envoy's wasmcustom.sluice.rls.* stats.
func rlsStats(t *testing.T, e *envoyproc.Envoy) map[string]int64 {
	t.Helper()
	st, err := e.Stats(`wasmcustom\.sluice\.rls\.`)
	if err != nil {
		t.Fatalf("envoy /stats: %v", err)
	}
	return st
}

// TestEnvoyRLSLeaseStop: what becomes of an open lease when an Envoy stops (SIGTERM). Three
// Envoys (2 workers each) share one rule (limit 100, lease 10, rls.instances 2); two of them,
// A1 and A2, each lease 10 of their own key and spend 3; B runs meanwhile; after A1 and A2
// have stopped, B gets 300 requests per key. The service counts what came back
// (sluice_rls_returned_total).
//
//   - A1, "idle, then SIGTERM": no request for more than a second before it stops, so its
//     pool expires idle and the root's tick returns the 7 unspent while A1 still runs: B
//     admits exactly 97 of that key.
//   - A2, "SIGTERM" at once. sluice's proxy_on_done sends the return and answers false, but
//     Envoy runs proxy_on_done only after the worker has left its dispatch loop (thread-local
//     shutdown) and deletes the VM right after it answers: the call is accepted
//     (proxy_grpc_call returns OK) and cancelled before it is written, as a rule. So B admits
//     90 of that key (the 7 lost, as with a killed proxy) or, if the write escaped, 97 —
//     exactly one of the two, and never more: a lease is never duplicated.
func TestEnvoyRLSLeaseStop(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		srv := startServe(t, c, "--inline-domains", rlsDomain)
		rule := rlsName(tg, "stop")
		es, urls := startRLSEnvoys(t, tg, 3, 2, srv, rule, rlsPluginConfig(rlsDomain, 2, "closed", rlsRule(rule, "", 100, 10)))
		b := es[2]
		spend := func(i int, key string) time.Time {
			for n := 0; n < 3; n++ {
				if s := rlsGet(t, urls[i], key).status; s != 200 {
					t.Fatalf("request %d through A%d: %d", n, i+1, s)
				}
			}
			spent := time.Now()
			if leased := envoyStat(t, es[i], "wasmcustom.sluice.rls.leased"); leased != 10 {
				t.Fatalf("A%d leased %d, want 10 (rls stats %v)", i+1, leased, rlsStats(t, es[i]))
			}
			return spent
		}
		stop := func(i int, spent time.Time) {
			checkEnvoyHealthy(t, es[i], 2)
			held := time.Since(spent)
			begin := time.Now()
			es[i].Stop()
			t.Logf("A%d stopped %v after its last spend, in %v (exit: %v)", i+1, held.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond), es[i].ExitErr())
		}
		// returnedSince polls the service's returned admissions until they pass from or 3 s
		// have gone by (a return sent just before an exit may still be running its script).
		returnedSince := func(from int64) int64 {
			var n int64
			for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if n = srv.metric(t, "sluice_rls_returned_total"); n != from || time.Now().After(deadline) {
					return n - from
				}
			}
		}

		// A1: idle until its pool has gone back, then SIGTERM.
		spent := spend(0, "k1")
		for deadline := time.Now().Add(10 * time.Second); envoyStat(t, es[0], "wasmcustom.sluice.rls.returned") != 7; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("A1's pool not returned within 10 s of its last spend: rls stats %v", rlsStats(t, es[0]))
			}
		}
		stop(0, spent)
		idle := returnedSince(0)

		// A2: SIGTERM right after its spends.
		stop(1, spend(1, "k2"))
		atStop := returnedSince(idle)

		r1 := tally(rlsBurst(t, urls[2:], 300, 16, "k1"))
		r2 := tally(rlsBurst(t, urls[2:], 300, 16, "k2"))
		t.Logf("envoy %s: idle, then SIGTERM: the service got %d back, B then admitted %d, denied %d (%v)", tg.Version, idle, r1[200], r1[429], r1)
		t.Logf("envoy %s: SIGTERM: the service got %d back, B then admitted %d, denied %d (%v)", tg.Version, atStop, r2[200], r2[429], r2)
		if r1[200]+r1[429] != 300 || r2[200]+r2[429] != 300 {
			t.Fatalf("B's answers %v and %v: want only 200 and 429", r1, r2)
		}
		if r1[200] != 97 || idle != 7 {
			t.Errorf("idle, then SIGTERM: B admitted %d, the service got %d back: want 97 and 7 (A1's pool returned before the stop)", r1[200], idle)
		}
		switch {
		case r2[200] == 90 && atStop == 0:
			t.Logf("envoy %s: the 7 unspent admissions A2 held at SIGTERM were lost: its proxy_on_done's return never reached the service", tg.Version)
		case r2[200] == 97 && atStop == 7:
			t.Logf("envoy %s: A2's return at SIGTERM reached the service", tg.Version)
		default:
			t.Errorf("SIGTERM: B admitted %d, the service got %d back: want 90 and 0 (the return lost with A2's VM) or 97 and 7 (it escaped), nothing between, never more", r2[200], atStop)
		}
		checkEnvoyHealthy(t, b, 2)
	})
}

// rlsEdgeConfig is `sluice serve --config` for Envoy's rate-limit filter: envoyproxy/ratelimit's
// format, each api_key value its own 100 per year (a fixed window, the default algorithm).
func rlsEdgeConfig(domain string) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: api_key\n    rate_limit:\n      unit: year\n      requests_per_unit: 100\n"
}

// TestEnvoyRateLimitFilter: stock Envoy's envoy.filters.http.ratelimit (no Wasm) against
// `sluice serve --config` in envoyproxy/ratelimit's format, the route's rate_limits action
// making api_key = x-api-key. Two Envoys (2 workers each), 3,000 requests on one key with
// limit 100 → exactly 100 admitted, 2,900 denied (429, x-envoy-ratelimited), and with
// enable_x_ratelimit_headers DRAFT_VERSION_03 every answer carries x-ratelimit-limit
// "100, 100;w=31536000", x-ratelimit-reset the whole seconds to the window's end, and
// x-ratelimit-remaining: the 100 admissions 99 down to 0, each once; 0 on every denial.
// With the service gone, failure_mode_deny false lets requests through and true answers
// 500 (status_on_error unset).
func TestEnvoyRateLimitFilter(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		domain := rlsName(tg, "edge")
		cfgPath := filepath.Join(t.TempDir(), "ratelimit.yaml")
		if err := os.WriteFile(cfgPath, []byte(rlsEdgeConfig(domain)), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Run("exact", func(t *testing.T) {
			srv := startServe(t, c, "--config", cfgPath)
			var es []*envoyproc.Envoy
			var urls []string
			for i := 0; i < 2; i++ {
				e := startEnvoy(t, tg, 2, renderRLSEnvoy(rlsBootstrap{Name: "ratelimit filter", RLSPort: srv.port,
					RateLimit: &rateLimitFilter{Domain: domain, FailureModeDeny: true, Headers: true}}))
				es, urls = append(es, e), append(urls, envoyProxy(t, e).url)
			}
			const requests, limit = 3000, 100
			begin := time.Now()
			as := rlsBurst(t, urls, requests, 64, "k")
			end := time.Now()
			n := tally(as)
			var ok, over, errs int64
			for _, e := range es {
				ok += envoyStat(t, e, "cluster.upstream.ratelimit.ok")
				over += envoyStat(t, e, "cluster.upstream.ratelimit.over_limit")
				errs += envoyStat(t, e, "cluster.upstream.ratelimit.error")
			}
			t.Logf("envoy %s, envoy.filters.http.ratelimit: %d requests over 2 Envoys x 2 workers in %v: %d admitted, %d denied, other %v; ratelimit stats ok %d, over_limit %d, error %d",
				tg.Version, requests, end.Sub(begin).Round(time.Millisecond), n[200], n[429], n, ok, over, errs)
			if n[200] != limit || n[429] != requests-limit {
				t.Fatalf("answers %v: want exactly %d admitted and %d denied", n, limit, requests-limit)
			}
			if ok != limit || over != requests-limit || errs != 0 {
				t.Errorf("ratelimit stats ok %d, over_limit %d, error %d", ok, over, errs)
			}
			// The window's end: windows of 365 days aligned to the epoch. Envoy sends
			// duration_until_reset's whole seconds (truncated).
			endOf := func(at time.Time) int64 {
				w := int64(rlsWindow / time.Second)
				return (at.Unix()/w+1)*w - at.Unix()
			}
			lo, hi := endOf(end)-1, endOf(begin)
			for _, st := range []int{200, 429} {
				for _, a := range as {
					if a.status == st {
						t.Logf("a %d: x-ratelimit-limit %q, -remaining %q, -reset %q (window end in %d..%d s)", st,
							a.h.Get("X-RateLimit-Limit"), a.h.Get("X-RateLimit-Remaining"), a.h.Get("X-RateLimit-Reset"), lo, hi)
						break
					}
				}
			}
			var remaining []int
			bad := 0
			for i, a := range as {
				errs := []string{}
				if got := a.h.Get("X-RateLimit-Limit"); got != "100, 100;w=31536000" {
					errs = append(errs, fmt.Sprintf("x-ratelimit-limit %q", got))
				}
				if r, err := strconv.ParseInt(a.h.Get("X-RateLimit-Reset"), 10, 64); err != nil || r < lo || r > hi {
					errs = append(errs, fmt.Sprintf("x-ratelimit-reset %q, want %d..%d", a.h.Get("X-RateLimit-Reset"), lo, hi))
				}
				rem, err := strconv.Atoi(a.h.Get("X-RateLimit-Remaining"))
				if err != nil {
					errs = append(errs, fmt.Sprintf("x-ratelimit-remaining %q", a.h.Get("X-RateLimit-Remaining")))
				}
				switch a.status {
				case 200:
					remaining = append(remaining, rem)
				case 429:
					if rem != 0 {
						errs = append(errs, fmt.Sprintf("x-ratelimit-remaining %d on a denial", rem))
					}
					if a.h.Get("X-Envoy-Ratelimited") != "true" {
						errs = append(errs, fmt.Sprintf("x-envoy-ratelimited %q", a.h.Get("X-Envoy-Ratelimited")))
					}
				}
				if len(errs) > 0 {
					if bad++; bad <= 5 {
						t.Errorf("answer %d (%d): %s", i, a.status, strings.Join(errs, "; "))
					}
				}
			}
			sort.Sort(sort.Reverse(sort.IntSlice(remaining)))
			for i, r := range remaining {
				if r != limit-1-i {
					t.Errorf("x-ratelimit-remaining of the admissions, sorted: %v; want 99 down to 0, each once", remaining)
					break
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d answers with wrong rate-limit headers", bad, requests)
			}
		})
		t.Run("service down", func(t *testing.T) {
			srv := startServe(t, c, "--config", cfgPath)
			urls := map[bool]string{}
			es := map[bool]*envoyproc.Envoy{}
			for _, deny := range []bool{false, true} {
				e := startEnvoy(t, tg, 2, renderRLSEnvoy(rlsBootstrap{Name: "ratelimit filter, service down", RLSPort: srv.port,
					RateLimit: &rateLimitFilter{Domain: domain, FailureModeDeny: deny}}))
				es[deny], urls[deny] = e, envoyProxy(t, e).url
				if a := rlsGet(t, urls[deny], "up"); a.status != 200 || envoyStat(t, e, "cluster.upstream.ratelimit.ok") != 1 {
					t.Fatalf("failure_mode_deny %v, service up: status %d", deny, a.status)
				}
			}
			srv.stop(t)
			for _, tc := range []struct {
				deny bool
				want int
			}{{false, 200}, {true, 500}} {
				var got []int
				for i := 0; i < 3; i++ {
					got = append(got, rlsGet(t, urls[tc.deny], "down").status)
				}
				e := es[tc.deny]
				errs, allowed := envoyStat(t, e, "cluster.upstream.ratelimit.error"), envoyStat(t, e, "cluster.upstream.ratelimit.failure_mode_allowed")
				t.Logf("envoy %s, failure_mode_deny %v, service stopped: statuses %v; ratelimit.error %d, failure_mode_allowed %d", tg.Version, tc.deny, got, errs, allowed)
				if fmt.Sprint(got) != fmt.Sprint([]int{tc.want, tc.want, tc.want}) {
					t.Errorf("failure_mode_deny %v: statuses %v, want %d", tc.deny, got, tc.want)
				}
				wantAllowed := int64(3)
				if tc.deny {
					wantAllowed = 0
				}
				if errs != 3 || allowed != wantAllowed {
					t.Errorf("failure_mode_deny %v: ratelimit.error %d, failure_mode_allowed %d; want 3 and %d", tc.deny, errs, allowed, wantAllowed)
				}
			}
		})
	})
}
