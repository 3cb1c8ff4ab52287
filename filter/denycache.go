package filter

import (
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// The denial cache: a VM remembers, per local rule, the keys it denied and until when, and
// denies them again without reading shared data until then.
//
// It is exact. A local rule's denial says the same request would be admitted no earlier than
// RetryAfter; until then no request of the key can be admitted on any worker (each would be
// denied, and a denial writes nothing), so the key's state stays as it is and every
// decision in between is the same denial, with its waits shorter by the time passed:
// RetryAfter and ResetAfter run down, Remaining stays 0, Limit stays. Three things could
// change a state meanwhile, and none reaches a cached rule: a refund (remote rules only), a
// held request giving its slot back (rules with delay), and a new configuration (a new
// Plugin, a new cache). The fourth is the key table evicting the key's slot for another
// key (store.go): the key would then start afresh, and the cache keeps denying it until its
// RetryAfter — the stricter of the two, and what the key would have got had it not been
// evicted.
//
// A cache is a table of denyCacheSize entries by key hash in sets of denyCacheWays, made on
// the rule's first denial (a configuration of many rules that never deny costs nothing). A
// key's entry is in its set; a new one takes the set's entry of the same key, else an empty
// or lapsed one, and is not kept when every entry of its set is live. A hit saves the
// slot's proxy_get_shared_data and the decision. With sets of four, a thousand keys denied
// at once nearly all stay (a few sets draw a fifth key; a direct-mapped table of the same
// size loses about a fifth of them to collisions: TestDenyCacheHoldsAThousandKeys).

const (
	denyCacheSize = 4096 // a power of two: 128 KiB a rule
	denyCacheWays = 4
	denyCacheSets = denyCacheSize / denyCacheWays
)

type denyCache [denyCacheSets][denyCacheWays]denyEntry

type denyEntry struct {
	hash             uint64
	retryAt, resetAt int64 // Unix ns; retryAt 0: empty
	limit            int64
}

// get sets *d to the cached denial of key hash h at now, if there is one.
func (c *denyCache) get(h uint64, now int64, d *algorithms.Decision) bool {
	set := &c[h&(denyCacheSets-1)]
	for i := range set {
		if e := &set[i]; e.hash == h && now < e.retryAt {
			*d = algorithms.Decision{Limit: e.limit, ResetAfter: time.Duration(max(e.resetAt-now, 0)), RetryAfter: time.Duration(e.retryAt - now)}
			return true
		}
	}
	return false
}

// put remembers denial d of key hash h, decided at now. Only a denial with nothing
// remaining and a wait is kept.
func (c *denyCache) put(h uint64, now int64, d *algorithms.Decision) {
	if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
		return
	}
	set := &c[h&(denyCacheSets-1)]
	// A set full of live entries keeps them: of more keys than ways denied in turn, the
	// ones cached stay cached and only the others read their slots (replacing one would
	// make each key push out the next, every key missing in turn). Entries lapse at their
	// Retry-After, so a set frees up within a window.
	w := -1
	for i := range set {
		if e := &set[i]; e.hash == h || now >= e.retryAt {
			w = i
			break
		}
	}
	if w < 0 {
		return
	}
	set[w] = denyEntry{hash: h, retryAt: now + int64(d.RetryAfter), resetAt: now + int64(d.ResetAfter), limit: d.Limit}
}
