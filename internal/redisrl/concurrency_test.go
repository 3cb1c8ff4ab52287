package redisrl

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redisclient"
	"github.com/sluice-proxy/sluice/internal/resp"
)

func (h *host) concurrency(t *testing.T, r ConcurrencyRequest) ConcurrencyResult {
	t.Helper()
	cmd := r.AppendEvalSHA(nil)
	for i := 0; i < 2; i++ {
		st, reply, err := h.c.Do(context.Background(), "rc", cmd)
		if err != nil || st != redisclient.StatusOK {
			t.Fatalf("redis call: %v %v", st, err)
		}
		var d resp.Decoder
		v, err := d.Parse(reply)
		if err != nil {
			t.Fatal(err)
		}
		res, err := ParseConcurrencyReply(v)
		if IsNoScript(err) {
			cmd = r.AppendEval(nil)
			continue
		}
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		return res
	}
	t.Fatal("NOSCRIPT after EVAL")
	return ConcurrencyResult{}
}

// The concurrency script on the cluster: holders share the limit; a refusal
// writes nothing; release and renew; a holder past its lease is dropped by
// the next call and its slots reported; the key expires one lease after its
// last write.
func TestConcurrencyScript(t *testing.T) {
	h := newHost(t)
	key := AppendConcurrencyKey(nil, "conc-"+time.Now().Format("150405.000000000"), "alice")
	now := time.Now().UnixMicro()
	ttl := 10 * time.Second
	call := func(op ConcurrencyOp, holder uint64, n, at int64) ConcurrencyResult {
		return h.concurrency(t, ConcurrencyRequest{Key: key, Op: op, Holder: holder, Limit: 3, N: n, TTL: ttl, Now: at})
	}
	want := func(got ConcurrencyResult, w ConcurrencyResult) {
		t.Helper()
		if got != w {
			t.Fatalf("got %+v, want %+v", got, w)
		}
	}
	want(call(ConcurrencyAcquire, 1, 1, now), ConcurrencyResult{true, 1, 0, 1})
	want(call(ConcurrencyAcquire, 2, 1, now), ConcurrencyResult{true, 2, 0, 1})
	want(call(ConcurrencyAcquire, 1, 1, now), ConcurrencyResult{true, 3, 0, 2})
	want(call(ConcurrencyAcquire, 2, 1, now), ConcurrencyResult{false, 3, 0, 1})
	want(call(ConcurrencyRelease, 1, 1, now), ConcurrencyResult{true, 2, 0, 1})
	// Holder 2 renews at +5 s; holder 1 does not: at +10 s its slot lapses.
	want(call(ConcurrencyRenew, 2, 1, now+5e6), ConcurrencyResult{true, 2, 0, 1})
	want(call(ConcurrencyAcquire, 3, 2, now+10e6-1), ConcurrencyResult{false, 2, 0, 0})
	want(call(ConcurrencyAcquire, 3, 2, now+10e6), ConcurrencyResult{true, 3, 1, 2})
	want(call(ConcurrencyRelease, 3, 5, now+10e6), ConcurrencyResult{true, 1, 0, 0})
	node, err := cluster.NodeOf(string(key))
	if err != nil {
		t.Fatal(err)
	}
	rc := cluster.Client(node)
	pttl, err := rc.PTTL(context.Background(), string(key)).Result()
	if err != nil || pttl <= 0 || pttl > ttl {
		t.Fatalf("PTTL %v %v, want at most the lease", pttl, err)
	}
	want(call(ConcurrencyRenew, 2, 0, now+10e6), ConcurrencyResult{true, 0, 0, 0})
	if n, _ := rc.Exists(context.Background(), string(key)).Result(); n != 0 {
		t.Fatal("the key outlived its last holder")
	}
	// Bad arguments are an error reply, not a decision.
	r := ConcurrencyRequest{Key: key, Op: 'x', Holder: 1, Limit: 3, N: 1, TTL: ttl}
	st, reply, _ := h.c.Do(context.Background(), "rc", r.AppendEval(nil))
	var d resp.Decoder
	v, _ := d.Parse(reply)
	if _, err := ParseConcurrencyReply(v); st != redisclient.StatusOK || err == nil || errors.Is(err, ErrBadReply) {
		t.Fatalf("bad op: %v", err)
	}
}
