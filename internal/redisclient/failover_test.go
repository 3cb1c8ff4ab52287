package redisclient

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// TestScriptPathFollowsFailover: a master of a cluster with replicas is killed (SIGKILL) and
// its replica promoted (CLUSTER FAILOVER TAKEOVER). The script path, whose connection to
// the dead master breaks and whose dials to it are refused, reads the slot table again and
// sends the key's calls to the new master within 2 s of the promotion; the counter written
// before the kill (and replicated: WAIT) is there.
func TestScriptPathFollowsFailover(t *testing.T) {
	redistest.SkipShort(t)
	rc, err := redistest.StartReplicated(t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	c := New(map[string][]string{"rc": append(append([]string(nil), rc.Addrs...), rc.Replicas...)}, Options{})
	if err := c.Init("rc", "", "", 200*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	const key = "failover-counter"
	if st, reply := do(t, c, "INCRBY", key, "5"); st != StatusOK || reply != ":5\r\n" {
		t.Fatalf("INCRBY before the kill: %v %q", st, reply)
	}
	m, err := rc.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	mc := rc.Client(m)
	if n, err := mc.Do(context.Background(), "wait", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d %v", n, err)
	}
	mc.Close()
	if err := rc.Kill(m); err != nil {
		t.Fatal(err)
	}
	if st, _ := do(t, c, "INCRBY", key, "1"); st == StatusOK {
		t.Fatal("INCRBY answered with the key's master dead")
	}
	if err := rc.Failover(len(rc.Addrs) + m); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	for {
		st, reply := do(t, c, "INCRBY", key, "1")
		if st == StatusOK {
			if reply != ":6\r\n" {
				t.Errorf("after the failover: %q, want :6 (the replicated 5, plus 1)", reply)
			}
			break
		}
		if time.Since(begin) > 2*time.Second {
			t.Fatalf("the script path still fails (%v) 2 s after the promotion", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("calls answered by the promoted replica %v after the promotion", time.Since(begin).Round(time.Millisecond))
}
