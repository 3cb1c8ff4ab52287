package rls

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/internal/redisrl"
	"github.com/sluice-proxy/sluice/internal/resp"
)

// Coalescing: a replica keeps at most one decision call in flight per
// (Redis key, parameters, cost, pinned time). A descriptor decided while
// the call for its key is in flight waits — whichever ShouldRateLimit call
// it belongs to — and the waiting descriptors go together in the next call,
// which decides them in arrival order at one instant (redisrl Request.N: as
// many admitted as the algorithm admits of that many requests one after the
// other). A hot key costs Redis one script call per round trip instead of
// one per descriptor; a quiet key's call goes at once. Refunds are never
// coalesced. Every descriptor keeps its own decision (Batch.At), so
// exactness, refunds and the response are as without coalescing. A
// shaped decision (Request.MaxDelay) is never coalesced: each request's
// delay is its own.

// maxBatch bounds the descriptors one call decides.
const maxBatch = 256

type batcher struct {
	mu sync.Mutex
	qs map[string]*batchQueue
}

// batchQueue is one key's descriptors waiting for the call in flight.
type batchQueue struct{ waiting []*batchWait }

type batchWait struct {
	done chan struct{}
	res  redisrl.Result
	err  error
}

// decide runs r's script, coalesced with the other descriptors of r's key
// (see above).
func (s *Server) decide(ctx context.Context, r *redisrl.Request) (redisrl.Result, error) {
	if r.Refund != nil || r.MaxDelay > 0 || r.Peek {
		// A refund, a shaped decision (one slot per call) or a peek.
		return run(ctx, s.opts.Backend, r, s.Metrics.noscript)
	}
	one := func() (redisrl.Result, error) {
		if r.Kind == algorithms.FixedWindow {
			bt, err := runCounter(ctx, s.opts.Backend, r, s.Metrics.noscript, s.Metrics.expireFailed, s.undoFailed(r))
			return bt.Last, err
		}
		return run(ctx, s.opts.Backend, r, s.Metrics.noscript)
	}
	id := batchID(r)
	b := &s.batch
	b.mu.Lock()
	if q := b.qs[id]; q != nil {
		w := &batchWait{done: make(chan struct{})}
		q.waiting = append(q.waiting, w)
		b.mu.Unlock()
		<-w.done
		return w.res, w.err
	}
	if b.qs == nil {
		b.qs = map[string]*batchQueue{}
	}
	q := &batchQueue{}
	b.qs[id] = q
	b.mu.Unlock()
	res, err := one()
	b.mu.Lock()
	if len(q.waiting) == 0 {
		delete(b.qs, id)
		b.mu.Unlock()
		return res, err
	}
	b.mu.Unlock()
	go s.drain(ctx, id, q, *r)
	return res, err
}

// drain sends the calls of q's waiting descriptors until none wait, then
// forgets q.
func (s *Server) drain(ctx context.Context, id string, q *batchQueue, r redisrl.Request) {
	b := &s.batch
	for {
		b.mu.Lock()
		ws := q.waiting
		if len(ws) == 0 {
			delete(b.qs, id)
			b.mu.Unlock()
			return
		}
		if len(ws) > maxBatch {
			q.waiting = append([]*batchWait(nil), ws[maxBatch:]...)
			ws = ws[:maxBatch]
		} else {
			q.waiting = nil
		}
		b.mu.Unlock()
		r.N = int64(len(ws))
		var batch redisrl.Batch
		var err error
		if r.Kind == algorithms.FixedWindow {
			batch, err = runCounter(ctx, s.opts.Backend, &r, s.Metrics.noscript, s.Metrics.expireFailed, s.undoFailed(&r))
		} else {
			batch, err = runBatch(ctx, s.opts.Backend, &r, s.Metrics.noscript)
		}
		for i, w := range ws {
			if err != nil {
				w.err = err
			} else {
				w.res = batch.At(int64(i), r.Cost)
			}
			close(w.done)
		}
	}
}

// batchID identifies the descriptors one call may decide together.
func batchID(r *redisrl.Request) string {
	b := make([]byte, 0, len(r.Key)+64)
	b = append(b, r.Key...)
	for _, n := range []int64{int64(r.Kind), r.Params.Limit, int64(r.Params.Window), r.Params.Burst, r.Cost, r.Now} {
		b = append(b, ' ')
		b = strconv.AppendInt(b, n, 10)
	}
	return string(b)
}

// runBatch is run for a call deciding r.N requests.
func runBatch(ctx context.Context, b Backend, r *redisrl.Request, noscript func()) (redisrl.Batch, error) {
	res, err := onceBatch(ctx, b, r.AppendEvalSHA(make([]byte, 0, 256)), r.N)
	if err != nil && redisrl.IsNoScript(err) {
		if noscript != nil {
			noscript()
		}
		res, err = onceBatch(ctx, b, r.AppendEval(nil), r.N)
	}
	if err != nil {
		return redisrl.Batch{}, &errRedis{err}
	}
	return res, nil
}

func onceBatch(ctx context.Context, b Backend, cmd []byte, n int64) (redisrl.Batch, error) {
	reply, err := b.Do(ctx, cmd)
	if err != nil {
		return redisrl.Batch{}, err
	}
	v, err := resp.Parse(reply)
	if err != nil {
		return redisrl.Batch{}, fmt.Errorf("redis reply: %w", err)
	}
	return redisrl.ParseBatchReply(v, n)
}
