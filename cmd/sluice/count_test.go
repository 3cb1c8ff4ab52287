package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// sluice run, 8 workers, a login upstream answering 401 unless the password is right: 5
// failed attempts per user per 15 minutes reach it, successes are not charged.
func TestRunCountFailedLogins(t *testing.T) {
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
	os.WriteFile(cfgFile, []byte(`{"rules":[{"name":"login","match":{"path_prefix":"/login"},"key":[{"header":"x-user"}],
	  "algorithm":"token_bucket","limit":5,"window":"15m","count":{"status":[401,403]}}]}`), 0o644)
	rs, _, _ := startTestRun(t, runConfig{wasm: buildWasm(t, "../sluice-wasm"), configPath: cfgFile, workers: 8, upstream: up.URL, clusters: clusterFlag{}})
	base := "http://" + rs.listenAddr
	burst := func(user, pw string, n, conc int) map[int]int {
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
				st, err := httpGetNoFatal(base+"/login", "x-user", user, "x-password", pw)
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
	if got := burst("victim", "guess", 40, 8); got[401] != 5 || got[429] != 35 || fails.Load() != 5 {
		t.Errorf("40 wrong attempts, 8 at a time: %v (upstream saw %d failures), want 5 × 401", got, fails.Load())
	}
	if got := burst("victim", "right", 2, 1); got[429] != 2 {
		t.Errorf("locked out with the right password: %v, want 429", got)
	}
	if got := burst("regular", "right", 100, 4); got[200] != 100 {
		t.Errorf("100 successes: %v", got)
	}
	fails.Store(0)
	var wg sync.WaitGroup
	for u := 0; u < 16; u++ {
		wg.Add(1)
		go func(u int) {
			defer wg.Done()
			if got := burst(fmt.Sprint("user", u), "guess", 10, 2); got[401] != 5 {
				t.Errorf("user%d: %v, want 5 × 401", u, got)
			}
		}(u)
	}
	wg.Wait()
	if fails.Load() != 80 {
		t.Errorf("16 users: the upstream saw %d failures, want 80", fails.Load())
	}
}

// A reload (SIGHUP) changes plans and overrides without losing counts: a tenant's admissions
// before it count against its new limit.
func TestRunReloadKeepsPlanCounts(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "plans.json")
	write := func(acme int) {
		os.WriteFile(cfgFile, []byte(`{"rules":[{"name":"tenant","key":[{"header":"x-tenant"}],"algorithm":"fixed_window","limit":2,"window":"1h",
		  "overrides":{"by":{"header":"x-tenant"},"values":{"acme":`+fmt.Sprint(acme)+`}}}]}`), 0o644)
	}
	write(5)
	rs, _, _ := startTestRun(t, runConfig{wasm: buildWasm(t, "../sluice-wasm"), configPath: cfgFile, workers: 4, clusters: clusterFlag{}})
	base := "http://" + rs.listenAddr
	count := func(tenant string, n int) int {
		ok := 0
		for i := 0; i < n; i++ {
			if st, _ := httpGetNoFatal(base+"/", "x-tenant", tenant); st == 200 {
				ok++
			}
		}
		return ok
	}
	if got := count("acme", 3); got != 3 {
		t.Fatalf("acme before the reload: %d of 3", got)
	}
	if got := count("other", 1); got != 1 {
		t.Fatalf("other: %d", got)
	}
	write(4)
	if err := rs.reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := count("acme", 5); got != 1 {
		t.Errorf("acme after lowering its override to 4: %d more admitted, want 1 (3 kept)", got)
	}
	if got := count("other", 5); got != 1 {
		t.Errorf("other after the reload: %d more admitted, want 1 (1 kept)", got)
	}
}
