package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// The service's path to Redis in TestEnvoyNetworkFaults: one toxiproxy link in front of
// every Redis node (masters and replicas), which each node announces as its address
// (CLUSTER SLOTS, MOVED), so that every connection of `sluice serve` to Redis — seeds,
// slot-table reads, script calls — crosses a link the test can break; the nodes' cluster
// bus stays direct.

// faultPath is where a phase puts its fault: the proxies' link to the service, or the
// service's links to Redis.
type faultPath interface {
	toxic(name, typ, attrs string, streams ...string)
	heal()
	refuse()
}

func (f *faultLink) String() string { return "service link" }

// redisLinks are the links in front of each node of a cluster, node i behind links[i].
type redisLinks []*faultLink

// newRedisLinks puts a link in front of every node of c and makes the node announce it.
func newRedisLinks(t *testing.T, c *redistest.Cluster) redisLinks {
	t.Helper()
	ls := make(redisLinks, c.Nodes())
	for i := range ls {
		ls[i] = newFaultLink(t, "127.0.0.1:"+strconv.Itoa(c.Port(i)))
		if err := c.Announce(i, ls[i].port); err != nil {
			t.Fatal(err)
		}
	}
	return ls
}

func (ls redisLinks) String() string { return "Redis links" }

// seeds is the --redis-cluster value: the masters' links.
func (ls redisLinks) seeds() string {
	var s []string
	for _, l := range ls {
		s = append(s, "127.0.0.1:"+strconv.Itoa(l.port))
	}
	return strings.Join(s, ",")
}

func (ls redisLinks) toxic(name, typ, attrs string, streams ...string) {
	for _, l := range ls {
		l.toxic(name, typ, attrs, streams...)
	}
}

func (ls redisLinks) heal() {
	for _, l := range ls {
		l.heal()
	}
}

func (ls redisLinks) refuse() {
	for _, l := range ls {
		l.refuse()
	}
}

// redisPhaseList: the faults of faultPhaseList on the service's links to Redis (all of them:
// a partition between the service and Redis). The black hole holds the bytes (a latency of
// a minute) rather than dropping them: on a TCP connection a black hole delays bytes until
// the path returns or the connection dies, never loses some in the middle of the stream
// (toxiproxy's "timeout" toxic does, which no real network can do to a pipelined
// connection). The service answers UNAVAILABLE for a call Redis did not answer, so a
// decision fails at timeout_ms only when Redis is slower than it.
var redisPhaseList = []faultPhase{
	faultPhaseList[0],
	faultPhaseList[1],
	faultPhaseList[2],
	{"black hole", func(l faultPath) { l.toxic("bh", "latency", `{"latency":60000}`, "upstream") }, true, true},
	faultPhaseList[4],
}

// masterFailover: two Envoys under "closed" (limit 30 per 20 s window, one key). The fleet
// spends 20 of the window; the key's Redis master is killed (SIGKILL) and its replica
// promoted (CLUSTER FAILOVER TAKEOVER): while no master serves the slot, requests are
// answered 503; within 2 s of the promotion the key's decisions are remote again (its
// requests polled one by one), and the rest of the window admits what the counter the
// replica holds allows. The admissions in the
// window above the limit are the counts replication had not copied (asserted: none, on
// loopback replication is done within a millisecond of the write).
func masterFailover(t *testing.T, tg envoyproc.Target, c *redistest.Cluster, srv *serveProc, link *faultLink) {
	rule := rlsName(tg, "fault-failover")
	cfg := fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-api-key"}],"algorithm":"fixed_window","limit":30,"window":"20s","backend":"rls"}],
 "failure_mode":"closed","rls":{"cluster":"rls","domain":%q,"timeout_ms":100,"instances":2}}`, rule, rlsDomain)
	_, urls := startEnvoys(t, tg, 2, 1, renderRLSEnvoy(rlsBootstrap{Name: rule, RLSPort: link.port, Config: cfg}))
	const window = 20 * time.Second
	// Kill, promotion and recovery take a few seconds: begin early in a window.
	faultPoll(t, window, "the first 10 s of a window", func() bool { return time.Now().UnixNano()%int64(window) < int64(10*time.Second) })
	start := time.Now().Truncate(window)
	key := "fo-" + rlsStamp
	before := statuses(timedGets(t, urls, 20, key))
	m := counterMaster(t, c, rule)
	redisNodes(t, c, "config", "set", "cluster-replica-no-failover", "yes") // CLUSTERDOWN first
	if err := c.Kill(m); err != nil {
		t.Fatal(err)
	}
	dead := statuses(timedGets(t, urls, 6, key))
	clusterDown(t, c, srv, urls)
	promoted := time.Now()
	if err := c.Failover(len(c.Addrs) + m); err != nil {
		t.Fatal(err)
	}
	promote := time.Since(promoted)
	healed := time.Now()
	var gap []timed // the key's requests until one is decided remotely again
	for len(gap) == 0 || gap[len(gap)-1].status == 503 {
		if time.Since(healed) > 10*time.Second {
			t.Fatalf("the key still fails 10 s after the promotion: %v", statuses(gap))
		}
		gap = append(gap, timedGets(t, urls[len(gap)%2:len(gap)%2+1], 1, key)...)
		time.Sleep(20 * time.Millisecond)
	}
	recovered := time.Since(healed)
	after := statuses(timedGets(t, urls, 30, key))
	after[gap[len(gap)-1].status]++
	if time.Now().Truncate(window) != start {
		t.Fatalf("the window ended before the requests did: the machine is too slow for this check")
	}
	admitted := before[200] + after[200]
	t.Logf("master failover (closed): before the kill %v; master dead %v; promotion took %v, the key remote again %v after it (%d requests); then %v: the window admitted %d of 30",
		before, dead, promote.Round(time.Millisecond), recovered.Round(time.Millisecond), len(gap), after, admitted)
	if before[200] != 20 || dead[503] != 6 {
		t.Errorf("before the kill %v (want 20 × 200), master dead %v (want 6 × 503)", before, dead)
	}
	if recovered > 2*time.Second {
		t.Errorf("remote decisions again only %v after the promotion", recovered)
	}
	if admitted > 30 || after[200] == 0 {
		t.Errorf("the window across the failover admitted %d (%d after it), want at most 30 and some after it", admitted, after[200])
	}
}

// clusterDown: with a master dead and cluster-require-full-coverage set, the cluster is
// down (cluster_state:fail once the others mark the master failed, after the node timeout)
// and every node answers CLUSTERDOWN: requests on keys of every master are refused (503
// under closed) and the service logs the refusal with the node. Twelve keys: one at least
// lives on a live master but for a chance of 3⁻¹².
func clusterDown(t *testing.T, c *redistest.Cluster, srv *serveProc, urls []string) {
	redisNodes(t, c, "config", "set", "cluster-require-full-coverage", "yes")
	began := time.Now()
	faultPoll(t, 10*time.Second, "cluster_state:fail on every running node", func() bool {
		for i := 0; i < c.Nodes(); i++ {
			cl := c.Client(i)
			info, err := cl.ClusterInfo(context.Background()).Result()
			cl.Close()
			if err == nil && !strings.Contains(info, "cluster_state:fail") {
				return false
			}
		}
		return true
	})
	down := time.Since(began)
	got := map[int]int{}
	for i := 0; i < 12; i++ {
		for k, v := range statuses(timedGets(t, urls, 1, fmt.Sprintf("cd-%d-%s", i, rlsStamp))) {
			got[k] += v
		}
	}
	logged := faultPoll(t, 5*time.Second, "a CLUSTERDOWN logged", func() bool {
		return strings.Contains(srv.log.String(), `error="CLUSTERDOWN`)
	})
	redisNodes(t, c, "config", "set", "cluster-require-full-coverage", "no")
	t.Logf("CLUSTERDOWN (a master dead, full coverage required): cluster down %v after; 12 keys: %v; logged %v after", down.Round(time.Millisecond), got, logged.Round(time.Millisecond))
	if got[503] != 12 {
		t.Errorf("CLUSTERDOWN: %v, want 12 × 503 (closed)", got)
	}
}

// redisNodes runs one command on every running node of c (a dead node is skipped).
func redisNodes(t *testing.T, c *redistest.Cluster, args ...any) {
	t.Helper()
	for i := 0; i < c.Nodes(); i++ {
		cl := c.Client(i)
		err := cl.Do(context.Background(), args...).Err()
		cl.Close()
		if err != nil && !strings.Contains(err.Error(), "refused") {
			t.Fatalf("node %d: %v: %v", i, args, err)
		}
	}
}

// counterMaster is the master serving the Redis key of the one window counter of rule
// (sluice:{DOMAIN/RULE|#hash of the key}:fwx:…).
func counterMaster(t *testing.T, c *redistest.Cluster, rule string) int {
	t.Helper()
	for i := range c.Addrs {
		cl := c.Client(i)
		keys, err := cl.Keys(context.Background(), "*/"+rule+"|*").Result()
		cl.Close()
		if err == nil && len(keys) > 0 {
			m, err := c.NodeOf(keys[0])
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	t.Fatalf("no Redis key of rule %q on the masters", rule)
	return -1
}
