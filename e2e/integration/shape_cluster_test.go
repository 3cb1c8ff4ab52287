package integration

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/filter"
	"github.com/sluice-proxy/sluice/host"
)

// Shaping with backend "redis" across proxies: three proxies (two workers each, each
// proxy its own shared data and Redis clients) share one shaped key on the real cluster.
// A burst of 40 at 10/s (leaky_bucket, burst 1, delay.max 2s): the script takes the slots
// in the key's state, so the proxies' requests queue behind each other — 21 leave, one
// slot (100 ms) apart across the fleet, and the rest are refused at once.
func TestRedisShapingAcrossProxies(t *testing.T) {
	testCluster(t)
	const proxies, workers, n = 3, 2, 40
	const spacing, maxDelay = 100 * time.Millisecond, 2 * time.Second
	rule := unique("shape")
	cfg := fmt.Sprintf(`{"rules":[{"name":%q,"key":[{"header":"x-user"}],"algorithm":"leaky_bucket","limit":10,"window":"1s","burst":1,
"backend":"redis","delay":{"max":"2s"}}],"failure_mode":"closed","redis":{"cluster":%q,"timeout_ms":5000,"instances":3}}`, rule, redisService)
	var ps []*redisProxy
	for i := 0; i < proxies; i++ {
		ps = append(ps, startRedisProxy(t, cfg, workers))
	}
	// Load the script on every node first: a burst's first calls would otherwise be EVALs
	// after a NOSCRIPT, a second round trip the others do not take.
	for k, p := range ps {
		for i := 0; i < 6; i++ {
			p.get(t, "warm-"+strconv.Itoa(k)+"-"+strconv.Itoa(i)) // a key each: none is held
		}
	}
	type result struct {
		status int
		done   time.Time
		held   string
	}
	res := make([]result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := ps[i%proxies].h.Exchange(context.Background(), &host.Request{Path: "/api", Headers: [][2]string{{"x-user", "alice"}}}, nil)
			if err != nil {
				t.Error(err)
				return
			}
			res[i] = result{resp.Status, time.Now(), resp.Header(filter.DelayHeader)}
		}()
	}
	begin := time.Now()
	close(start)
	wg.Wait()
	var done []time.Time
	refused := 0
	for _, r := range res {
		switch r.status {
		case 200:
			done = append(done, r.done)
		case 429:
			refused++
			if r.done.Sub(begin) > 5*spacing {
				t.Errorf("a refusal took %v", r.done.Sub(begin))
			}
		default:
			t.Fatalf("status %d", r.status)
		}
	}
	admitted := len(done)
	// 1 at once and 20 held (slots +100 ms … +2 s); a burst whose requests reach Redis
	// later than the first wait less for the same slot, so a few more may fit.
	if admitted < 21 || admitted > 24 || admitted+refused != n {
		t.Fatalf("%d admitted, %d refused; want 21..24 admitted", admitted, refused)
	}
	sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
	minGap, maxGap := time.Hour, time.Duration(0)
	for k := 1; k < admitted; k++ {
		slot := done[0].Add(time.Duration(k) * spacing)
		if done[k].Before(slot.Add(-20*time.Millisecond)) || done[k].After(slot.Add(250*time.Millisecond)) {
			t.Errorf("completion %d at +%v, its slot +%v", k, done[k].Sub(done[0]), slot.Sub(done[0]))
		}
		gap := done[k].Sub(done[k-1])
		minGap, maxGap = min(minGap, gap), max(maxGap, gap)
	}
	if last := done[admitted-1].Sub(begin); last > maxDelay+500*time.Millisecond {
		t.Errorf("the last release came %v after the burst", last)
	}
	var delayed, refusedM, held, calls int64
	for _, p := range ps {
		delayed += p.metric(filter.RuleMetric(rule, "delayed"))
		refusedM += p.metric(filter.RuleMetric(rule, "delay_refused"))
		held += p.metric(filter.RuleMetric(rule, "held"))
		calls += p.metric(filter.MetricRedisCalls) - p.metric(filter.MetricRedisNoScript)
	}
	t.Logf("%d admitted, %d refused over %d proxies; completions %v..%v apart, last at +%v; %d delayed; %d calls",
		admitted, refused, proxies, minGap.Round(time.Millisecond), maxGap.Round(time.Millisecond),
		done[admitted-1].Sub(done[0]).Round(time.Millisecond), delayed, calls)
	if delayed != int64(admitted-1) || refusedM != int64(refused) || held != 0 {
		t.Errorf("delayed %d, delay_refused %d, held %d; want %d, %d, 0", delayed, refusedM, held, admitted-1, refused)
	}
	// Shaped decisions are not coalesced: one call per request (and the warm-up's).
	if calls != int64(n+proxies*6) {
		t.Errorf("%d decision calls for %d requests", calls, n+proxies*6)
	}
}
