package rls

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// Backend runs one RESP command on the Redis Cluster and returns the raw
// RESP2 reply. An error means no reply arrived (connection failure,
// timeout): the service answers UNAVAILABLE.
type Backend interface {
	Do(ctx context.Context, cmd []byte) ([]byte, error)
}

// clusterName is the one cluster the service's redisclient.Clusters knows.
const clusterName = "rls"

// ClusterBackend is a Backend on a Redis Cluster through internal/redisclient's
// Clusters (go-redis ClusterClient: slot routing, MOVED/ASK, pooling; no
// retries of a script, which could charge twice).
type ClusterBackend struct{ c *redisclient.Clusters }

// NewClusterBackend connects lazily to the cluster given by the seed
// addresses; every call is bounded by timeout.
func NewClusterBackend(addrs []string, username, password string, opts redisclient.Options, timeout time.Duration) (*ClusterBackend, error) {
	c := redisclient.New(map[string][]string{clusterName: addrs}, opts)
	if err := c.Init(clusterName, username, password, timeout); err != nil {
		c.Close()
		return nil, err
	}
	return &ClusterBackend{c}, nil
}

// Do implements Backend.
func (b *ClusterBackend) Do(ctx context.Context, cmd []byte) ([]byte, error) {
	st, reply, err := b.c.Do(ctx, clusterName, cmd)
	if err != nil {
		return nil, err
	}
	return b.result(st, reply)
}

// result is a call's reply, or the error its status stands for.
func (b *ClusterBackend) result(st redisclient.Status, reply []byte) ([]byte, error) {
	if st != redisclient.StatusOK {
		if cerr := b.c.ConnError(clusterName); st == redisclient.StatusNetworkError && cerr != nil {
			return nil, fmt.Errorf("redis: %s: %w", st, cerr)
		}
		return nil, errors.New("redis: " + st.String())
	}
	return reply, nil
}

// Pipeliner is a Backend that sends several commands at once, in order,
// without waiting for a reply between them: replies[i] and errs[i] are
// cmds[i]'s, as Do would return them. ClusterBackend is one (commands on
// one slot share a connection, which keeps their order); on any other
// Backend the commands go one Do after another.
type Pipeliner interface {
	DoPipeline(ctx context.Context, cmds [][]byte) (replies [][]byte, errs []error)
}

// DoPipeline implements Pipeliner.
func (b *ClusterBackend) DoPipeline(ctx context.Context, cmds [][]byte) ([][]byte, []error) {
	replies, errs := make([][]byte, len(cmds)), make([]error, len(cmds))
	var wg sync.WaitGroup
	for i, cmd := range cmds {
		wg.Add(1)
		err := b.c.Call(ctx, clusterName, cmd, func(st redisclient.Status, reply []byte) {
			defer wg.Done()
			replies[i], errs[i] = b.result(st, reply)
		})
		if err != nil {
			errs[i] = err
			wg.Done()
		}
	}
	wg.Wait()
	return replies, errs
}

// doPipeline runs cmds on b: at once when b is a Pipeliner, else in turn.
func doPipeline(ctx context.Context, b Backend, cmds [][]byte) ([][]byte, []error) {
	if p, ok := b.(Pipeliner); ok {
		return p.DoPipeline(ctx, cmds)
	}
	replies, errs := make([][]byte, len(cmds)), make([]error, len(cmds))
	for i, cmd := range cmds {
		replies[i], errs[i] = b.Do(ctx, cmd)
	}
	return replies, errs
}

// Ping checks that every master answers (TLS and AUTH included) and says
// why not: for a start-up check.
func (b *ClusterBackend) Ping() error { return b.c.Ping(clusterName) }

// Close closes the cluster's connections.
func (b *ClusterBackend) Close() error { return b.c.Close() }

// errRedis is a failure to get a decision from Redis (→ UNAVAILABLE).
type errRedis struct{ err error }

func (e *errRedis) Error() string { return e.err.Error() }
func (e *errRedis) Unwrap() error { return e.err }

// run sends r's script (EVALSHA; EVAL after NOSCRIPT) and parses the
// reply, or, for fixed_window, decides on its window counter (runCounter).
// noscript counts the fallbacks.
func run(ctx context.Context, b Backend, r *redisrl.Request, noscript func()) (redisrl.Result, error) {
	if r.Kind == algorithms.FixedWindow {
		// Window counters (counter.go), not the script.
		bt, err := runCounter(ctx, b, r, noscript, nil, nil)
		return bt.Last, err
	}
	return runScript(ctx, b, r, noscript, func(v resp.Value) (redisrl.Result, error) {
		return redisrl.ParseReplyFor(v, r)
	})
}

// runLease runs the lease script's call q as run does the algorithms'.
func runLease(ctx context.Context, b Backend, q *redisrl.LeaseRequest, noscript func()) (redisrl.LeaseResult, error) {
	return runScript(ctx, b, q, noscript, func(v resp.Value) (redisrl.LeaseResult, error) {
		return redisrl.ParseLeaseReply(v, q.N)
	})
}

// scriptCall is a script's call: redisrl.Request or LeaseRequest.
type scriptCall interface {
	AppendEvalSHA(dst []byte) []byte
	AppendEval(dst []byte) []byte
}

// runScript sends c (EVALSHA; EVAL after NOSCRIPT) and parses the reply.
func runScript[R any](ctx context.Context, b Backend, c scriptCall, noscript func(), parse func(resp.Value) (R, error)) (R, error) {
	res, err := once(ctx, b, c.AppendEvalSHA(make([]byte, 0, 256)), parse)
	if err != nil && redisrl.IsNoScript(err) {
		if noscript != nil {
			noscript()
		}
		res, err = once(ctx, b, c.AppendEval(nil), parse)
	}
	if err != nil {
		var zero R
		return zero, &errRedis{err}
	}
	return res, nil
}

func once[R any](ctx context.Context, b Backend, cmd []byte, parse func(resp.Value) (R, error)) (R, error) {
	var zero R
	reply, err := b.Do(ctx, cmd)
	if err != nil {
		return zero, err
	}
	v, err := resp.Parse(reply)
	if err != nil {
		return zero, fmt.Errorf("redis reply: %w", err)
	}
	return parse(v)
}
