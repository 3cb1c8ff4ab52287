package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"
)

// floodRequest is one request of a Flood: its key and class (0 attacker, 1 innocent,
// 2 heavy).
type floodRequest struct {
	key   string
	class int
}

// floodRequests lists every request of f in its seeded random order.
func floodRequests(f *Flood, seed uint64) []floodRequest {
	var reqs []floodRequest
	for class, c := range [][2]int{{f.Attackers, f.AttackerRequests}, {f.Innocents, f.InnocentRequests}, {f.Heavy, f.HeavyRequests}} {
		for k := range c[0] {
			key := [...]string{"attacker-", "innocent-", "heavy-"}[class] + strconv.Itoa(k+1)
			for range c[1] {
				reqs = append(reqs, floodRequest{key, class})
			}
		}
	}
	rng := rand.New(rand.NewPCG(seed, 15))
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	return reqs
}

// runFlood sends st.Flood (see Flood) and checks what each class got.
func runFlood(ctx context.Context, t *testing.T, p *proxy, st Step) error {
	f := st.Flood
	reqs := floodRequests(f, 1)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c := newClient(f.Conns)
	defer c.CloseIdleConnections()
	type result struct {
		i      int
		status int
		err    error
	}
	next := make(chan int)
	results := make(chan result, f.Conns)
	var wg sync.WaitGroup
	for range f.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r := st.Req
				r.Header = r.Header.Clone()
				if r.Header == nil {
					r.Header = http.Header{}
				}
				r.Header.Set(f.KeyHeader, reqs[i].key)
				resp, err := do(ctx, c, p.url, r)
				results <- result{i, resp.status, err}
			}
		}()
	}
	go func() {
		for i := range reqs {
			next <- i
		}
		close(next)
		wg.Wait()
		close(results)
	}()
	began := time.Now()
	var firstErr error
	innocentDenied, innocents := 0, 0
	heavy := map[string]int{}
	statuses := map[int]int{}
	for r := range results {
		if r.err != nil {
			if firstErr == nil {
				firstErr = r.err
				cancel()
			}
			continue
		}
		q := reqs[r.i]
		statuses[r.status]++
		switch {
		case r.status != st.Want.Status && r.status != f.DeniedStatus:
			if firstErr == nil {
				firstErr = fmt.Errorf("%s: status %d, want %d or %d", q.key, r.status, st.Want.Status, f.DeniedStatus)
			}
		case q.class == 1:
			innocents++
			if r.status == f.DeniedStatus {
				innocentDenied++
			}
		case q.class == 2 && r.status == st.Want.Status:
			heavy[q.key]++
		}
	}
	if firstErr != nil {
		return firstErr
	}
	heavyMax := 0
	for _, n := range heavy {
		heavyMax = max(heavyMax, n)
	}
	t.Logf("flood of %d requests in %v: statuses %v; innocent requests denied %d of %d; the most admitted for a heavy key %d",
		len(reqs), time.Since(began).Round(time.Millisecond), statuses, innocentDenied, innocents, heavyMax)
	if innocentDenied > f.MaxInnocentDenied {
		return fmt.Errorf("%d of %d innocent requests denied, want at most %d", innocentDenied, innocents, f.MaxInnocentDenied)
	}
	if heavyMax > f.MaxHeavyAdmitted {
		return fmt.Errorf("a heavy key admitted %d times, want at most %d", heavyMax, f.MaxHeavyAdmitted)
	}
	if p.admin == "" {
		return nil
	}
	var status struct {
		SharedData struct{ Keys, Bytes int } `json:"shared_data"`
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.admin+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("admin /status: %v", err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
		return fmt.Errorf("admin /status: %v", err)
	}
	t.Logf("shared data: %d entries, %d bytes", status.SharedData.Keys, status.SharedData.Bytes)
	if status.SharedData.Keys > f.MaxSharedKeys || status.SharedData.Keys == 0 {
		return fmt.Errorf("%d shared-data entries, want 1..%d", status.SharedData.Keys, f.MaxSharedKeys)
	}
	return nil
}
