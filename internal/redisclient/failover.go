package redisclient

import (
	"context"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Following a failover on the script path. A master that dies answers no
// MOVED: its connection breaks, or its address refuses the dial, and only a
// fresh slot table tells which replica took its slots over. So every lost
// connection (a failed dial, a connection that broke while open) asks for the
// slot table again, at most once per lostRefreshEvery, and the table is read
// from another node when the one go-redis picked does not answer (it picks a
// random known node for CLUSTER SLOTS, the dead master among them).

// lostRefreshEvery bounds how often lost connections make the router read
// the slot table: while a dead master still owns its slots (before its
// replica is promoted) every call to it fails, and one read per interval
// finds the promotion soon enough.
const lostRefreshEvery = 100 * time.Millisecond

// slotsAttempts is how many nodes refresh asks for CLUSTER SLOTS, one after
// the other while the context allows.
const slotsAttempts = 3

// connLost reads the slot table again (in the background) unless a lost
// connection asked for it less than lostRefreshEvery ago.
func (r *router) connLost() {
	now := time.Now().UnixNano()
	last := r.lostAt.Load()
	if now-last < int64(lostRefreshEvery) || !r.lostAt.CompareAndSwap(last, now) {
		return
	}
	r.refresh()
}

// readSlots is CLUSTER SLOTS through go-redis, asked again of another node
// when one fails (up to slotsAttempts, within ctx).
func (r *router) readSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	var err error
	for i := 0; i < slotsAttempts && ctx.Err() == nil; i++ {
		var ranges []goredis.ClusterSlot
		//lint:ignore SA1019 CLUSTER SLOTS answers on every Redis Cluster; CLUSTER SHARDS needs Redis 7
		ranges, err = r.client.ClusterSlots(ctx).Result()
		if err == nil {
			return ranges, nil
		}
	}
	if err == nil {
		err = ctx.Err()
	}
	return nil, err
}
