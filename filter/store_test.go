package filter

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// storeT0 is a round instant (a multiple of every window used here).
const storeT0 = int64(1_767_225_600) * 1e9

// tableRun drives one slotStore with requests of cost 1 and records, per
// key, what it admitted and when it was evicted with how much Used.
type tableRun struct {
	t        *testing.T
	s        *slotStore
	lim      algorithms.Limiter
	buf      []byte
	admitted map[uint64][]int64          // admission times per identity
	evicted  map[uint64][]evictionRecord // evictions per identity (the victim's)
	decided  map[uint64]*[2]int          // [admitted, denied] per identity
}

type evictionRecord struct {
	at   int64
	used int64
}

func newTableRun(t *testing.T, lim algorithms.Limiter, maxKeys int) *tableRun {
	return &tableRun{t: t, s: newSlotStore(filtertest.NewHost(), lim, "t:", maxKeys), lim: lim,
		admitted: map[uint64][]int64{}, evicted: map[uint64][]evictionRecord{}, decided: map[uint64]*[2]int{}}
}

// do decides one request of identity h at now, as evaluate + commit do on
// one worker, and reports whether it was admitted.
func (r *tableRun) do(h uint64, now int64) bool {
	r.t.Helper()
	var e entry
	if err := r.s.load(h, now, &e); err != nil {
		r.t.Fatal(err)
	}
	st, d, err := r.lim.Decide(r.buf[:0], e.state, now, 1)
	if err != nil {
		r.t.Fatal(err)
	}
	r.buf = st
	c := r.decided[h]
	if c == nil {
		c = new([2]int)
		r.decided[h] = c
	}
	if !d.Allowed {
		c[1]++
		return false
	}
	c[0]++
	if e.evicted {
		old, err := r.s.read(e.slot)
		if err != nil || !old.valid || old.ident == h {
			r.t.Fatalf("eviction of a slot that is not another key's: %+v %v", old, err)
		}
		if u := r.lim.Used(old.state, now); u != e.evictedUsed {
			r.t.Fatalf("evictedUsed %d, the victim's Used is %d", e.evictedUsed, u)
		}
		r.evicted[old.ident] = append(r.evicted[old.ident], evictionRecord{now, e.evictedUsed})
	}
	if ok, err := r.s.store(&e, st); !ok || err != nil {
		r.t.Fatalf("store: %v %v (one writer)", ok, err)
	}
	r.admitted[h] = append(r.admitted[h], now)
	return true
}

// base is the most a key can be admitted over [a, b] (b − a < Window for
// the window algorithms) by its algorithm alone, from any starting state:
// sliding_log Limit; fixed and sliding window Limit per aligned window
// (two of them); the buckets Burst + Limit × (b − a) / Window.
func base(lim algorithms.Limiter, a, b int64) int64 {
	p := lim.Params()
	switch lim.Kind() {
	case algorithms.SlidingLog:
		return p.Limit
	case algorithms.FixedWindow, algorithms.SlidingWindow:
		return 2 * p.Limit
	}
	return p.Burst + p.Limit*(b-a)/int64(p.Window)
}

// checkBound asserts the bound of RATIONALE.md ("Why evict the least-used
// key?") for every key and every interval [a, b] between two of its
// admissions: admitted ≤ base(a, b) + the Used of each of its evictions at
// an instant in [a, b]. It returns the largest gain any key used (admitted
// − base, when positive) and the most any key was admitted over its base
// in total, for the caller's own assertions.
func (r *tableRun) checkBound(name string) (maxGain int64) {
	w := int64(r.lim.Params().Window)
	windowed := r.lim.Kind() != algorithms.TokenBucket && r.lim.Kind() != algorithms.LeakyBucket
	for h, times := range r.admitted {
		ev := r.evicted[h]
		for i := range times {
			for j := i; j < len(times); j++ {
				a, b := times[i], times[j]
				if windowed && b-a >= w {
					break
				}
				var gain int64
				for _, e := range ev {
					if e.at >= a && e.at <= b {
						gain += e.used
					}
				}
				n := int64(j - i + 1)
				if lim := base(r.lim, a, b); n > lim+gain {
					r.t.Fatalf("%s: key %x admitted %d in [%d, %d] (%v), bound %d + evictions %d", name, h, n, a, b, time.Duration(b-a), lim, gain)
				} else if n-lim > maxGain {
					maxGain = n - lim
				}
			}
		}
	}
	return maxGain
}

// The bound, as a property: random traffic on a small table — light keys
// that come and go, keys sending 2 or 3 requests to look used, heavy keys
// sending far over their limit, idle gaps, bursts at one instant — through
// every algorithm; every key's admissions over every interval stay within
// its algorithm's own bound plus the Used of its evictions in that
// interval. And no key under its limit is ever denied: a key is only
// decided against its own state.
func TestPropertyEvictionGainBounded(t *testing.T) {
	for _, k := range algorithms.Kinds {
		for seed := uint64(1); seed <= 6; seed++ {
			p := algorithms.Params{Limit: 4 + int64(seed), Window: time.Duration(seed) * 10 * time.Second}
			if k == algorithms.TokenBucket || k == algorithms.LeakyBucket {
				p.Burst = p.Limit + int64(seed%3)
			}
			lim, err := algorithms.New(k, p)
			if err != nil {
				t.Fatal(err)
			}
			name := k.String() + "/" + strconv.Itoa(int(seed))
			rng := rand.New(rand.NewPCG(seed, uint64(k)))
			r := newTableRun(t, lim, 8+int(seed)*5)
			now := storeT0 + rng.Int64N(int64(p.Window))
			heavy := []uint64{hashKey(seed, []byte("heavy-1")), hashKey(seed, []byte("heavy-2"))}
			fresh := 0
			for i := 0; i < 6000; i++ {
				switch x := rng.IntN(100); {
				case x < 3:
					now += rng.Int64N(2 * int64(p.Window))
				case x < 60:
					now += rng.Int64N(int64(p.Window) / 50)
				}
				var h uint64
				switch x := rng.IntN(100); {
				case x < 25:
					h = heavy[rng.IntN(2)]
				case x < 70: // a new key, once
					fresh++
					h = hashKey(seed, []byte("f"+strconv.Itoa(fresh)))
				default: // one of 300 keys sending a few each
					h = hashKey(seed, []byte("m"+strconv.Itoa(rng.IntN(300))))
				}
				r.do(h, now)
			}
			gain := r.checkBound(name)
			n := 0
			for _, ev := range r.evicted {
				n += len(ev)
			}
			if n == 0 {
				t.Fatalf("%s: no eviction: the table was never full", name)
			}
			t.Logf("%s: %d evictions, the largest gain over the algorithm's own bound %d", name, n, gain)
		}
	}
}

// The bound is tight where it should be: a key evicted with Used u gets u
// more over the interval, no more (fixed window, max_keys 1).
func TestEvictionGainIsTheVictimsUsed(t *testing.T) {
	lim, _ := algorithms.New(algorithms.FixedWindow, algorithms.Params{Limit: 5, Window: time.Minute})
	r := newTableRun(t, lim, 1)
	a, b := hashKey(1, []byte("a")), hashKey(1, []byte("b"))
	now := storeT0
	for i := 0; i < 3; i++ {
		r.do(a, now)
	}
	r.do(b, now+1) // evicts a with Used 3
	n := 0
	for i := 0; i < 10; i++ {
		if r.do(a, now+2) { // a back, fresh: evicts b, then its own limit
			n++
		}
	}
	if n != 5 || len(r.admitted[a]) != 8 {
		t.Fatalf("a admitted %d after its eviction, %d in all; want 5 and 8 = limit + its Used 3", n, len(r.admitted[a]))
	}
	if ev := r.evicted[a]; len(ev) != 1 || ev[0].used != 3 {
		t.Fatalf("a's evictions %+v", ev)
	}
	r.checkBound("tight")
}

// The key flood on the store alone, for every algorithm: max_keys
// 1000, 20,000 one-request keys, 100 clients sending 5 of their 10 per
// minute, 5 heavy hitters sending 100 each, in random order within 5 s (so
// the buckets refill less than one request meanwhile). No innocent request
// is denied; each heavy hitter is admitted at most limit × 1.2; the table
// holds at most max_keys entries.
func TestFloodInnocentsAndHeavyHitters(t *testing.T) {
	for _, per := range []int{1, 3} { // attackers sending 3 look more used than a fresh innocent
		t.Run("attacker-requests-"+strconv.Itoa(per), func(t *testing.T) { testFlood(t, per) })
	}
}

func testFlood(t *testing.T, perAttacker int) {
	type rq struct {
		key   string
		class int // 0 attacker, 1 innocent, 2 heavy
	}
	var reqs []rq
	for i := 0; i < 20000; i++ {
		for j := 0; j < perAttacker; j++ {
			reqs = append(reqs, rq{"a" + strconv.Itoa(i), 0})
		}
	}
	for i := 0; i < 100; i++ {
		for j := 0; j < 5; j++ {
			reqs = append(reqs, rq{"i" + strconv.Itoa(i), 1})
		}
	}
	for i := 0; i < 5; i++ {
		for j := 0; j < 100; j++ {
			reqs = append(reqs, rq{"h" + strconv.Itoa(i), 2})
		}
	}
	rng := rand.New(rand.NewPCG(15, 15))
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	for _, k := range algorithms.Kinds {
		t.Run(k.String(), func(t *testing.T) {
			lim, err := algorithms.New(k, algorithms.Params{Limit: 10, Window: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			r := newTableRun(t, lim, 1000)
			denied := 0
			heavy := map[string]int{}
			for i, q := range reqs {
				ok := r.do(hashKey(7, []byte(q.key)), storeT0+int64(i)*int64(5*time.Second)/int64(len(reqs)))
				switch {
				case q.class == 1 && !ok:
					denied++
				case q.class == 2 && ok:
					heavy[q.key]++
				}
			}
			if denied != 0 {
				t.Errorf("%d of 500 innocent requests denied", denied)
			}
			for key, n := range heavy {
				if n > 12 {
					t.Errorf("heavy hitter %s admitted %d, limit 10", key, n)
				}
			}
			if n := len(r.s.host.(*filtertest.Host).Shared.Keys("t:")); n > 1000 {
				t.Errorf("%d entries > max_keys", n)
			}
			r.checkBound(k.String())
			t.Logf("heavy hitters admitted %v", heavy)
		})
	}
}

// Two workers race to evict the same occupant of a one-slot table: both
// read it, the first CAS wins, the second fails and, deciding again on what
// it then reads, evicts the winner instead of believing it owns the slot.
func TestEvictionRaceIsACAS(t *testing.T) {
	lim, _ := algorithms.New(algorithms.FixedWindow, algorithms.Params{Limit: 5, Window: time.Minute})
	h := filtertest.NewHost()
	s1 := newSlotStore(h, lim, "t:", 1)
	s2 := newSlotStore(h, lim, "t:", 1)
	a, b, c := hashKey(1, []byte("a")), hashKey(1, []byte("b")), hashKey(1, []byte("c"))
	one := func(s *slotStore, k uint64, e *entry) []byte {
		if err := s.load(k, storeT0, e); err != nil {
			t.Fatal(err)
		}
		st, d, err := lim.Decide(nil, e.state, storeT0, 1)
		if err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
		return st
	}
	var ea, eb, ec entry
	if ok, _ := s1.store(&ea, one(s1, a, &ea)); !ok {
		t.Fatal("a's first write failed")
	}
	stb, stc := one(s1, b, &eb), one(s2, c, &ec)
	if !eb.evicted || !ec.evicted || eb.slot != ec.slot || eb.cas != ec.cas {
		t.Fatalf("both should evict a from the one slot: %+v %+v", eb, ec)
	}
	if ok, _ := s1.store(&eb, stb); !ok {
		t.Fatal("b's eviction failed")
	}
	if ok, _ := s2.store(&ec, stc); ok {
		t.Fatal("c's eviction succeeded on a stale CAS: b and c both own the slot")
	}
	stc = one(s2, c, &ec) // c decides again: now b is the occupant
	if !ec.evicted || ec.evictedUsed != 1 {
		t.Fatalf("c after the lost race: %+v", ec)
	}
	if ok, _ := s2.store(&ec, stc); !ok {
		t.Fatal("c's second eviction failed")
	}
	si, _ := s1.read(0)
	if si.ident != c {
		t.Fatalf("the slot belongs to %x, want c", si.ident)
	}
}
