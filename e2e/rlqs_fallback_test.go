package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// TestRLQSEnvoyExpiredAssignment: what Envoy does when `sluice serve` is
// gone (docs/rlqs.md, "TTL"), for every Envoy of forEachEnvoy. One replica
// serves one Envoy whose buckets have no_assignment_behavior ALLOW_ALL and
// expired_assignment_behavior {fallback_rate_limit: DENY_ALL} for 6 s, and
// two buckets: {api: <grant>} with a limit of 100,000 per hour (its grant,
// the floor of 10,000 tokens, outlasts the test's requests) and
// {api: <deny>} with requests_per_unit 0 (answered DENY_ALL). Right after
// the service answered a periodic report (the last assignments' TTL, 2I+1 s
// in whole seconds, 11 or 12 s with Envoy's 5 s reports, starts then), the
// replica is killed (SIGKILL) and both buckets are probed every ~100 ms:
//
//   - the grant bucket admits (its token bucket) until the TTL, denies (the
//     fallback) for 6 s, then admits (no_assignment_behavior);
//   - the deny bucket denies (its DENY_ALL, then the fallback) until the
//     TTL and the 6 s have passed, then admits.
//
// Each bucket's answers must be exactly these runs (no flapping); the phase
// boundaries, measured from the kill, must be within a second or so of the
// TTL and of the 6 s.
func TestRLQSEnvoyExpiredAssignment(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		t.Parallel()
		const fallbackFor = 6 * time.Second
		domain := rlqsRunName(tg, "rlqs-expired")
		grant, deny := rlqsRunName(tg, "expired-grant"), rlqsRunName(tg, "expired-deny")
		conf := filepath.Join(t.TempDir(), "rl.yaml")
		writeRLQSConfig(t, conf, domain, map[string]int{grant: 100000, deny: 0})
		begun := time.Now()
		s := startServe(t, c, "--config", conf)
		_, url := startRLQSEnvoy(t, tg, rlqsBootstrap{Domain: domain, NoAssignment: "ALLOW_ALL", Ports: []int{s.port},
			Expired: "DENY_ALL", ExpiredTimeout: fmt.Sprintf("%ds", int(fallbackFor/time.Second))})

		// The first request of each bucket is admitted (no assignment yet)
		// and reported at once; the answers are a token bucket and DENY_ALL.
		if st := rlqsGet(t, url, grant); st != 200 {
			t.Fatalf("the grant bucket's first request: %d, want 200 (no_assignment_behavior ALLOW_ALL)", st)
		}
		pollUntil(t, 5*time.Second, "the deny bucket's DENY_ALL in force", func() bool { return rlqsGet(t, url, deny) == 429 })
		pollUntil(t, 5*time.Second, "a token bucket sent for the grant bucket", func() bool {
			return rlqsAction(t, s, "token_bucket") >= 1
		})
		if st := rlqsGet(t, url, grant); st != 200 {
			t.Fatalf("the grant bucket with its token bucket: %d, want 200", st)
		}
		// Kill the replica just after it answered a periodic report (both
		// buckets: two actions), so that the kill is when the last
		// assignments' TTL started. The 100 ms let the response, decided
		// and queued when the actions are counted, cross the loopback.
		base := s.metric(t, "sluice_rlqs_actions_total")
		pollUntil(t, 8*time.Second, "a periodic report answered", func() bool {
			return s.metric(t, "sluice_rlqs_actions_total") >= base+2
		})
		time.Sleep(100 * time.Millisecond)
		if err := s.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		<-s.done
		t.Logf("replica killed %v after the start, just after it answered a periodic report", killed.Sub(begun).Round(10*time.Millisecond))

		// Probe both buckets until each has admitted for 1.5 s after its
		// fallback (at most 40 s).
		var ga, gd []rlqsSample
		settled := func(ss []rlqsSample, phases int) bool {
			rs := rlqsRuns(ss)
			return len(rs) >= phases && rs[len(rs)-1].status == 200 && rs[len(rs)-1].last-rs[len(rs)-1].first >= 1500*time.Millisecond
		}
		for deadline := killed.Add(40 * time.Second); time.Now().Before(deadline); {
			ga = append(ga, rlqsSample{time.Since(killed), rlqsGet(t, url, grant)})
			gd = append(gd, rlqsSample{time.Since(killed), rlqsGet(t, url, deny)})
			if settled(ga, 3) && settled(gd, 2) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		ra, rd := rlqsRuns(ga), rlqsRuns(gd)
		t.Logf("after the kill: grant bucket %s; deny bucket %s", rlqsRunsString(ra), rlqsRunsString(rd))
		if !rlqsRunsAre(ra, 200, 429, 200) {
			t.Fatalf("grant bucket: answers %s, want admitted (its token bucket), denied (the fallback), admitted (no_assignment_behavior)", rlqsRunsString(ra))
		}
		if !rlqsRunsAre(rd, 429, 200) {
			t.Fatalf("deny bucket: answers %s, want denied (DENY_ALL, then the fallback), then admitted (no_assignment_behavior)", rlqsRunsString(rd))
		}
		ttl, fallbackEnd, denyEnd := ra[1].first, ra[2].first, rd[1].first
		t.Logf("phases from the kill (±%v): grant bucket's TTL ends at %v, its fallback lasts %v (until %v); deny bucket admits from %v",
			rlqsProbeStep(ga).Round(10*time.Millisecond), ttl.Round(10*time.Millisecond), (fallbackEnd - ttl).Round(10*time.Millisecond),
			fallbackEnd.Round(10*time.Millisecond), denyEnd.Round(10*time.Millisecond))
		// The TTL is 11 or 12 s (2I+1 s rounded up, I measured a little over
		// or under 5 s), started up to ~100 ms before the kill.
		if ttl < 10*time.Second || ttl > 13500*time.Millisecond {
			t.Errorf("the last assignment ended %v after the kill, want its TTL (11 or 12 s)", ttl)
		}
		if d := fallbackEnd - ttl; d < fallbackFor-time.Second || d > fallbackFor+1500*time.Millisecond {
			t.Errorf("the fallback (DENY_ALL) lasted %v, want expired_assignment_behavior_timeout %v", d, fallbackFor)
		}
		// Both buckets' assignments came in one response; their TTLs differ
		// by at most the rounding of their own intervals (a second).
		if d := denyEnd - fallbackEnd; d < -1500*time.Millisecond || d > 1500*time.Millisecond {
			t.Errorf("the deny bucket admits from %v, the grant bucket from %v: want the same TTL plus fallback", denyEnd, fallbackEnd)
		}
	})
}

// TestRLQSEnvoyReload: SIGHUP with smaller limits under an open stream, for
// every Envoy of forEachEnvoy. One replica serves one Envoy (no_assignment
// DENY_ALL: every admission spends a granted token) two buckets of 1,000 per
// hour, {api: <over>} at ~10 requests per second and {api: <follow>} at ~40.
// Once each has its first grant (the floor, 100 tokens, taken from its pool:
// T = 100), --config is rewritten with 50 for over and 300 for follow and
// the replica gets SIGHUP. The pool key is the descriptor's (the limit's
// value is not part of it), so both pools keep their T; the script computes
// what is left as max(new limit − T, 0):
//
//   - follow (T 100 < 300): its next grant is at most the 200 left (without
//     the reload it would be three intervals of its demand, ~300), so it
//     admits at most 300 in all, and is denied once they are spent;
//   - over (T 100 > 50): nothing is left, and the bucket the Envoy holds is
//     revoked (DENY_ALL) at the first report after the reload (the server
//     reads the limit at reports): the Envoy admits at most what it had at
//     the reload plus one report interval of its demand (5 s at ~10/s), and
//     no more than the pool's T at the reload.
//
// Throughout, the Envoy keeps its one stream: sluice_rlqs_streams stays 1,
// no stream error, and Envoy's cluster "rlqs" opened one stream.
func TestRLQSEnvoyReload(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		t.Parallel()
		const before, overAfter, followAfter = 1000, 50, 300
		domain := rlqsRunName(tg, "rlqs-reload")
		over, follow := rlqsRunName(tg, "reload-over"), rlqsRunName(tg, "reload-follow")
		conf := filepath.Join(t.TempDir(), "rl.yaml")
		writeRLQSConfig(t, conf, domain, map[string]int{over: before, follow: before})
		hour := time.Now().Truncate(time.Hour)
		s := startServe(t, c, "--config", conf)
		start := time.Now()
		e, url := startRLQSEnvoy(t, tg, rlqsBootstrap{Domain: domain, NoAssignment: "DENY_ALL", Ports: []int{s.port}})
		overLoad := startRLQSLoad(url, over, 1, 100*time.Millisecond)
		followLoad := startRLQSLoad(url, follow, 2, 50*time.Millisecond)
		defer overLoad.end()
		defer followLoad.end()
		pool := func(v string) int64 { return rlqsPoolTaken(t, c, domain, "api="+v) }
		pollUntil(t, 5*time.Second, "both buckets' first grants spent from", func() bool {
			return overLoad.ok.Load() > 0 && followLoad.ok.Load() > 0
		})
		if n := s.metric(t, "sluice_rlqs_streams"); n != 1 {
			t.Fatalf("sluice_rlqs_streams %d before the reload, want 1", n)
		}

		writeRLQSConfig(t, conf, domain, map[string]int{over: overAfter, follow: followAfter})
		reloads := strings.Count(s.log.String(), "SIGHUP: configuration reloaded")
		if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		pollUntil(t, 5*time.Second, "the reload logged", func() bool {
			return strings.Count(s.log.String(), "SIGHUP: configuration reloaded") > reloads
		})
		reloaded := time.Now()
		okOver0, okFollow0 := overLoad.ok.Load(), followLoad.ok.Load()
		tOver0, tFollow0 := pool(over), pool(follow)
		reports0 := s.metric(t, "sluice_rlqs_reports_total")
		t.Logf("reload %v after the start: over admitted %d, pool T %d; follow admitted %d, pool T %d",
			reloaded.Sub(start).Round(time.Millisecond), okOver0, tOver0, okFollow0, tFollow0)
		// The scenario's preconditions: the follow pool has room under its
		// new limit, the over pool is already beyond its own.
		if tFollow0 >= followAfter || tFollow0 < okFollow0 {
			t.Fatalf("follow: pool T %d at the reload (admitted %d), want below the new limit %d", tFollow0, okFollow0, followAfter)
		}
		if tOver0 <= overAfter || tOver0 < okOver0 {
			t.Fatalf("over: pool T %d at the reload (admitted %d), want above the new limit %d", tOver0, okOver0, overAfter)
		}

		// Three periodic reports of both buckets after the reload (~15 s):
		// follow's grant of the new limit's rest arrives at the first and is
		// spent at ~40/s before the third; over's rest is spent at ~10/s.
		pollUntil(t, 25*time.Second, "three periodic reports after the reload", func() bool {
			return s.metric(t, "sluice_rlqs_reports_total") >= reports0+6
		})
		if n := s.metric(t, "sluice_rlqs_streams"); n != 1 {
			t.Errorf("sluice_rlqs_streams %d after the reload, want 1 (the same stream)", n)
		}
		// Both pools spent: the Envoy holds nothing and denies both buckets
		// (at most one more report, should the follow grant come late).
		pollUntil(t, 6*time.Second, "both buckets denied", func() bool {
			return rlqsGet(t, url, follow) == 429 && rlqsGet(t, url, over) == 429
		})
		overLoad.end()
		followLoad.end()
		okOver, okFollow := overLoad.ok.Load(), followLoad.ok.Load()
		tOver, tFollow := pool(over), pool(follow)
		t.Logf("%v after the reload: over (limit %d → %d) admitted %d (%d since the reload), pool T %d; follow (limit %d → %d) admitted %d (%d since the reload), pool T %d",
			time.Since(reloaded).Round(100*time.Millisecond), before, overAfter, okOver, okOver-okOver0, tOver,
			before, followAfter, okFollow, okFollow-okFollow0, tFollow)
		t.Logf("loads: over %s, follow %s; replica assigned %d tokens, reports say %d used, %d denied",
			overLoad, followLoad, s.metric(t, "sluice_rlqs_assigned_total"), s.metric(t, "sluice_rlqs_used_total"), s.metric(t, "sluice_rlqs_denied_total"))
		// A run across an hour: each pool started again once, and the new
		// hour's limit is admitted on top (the pools' T are not comparable).
		crossed := !time.Now().Truncate(time.Hour).Equal(hour)
		followBound, overExtra := int64(followAfter), int64(0)
		if crossed {
			followBound, overExtra = 2*followAfter, overAfter
			t.Logf("the run crossed an hour: the bounds add the new hour's limits")
		}

		// The stream is the one of the start.
		if n := s.metric(t, "sluice_rlqs_streams"); n != 1 {
			t.Errorf("sluice_rlqs_streams %d at the end, want 1", n)
		}
		if n := s.metric(t, "sluice_rlqs_stream_errors_total"); n != 0 {
			t.Errorf("sluice_rlqs_stream_errors_total %d, want 0", n)
		}
		st, err := e.Stats(`^cluster\.rlqs\.upstream_rq_total$`)
		if err != nil {
			t.Fatal(err)
		}
		if n := st["cluster.rlqs.upstream_rq_total"]; n != 1 {
			t.Errorf("Envoy opened %d streams to the service (cluster.rlqs.upstream_rq_total), want 1", n)
		}

		// follow: within the new limit, exactly; and it did get the rest.
		if okFollow > followBound || (!crossed && tFollow > followAfter) {
			t.Errorf("follow: admitted %d, pool T %d: over the new limit %d", okFollow, tFollow, followAfter)
		}
		if okFollow <= tFollow0 {
			t.Errorf("follow: admitted %d, no more than the pool's T at the reload (%d): no grant from the new limit's rest", okFollow, tFollow0)
		}
		// over: no token granted after the reload, and the bucket the Envoy
		// held revoked at the next report.
		if !crossed && (okOver > tOver0 || tOver > tOver0) {
			t.Errorf("over: admitted %d, pool T %d: more than the pool's T at the reload (%d), a grant beyond the new limit %d",
				okOver, tOver, tOver0, overAfter)
		}
		if bound := okOver0 + 75 + overExtra; okOver > bound {
			t.Errorf("over: admitted %d after the limit went to %d (%d at the reload): the bucket it held was not revoked at the next report (want at most %d)",
				okOver, overAfter, okOver0, bound)
		}
		if n := rlqsAction(t, s, "deny_all"); n == 0 {
			t.Errorf("no DENY_ALL sent: over's bucket was not revoked")
		}
	})
}

// rlqsRunName is rlsName unique to this run of the test too (-count=N
// runs the tests again in the same binary and, likely, the same hour: a
// name of rlsName alone would find its pool spent by the previous run).
func rlqsRunName(tg envoyproc.Target, what string) string {
	return rlsName(tg, what) + "-" + strconv.FormatInt(rlqsRunSeq.Add(1), 36)
}

var rlqsRunSeq atomic.Int64

// writeRLQSConfig writes (atomically: a SIGHUP never reads half a file) a
// configuration of domain with one fixed_window limit per hour for each
// value of the descriptor key api.
func writeRLQSConfig(t *testing.T, path, domain string, limits map[string]int) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for v, n := range limits {
		fmt.Fprintf(&b, "  - key: api\n    value: %s\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", v, n)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// rlqsPoolTaken is the T of a bucket's RLQS pool (tokens taken in the
// current window, serve/rlqs/alloc.go), 0 when the pool holds another
// window or none.
func rlqsPoolTaken(t *testing.T, c *redistest.Cluster, domain, keyPart string) int64 {
	t.Helper()
	key := "sluice:{rlqs/" + domain + "/" + keyPart + "}:q"
	i, err := c.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	cl := c.Client(i)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	vs, err := cl.HMGet(ctx, key, "w", "T").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("HMGET %s: %v", key, err)
	}
	if len(vs) != 2 || vs[0] == nil || vs[1] == nil {
		return 0
	}
	var w, n float64
	fmt.Sscan(vs[0].(string), &w)
	fmt.Sscan(vs[1].(string), &n)
	if now := time.Now(); int64(w) != now.Truncate(time.Hour).UnixMicro() {
		return 0
	}
	return int64(n)
}

// rlqsAction is sluice_rlqs_actions_total of one action (all domains).
func rlqsAction(t *testing.T, s *serveProc, action string) int64 {
	t.Helper()
	return s.metricLabel(t, "sluice_rlqs_actions_total", `action="`+action+`"`)
}

// metricLabel sums the samples of one family whose labels contain label.
func (s *serveProc) metricLabel(t *testing.T, name, label string) int64 {
	t.Helper()
	var sum int64
	for _, l := range strings.Split(s.metricsText(t), "\n") {
		if !strings.HasPrefix(l, name+"{") || !strings.Contains(l[:strings.LastIndex(l, "}")+1], label) {
			continue
		}
		var v int64
		f := strings.Fields(l[strings.LastIndex(l, "}")+1:])
		if len(f) == 1 {
			fmt.Sscan(f[0], &v)
		}
		sum += v
	}
	return sum
}

// pollUntil calls ok every 20 ms until it returns true; the test fails
// when it has not within d.
func pollUntil(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
	}
}

// rlqsSample is one probe: its time (since an origin) and status.
type rlqsSample struct {
	at     time.Duration
	status int
}

// rlqsRun is a run of probes of one status: the first and last probe's times.
type rlqsRun struct {
	status      int
	first, last time.Duration
	n           int
}

func rlqsRuns(ss []rlqsSample) []rlqsRun {
	var rs []rlqsRun
	for _, s := range ss {
		if len(rs) == 0 || rs[len(rs)-1].status != s.status {
			rs = append(rs, rlqsRun{status: s.status, first: s.at})
		}
		r := &rs[len(rs)-1]
		r.last, r.n = s.at, r.n+1
	}
	return rs
}

func rlqsRunsAre(rs []rlqsRun, statuses ...int) bool {
	if len(rs) != len(statuses) {
		return false
	}
	for i, r := range rs {
		if r.status != statuses[i] {
			return false
		}
	}
	return true
}

func rlqsRunsString(rs []rlqsRun) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d ×%d %v–%v", r.status, r.n, r.first.Round(10*time.Millisecond), r.last.Round(10*time.Millisecond))
	}
	return b.String()
}

// rlqsProbeStep is the largest gap between two probes: a phase boundary's
// uncertainty.
func rlqsProbeStep(ss []rlqsSample) time.Duration {
	var m time.Duration
	for i := 1; i < len(ss); i++ {
		m = max(m, ss[i].at-ss[i-1].at)
	}
	return m
}
