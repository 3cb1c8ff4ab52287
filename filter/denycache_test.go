package filter_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
)

// TestDecisionsMatchTheAlgorithm: three workers over one shared data, random arrivals of
// four keys, every algorithm: each response — status, Retry-After, the RateLimit header's
// remaining and reset, on admissions and denials — is the one the algorithm gives deciding
// the same requests in the same order on one state per key. It holds with the denial cache
// (denycache.go), which answers most denials here without reading shared data.
func TestDecisionsMatchTheAlgorithm(t *testing.T) {
	for _, kind := range algorithms.Kinds {
		t.Run(kind.String(), func(t *testing.T) {
			p := algorithms.Params{Limit: 3, Window: time.Second, Burst: 3}
			burst := ""
			if kind == algorithms.TokenBucket || kind == algorithms.LeakyBucket {
				p.Burst = 2
				burst = `,"burst":2`
			}
			ref, err := algorithms.New(kind, p)
			if err != nil {
				t.Fatal(err)
			}
			cfg := fmt.Sprintf(`{"rules":[{"name":"r","key":[{"header":"x-key"}],"algorithm":%q,"limit":3,"window":"1s"%s}],"response":{"headers":"draft"}}`, kind, burst)
			shared, metrics := filtertest.NewSharedData(), filtertest.NewMetrics()
			var ws []*filtertest.Worker
			var hosts []*countingHost
			for i := 0; i < 3; i++ {
				h := &countingHost{Host: &filtertest.Host{Shared: shared, Metrics: metrics, Now_: t0}}
				w := filtertest.NewWorker(h.Host, filter.NewVM(h))
				hosts = append(hosts, h)
				if !w.Start(cfg) {
					t.Fatalf("start: %v", w.Host.Logs)
				}
				ws = append(ws, w)
			}
			rng := rand.New(rand.NewPCG(uint64(kind), 3))
			states := map[string][]byte{}
			now := t0
			denied := 0
			for i := 0; i < 3000; i++ {
				now += rng.Int64N(int64(20 * time.Millisecond)) // dense: most requests are denials, most of those cached
				key := "k" + strconv.Itoa(rng.IntN(4))
				w := ws[rng.IntN(len(ws))]
				w.Host.Now_ = now
				got := w.Do(filtertest.Request{Headers: [][2]string{{"x-key", key}}})
				st, d, err := ref.Decide(nil, states[key], now, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					states[key] = st
				} else {
					denied++
				}
				want := 200
				if !d.Allowed {
					want = 429
				}
				rl := fmt.Sprintf(`"r";r=%d;t=%d`, d.Remaining, ceilSec(d.ResetAfter))
				if got.Status != want || got.Header("ratelimit") != rl {
					t.Fatalf("request %d (%s at +%v): %d %q, want %d %q", i, key, time.Duration(now-t0), got.Status, got.Header("ratelimit"), want, rl)
				}
				if !d.Allowed {
					if ra := strconv.FormatInt(max(ceilSec(d.RetryAfter), 1), 10); got.Header("retry-after") != ra {
						t.Fatalf("request %d: Retry-After %q, want %s", i, got.Header("retry-after"), ra)
					}
				}
			}
			if denied < 500 {
				t.Fatalf("only %d denials: the test is meant to exercise them", denied)
			}
			// The cache answered most denials: a request read from shared data costs at
			// least one get (the seed's reads at start aside).
			gets := 0
			for _, h := range hosts {
				gets += h.gets
			}
			if reads := gets - 3*4; reads > 3000-denied/2 {
				t.Errorf("%d shared-data reads for 3000 requests of which %d denied: the denial cache is not answering", reads, denied)
			}
			t.Logf("%d denied; %d shared-data reads", denied, gets)
		})
	}
}

func ceilSec(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// countingHost counts the shared-data reads of a worker.
type countingHost struct {
	*filtertest.Host
	gets int
}

func (h *countingHost) GetSharedData(key []byte) ([]byte, uint32, abi.Status) {
	h.gets++
	return h.Host.GetSharedData(key)
}

// TestDenyCacheHoldsAThousandKeys: a thousand keys denied on one worker are then denied
// again from the cache, without a shared-data read, but for the few keys whose set four
// others fill (at most 12 in 300 runs with random seeds; the direct-mapped table of the
// same size lost about 230).
func TestDenyCacheHoldsAThousandKeys(t *testing.T) {
	const keys = 1000
	h := &countingHost{Host: filtertest.NewHost()}
	h.Now_ = t0
	w := filtertest.NewWorker(h.Host, filter.NewVM(h))
	// A key table far larger than the keys, so that no key's candidate slots are all taken
	// (the default 10,000 evicts one of a thousand keys in about one run in ten, with the
	// random seed), and every key's second request is its denial.
	if !w.Start(`{"rules":[{"name":"r","key":[{"header":"x-key"}],"algorithm":"fixed_window","limit":1,"window":"1h","max_keys":1000000}]}`) {
		t.Fatalf("start: %v", h.Logs)
	}
	pass := func(want int) {
		t.Helper()
		for i := range keys {
			h.Now_ += int64(time.Millisecond)
			if got := w.Do(filtertest.Request{Headers: [][2]string{{"x-key", "key-" + strconv.Itoa(i)}}}); got.Status != want {
				t.Fatalf("key %d: %d, want %d", i, got.Status, want)
			}
		}
	}
	pass(200) // each key's one admission
	pass(429) // denied from shared data, and cached
	before := h.gets
	pass(429)
	if reads := h.gets - before; reads > keys/50 {
		t.Errorf("%d shared-data reads for %d cached denials: the cache lost %.0f%% of its keys", reads, keys, 100*float64(reads)/keys)
	}
}
