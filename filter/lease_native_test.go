package filter_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Native tests of leases against the hand-answered fake host (redisRig):
// one acquire per burst, spending from the pool without calls, denial with
// the script's Retry-After, expiry and return on tick and at the root's
// end, refunds into the pool, failures under failure_mode.

func leaseConfig(failure string, lease int, extraRules string) string {
	return `{"rules":[{"name":"r1","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":100,"window":"1h","backend":"redis","lease":` +
		strconv.Itoa(lease) + `}` + extraRules + `],
"failure_mode":"` + failure + `","redis":{"cluster":"rc","timeout_ms":50,"instances":3}}`
}

// leaseReply is the lease script's reply: granted, limit, remaining,
// reset_after_us, retry_after_us, stamp_us, valid_us.
func leaseReply(granted, remaining, retryUS, validUS int64) string {
	return fmt.Sprintf("*7\r\n:%d\r\n:100\r\n:%d\r\n:3000000000\r\n:%d\r\n:1700000000000000\r\n:%d\r\n", granted, remaining, retryUS, validUS)
}

const hourUS = 3_600_000_000

// returnOf reports whether query q is a lease return of n admissions.
func returnOf(q string, n int) bool {
	return strings.Contains(q, "$"+strconv.Itoa(len(strconv.Itoa(n)))+"\r\n"+strconv.Itoa(n)+"\r\n$1\r\n0\r\n$1\r\n1\r\n")
}

func TestLeaseOneAcquireServesTheBurst(t *testing.T) {
	r := startRedisRig(t, leaseConfig("closed", 10, ""))
	var ids []uint32
	for i := 0; i < 3; i++ {
		id, act := r.request("alice")
		if act != abi.ActionPause {
			t.Fatalf("request %d: %v, want Pause for the acquire", i, act)
		}
		ids = append(ids, id)
	}
	if len(r.f.order) != 1 {
		t.Fatalf("%d Redis calls for three waiting requests, want one acquire", len(r.f.order))
	}
	q := r.f.sent[r.lastToken()]
	if !strings.Contains(q, "-- sluice lease v1") || !strings.Contains(q, "}:fwl\r\n") || !strings.Contains(q, "$2\r\n10\r\n") {
		t.Fatalf("acquire %.300q", q)
	}
	r.answer(r.lastToken(), 0, leaseReply(10, 90, 0, hourUS))
	for _, id := range ids {
		if !r.continuedOnce(id) {
			t.Fatalf("stream %d not resumed: %v", id, r.f.continued)
		}
	}
	// The 7 left are spent from the pool without a call, answered at once.
	for i := 0; i < 7; i++ {
		id, act := r.request("alice")
		if act != abi.ActionContinue {
			t.Fatalf("pool request %d: %v", i, act)
		}
		r.f.RespHeaders = [][2]string{{":status", "200"}}
		r.vm.OnResponseHeaders(id, 1, false)
		want := "x-ratelimit-remaining " + strconv.Itoa(90+6-i)
		if got := fmt.Sprint(r.f.RespHeaders); !strings.Contains(got, want) {
			t.Fatalf("pool request %d headers %s, want %s", i, got, want)
		}
		r.end(id)
	}
	if len(r.f.order) != 1 {
		t.Fatalf("%d calls after spending the pool", len(r.f.order))
	}
	// Empty pool: the next request asks again; a grant of 0 denies with the
	// script's Retry-After.
	id, act := r.request("alice")
	if act != abi.ActionPause || len(r.f.order) != 2 {
		t.Fatalf("empty pool: %v, %d calls", act, len(r.f.order))
	}
	if q := r.f.sent[r.lastToken()]; !strings.HasPrefix(q, "*13\r\n$7\r\nEVALSHA\r\n") {
		t.Fatalf("warm acquire %.40q", q)
	}
	r.answer(r.lastToken(), 0, leaseReply(0, 0, 5_000_000, 0))
	if lr := r.f.local[id]; lr == nil || lr.Status != 429 || headerOf(lr.Headers, "retry-after") != "5" {
		t.Fatalf("denied: %+v", lr)
	}
	if r.metric(filter.MetricRedisLeased) != 10 || r.metric(filter.MetricRedisCalls) != 2 ||
		r.metric(filter.MetricNames("r1")[0]) != 10 || r.metric(filter.MetricNames("r1")[1]) != 1 {
		t.Fatalf("leased %d calls %d allowed %d denied %d", r.metric(filter.MetricRedisLeased), r.metric(filter.MetricRedisCalls),
			r.metric(filter.MetricNames("r1")[0]), r.metric(filter.MetricNames("r1")[1]))
	}
}

// Waiters beyond a grant take from the pool or ask again; near exhaustion
// Redis grants less and the rest are denied.
func TestLeaseWaitersBeyondTheGrant(t *testing.T) {
	r := startRedisRig(t, leaseConfig("closed", 10, ""))
	var ids []uint32
	for i := 0; i < 5; i++ {
		id, _ := r.request("bob")
		ids = append(ids, id)
	}
	r.answer(r.lastToken(), 0, leaseReply(2, 1, 0, hourUS)) // 2 of 3 left
	if len(r.f.order) != 2 {
		t.Fatalf("%d calls, want a second acquire for the 3 unserved", len(r.f.order))
	}
	r.answer(r.lastToken(), 0, leaseReply(1, 0, 0, hourUS))
	if len(r.f.order) != 3 {
		t.Fatalf("%d calls, want a third acquire", len(r.f.order))
	}
	r.answer(r.lastToken(), 0, leaseReply(0, 0, 7_000_000, 0))
	admitted, denied := 0, 0
	for _, id := range ids {
		switch {
		case r.continuedOnce(id):
			admitted++
		case r.f.local[id] != nil && r.f.local[id].Status == 429:
			denied++
		}
	}
	if admitted != 3 || denied != 2 {
		t.Fatalf("admitted %d denied %d, want 3 and 2", admitted, denied)
	}
}

// A pool expires a second after its last spend; the tick gives the unspent
// admissions back with one return call, and a root that ends gives back
// everything its pools hold.
func TestLeaseReturnOnExpiryAndAtTheEnd(t *testing.T) {
	r := startRedisRig(t, leaseConfig("closed", 10, ""))
	id, _ := r.request("carol")
	r.answer(r.lastToken(), 0, leaseReply(10, 90, 0, hourUS))
	r.end(id)
	for i := 0; i < 3; i++ {
		id, _ := r.request("carol")
		r.end(id)
	}
	r.f.Now_ += 999_000_000
	r.vm.OnTick(1)
	if len(r.f.order) != 1 {
		t.Fatalf("returned before the lifetime: %d calls", len(r.f.order))
	}
	r.f.Now_ += 100_000_000 // the tick looks at the pools every 100 ms
	r.vm.OnTick(1)
	if len(r.f.order) != 2 || !returnOf(r.f.sent[r.lastToken()], 6) {
		t.Fatalf("after the lifetime: %d calls, last %.400q", len(r.f.order), r.f.sent[r.lastToken()])
	}
	r.answer(r.lastToken(), 0, leaseReply(6, 96, 0, 0))
	if r.metric(filter.MetricRedisReturned) != 6 || r.metric(filter.MetricRedisCalls) != 2 {
		t.Fatalf("returned %d calls %d", r.metric(filter.MetricRedisReturned), r.metric(filter.MetricRedisCalls))
	}
	r.vm.OnTick(1) // nothing left to return
	if len(r.f.order) != 2 {
		t.Fatalf("a second return: %d calls", len(r.f.order))
	}
	// The pool went back with 6 of 10 unspent: the next acquire asks for
	// what was spent (4). A pool in use lives on: a spend every 0.9 s keeps
	// it (no return).
	id, _ = r.request("carol")
	if q := r.f.sent[r.lastToken()]; !strings.Contains(q, "}:fwl\r\n$3\r\n100\r\n$10\r\n3600000000\r\n$3\r\n100\r\n$1\r\n4\r\n") {
		t.Fatalf("acquire after an unused pool: %.400q", q)
	}
	r.answer(r.lastToken(), 0, leaseReply(4, 90, 0, hourUS))
	r.end(id)
	calls := len(r.f.order)
	for i := 0; i < 3; i++ {
		r.f.Now_ += 900_000_000
		r.vm.OnTick(1)
		id, act := r.request("carol")
		if act != abi.ActionContinue {
			t.Fatalf("spend %d at +%.1fs: %v (pool returned while in use)", i, 0.9*float64(i+1), act)
		}
		r.end(id)
	}
	if len(r.f.order) != calls {
		t.Fatalf("%d calls while the pool was in use", len(r.f.order)-calls)
	}
	// A new pool, then the root ends (proxy stop or drained configuration).
	r.f.Now_ += 2_000_000_000
	id, _ = r.request("carol")
	r.answer(r.lastToken(), 0, leaseReply(4, 86, 0, hourUS))
	r.end(id)
	r.vm.OnDone(1)
	if len(r.f.order) != calls+2 || !returnOf(r.f.sent[r.lastToken()], 3) {
		t.Fatalf("at the end: %d calls, last %.400q", len(r.f.order)-calls, r.f.sent[r.lastToken()])
	}
}

// A fixed window's admissions are never spent after the window they were
// granted in: the pool expires at the window's end measured from the send.
func TestLeaseFixedWindowEnds(t *testing.T) {
	r := startRedisRig(t, leaseConfig("closed", 10, ""))
	id, _ := r.request("dave")
	r.f.Now_ += 300_000                                     // the reply comes 0.3 ms later
	r.answer(r.lastToken(), 0, leaseReply(10, 90, 0, 1000)) // 1 ms left in the window
	r.end(id)
	r.f.Now_ += 700_000 // 1 ms after the send
	_, act := r.request("dave")
	if act != abi.ActionPause {
		t.Fatalf("spent a pool of the previous window: %v", act)
	}
	// The expired 9 went back (return) before the new acquire.
	if n := len(r.f.order); n != 3 || !returnOf(r.f.sent[r.f.order[1]], 9) {
		t.Fatalf("%d calls; second %.300q", n, r.f.sent[r.f.order[1]])
	}
}

// A request admitted from the pool but denied by another Redis rule gives
// its admission back to the pool: the pool still serves nine more.
func TestLeaseRefundIntoThePool(t *testing.T) {
	other := `,{"name":"r2","key":[{"header":"x-user"}],"algorithm":"fixed_window","limit":100,"window":"1h","backend":"redis"}`
	r := startRedisRig(t, leaseConfig("closed", 10, other))
	acquires := func() int {
		n := 0
		for _, tk := range r.f.order {
			if strings.Contains(r.f.sent[tk], "}:fwl\r\n") {
				n++
			}
		}
		return n
	}
	id, _ := r.request("erin")
	if len(r.f.order) != 2 || acquires() != 1 {
		t.Fatalf("%d calls, %d acquires", len(r.f.order), acquires())
	}
	r.answer(r.f.order[0], 0, leaseReply(10, 90, 0, hourUS))
	r.answer(r.f.order[1], 0, replyAdmit)
	if !r.continuedOnce(id) {
		t.Fatal("first request not admitted")
	}
	r.end(id)
	id, _ = r.request("erin") // r1 from the pool (8 left), r2 denies
	r.answer(r.lastToken(), 0, replyDeny)
	if lr := r.f.local[id]; lr == nil || lr.Status != 429 {
		t.Fatalf("r2 denial: %+v", lr)
	}
	r.end(id)
	for i := 0; i < 9; i++ {
		id, _ := r.request("erin")
		r.answer(r.lastToken(), 0, replyAdmit)
		if !r.continuedOnce(id) {
			t.Fatalf("pool request %d not admitted", i)
		}
		r.end(id)
	}
	if acquires() != 1 || r.metric(filter.MetricRedisReturned) != 0 {
		t.Fatalf("%d acquires: the refund did not go back to the pool", acquires())
	}
	r.request("erin")
	if acquires() != 2 {
		t.Fatalf("%d acquires after the pool is spent", acquires())
	}
}

// An acquire that fails follows failure_mode for every waiter.
func TestLeaseAcquireFailure(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			r := startRedisRig(t, leaseConfig(mode, 10, ""))
			a, _ := r.request("frank")
			b, _ := r.request("frank")
			r.answer(r.lastToken(), 0, "-CLUSTERDOWN The cluster is down\r\n")
			for _, id := range []uint32{a, b} {
				if mode == "open" && !r.continuedOnce(id) {
					t.Fatalf("open: %d not resumed", id)
				}
				if mode == "closed" && (r.f.local[id] == nil || r.f.local[id].Status != 503) {
					t.Fatalf("closed: %d: %+v", id, r.f.local[id])
				}
			}
			if r.metric(filter.MetricRedisFailures) != 2 {
				t.Fatalf("failures %d", r.metric(filter.MetricRedisFailures))
			}
			// A later request asks again (no stale acquire left behind).
			r.request("frank")
			if len(r.f.order) != 2 {
				t.Fatalf("%d calls", len(r.f.order))
			}
		})
	}
}

// The guard fails waiters whose acquire never gets a reply, and the next
// request sends a new acquire.
func TestLeaseAcquireTimeout(t *testing.T) {
	r := startRedisRig(t, leaseConfig("closed", 10, ""))
	id, _ := r.request("gina")
	r.f.Now_ += 61_000_000
	r.vm.OnTick(1)
	if lr := r.f.local[id]; lr == nil || lr.Status != 503 || r.metric(filter.MetricRedisTimeouts) != 1 {
		t.Fatalf("after the guard: %+v timeouts %d", lr, r.metric(filter.MetricRedisTimeouts))
	}
	r.answer(r.f.order[0], 0, leaseReply(10, 90, 0, hourUS)) // too late: dropped
	r.request("gina")
	if len(r.f.order) != 2 {
		t.Fatalf("%d calls", len(r.f.order))
	}
}

// askOf returns the n of a lease acquire query (after the key, limit, window
// and burst).
func askOf(t *testing.T, q string) int {
	t.Helper()
	m := regexp.MustCompile(`\}:fwl\r\n\$3\r\n100\r\n\$10\r\n3600000000\r\n\$3\r\n100\r\n\$\d+\r\n(\d+)\r\n`).FindStringSubmatch(q)
	if m == nil {
		t.Fatalf("not an acquire: %.300q", q)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// The acquire size: the lease, then what an unused pool served, doubling
// back to the lease while acquires follow each other within a second.
func TestLeaseAdaptiveSize(t *testing.T) {
	r := startRedisRig(t, leaseConfig("closed", 10, ""))
	var asks []int
	acquire := func(grant int64) {
		id, act := r.request("hank")
		if act != abi.ActionPause {
			t.Fatalf("%v, want an acquire", act)
		}
		asks = append(asks, askOf(t, r.f.sent[r.lastToken()]))
		r.answer(r.lastToken(), 0, leaseReply(grant, 50, 0, hourUS))
		if !r.continuedOnce(id) {
			t.Fatal("not admitted")
		}
		r.end(id)
	}
	acquire(10) // 1 spent, 9 go back after a second without a spend
	r.f.Now_ += 1_100_000_000
	r.vm.OnTick(1)
	for _, g := range []int64{1, 1, 2, 4, 8, 10} {
		acquire(g)
		for i := int64(1); i < g; i++ { // spend the pool
			id, act := r.request("hank")
			if act != abi.ActionContinue {
				t.Fatalf("pool of %d, spend %d: %v", g, i, act)
			}
			r.end(id)
		}
		r.f.Now_ += 100_000_000
	}
	if fmt.Sprint(asks) != "[10 1 1 2 4 8 10]" {
		t.Fatalf("acquire sizes %v, want [10 1 1 2 4 8 10]", asks)
	}
}
