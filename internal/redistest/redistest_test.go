package redistest

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var cluster *Cluster

func TestMain(m *testing.M) { os.Exit(Main(m, 3, &cluster)) }

func TestSlotMatchesRedis(t *testing.T) {
	SkipShort(t)
	cl := cluster.Client(0)
	defer cl.Close()
	ctx := context.Background()
	for _, k := range []string{"", "a", "foo", "sluice:{api:1.2.3.4}:tb", "{}x", "x{}{y}", "{user1000}.following", "\xff\x00"} {
		want, err := cl.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := Slot(k); int64(got) != want {
			t.Errorf("Slot(%q) = %d, Redis says %d", k, got, want)
		}
	}
}

func TestKillRestartPause(t *testing.T) {
	SkipShort(t)
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs, Protocol: 2,
		ReadTimeout: 300 * time.Millisecond, DialTimeout: 300 * time.Millisecond, DisableIdentity: true})
	defer cc.Close()
	const key = "rediscluster-test"
	if err := cc.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	i, err := cluster.NodeOf(key)
	if err != nil {
		t.Fatal(err)
	}
	// The owner holds the key; a plain client of it reads it directly.
	owner := cluster.Client(i)
	if v, err := owner.Get(ctx, key).Result(); err != nil || v != "v" {
		t.Fatalf("owner GET: %q %v", v, err)
	}
	owner.Close()

	if err := cluster.Pause(i); err != nil {
		t.Fatal(err)
	}
	const timeout = 200 * time.Millisecond
	tctx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	err = cc.Get(tctx, key).Err()
	cancel()
	// The context's deadline ended the call (a paused node never answers).
	if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Fatalf("GET on a paused node: err=%v after %v", err, time.Since(start))
	}
	if err := cluster.Resume(i); err != nil {
		t.Fatal(err)
	}

	if err := cluster.Kill(i); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Restart(i); err != nil {
		t.Fatal(err)
	}
	// Data is gone (no persistence), the slot is served again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = cc.Get(ctx, key).Err()
		if err == redis.Nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isTimeout reports whether err is a network timeout (a read past its deadline).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
