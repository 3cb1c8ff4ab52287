package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Counting by response on fixed_window in real Envoy: 5 failed logins per user per 15
// minutes (/login) and per 2 seconds (/short, to watch the window end), 8 workers on one
// key. Envoy's router answers both (direct_response: 200 with the right password, 401
// otherwise), after sluice.

const loginWindowRoutes = loginRoutes + `
- match:
    prefix: /short
    headers: [{name: x-password, string_match: {exact: right}}]
  direct_response: {status: 200, body: {inline_string: "welcome\n"}}
- match: {prefix: /short}
  direct_response: {status: 401, body: {inline_string: "wrong password\n"}}`

// LoginWindowConfig is the fixed_window brute-force rules the window tests run.
const LoginWindowConfig = `{"rules":[
  {"name":"login","match":{"path_prefix":"/login"},"key":[{"header":"x-user"}],
   "algorithm":"fixed_window","limit":5,"window":"15m","count":{"status":[401,403]}},
  {"name":"short","match":{"path_prefix":"/short"},"key":[{"header":"x-user"}],
   "algorithm":"fixed_window","limit":5,"window":"2s","count":{"status":[401,403]}}]}`

func TestEnvoyCountFailedLoginsWindow(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		e := startEnvoyAs(t, tg, a, 8, func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "count-logins-window", Config: LoginWindowConfig, CatchAll: true,
				ExactBalance: true, ExtraRoutes: loginWindowRoutes})
		})
		url, err := e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		clearOfWindowEnd(15*time.Minute, 30*time.Second)
		checkLogin(t, url) // the 15-minute window: as the bucket's scenario, held for the window
		checkWindowEnd(t, url)
	})
}

// checkWindowEnd locks a user out of the 2 s window, polls with the right password until it
// is let in — not before the window's end — and counts 5 failures in the next window.
func checkWindowEnd(t *testing.T, url string) {
	t.Helper()
	const w = 2 * time.Second
	start := time.Now().Truncate(w).Add(w)
	time.Sleep(time.Until(start) + 20*time.Millisecond) // the burst falls in one window
	got := loginBurstPath(t, url, "/short", "victim", "guess", 24, 8)
	if got[401] != 5 || got[429] != 19 {
		t.Fatalf("2s window, 24 wrong attempts 8 at a time: %v, want 5 × 401", got)
	}
	end := start.Add(w)
	deadline := time.Now().Add(5 * time.Second)
	polls := 0
	for {
		polls++
		st := loginBurstPath(t, url, "/short", "victim", "right", 1, 1)
		if st[200] == 1 {
			break
		}
		if st[429] != 1 || time.Now().After(deadline) {
			t.Fatalf("poll %d: %v at %v (window ends %v)", polls, st, time.Now(), end)
		}
		time.Sleep(25 * time.Millisecond)
	}
	if now := time.Now(); now.Before(end) {
		t.Fatalf("let in at %v, before the window's end %v", now, end)
	}
	t.Logf("2s window: 5 failures then locked out; let in again %v after the window's end (%d polls)", time.Since(end), polls)
	if got := loginBurstPath(t, url, "/short", "victim", "guess", 8, 1); got[401] != 5 || got[429] != 3 {
		t.Errorf("the next window: %v, want 5 × 401 then 429", got)
	}
}

// loginBurstPath is loginBurst on path.
func loginBurstPath(t *testing.T, url, path, user, password string, n, conc int) map[int]int {
	t.Helper()
	counts := map[int]int{}
	if path == "/login" {
		return loginBurst(t, url, user, password, n, conc)
	}
	res := make(chan int, n)
	sem := make(chan struct{}, conc)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			req, _ := http.NewRequest("POST", url+path, nil)
			req.Header.Set("x-user", user)
			req.Header.Set("x-password", password)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				res <- 0
				return
			}
			resp.Body.Close()
			res <- resp.StatusCode
		}()
	}
	for i := 0; i < n; i++ {
		counts[<-res]++
	}
	return counts
}

// clearOfWindowEnd waits out the end of the aligned window of w when it is less than margin
// away, so that a scenario of that window runs within one.
func clearOfWindowEnd(w, margin time.Duration) {
	if left := time.Until(time.Now().Truncate(w).Add(w)); left < margin {
		time.Sleep(left + 20*time.Millisecond)
	}
}
