package e2e

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// envoyproxy/ratelimit's integration scenarios (its integration-test/scripts and examples/),
// replayed against `sluice serve` through Envoy 1.40.0's own ratelimit filter on the suite's
// 3-master Redis Cluster. The facts carry over — the routes and their descriptors (request
// headers, generic keys, per-route policies, hits_addend 0 on the request path and a charge
// with apply_on_stream_done on the response path, the service picked by a subset load
// balancer from the response's dynamic metadata), the limits of the example configuration,
// and every request with what the peer answers it — as sluice's own test:
//
//   - the limits' units are years, not minutes (nothing here waits for a window, and none may
//     roll within a scenario); a script's `sleep 60` (the next window) is the domain's
//     counters deleted from Redis, after which the script's last request is sent;
//   - every scenario starts from fresh counters (the peer's scripts assume it, and run a
//     minute apart where they share one);
//   - a request whose response path charges (apply_on_stream_done: Envoy sends that call when
//     the stream ends, after the client has its answer) is followed by a wait, polled with a
//     deadline, until the service has counted the charge (sluice_rls_limit_hits_total);
//   - value-included-in-stats-key-when-unspecified reads sluice's /metrics instead of the
//     peer's statsd exporter: over_limit of the stat key "<domain>.unspec_unspecified_value".
//
// With --charge-denied every answer is the peer's. Without it, two scenarios differ, both
// because of the rule for a check (hits_addend 0): sluice's default mode refuses a check when
// one more request would be refused, so a limit of N admits exactly N requests checked on the
// request path and charged on the response path, where the peer (count > limit) admits N + 1:
// token-quota admits 2 (the peer 3) and multiservice-tokenquota sends 1 request to service 1
// and 2 to service 2 (the peer 2 and 3) before refusing.

//go:embed envoy/peer.yaml.tmpl
var peerTemplate string

var peerTmpl = template.Must(template.Must(envoyTmpl.Clone()).New("peer.yaml").Parse(peerTemplate))

type peerBootstrap struct {
	EnvoySite
	Domain                      string
	RLSPort, Service1, Service2 int
}

// peerConfig is the example configuration's domain "rl" for `sluice serve --config`, as
// domain: the same descriptors and limits, per year.
func peerConfig(domain string) string {
	return "domain: " + domain + `
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces: [{name: bkthomps}, {name: fake_name}]
      unit: year
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit: {replaces: [{name: bkthomps}], unit: year, requests_per_unit: 2}
      - key: destination_cluster
        value: mock
        rate_limit: {unit: year, requests_per_unit: 1}
      - key: destination_cluster
        value: override
        rate_limit: {replaces: [{name: banned_limit}], unit: year, requests_per_unit: 2}
      - key: destination_cluster
        value: fake
        rate_limit: {name: fake_name, unit: year, requests_per_unit: 2}
  - key: foo
    rate_limit: {unit: year, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: year, requests_per_unit: 3}
      - key: bar
        value: bkthomps
        rate_limit: {name: bkthomps, unit: year, requests_per_unit: 1}
      - key: bar
        value: banned
        rate_limit: {name: banned_limit, unit: year, requests_per_unit: 0}
      - key: baz
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: baz
        value: not-so-shady
        rate_limit: {unit: year, requests_per_unit: 3}
      - key: baz
        value: shady
        rate_limit: {unit: year, requests_per_unit: 3}
        shadow_mode: true
      - key: bay
        rate_limit: {unlimited: true}
  - key: unspec
    detailed_metric: true
    rate_limit: {unit: year, requests_per_unit: 2}
  - key: qux
    rate_limit: {unlimited: true}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: year, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: year, requests_per_unit: 2}
    metadata:
      service_with_quota: {name: service_2}
`
}

// peerStep is one request and the answer it must get.
type peerStep struct {
	path    string
	headers []string // name, value, ...
	status  int
	body    string // the body, when not empty (the service that answered)
	// remaining, when not empty, is the x-ratelimit-remaining the answer must carry.
	remaining string
	// newWindow deletes the domain's counters before the request (the script's sleep 60).
	newWindow bool
}

// peerScenario is one script: its steps with --charge-denied (the peer's answers) and, when
// they differ, without it.
type peerScenario struct {
	name          string
	charged       []peerStep
	byDefault     []peerStep // nil: as charged
	responseCharg []string   // stat keys (after the domain) the response path charges
}

const (
	svc1 = "Hello World from Service 1"
	svc2 = "Hello World from Service 2"
)

func peerScenarios() []peerScenario {
	get := func(path string, status int, headers ...string) peerStep {
		return peerStep{path: path, status: status, headers: headers}
	}
	rep := func(n int, s peerStep) []peerStep {
		out := make([]peerStep, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	cat := func(parts ...[]peerStep) []peerStep {
		var out []peerStep
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	fresh := func(s peerStep) peerStep { s.newWindow = true; return s }
	body := func(s peerStep, b string) peerStep { s.body = b; return s }
	remaining := func(s peerStep, r string) peerStep { s.remaining = r; return s }
	// replaces.sh's requests.
	banned := []string{"foo", "bkthomps", "bar", "banned"}
	four := func(foo, bar, dest string) []string {
		return []string{"foo", foo, "bar", bar, "source_cluster", "proxy", "destination_cluster", dest}
	}
	five := append(four("my_foo", "bkthomps", "fake"), "category", "account")
	multi := func(status int, b string) peerStep {
		return body(get("/multiservice-tokenquota", status), b)
	}
	return []peerScenario{
		{name: "multiservice-tokenquota", responseCharg: []string{"service_service_1", "service_service_2"},
			charged: []peerStep{multi(200, svc1), multi(200, svc1), multi(200, svc2), multi(200, svc2), multi(200, svc2),
				multi(429, ""), fresh(multi(200, svc1))},
			byDefault: []peerStep{multi(200, svc1), multi(200, svc2), multi(200, svc2), multi(429, ""), multi(429, ""),
				multi(429, ""), fresh(multi(200, svc1))}},
		{name: "quota", charged: []peerStep{get("/quota", 200), get("/quota", 200), get("/quota", 429), fresh(get("/quota", 200))}},
		{name: "replaces", charged: cat(
			[]peerStep{get("/twoheader", 429, banned...), get("/fourheader", 429, append(append([]string{}, banned...), "source_cluster", "proxy", "destination_cluster", "mock")...)},
			rep(2, get("/fourheader", 200, append(append([]string{}, banned...), "source_cluster", "proxy", "destination_cluster", "override")...)),
			[]peerStep{get("/fourheader", 429, append(append([]string{}, banned...), "source_cluster", "proxy", "destination_cluster", "override")...)},
			rep(2, get("/fourheader", 200, four("my_foo", "bkthomps", "bkthomps")...)),
			[]peerStep{get("/fourheader", 429, four("my_foo", "bkthomps", "bkthomps")...)},
			[]peerStep{get("/fourheader", 200, four("my_foo", "bkthomps", "not_bkthomps")...), get("/fourheader", 429, four("my_foo", "bkthomps", "not_bkthomps")...)},
			[]peerStep{get("/fourheader", 429, four("my_foo", "bkthomps", "bkthomps")...)},
			rep(4, get("/fiveheader", 200, five...)),
			[]peerStep{get("/fiveheader", 429, five...)},
			[]peerStep{get("/twoheader", 200, "foo", "foo_2", "bar", "bkthomps"), get("/twoheader", 429, "foo", "foo_2", "bar", "bkthomps")},
			rep(2, get("/fourheader", 200, four("foo_3", "bar_3", "fake")...)),
			[]peerStep{get("/fourheader", 429, four("foo_3", "bar_3", "fake")...)},
			[]peerStep{get("/fiveheader", 429, five...)},
		)},
		{name: "simple-get", charged: []peerStep{get("/twoheader", 200, "foo", "test", "baz", "shady")}},
		{name: "token-quota", responseCharg: []string{"service_service_2"},
			charged:   cat(rep(3, get("/tokenquota", 200)), []peerStep{get("/tokenquota", 429), fresh(get("/tokenquota", 200))}),
			byDefault: cat(rep(2, get("/tokenquota", 200)), rep(2, get("/tokenquota", 429)), []peerStep{fresh(get("/tokenquota", 200))})},
		{name: "trigger-ratelimit", charged: cat(rep(3, get("/twoheader", 200, "foo", "pelle", "baz", "not-so-shady")),
			rep(2, get("/twoheader", 429, "foo", "pelle", "baz", "not-so-shady")))},
		// The script compares x-ratelimit-remaining with "0" after cutting the line at ':',
		// which leaves the '\r' on: its check never fires. The peer answers 0 (shadow_mode:
		// over the limit, answered OK with nothing remaining), and so must sluice.
		{name: "trigger-shadow-mode-key", charged: cat(rep(5, get("/twoheader", 200, "foo", "pelle", "baz", "shady")),
			[]peerStep{remaining(get("/twoheader", 200, "foo", "pelle", "baz", "shady"), "0")})},
		{name: "value-included-in-stats-key-when-unspecified", charged: cat(rep(2, get("/unspec", 200, "unspec", "unspecified_value")),
			[]peerStep{get("/unspec", 429, "unspec", "unspecified_value")})},
	}
}

// peerTarget is Envoy 1.40.0, the version the scenarios are pinned to.
func peerTarget(t *testing.T) envoyproc.Target {
	t.Helper()
	skipShort(t, "runs real Envoy")
	ts, err := envoyTargets()
	if err != nil {
		t.Fatal(err)
	}
	for _, tg := range ts {
		if tg.Version == "1.40.0" {
			return tg
		}
	}
	t.Fatalf("no Envoy 1.40.0 among the targets %v (make envoy-fetch)", ts)
	return envoyproc.Target{}
}

// serviceServer answers every request with body, as the scripts' two mock services do.
func serviceServer(t *testing.T, body string) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, body)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().(*net.TCPAddr).Port
}

// deleteDomain deletes every counter of domain in the cluster: the next window, for the
// service (its keys are "sluice:{<domain>/…").
func deleteDomain(t *testing.T, c *redistest.Cluster, domain string) {
	t.Helper()
	ctx := context.Background()
	for i := range c.Addrs {
		cl := c.Client(i)
		var cursor uint64
		for {
			keys, next, err := cl.Scan(ctx, cursor, "sluice:{"+domain+"/*", 1000).Result()
			if err != nil {
				cl.Close()
				t.Fatalf("SCAN on node %d: %v", i, err)
			}
			for _, k := range keys {
				if err := cl.Del(ctx, k).Err(); err != nil {
					cl.Close()
					t.Fatalf("DEL %s: %v", k, err)
				}
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
		cl.Close()
	}
}

// limitStat reads one sample of sluice_rls_limit_hits_total from the service's /metrics
// (0 when the key has none yet).
func limitStat(t *testing.T, s *serveProc, key, stat string) int64 {
	t.Helper()
	prefix := `sluice_rls_limit_hits_total{key=` + strconv.Quote(key) + `,stat=` + strconv.Quote(stat) + `} `
	for _, l := range strings.Split(s.metricsText(t), "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			return n
		}
	}
	return 0
}

func TestEnvoyPeerScenarios(t *testing.T) {
	tg := peerTarget(t)
	c := suiteCluster(t)
	s1, s2 := serviceServer(t, svc1), serviceServer(t, svc2)
	client := &http.Client{Timeout: 30 * time.Second}
	for _, charge := range []bool{true, false} {
		mode := "default"
		if charge {
			mode = "charge-denied"
		}
		t.Run(mode, func(t *testing.T) {
			domain := rlsName(tg, "peer-"+mode)
			cfgPath := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(cfgPath, []byte(peerConfig(domain)), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"--config", cfgPath, "--response-dynamic-metadata"}
			if charge {
				args = append(args, "--charge-denied")
			}
			srv := startServe(t, c, args...)
			e := startEnvoy(t, tg, 1, func(site EnvoySite) ([]byte, error) {
				var out bytes.Buffer
				err := peerTmpl.Execute(&out, peerBootstrap{EnvoySite: site, Domain: domain, RLSPort: srv.port, Service1: s1, Service2: s2})
				return out.Bytes(), err
			})
			url := envoyProxy(t, e).url
			for _, sc := range peerScenarios() {
				steps := sc.charged
				if !charge && sc.byDefault != nil {
					steps = sc.byDefault
				}
				t.Run(sc.name, func(t *testing.T) {
					deleteDomain(t, c, domain)
					charges := func() int64 {
						var n int64
						for _, k := range sc.responseCharg {
							n += limitStat(t, srv, domain+"."+k, "total_hits")
						}
						return n
					}
					base, admitted := charges(), int64(0)
					var got []string
					for i, st := range steps {
						if st.newWindow {
							deleteDomain(t, c, domain)
						}
						req, err := http.NewRequest("GET", url+st.path, nil)
						if err != nil {
							t.Fatal(err)
						}
						for j := 0; j+1 < len(st.headers); j += 2 {
							req.Header.Set(st.headers[j], st.headers[j+1])
						}
						resp, err := client.Do(req)
						if err != nil {
							t.Fatalf("request %d: %v", i+1, err)
						}
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						ans := fmt.Sprintf("%d", resp.StatusCode)
						if resp.StatusCode == 200 && sc.responseCharg != nil {
							ans += " " + strings.TrimPrefix(string(b), "Hello World from ")
						}
						got = append(got, ans)
						var errs []string
						if resp.StatusCode != st.status {
							errs = append(errs, fmt.Sprintf("status %d, want %d", resp.StatusCode, st.status))
						}
						if st.body != "" && string(b) != st.body {
							errs = append(errs, fmt.Sprintf("body %q, want %q", b, st.body))
						}
						if st.remaining != "" && resp.Header.Get("X-RateLimit-Remaining") != st.remaining {
							errs = append(errs, fmt.Sprintf("x-ratelimit-remaining %q, want %q", resp.Header.Get("X-RateLimit-Remaining"), st.remaining))
						}
						if len(errs) > 0 {
							t.Errorf("%s request %d (%s %v): %s", mode, i+1, st.path, st.headers, strings.Join(errs, "; "))
						}
						if resp.StatusCode == 200 && sc.responseCharg != nil {
							// The response path's charge is sent when the stream ends: wait
							// until the service has counted it.
							admitted++
							deadline := time.Now().Add(10 * time.Second)
							for charges()-base < admitted {
								if time.Now().After(deadline) {
									t.Fatalf("request %d: the response path's charge did not arrive within 10 s (%d of %d counted)", i+1, charges()-base, admitted)
								}
								time.Sleep(10 * time.Millisecond)
							}
						}
					}
					t.Logf("%s: %s", mode, strings.Join(got, ", "))
					if sc.name == "value-included-in-stats-key-when-unspecified" {
						key := domain + ".unspec_unspecified_value"
						if n := limitStat(t, srv, key, "over_limit"); n != 1 {
							t.Errorf("over_limit of %s = %d, want 1", key, n)
						}
					}
				})
			}
		})
	}
}
