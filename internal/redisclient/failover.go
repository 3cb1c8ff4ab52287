package redisclient

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// Following a failover on the script path. A master that dies answers no
// MOVED: its connection breaks, or its address refuses the dial, and only a
// fresh slot table tells which replica took its slots over. So every lost
// connection (a failed dial, a connection that broke while open) asks for the
// slot table again, at most once per lostRefreshEvery, and the table is read
// from another node when one does not answer (the dead master may be asked).

// lostRefreshEvery bounds how often lost connections make the router read
// the slot table: while a dead master still owns its slots (before its
// replica is promoted) every call to it fails, and one read per interval
// finds the promotion soon enough.
const lostRefreshEvery = 100 * time.Millisecond

// slotsAttempts bounds how many nodes one refresh asks for CLUSTER SLOTS,
// one after the other while the refresh's timeout allows.
const slotsAttempts = 4

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

// readSlots asks CLUSTER SLOTS of the nodes slotSources names, each over a
// connection of its own with a third of the timeout at most (a black-holed
// node must not take all of it), until one answers. Through go-redis the
// command went to a node of its choosing, the dead master among them, and
// its retries could spend the whole timeout there.
func (r *router) readSlots(ctx context.Context) ([]goredis.ClusterSlot, error) {
	err := errors.New("no node to ask")
	for _, addr := range r.slotSources() {
		if ctx.Err() != nil {
			break
		}
		var ranges []goredis.ClusterSlot
		if ranges, err = r.slotsFrom(ctx, addr); err == nil && len(ranges) > 0 {
			return ranges, nil
		}
	}
	if ctx.Err() != nil {
		err = ctx.Err()
	}
	return nil, err
}

// slotSources is up to slotsAttempts nodes to ask for the slot table, in
// random order: the masters of the current table and the seed nodes.
func (r *router) slotSources() []string {
	seen := map[string]bool{}
	var out []string
	add := func(a string) {
		if a != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	r.slotsMu.RLock()
	for _, a := range r.slots {
		add(a)
	}
	r.slotsMu.RUnlock()
	for _, a := range r.client.Options().Addrs {
		add(a)
	}
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:min(len(out), slotsAttempts)]
}

// slotsFrom is CLUSTER SLOTS of the node at addr, with the binding's
// credentials and TLS.
func (r *router) slotsFrom(ctx context.Context, addr string) ([]goredis.ClusterSlot, error) {
	d := max(r.k.timeout/3, 50*time.Millisecond)
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	o := r.client.Options()
	cl := goredis.NewClient(&goredis.Options{Addr: addr, Username: o.Username, Password: o.Password,
		Protocol: 2, DisableIdentity: true, TLSConfig: o.TLSConfig, DialTimeout: d, ReadTimeout: d,
		WriteTimeout: d, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 1})
	defer cl.Close()
	//lint:ignore SA1019 CLUSTER SLOTS answers on every Redis Cluster; CLUSTER SHARDS needs Redis 7
	return cl.ClusterSlots(ctx).Result()
}
