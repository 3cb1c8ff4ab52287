package e2e

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// TestEnvoyNetworkFaults (issue 43): two real Envoys 1.40.0 with sluice.wasm (one rule on
// backend "rls": a fixed window of 30 per 5 s, timeout_ms 100, instances 2) call `sluice
// serve` through a toxiproxy link; the service decides on its own Redis Cluster of 3
// masters with a replica each, every node behind a toxiproxy link of its own
// (fault_redis_test.go). For each failure_mode, each phase puts one fault on the service
// link, then on the Redis links (latency below and above timeout_ms, resets, a black hole,
// refused connections: a partition) and heals it:
//
//   - the latency a request gains is at most timeout_ms + the guard (10 ms) + scheduling
//     (asserted within 150 ms more on a loaded machine; the figure is logged);
//   - every decision the fault prevents is a failure, and one that ended at timeout_ms is a
//     timeout (sluice.rls.timeouts), the others not;
//   - "open" admits, "closed" answers 503, "local" decides on the proxy;
//   - decisions are remote again within 2 s of healing.
//
// Under "local", a partition that begins after the fleet spent the window's limit admits
// nothing more in that window, and at most the limit (its shares) in the next one.
// Redis refusing commands (OOM, NOAUTH), first: the service logs it with the node, its
// /ready and gRPC health say NOT_SERVING, and SERVING again once Redis accepts commands.
// Then leases cut off (fault_lease_test.go) and a master killed with failover.
func TestEnvoyNetworkFaults(t *testing.T) {
	forEachEnvoyWhere(t, func(tg envoyproc.Target) bool { return tg.Version == "1.40.0" }, "", func(t *testing.T, tg envoyproc.Target) {
		redistest.SkipShort(t)
		c, err := redistest.StartReplicated(t.TempDir(), 3)
		if err != nil {
			t.Fatalf("starting a Redis cluster: %v", err)
		}
		t.Cleanup(c.Close)
		redis := newRedisLinks(t, c)
		srv := startServe(t, c, "--inline-domains", rlsDomain, "--redis-timeout", "1s", "--redis-cluster", redis.seeds())
		link := newFaultLink(t, srv.addr)
		t.Run("redis refusing", func(t *testing.T) { redisRefusing(t, c, srv) })
		for _, mode := range []string{"open", "closed", "local"} {
			t.Run(mode, func(t *testing.T) {
				rule := rlsName(tg, "fault-"+mode)
				cfg := fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":30,"window":"5s","backend":"rls"}],
 "failure_mode":%q,"rls":{"cluster":"rls","domain":%q,"timeout_ms":100,"instances":2}}`, rule, mode, rlsDomain)
				es, urls := startEnvoys(t, tg, 2, 1, renderRLSEnvoy(rlsBootstrap{Name: rule, RLSPort: link.port, Config: cfg}))
				faultPhases(t, es, urls, link, mode, faultPhaseList)
				faultPhases(t, es, urls, redis, mode, redisPhaseList)
				if mode == "local" {
					localWindows(t, es, urls, link)
				}
			})
		}
		for _, mode := range []string{"closed", "local"} {
			t.Run("lease "+mode, func(t *testing.T) { leaseFaults(t, tg, link, mode) })
		}
		t.Run("rlqs cut", func(t *testing.T) { rlqsCut(t, tg, c) })
		t.Run("master failover", func(t *testing.T) { masterFailover(t, tg, c, srv, link) })
	})
}

// faultPhase is one fault on the link.
type faultPhase struct {
	name    string
	apply   func(l faultPath)
	fails   bool // the decisions fail
	timeout bool // at timeout_ms
}

var faultPhaseList = []faultPhase{
	{"latency 40ms", func(l faultPath) { l.toxic("lat", "latency", `{"latency":40}`, "downstream") }, false, false},
	{"latency 300ms", func(l faultPath) { l.toxic("lat", "latency", `{"latency":300}`, "downstream") }, true, true},
	{"reset", func(l faultPath) { l.toxic("rst", "reset_peer", `{"timeout":0}`, "upstream") }, true, false},
	{"black hole", func(l faultPath) { l.toxic("bh", "timeout", `{"timeout":0}`, "upstream", "downstream") }, true, true},
	{"refused", func(l faultPath) { l.refuse() }, true, false},
}

// faultPhases runs every phase of faultPhaseList on the Envoys es (ingress urls) under mode.
func faultPhases(t *testing.T, es []*envoyproc.Envoy, urls []string, link faultPath, mode string, phases []faultPhase) {
	base := p99(timedGets(t, urls, 10, "base-"+mode))
	const n = 6
	for _, ph := range phases {
		before := rlsFleet(t, es)
		ph.apply(link)
		tag := mode + "-" + strings.ReplaceAll(fmt.Sprint(link)+"-"+ph.name, " ", "_")
		got := timedGets(t, urls, n, "k-"+tag)
		after := rlsFleet(t, es)
		link.heal()
		added := p99(got) - base
		recovered := recoverTime(t, es, urls, "r-"+tag)
		d := func(k string) int64 { return after[k] - before[k] }
		t.Logf("%s, %s, %s: statuses %v, latency added (p99) %v, failures %d, timeouts %d, fail_%s %d; remote again after %v",
			mode, link, ph.name, statuses(got), added.Round(time.Millisecond), d("failures"), d("timeouts"), mode, d("fail_"+mode), recovered.Round(time.Millisecond))
		wantFail, wantTimeout := int64(0), int64(0)
		if ph.fails {
			wantFail = n
		}
		if ph.timeout {
			wantTimeout = n
		}
		if d("failures") != wantFail || d("fail_"+mode) != wantFail || d("timeouts") != wantTimeout {
			t.Errorf("%s: failures %d, fail_%s %d, timeouts %d; want %d, %d, %d", ph.name, d("failures"), mode, d("fail_"+mode), d("timeouts"), wantFail, wantFail, wantTimeout)
		}
		want := 200
		if ph.fails && mode == "closed" {
			want = 503
		}
		if s := statuses(got); s[want] != n {
			t.Errorf("%s: statuses %v, want %d × %d", ph.name, s, n, want)
		}
		if added > 100*time.Millisecond+10*time.Millisecond+150*time.Millisecond {
			t.Errorf("%s: latency added %v, more than timeout_ms + guard (+150 ms of scheduling)", ph.name, added)
		}
		if recovered > 2*time.Second {
			t.Errorf("%s: remote decisions again only %v after healing", ph.name, recovered)
		}
	}
}

// rlsFleet sums the Envoys' sluice.rls.* stats (without the prefix).
func rlsFleet(t *testing.T, es []*envoyproc.Envoy) map[string]int64 {
	m := map[string]int64{}
	for _, e := range es {
		for k, v := range rlsStats(t, e) {
			m[strings.TrimPrefix(k, "wasmcustom.sluice.rls.")] += v
		}
	}
	return m
}

// recoverTime is how long after the heal a request on each Envoy is decided remotely again
// (no new failure), polled request by request.
func recoverTime(t *testing.T, es []*envoyproc.Envoy, urls []string, key string) time.Duration {
	begin := time.Now()
	for i := 0; ; i++ {
		before := rlsFleet(t, es)["failures"]
		timedGets(t, urls[i%2:i%2+1], 1, key)
		if rlsFleet(t, es)["failures"] == before && i >= 1 {
			return time.Since(begin)
		}
		if time.Since(begin) > 10*time.Second {
			t.Fatalf("no remote decision within 10 s of healing")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// localWindows: the fleet spends the window's 30 remotely (34 asked), the link is cut
// (refused) and 40 more are asked in the same window; then 40 in the next window, still cut.
func localWindows(t *testing.T, es []*envoyproc.Envoy, urls []string, link *faultLink) {
	const window = 5 * time.Second
	faultPoll(t, window+time.Second, "the start of a window", func() bool { return time.Now().UnixNano()%int64(window) < int64(300*time.Millisecond) })
	start := time.Now().Truncate(window)
	key := "w-" + rlsStamp
	first := statuses(timedGets(t, urls, 34, key))
	link.refuse()
	cut := statuses(timedGets(t, urls, 40, key))
	if time.Now().Truncate(window) != start {
		t.Fatalf("the first window ended before its requests did: the machine is too slow for this check")
	}
	faultPoll(t, window+time.Second, "the next window", func() bool { return time.Now().Truncate(window) != start })
	next := statuses(timedGets(t, urls, 40, key))
	link.heal()
	t.Logf("local, window where the partition begins: remote %v, then cut %v (fleet admitted %d of 30); next window, cut: %v",
		first, cut, first[200]+cut[200], next)
	if first[200] != 30 {
		t.Errorf("before the cut: %d admitted remotely, want 30", first[200])
	}
	if first[200]+cut[200] > 30 {
		t.Errorf("the window where the partition began admitted %d, more than the limit 30", first[200]+cut[200])
	}
	if next[200] > 30 || next[200] < 28 {
		t.Errorf("the next window, cut: %d admitted, want the two shares (30, at most)", next[200])
	}
}

// redisRefusing: Redis refuses every write (OOM: maxmemory 1 byte, noeviction), then every
// command (NOAUTH: a password set after start-up, the service's connections dropped). Each
// time the service logs the refusal with the node, /ready answers 503 and gRPC health
// NOT_SERVING; once Redis accepts commands, both say SERVING again within 2 s.
func redisRefusing(t *testing.T, c *redistest.Cluster, srv *serveProc) {
	conn, err := grpc.NewClient(srv.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	serving := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
			return err == nil && r.Status == want && readyStatus(srv) == map[bool]int{true: 200, false: 503}[want == healthpb.HealthCheckResponse_SERVING]
		}
	}
	faultPoll(t, 5*time.Second, "ready before the faults", serving(healthpb.HealthCheckResponse_SERVING))
	pass := "fault-" + rlsStamp
	for _, f := range []struct {
		name, logged     string
		refuse, restore  [][]any
		authed, unauthed bool // the refusal's commands after the first, the restore's: with AUTH
	}{
		{"OOM", `error="OOM command not allowed`, [][]any{{"config", "set", "maxmemory-policy", "noeviction"}, {"config", "set", "maxmemory", "1"}},
			[][]any{{"config", "set", "maxmemory", "0"}}, false, false},
		{"NOAUTH", `error="NOAUTH Authentication required.`, [][]any{{"config", "set", "requirepass", pass}, {"client", "kill", "type", "normal"}},
			[][]any{{"config", "set", "requirepass", ""}}, true, true},
	} {
		for i, a := range f.refuse {
			redisAll(t, c, pass, f.authed && i > 0, a...)
		}
		down := faultPoll(t, 5*time.Second, f.name+": NOT_SERVING", serving(healthpb.HealthCheckResponse_NOT_SERVING))
		for _, a := range f.restore {
			redisAll(t, c, pass, f.unauthed, a...)
		}
		up := faultPoll(t, 2*time.Second, f.name+": SERVING again", serving(healthpb.HealthCheckResponse_SERVING))
		re := regexp.MustCompile(`Redis call failed.*` + regexp.QuoteMeta(f.logged) + `.*node=`)
		if !re.MatchString(srv.log.String()) {
			t.Errorf("%s: no log line of the refusal:\n%s", f.name, boundedLog(srv.log.String()))
		}
		t.Logf("Redis refusing (%s): NOT_SERVING after %v, SERVING %v after Redis accepted commands again", f.name, down.Round(time.Millisecond), up.Round(time.Millisecond))
	}
	if !strings.Contains(srv.metricsText(t), `sluice_redis_calls_total{outcome="error_reply"}`) {
		t.Error("no sluice_redis_calls_total in /metrics")
	}
}

// redisAll runs one command on every master, authenticated with pass when auth is set.
func redisAll(t *testing.T, c *redistest.Cluster, pass string, auth bool, args ...any) {
	for i := range c.Addrs {
		cl := c.Client(i)
		if auth {
			if err := cl.Do(context.Background(), "auth", pass).Err(); err != nil {
				t.Fatalf("node %d: AUTH: %v", i, err)
			}
		}
		if err := cl.Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("node %d: %v: %v", i, args, err)
		}
		cl.Close()
	}
}

// readyStatus is the status of the service's /ready (0: no answer).
func readyStatus(s *serveProc) int {
	resp, err := http.Get("http://" + s.admin + "/ready")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
