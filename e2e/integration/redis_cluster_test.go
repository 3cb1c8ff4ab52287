package integration

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/host/redis"
	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// End-to-end tests of the Redis backend: sluice-redis.wasm in the embedded
// host with the Redis extension, several hosts (each standing for one proxy
// process, with its own shared data and its own Redis clients) sharing one
// real 3-master Redis Cluster.

// Each test starts its own cluster (about a second): tests kill and pause nodes, and
// the filter package's TestMain is not the place for a cluster every test would wait for.
// Tests using it must not run in parallel (it is a package variable).
var cluster *redistest.Cluster

func testCluster(t testing.TB) *redistest.Cluster {
	t.Helper()
	redistest.SkipShort(t)
	if cluster != nil {
		return cluster
	}
	c, err := redistest.Start(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	cluster = c
	t.Cleanup(func() { c.Close(); cluster = nil })
	return c
}

// redisService is the redis.cluster name the configurations use.
const redisService = "outbound|6379||redis.test"

// redisProxy is one proxy instance: a host running sluice-redis.wasm with its own Redis
// clients.
type redisProxy struct {
	h    *host.Host
	st   *redis.Stats
	logs *bytes.Buffer
	mu   *sync.Mutex
}

func startRedisProxy(t testing.TB, cfg string, workers int) *redisProxy {
	t.Helper()
	c := testCluster(t)
	wasm := filtertest.Wasm(t, "redis")
	clusters := redisclient.New(map[string][]string{redisService: c.Addrs}, redisclient.Options{})
	t.Cleanup(func() { clusters.Close() })
	p := &redisProxy{st: new(redis.Stats), logs: new(bytes.Buffer), mu: new(sync.Mutex)}
	h, err := host.New(context.Background(), host.Options{
		Wasm:         wasm,
		PluginConfig: []byte(cfg),
		Workers:      workers,
		VMID:         "sluice-redis-test",
		Logger:       slog.New(slog.NewTextHandler(lockedWriter{p.mu, p.logs}, nil)),
		Extensions:   []host.Extension{redis.NewExtension(clusters, p.st)},
	})
	if err != nil {
		t.Fatalf("host.New: %v\n%s", err, p.logs)
	}
	t.Cleanup(func() { h.Close(context.Background()) })
	p.h = h
	return p
}

func (p *redisProxy) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

func (p *redisProxy) metric(name string) int64 {
	m, _ := p.h.Metric(name)
	return int64(m.Value)
}

func (p *redisProxy) get(t testing.TB, user string) *host.Response {
	t.Helper()
	resp, err := p.h.Exchange(context.Background(), &host.Request{Path: "/api", Headers: [][2]string{{"x-user", user}}, RemoteAddr: "10.0.0.1:1234"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// unique makes rule names (and so Redis keys) fresh for each run against the same cluster.
var uniqueN atomic.Int64

func unique(s string) string {
	return fmt.Sprintf("%s-%d-%d", s, time.Now().UnixNano()%1e9, uniqueN.Add(1))
}

func redisConfig(rule, alg string, limit int, window, failure string, timeoutMS, instances int) string {
	return fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-user"}],"algorithm":%q,"limit":%d,"window":%q,"backend":"redis"}],
"failure_mode":%q,"redis":{"cluster":%q,"timeout_ms":%d,"instances":%d}}`, rule, alg, limit, window, failure, redisService, timeoutMS, instances)
}

var algorithmNames = []string{"token_bucket", "leaky_bucket", "fixed_window", "sliding_log", "sliding_window"}

// The check: three proxies sharing the cluster, 3,000 concurrent requests on one
// key, limit 100 per hour: exactly 100 admitted, for every algorithm.
func TestRedisExactAdmissionsAcrossProxies(t *testing.T) {
	testCluster(t)
	const proxies, workers, requests, limit = 3, 2, 3000, 100
	for _, alg := range algorithmNames {
		t.Run(alg, func(t *testing.T) {
			cfg := redisConfig(unique(alg), alg, limit, "1h", "closed", 5000, 1)
			var ps []*redisProxy
			for i := 0; i < proxies; i++ {
				ps = append(ps, startRedisProxy(t, cfg, workers))
			}
			start := time.Now()
			ok, denied, other := burst(ps, requests, "alice")
			t.Logf("%s: %d requests through %d proxies in %v: %d admitted, %d denied", alg, requests, proxies, time.Since(start).Round(time.Millisecond), ok, denied)
			if ok != limit || denied != requests-limit || other != 0 {
				t.Errorf("admitted %d, denied %d, other %d; want exactly %d admitted\n%s", ok, denied, other, limit, ps[0].Logs())
			}
			var calls, noscript, failures int64
			for _, p := range ps {
				calls += p.metric(filter.MetricRedisCalls)
				noscript += p.metric(filter.MetricRedisNoScript)
				failures += p.metric(filter.MetricRedisFailures)
			}
			// At most one decision call per request, plus one EVAL for each NOSCRIPT; a
			// worker's requests for the key that arrive while its call is in flight go
			// together in the next one, so a burst on one key takes far fewer.
			t.Logf("%s: %d calls, of which %d EVAL after NOSCRIPT", alg, calls, noscript)
			if calls-noscript > requests/2 || calls < 1 || failures != 0 {
				t.Errorf("redis calls %d (NOSCRIPT %d), failures %d for %d requests", calls, noscript, failures, requests)
			}
		})
	}
}

// keyNode finds the node holding the Redis key(s) of rule.
func keyNode(t *testing.T, rule string) int {
	t.Helper()
	for i := range cluster.Addrs {
		keys, err := cluster.Client(i).Keys(context.Background(), "sluice:{"+rule+"|*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) > 0 {
			return i
		}
	}
	t.Fatalf("no node holds a key of rule %s", rule)
	return -1
}

// The limit is enforced with the Redis reply's numbers: Retry-After and the headers come
// from the script.
func TestRedisHeadersAndRetryAfter(t *testing.T) {
	testCluster(t)
	rule := unique("headers")
	p := startRedisProxy(t, redisConfig(rule, "fixed_window", 2, "1h", "closed", 1000, 1), 1)
	for i, want := range []string{"1", "0"} {
		r := p.get(t, "bob")
		if r.Status != 200 || r.Header("x-ratelimit-remaining") != want || r.Header("x-ratelimit-limit") != "2" {
			t.Fatalf("request %d: %d %v", i, r.Status, r.Headers)
		}
	}
	r := p.get(t, "bob")
	ra, _ := strconv.Atoi(r.Header("retry-after"))
	if r.Status != 429 || ra < 1 || ra > 3600 || !strings.Contains(r.Header("ratelimit"), `"`+rule+`";r=0`) {
		t.Fatalf("third request: %d %v", r.Status, r.Headers)
	}
	if r := p.get(t, "carol"); r.Status != 200 {
		t.Fatalf("another key: %d", r.Status)
	}
}

// Kill the master owning the key's slot: each failure mode, then the node comes back and
// limiting resumes without restarting anything.
func TestRedisNodeDown(t *testing.T) {
	testCluster(t)
	const timeoutMS = 100
	type proxy struct {
		mode string
		rule string
		p    *redisProxy
	}
	var ps []*proxy
	for _, mode := range []string{"open", "closed", "local"} {
		rule := unique("down-" + mode)
		// limit 8, instances 4: the local fallback admits 2 per key.
		ps = append(ps, &proxy{mode, rule, startRedisProxy(t, redisConfig(rule, "sliding_log", 8, "1h", mode, timeoutMS, 4), 2)})
	}
	// Put every rule's key on one node: for each rule find a user whose key lands on the
	// node of the first rule's key. (One user for all rules does not do: CRC16 is linear,
	// so the slots of equally long hash tags differ by a fixed XOR, which can keep them on
	// different nodes for every user.) A probe's key is the one that appears after its
	// request.
	users := map[string]string{}
	node := -1
	for _, x := range ps {
		for i := 0; users[x.mode] == ""; i++ {
			if i == 200 {
				t.Fatalf("%s: no user with a key on node %d in 200", x.mode, node)
			}
			u := x.mode + "-u" + strconv.Itoa(i)
			before := ruleKeys(t, x.rule)
			if r := x.p.get(t, u); r.Status != 200 {
				t.Fatalf("%s: %d", x.mode, r.Status)
			}
			k := newKeyNode(t, x.rule, before)
			if node < 0 {
				node = k
			}
			if k == node {
				users[x.mode] = u
			}
		}
	}
	if err := cluster.Kill(node); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			cluster.Restart(node)
		}
	}()
	for _, x := range ps {
		var admitted, rejected503, denied int
		var slowest time.Duration
		for i := 0; i < 6; i++ {
			start := time.Now()
			r := x.p.get(t, users[x.mode])
			if d := time.Since(start); d > slowest {
				slowest = d
			}
			switch r.Status {
			case 200:
				admitted++
			case 503:
				rejected503++
				if string(r.Body) != "rate limiter unavailable\n" {
					t.Errorf("closed: body %q", r.Body)
				}
			case 429:
				denied++
			}
		}
		t.Logf("%s with the node down: %d admitted, %d 503, %d 429; slowest request %v", x.mode, admitted, rejected503, denied, slowest)
		if slowest > redistest.TimeoutBound(timeoutMS*time.Millisecond) {
			t.Errorf("%s: a request took %v with timeout_ms %d", x.mode, slowest, timeoutMS)
		}
		switch x.mode {
		case "open":
			if admitted != 6 || x.p.metric(filter.MetricRedisFailOpen) != 6 {
				t.Errorf("open: %d admitted, fail_open %d", admitted, x.p.metric(filter.MetricRedisFailOpen))
			}
		case "closed":
			if rejected503 != 6 || x.p.metric(filter.MetricRedisFailClosed) != 6 {
				t.Errorf("closed: %d 503, fail_closed %d", rejected503, x.p.metric(filter.MetricRedisFailClosed))
			}
		case "local":
			// The local share is 8/4 = 2, and the fallback starts from this proxy's share
			// of what Redis said the fleet used (the user's one request before the kill:
			// ⌈1 × 2/8⌉ = 1; filter/fallback_seed.go): 1 more is admitted.
			if admitted != 1 || denied != 5 || x.p.metric(filter.MetricRedisFailLocal) != 6 {
				t.Errorf("local: %d admitted %d denied (want 2 - 1 = 1 admitted), fail_local %d", admitted, denied, x.p.metric(filter.MetricRedisFailLocal))
			}
		}
	}
	// A concurrent burst with the node down, failure_mode open: every request completes
	// about timeout_ms after it started.
	{
		open := ps[0].p
		var wg sync.WaitGroup
		var slowest atomic.Int64
		var notOK atomic.Int64
		for i := 0; i < 100; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				r, err := open.h.Exchange(context.Background(), &host.Request{Path: "/api", Headers: [][2]string{{"x-user", users["open"]}}}, nil)
				d := int64(time.Since(start))
				for {
					cur := slowest.Load()
					if d <= cur || slowest.CompareAndSwap(cur, d) {
						break
					}
				}
				if err != nil || r.Status != 200 {
					notOK.Add(1)
				}
			}()
		}
		wg.Wait()
		t.Logf("open, node down, 100 concurrent requests: slowest %v, %d not admitted", time.Duration(slowest.Load()), notOK.Load())
		if notOK.Load() != 0 || time.Duration(slowest.Load()) > redistest.TimeoutBound(timeoutMS*time.Millisecond) {
			t.Errorf("open, node down, burst: %d not admitted, slowest %v", notOK.Load(), time.Duration(slowest.Load()))
		}
	}
	if err := cluster.Restart(node); err != nil {
		t.Fatal(err)
	}
	restarted = true
	// The node is back (empty): limiting through Redis resumes for the keys on it, with no
	// restart of the proxies.
	for _, x := range ps {
		deadline := time.Now().Add(10 * time.Second)
		failures := x.p.metric(filter.MetricRedisFailures)
		for {
			r := x.p.get(t, users[x.mode])
			if x.p.metric(filter.MetricRedisFailures) == failures && r.Status == 200 {
				break
			}
			failures = x.p.metric(filter.MetricRedisFailures)
			if time.Now().After(deadline) {
				t.Fatalf("%s: Redis decisions did not resume: %d\n%s", x.mode, r.Status, x.p.Logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
		// 8 per hour through Redis again: the first request counted above, 7 more, then 429.
		for i := 0; i < 7; i++ {
			if r := x.p.get(t, users[x.mode]); r.Status != 200 {
				t.Fatalf("%s after restart: request %d: %d", x.mode, i, r.Status)
			}
		}
		if r := x.p.get(t, users[x.mode]); r.Status != 429 {
			t.Fatalf("%s after restart: 9th request %d, want 429", x.mode, r.Status)
		}
	}
}

// ruleKeys returns the Redis keys of rule on every node, by node.
func ruleKeys(t *testing.T, rule string) []map[string]bool {
	t.Helper()
	out := make([]map[string]bool, len(cluster.Addrs))
	for i := range cluster.Addrs {
		keys, err := cluster.Client(i).Keys(context.Background(), "sluice:{"+rule+"|*").Result()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = map[string]bool{}
		for _, k := range keys {
			out[i][k] = true
		}
	}
	return out
}

// newKeyNode returns the node that holds a key of rule not in before.
func newKeyNode(t *testing.T, rule string, before []map[string]bool) int {
	t.Helper()
	for i, keys := range ruleKeys(t, rule) {
		for k := range keys {
			if !before[i][k] {
				return i
			}
		}
	}
	t.Fatalf("no new key of rule %s", rule)
	return -1
}

// A paused node (no answer at all): the request waits at most about timeout_ms.
func TestRedisNodePausedBoundsTheWait(t *testing.T) {
	testCluster(t)
	const timeoutMS = 80
	rule := unique("paused")
	p := startRedisProxy(t, redisConfig(rule, "token_bucket", 100, "1m", "open", timeoutMS, 1), 1)
	if r := p.get(t, "dave"); r.Status != 200 {
		t.Fatal(r.Status)
	}
	node := keyNode(t, rule)
	if err := cluster.Pause(node); err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for i := 0; i < 5; i++ {
		start := time.Now()
		r := p.get(t, "dave")
		if d := time.Since(start); d > slowest {
			slowest = d
		}
		if r.Status != 200 {
			t.Errorf("open with a paused node: %d", r.Status)
		}
	}
	if err := cluster.Resume(node); err != nil {
		t.Fatal(err)
	}
	t.Logf("paused node: slowest request %v (timeout_ms %d)", slowest, timeoutMS)
	// The timeouts metric says the timeout ended each wait; the bound only that it did.
	if slowest < timeoutMS*time.Millisecond || slowest > redistest.TimeoutBound(timeoutMS*time.Millisecond) {
		t.Errorf("slowest request %v, want about timeout_ms %d", slowest, timeoutMS)
	}
	if got := p.metric(filter.MetricRedisTimeouts); got != 5 {
		t.Errorf("timeouts metric %d, want 5", got)
	}
}
