package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// loginWindowRules: 5 failed logins per user per 15 minutes on /login, and the same per 2
// seconds on /short (to watch a window end), both fixed_window.
const loginWindowRules = `{"rules":[
  {"name":"login","match":{"path_prefix":"/login"},"key":[{"header":"x-user"}],
   "algorithm":"fixed_window","limit":5,"window":"15m","count":{"status":[401,403]}},
  {"name":"short","match":{"path_prefix":"/short"},"key":[{"header":"x-user"}],
   "algorithm":"fixed_window","limit":5,"window":"2s","count":{"status":[401,403]}}]}`

// loginAttempts sends n attempts of user at url, conc at a time, and counts the answers.
func loginAttempts(t *testing.T, url, user, pw string, n, conc int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	counts := map[int]int{}
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			st, err := httpGetNoFatal(url, "x-user", user, "x-password", pw)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			counts[st]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return counts
}

// untilWindowStart waits for the start of the next aligned window of w (plus a margin), so
// that a burst falls in one window.
func untilWindowStart(w time.Duration) time.Time {
	now := time.Now()
	start := now.Truncate(w).Add(w)
	time.Sleep(time.Until(start) + 20*time.Millisecond)
	return start
}

// The login scenario on fixed_window in sluice run, 8 workers: exactly 5 failures of one
// user reach the upstream, then 429 for the rest of the window even with the right
// password; successes are unlimited; the window's end lets the user try again.
func TestRunCountFailedLoginsWindow(t *testing.T) {
	var fails atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("x-password") != "right" {
			fails.Add(1)
			http.Error(w, "wrong password", http.StatusUnauthorized)
			return
		}
		w.Write([]byte("welcome\n"))
	}))
	defer up.Close()
	cfgFile := filepath.Join(t.TempDir(), "login.json")
	if err := os.WriteFile(cfgFile, []byte(loginWindowRules), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, _, _ := startTestRun(t, runConfig{wasm: buildWasm(t, "../sluice-wasm"), configPath: cfgFile, workers: 8, upstream: up.URL, clusters: clusterFlag{}})
	base := "http://" + rs.listenAddr
	if left := time.Until(time.Now().Truncate(15 * time.Minute).Add(15 * time.Minute)); left < 20*time.Second {
		time.Sleep(left + 20*time.Millisecond) // the 15-minute scenario runs within one window
	}
	// Successes are unlimited in number; in flight each holds its unit until its
	// response, so at most 5 at a time (4 here) for one user.
	if got := loginAttempts(t, base+"/login", "regular", "right", 200, 4); got[200] != 200 {
		t.Errorf("200 successes, 4 at a time: %v", got)
	}
	got := loginAttempts(t, base+"/login", "victim", "guess", 40, 8)
	if got[401] != 5 || got[429] != 35 || fails.Load() != 5 {
		t.Errorf("40 wrong attempts, 8 at a time: %v (upstream saw %d failures), want 5 × 401", got, fails.Load())
	}
	t.Logf("15m window: %v, upstream saw %d failures", got, fails.Load())
	if got := loginAttempts(t, base+"/login", "victim", "right", 4, 2); got[429] != 4 {
		t.Errorf("locked out with the right password: %v, want 429", got)
	}
	if got := loginAttempts(t, base+"/login", "regular", "right", 50, 4); got[200] != 50 {
		t.Errorf("successes after the lock-out of another user: %v", got)
	}

	// The 2 s window: locked out, then open again at the window's end, not before.
	fails.Store(0)
	start := untilWindowStart(2 * time.Second)
	got = loginAttempts(t, base+"/short", "victim", "guess", 24, 8)
	if got[401] != 5 || got[429] != 19 || fails.Load() != 5 {
		t.Fatalf("2s window, 24 wrong attempts: %v (upstream saw %d), want 5 × 401", got, fails.Load())
	}
	end := start.Add(2 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	var polls int
	for {
		polls++
		st, err := httpGetNoFatal(base+"/short", "x-user", "victim", "x-password", "right")
		if err != nil {
			t.Fatal(err)
		}
		if st == 200 {
			break
		}
		if st != 429 || time.Now().After(deadline) {
			t.Fatalf("poll %d: status %d at %v", polls, st, time.Now())
		}
		time.Sleep(25 * time.Millisecond)
	}
	if at := time.Now(); at.Before(end) {
		t.Fatalf("admitted at %v, before the window's end %v", at, end)
	}
	t.Logf("2s window: admitted again %v after the window's end, after %d polls", time.Since(end), polls)
	fails.Store(0)
	if got := loginAttempts(t, base+"/short", "victim", "guess", 8, 1); got[401] != 5 || got[429] != 3 {
		t.Errorf("the next window: %v, want 5 × 401 then 429", got)
	}
}
