package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// startRunProcess starts `sluice run` with sluice-redis.wasm on the test cluster, config
// cfgPath and --drain-timeout drain, and waits until it listens.
func startRunProcess(t *testing.T, cfgPath string, drain time.Duration) *runProcess {
	t.Helper()
	skipShort(t, "runs sluice run as a child process")
	c := testCluster(t)
	args := []string{"--wasm", buildRedisWasm(t), "--config", cfgPath, "--listen", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--workers", "2", "--redis-cluster", "redis=" + strings.Join(c.Addrs, ","),
		"--cache-dir", leaseCacheDir(t), "--drain-timeout", drain.String()}
	return startSluiceRun(t, args...)
}

var leaseCache struct {
	dir string
}

// leaseCacheDir is one compilation cache for every proxy of these tests.
func leaseCacheDir(t *testing.T) string {
	if leaseCache.dir == "" {
		d, err := os.MkdirTemp("", "sluice-lease-stop-cache-")
		if err != nil {
			t.Fatal(err)
		}
		leaseCache.dir = d
	}
	return leaseCache.dir
}

// spend sends n requests for key to addr one after another and fails unless all are
// admitted.
func spend(t *testing.T, addr, key string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		req, _ := http.NewRequest("GET", "http://"+addr+"/v1/items", nil)
		req.Header.Set("x-api-key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d on the proxy with the lease: %d, want 200", i+1, resp.StatusCode)
		}
	}
}

// leaseRule is a configuration with one Redis rule with lease 10 shared by three proxies.
func leaseRule(t *testing.T, alg, window string) (cfgPath, rule string) {
	rule = fmt.Sprintf("stop-%s-%d", alg, time.Now().UnixNano())
	cfgPath = writeFile(t, "sluice.json", `{"rules":[{"name":"`+rule+`","key":[{"header":"x-api-key"}],
"algorithm":"`+alg+`","limit":100,"window":"`+window+`","backend":"redis","lease":10}],
"failure_mode":"closed","redis":{"cluster":"redis","timeout_ms":5000,"instances":3}}`)
	return cfgPath, rule
}

const (
	leaseN     = 10 // the rule's lease
	leaseSpent = 3  // requests the stopped or killed proxy admits from its pool
)

// A proxy that stops (SIGTERM) with an open lease returns what it did not spend: its
// root context's proxy_on_done sends the return to Redis, and `sluice run` waits (up to
// --drain-timeout) until Redis has answered before it exits. The other proxy then admits
// exactly the limit minus what the stopped one spent.
func TestRunLeaseStopReturnsPool(t *testing.T) {
	c := testCluster(t)
	withRedisClusters(t, redisClusterFlag{"redis": c.Addrs})
	cfgPath, rule := leaseRule(t, "fixed_window", "1h")
	a := startRunProcess(t, cfgPath, 10*time.Second)
	b, _, _ := startTestRun(t, runConfig{wasm: buildRedisWasm(t), configPath: cfgPath, clusters: clusterFlag{}, workers: 2, admin: "127.0.0.1:0", cacheDir: leaseCacheDir(t)})
	spend(t, a.addr, "k", leaseSpent)
	if leased := metricValue(t, a.admin, "sluice_redis_leased"); leased != leaseN {
		t.Fatalf("the proxy leased %d, want one pool of %d", leased, leaseN)
	}
	start := time.Now()
	if err := a.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("sluice run after SIGTERM: %v", err)
	}
	stopped := a.stderr.wait(t, regexp.MustCompile(`filter stopped.*took=(\S+)`), time.Second)
	t.Logf("SIGTERM with %d unspent admissions: exited in %v (the filter's end: %s)", leaseN-leaseSpent, time.Since(start).Round(time.Millisecond), stopped[1])
	if st := leaseState(t, c.Addrs, rule); st.fields["n"] != fmt.Sprint(leaseSpent) {
		t.Fatalf("after the stop the window counts %q admitted, want the %d spent (the rest returned)", st.fields["n"], leaseSpent)
	}
	r := fire(t, []string{b.listenAddr}, 300, 16, "k")
	want := int64(100 - leaseSpent)
	t.Logf("the other proxy then: %d admitted, %d denied, %d other; sluice_redis_returned %d", r.ok, r.denied, r.other, metricValue(t, b.adminAddr, "sluice_redis_returned"))
	if r.ok != want || r.other != 0 {
		t.Fatalf("after the stop the other proxy admitted %d (other %d: %v), want exactly %d = limit - spent: the stopped proxy's %d unspent admissions came back", r.ok, r.other, r.others, want, leaseN-leaseSpent)
	}
}

// A proxy killed (SIGKILL) with an open lease loses what it did not spend, never duplicates
// it: the others admit exactly limit - N (N = spent + unspent, the pool), for a fixed
// window until the window ends — the key's state, the lost admissions with it, expires then
// — and for a token bucket (100/h: a token per 36 s) plus what refilled meanwhile.
func TestRunLeaseKilledProxy(t *testing.T) {
	c := testCluster(t)
	withRedisClusters(t, redisClusterFlag{"redis": c.Addrs})
	t.Run("fixed_window", func(t *testing.T) {
		// A window length whose current window has minutes left, so that everything
		// below happens in one window without waiting for one to begin (windows are
		// multiples of their length since the epoch, on Redis's clock: this machine's).
		var window time.Duration
		for _, h := range []int{1, 2, 3, 5, 7} {
			w := time.Duration(h) * time.Hour
			if windowLeft(w) > 5*time.Minute {
				window = w
				break
			}
		}
		cfgPath, rule := leaseRule(t, "fixed_window", window.String())
		a := startRunProcess(t, cfgPath, 10*time.Second)
		b, _, _ := startTestRun(t, runConfig{wasm: buildRedisWasm(t), configPath: cfgPath, clusters: clusterFlag{}, workers: 2, admin: "127.0.0.1:0", cacheDir: leaseCacheDir(t)})
		spend(t, a.addr, "k", leaseSpent)
		if err := a.stop(t, syscall.SIGKILL); err == nil {
			t.Fatal("SIGKILL: exit status 0")
		}
		if st := leaseState(t, c.Addrs, rule); st.fields["n"] != fmt.Sprint(leaseN) {
			t.Fatalf("after the kill the window counts %q admitted, want the whole pool %d", st.fields["n"], leaseN)
		}
		r := fire(t, []string{b.listenAddr}, 300, 16, "k")
		want := int64(100 - leaseN)
		t.Logf("killed with %d unspent admissions: the other proxy admitted %d (want %d), %d denied", leaseN-leaseSpent, r.ok, want, r.denied)
		if r.ok != want || r.other != 0 {
			t.Fatalf("after the kill the other proxy admitted %d (other %d: %v), want exactly %d = limit - N: the %d unspent are lost, never admitted twice", r.ok, r.other, r.others, want, leaseN-leaseSpent)
		}
		st := leaseState(t, c.Addrs, rule)
		end := windowLeft(window)
		t.Logf("the window's state %v expires in %v; the window ends in %v", st.fields, st.pttl.Round(time.Millisecond), end.Round(time.Millisecond))
		if st.fields["n"] != "100" || st.pttl <= 0 || st.pttl > end+2*time.Second || st.pttl < end-2*time.Second {
			t.Fatalf("the window's state %v expires in %v, want n 100 expiring with the window (in %v)", st.fields, st.pttl, end)
		}
	})
	t.Run("token_bucket", func(t *testing.T) {
		cfgPath, _ := leaseRule(t, "token_bucket", "1h")
		a := startRunProcess(t, cfgPath, 10*time.Second)
		b, _, _ := startTestRun(t, runConfig{wasm: buildRedisWasm(t), configPath: cfgPath, clusters: clusterFlag{}, workers: 2, admin: "127.0.0.1:0", cacheDir: leaseCacheDir(t)})
		start := time.Now()
		spend(t, a.addr, "k", leaseSpent)
		if err := a.stop(t, syscall.SIGKILL); err == nil {
			t.Fatal("SIGKILL: exit status 0")
		}
		r := fire(t, []string{b.listenAddr}, 300, 16, "k")
		// 100 tokens per hour refill one per 36 s: at most this many since the first
		// acquire.
		refill := int64(time.Since(start)/(36*time.Second)) + 1
		lo, hi := int64(100-leaseN), int64(100-leaseN)+refill
		t.Logf("killed with %d unspent tokens: the other proxy admitted %d (want %d..%d), %d denied", leaseN-leaseSpent, r.ok, lo, hi, r.denied)
		if r.ok < lo || r.ok > hi || r.other != 0 {
			t.Fatalf("after the kill the other proxy admitted %d (other %d: %v), want %d..%d: the %d unspent tokens are lost, never admitted twice", r.ok, r.other, r.others, lo, hi, leaseN-leaseSpent)
		}
	})
}

// windowLeft is the time left in the current fixed window of length w (windows are
// multiples of w since the Unix epoch; time.Truncate counts from year 1).
func windowLeft(w time.Duration) time.Duration {
	now := time.Now().UnixMicro()
	return time.Duration(w.Microseconds()-now%w.Microseconds()) * time.Microsecond
}

// leaseStateOf is a lease key's Redis hash and time to live.
type leaseStateOf struct {
	key    string
	fields map[string]string
	pttl   time.Duration
}

// leaseState reads the one lease key of rule from the cluster.
func leaseState(t *testing.T, addrs []string, rule string) leaseStateOf {
	t.Helper()
	ctx := context.Background()
	cl := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
	defer cl.Close()
	var mu sync.Mutex
	var keys []string
	err := cl.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
		ks, err := n.Keys(ctx, "sluice:{"+rule+"|*").Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || !strings.HasSuffix(keys[0], "l") {
		t.Fatalf("keys of rule %s: %q, want one lease key", rule, keys)
	}
	st := leaseStateOf{key: keys[0]}
	if st.fields, err = cl.HGetAll(ctx, st.key).Result(); err != nil {
		t.Fatal(err)
	}
	if st.pttl, err = cl.PTTL(ctx, st.key).Result(); err != nil {
		t.Fatal(err)
	}
	return st
}
