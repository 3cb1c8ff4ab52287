package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// Counting by response in real Envoy: a login endpoint limited to 5 failed attempts per user
// per 15 minutes, successful logins not charged. Envoy's router answers the login itself
// (direct_response): 200 with the right password, 401 otherwise — after sluice, so sluice
// sees the status as it would an upstream's.

const loginRoutes = `- match:
    prefix: /login
    headers: [{name: x-password, string_match: {exact: right}}]
  direct_response: {status: 200, body: {inline_string: "welcome\n"}}
- match: {prefix: /login}
  direct_response: {status: 401, body: {inline_string: "wrong password\n"}}`

// LoginConfig is the brute-force rule the login tests run.
const LoginConfig = `{"rules":[{"name":"login","match":{"path_prefix":"/login"},"key":[{"header":"x-user"}],
  "algorithm":"token_bucket","limit":5,"window":"15m","count":{"status":[401,403]}}]}`

// loginBurst sends n login attempts of user at once, conc at a time, and counts the answers
// by status.
func loginBurst(t *testing.T, url, user, password string, n, conc int) map[int]int {
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
			req, _ := http.NewRequest("POST", url+"/login", nil)
			req.Header.Set("x-user", user)
			req.Header.Set("x-password", password)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			counts[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return counts
}

// checkLogin runs the login scenario against a proxy at url: one user hammered, many users
// at once, successes, and the locked-out user with the right password.
func checkLogin(t *testing.T, url string) {
	t.Helper()
	got := loginBurst(t, url, "victim", "guess", 40, 8)
	if got[401] != 5 || got[429] != 35 {
		t.Errorf("one user, 40 wrong attempts 8 at a time: %v, want 5 × 401 then 429", got)
	}
	t.Logf("one user: %d attempts reached the login before lock-out (configured 5)", got[401])
	if got := loginBurst(t, url, "victim", "right", 3, 1); got[429] != 3 {
		t.Errorf("locked-out user with the right password: %v, want 429 (locked out)", got)
	}
	if got := loginBurst(t, url, "regular", "right", 100, 4); got[200] != 100 {
		t.Errorf("100 successful logins, 4 at a time: %v, want all 200", got)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := 0
	for u := 0; u < 16; u++ {
		wg.Add(1)
		go func(u int) {
			defer wg.Done()
			got := loginBurst(t, url, fmt.Sprint("user", u), "guess", 10, 2)
			if got[401] != 5 || got[429] != 5 {
				mu.Lock()
				bad++
				mu.Unlock()
				t.Errorf("user%d: %v, want 5 × 401, 5 × 429", u, got)
			}
		}(u)
	}
	wg.Wait()
	t.Logf("16 users × 10 wrong attempts: %d users off their 5", bad)
}

func TestEnvoyCountFailedLogins(t *testing.T) {
	forEachArtifact(t, func(t *testing.T, tg envoyproc.Target, a artifact) {
		e := startEnvoyAs(t, tg, a, 8, func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "count-logins", Config: LoginConfig, CatchAll: true,
				ExactBalance: true, ExtraRoutes: loginRoutes})
		})
		url, err := e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		checkLogin(t, url)
	})
}
