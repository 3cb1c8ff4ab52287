package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/redistest"
)

// rlqsCut: Envoy's RLQS filter (one bucket, 100,000 per hour: its token bucket outlasts the
// test; no_assignment_behavior ALLOW_ALL, expired_assignment_behavior DENY_ALL) calls a
// `sluice serve` of its own through a toxiproxy link. Once the bucket has its token bucket,
// the link is refused for 2 s, the bucket probed every ~100 ms: the service sees the stream
// end, and the bucket keeps admitting on its assignment (in force until its TTL, 11–12 s
// with Envoy's 5 s reports: TestRLQSEnvoyExpiredAssignment pins what follows it). After the
// heal Envoy opens its stream again and reports: the time that takes is measured, bounded by
// Envoy's report interval (it reopens the stream to send a report) plus 2 s.
func rlqsCut(t *testing.T, tg envoyproc.Target, c *redistest.Cluster) {
	domain := rlqsRunName(tg, "fault-rlqs")
	bucket := rlqsRunName(tg, "fault-rlqs-grant")
	conf := filepath.Join(t.TempDir(), "rl.yaml")
	writeRLQSConfig(t, conf, domain, map[string]int{bucket: 100000})
	s := startServe(t, c, "--config", conf)
	link := newFaultLink(t, s.addr)
	_, url := startRLQSEnvoy(t, tg, rlqsBootstrap{Domain: domain, NoAssignment: "ALLOW_ALL", Ports: []int{link.port},
		Expired: "DENY_ALL", ExpiredTimeout: "6s"})
	if st := rlqsGet(t, url, bucket); st != 200 {
		t.Fatalf("the first request: %d, want 200 (no_assignment_behavior ALLOW_ALL)", st)
	}
	pollUntil(t, 5*time.Second, "a token bucket assigned", func() bool { return rlqsAction(t, s, "token_bucket") >= 1 })
	const cutFor = 2 * time.Second
	link.refuse()
	cut := time.Now()
	pollUntil(t, 2*time.Second, "the service seeing the stream end", func() bool { return s.metric(t, "sluice_rlqs_streams") == 0 })
	var during []rlqsSample
	for time.Since(cut) < cutFor {
		during = append(during, rlqsSample{time.Since(cut), rlqsGet(t, url, bucket)})
		time.Sleep(100 * time.Millisecond)
	}
	used := s.metric(t, "sluice_rlqs_used_total")
	link.heal()
	healed := time.Now()
	pollUntil(t, 10*time.Second, "a report after the heal", func() bool {
		return s.metric(t, "sluice_rlqs_streams") >= 1 && s.metric(t, "sluice_rlqs_used_total") > used
	})
	back := time.Since(healed)
	rs := rlqsRuns(during)
	t.Logf("RLQS, link refused %v: %s; healed: stream open and reporting again after %v", cutFor, rlqsRunsString(rs), back.Round(time.Millisecond))
	if !rlqsRunsAre(rs, 200) {
		t.Errorf("RLQS cut off for %v: %s; want admissions throughout (the assignment in force until its TTL)", cutFor, rlqsRunsString(rs))
	}
	if back > 5*time.Second+2*time.Second {
		t.Errorf("RLQS: reporting again only %v after healing, want within the report interval (5 s) + 2 s", back)
	}
	if st := rlqsGet(t, url, bucket); st != 200 {
		t.Errorf("RLQS after the heal: %d, want 200", st)
	}
}
