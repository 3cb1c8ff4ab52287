package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// TestRLQSEnvoy: Envoy's own rate_limit_quota filter against `sluice serve`
// (docs/rlqs.md), for every Envoy of forEachEnvoy. Two replicas on one Redis
// Cluster serve a limit of 3,000 per hour on one bucket {api: <key>}; every
// Envoy lists both replicas (round robin) and denies until its first
// assignment (no_assignment_behavior DENY_ALL):
//
//   - uneven load: one Envoy at about 100 requests per second, one at 20;
//   - the light Envoy is killed (SIGKILL) after 8 s, a third Envoy starts at 10 s;
//   - the replica that granted the most (the busy Envoy's) is killed
//     (SIGKILL) at 14 s: the Envoys reconnect to the other;
//   - after 34 s the admitted total over all Envoys (counted by the clients)
//     is at most the limit — exactly, as every admission spent a token of a
//     grant of this hour — and the busy Envoy admitted more than the light
//     one, the added one some;
//   - the three Envoys name themselves (x-sluice-client-id): the busy
//     Envoy's participant is continued on the surviving replica, and at
//     least half the limit is admitted within the 34 s.
//
// At the same time a third replica serves two more Envoys, one with
// no_assignment_behavior ALLOW_ALL on a bucket whose limit (20) its load has
// spent, one with DENY_ALL on a bucket with room: the replica is killed, and
// once the assignments' TTL has passed the first admits everything and the
// second denies everything.
func TestRLQSEnvoy(t *testing.T) {
	c := suiteCluster(t)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		const limit = 3000
		domain := rlsName(tg, "rlqs")
		key, small := rlsName(tg, "key"), rlsName(tg, "small")
		conf := filepath.Join(t.TempDir(), "rl.yaml")
		yaml := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: api\n    value: %s\n    rate_limit: {unit: hour, requests_per_unit: 20}\n"+
			"  - key: api\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", domain, small, limit)
		if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		hour := time.Now().Truncate(time.Hour)
		s1, s2, s3 := startServe(t, c, "--config", conf), startServe(t, c, "--config", conf), startServe(t, c, "--config", conf)
		boot := func(no string, ports ...int) rlqsBootstrap {
			return rlqsBootstrap{Domain: domain, NoAssignment: no, Ports: ports}
		}
		named := func(name string, ports ...int) rlqsBootstrap {
			b := boot("DENY_ALL", ports...)
			b.Client = rlsName(tg, name)
			return b
		}
		_, busyURL := startRLQSEnvoy(t, tg, named("busy", s1.port, s2.port))
		light, lightURL := startRLQSEnvoy(t, tg, named("light", s2.port, s1.port))
		_, allowURL := startRLQSEnvoy(t, tg, boot("ALLOW_ALL", s3.port))
		_, denyURL := startRLQSEnvoy(t, tg, boot("DENY_ALL", s3.port))

		start := time.Now()
		busy := startRLQSLoad(busyURL, key, 2, 20*time.Millisecond)
		lightLoad := startRLQSLoad(lightURL, key, 1, 50*time.Millisecond)
		allowLoad := startRLQSLoad(allowURL, small, 1, 50*time.Millisecond)
		denyLoad := startRLQSLoad(denyURL, small+"-room", 1, 100*time.Millisecond)
		at := func(d time.Duration) { time.Sleep(time.Until(start.Add(d))) }

		at(8 * time.Second)
		syscall.Kill(light.PID(), syscall.SIGKILL)
		lightLoad.end()
		at(10 * time.Second)
		_, addedURL := startRLQSEnvoy(t, tg, named("added", s2.port, s1.port))
		added := startRLQSLoad(addedURL, key, 1, 20*time.Millisecond)

		// The fallback replica: its Envoys have had their assignments; kill it.
		allowLoad.end()
		denyLoad.end()
		if allowLoad.denied.Load() == 0 || denyLoad.ok.Load() == 0 {
			t.Errorf("before the kill: ALLOW_ALL Envoy %s (its limit of 20 spent: denials expected), DENY_ALL Envoy %s (admissions expected)", allowLoad, denyLoad)
		}
		s3.cmd.Process.Kill()
		killed3 := time.Now()

		at(14 * time.Second)
		t.Logf("at 14 s: replica 1 assigned %d, used %d; replica 2 assigned %d, used %d; admitted busy %d, light %d, added %d",
			s1.metric(t, "sluice_rlqs_assigned_total"), s1.metric(t, "sluice_rlqs_used_total"),
			s2.metric(t, "sluice_rlqs_assigned_total"), s2.metric(t, "sluice_rlqs_used_total"), busy.ok.Load(), lightLoad.ok.Load(), added.ok.Load())
		// Kill the replica that granted the most: the busy Envoy's stream is on
		// it, and the Envoy must go on with the other.
		victim := s1
		if s2.metric(t, "sluice_rlqs_assigned_total") > s1.metric(t, "sluice_rlqs_assigned_total") {
			victim, s2 = s2, s1
		}
		victim.cmd.Process.Kill()
		okAtKill := busy.ok.Load() + added.ok.Load()

		// The service gone for longer than the TTL: each Envoy follows its
		// no_assignment_behavior (no expired_assignment_behavior is set).
		fallback := func(url, k string, want int) time.Duration {
			deadline := killed3.Add(40 * time.Second)
			run := 0
			for time.Now().Before(deadline) {
				if rlqsGet(t, url, k) == want {
					run++
				} else {
					run = 0
				}
				if run == 5 {
					return time.Since(killed3)
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Errorf("%s: no run of five %d answers within 40 s of the service's kill", url, want)
			return 0
		}
		ta := fallback(allowURL, small, 200)
		td := fallback(denyURL, small+"-room", 429)
		t.Logf("service killed: ALLOW_ALL Envoy admits everything %v after, DENY_ALL Envoy denies everything %v after", ta.Round(100*time.Millisecond), td.Round(100*time.Millisecond))

		at(34 * time.Second)
		busy.end()
		added.end()
		total := busy.ok.Load() + lightLoad.ok.Load() + added.ok.Load()
		t.Logf("limit %d per hour: admitted %d (busy Envoy %s; light Envoy, killed at 8 s, %s; added at 10 s %s); %d admitted after a replica's kill",
			limit, total, busy, lightLoad, added, total-lightLoad.ok.Load()-okAtKill)
		adopted := s2.metricLabel(t, "sluice_rlqs_continued_total", `result="adopted"`)
		t.Logf("surviving replica: assigned %d tokens, reports say %d used; %d participants continued (adopted), %d own",
			s2.metric(t, "sluice_rlqs_assigned_total"), s2.metric(t, "sluice_rlqs_used_total"), adopted,
			s2.metricLabel(t, "sluice_rlqs_continued_total", `result="own"`))
		bound := int64(limit)
		if !time.Now().Truncate(time.Hour).Equal(hour) {
			bound = 2 * limit // the run spans two windows of the limit
			t.Logf("the run crossed an hour: two windows, bound %d", bound)
		}
		if total > bound {
			t.Errorf("admitted %d > %d", total, bound)
		}
		if busy.ok.Load() <= lightLoad.ok.Load() || added.ok.Load() == 0 {
			t.Errorf("shares do not follow demand: busy %s, light %s, added %s", busy, lightLoad, added)
		}
		if total-lightLoad.ok.Load()-okAtKill == 0 {
			t.Errorf("nothing admitted after the replica's kill")
		}
		// The busy Envoy names itself: its bucket continued on the surviving
		// replica, its tokens kept, instead of being stranded until the hour
		// ends (hundreds of requests at these rates).
		if adopted < 1 {
			t.Errorf("the busy Envoy's participant was not continued on the surviving replica")
		}
		if total < limit/2 {
			t.Errorf("admitted only %d of %d", total, limit)
		}
	})
}
