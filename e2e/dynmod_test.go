package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// The stages only the dynamic module has: a panic never takes Envoy down, and an Envoy
// whose ABI the module does not speak refuses it with the versions it needs.

// panicConfig keys its rule on x-api-key; the sluice_panictest build panics inside the VM
// when it reads the value "panic-in-filter", and in the shell on x-sluice-panic: shell.
func panicConfig(mode string) string {
	return `{"rules":[{"name":"p","key":[{"header":"x-api-key"}],"algorithm":"token_bucket","limit":1000,"window":"1h"}],"failure_mode":"` + mode + `"}`
}

var panicLib = sync.OnceValues(func() (string, error) { return buildDynmod("sluice_panictest") })

// TestEnvoyDynmodPanic: a libsluice.so built to panic on purpose, in real Envoy with two
// workers: a panic in the shell and one inside the filter are each recovered, counted in
// sluice.errors and logged once, and decided by failure_mode (closed: 503, open: the request
// goes on); Envoy keeps serving throughout, and requests that do not panic are decided as
// usual.
func TestEnvoyDynmodPanic(t *testing.T) {
	lib, err := panicLib()
	if err != nil {
		t.Fatal(err)
	}
	forEachEnvoyWhere(t, dynmodSpoken, "", func(t *testing.T, tg envoyproc.Target) {
		for _, tc := range []struct {
			mode string
			want int
		}{{"closed", 503}, {"open", 200}} {
			t.Run(tc.mode, func(t *testing.T) {
				render := func(site EnvoySite) ([]byte, error) {
					return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "dynmod-panic", Config: panicConfig(tc.mode), CatchAll: true})
				}
				e, err := tryStartEnvoyAs(t, tg, artDynmod, lib, 2, render)
				if err != nil {
					t.Fatal(err)
				}
				p := envoyProxy(t, e)
				do := func(h ...string) int {
					req, _ := http.NewRequest("GET", p.url+"/x", nil)
					for i := 0; i+1 < len(h); i += 2 {
						req.Header.Set(h[i], h[i+1])
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatalf("envoy stopped serving: %v", err)
					}
					resp.Body.Close()
					return resp.StatusCode
				}
				for i := 0; i < 4; i++ {
					if got := do("x-sluice-panic", "shell", "x-api-key", "a"); got != tc.want {
						t.Errorf("panic in the shell: status %d, want %d", got, tc.want)
					}
					if got := do("x-api-key", "panic-in-filter"); got != tc.want {
						t.Errorf("panic in the filter: status %d, want %d", got, tc.want)
					}
					if got := do("x-api-key", "b"); got != 200 {
						t.Errorf("a request that does not panic: status %d", got)
					}
				}
				st, err := e.Stats(`dynamicmodulescustom\.sluice\.`)
				if err != nil {
					t.Fatal(err)
				}
				if st["dynamicmodulescustom.sluice.errors"] != 8 {
					t.Errorf("sluice.errors = %d, want 8 (one per panic)", st["dynamicmodulescustom.sluice.errors"])
				}
				// Only the requests that did not panic were decided (and charged): a request let
				// through by failure_mode "open" is charged to no rule.
				if st["dynamicmodulescustom.sluice.p.allowed"] != 4 {
					t.Errorf("p.allowed = %d, want 4", st["dynamicmodulescustom.sluice.p.allowed"])
				}
				log := e.Log()
				if n := strings.Count(log, "recovered from a panic in the dynamic module"); n != 4 {
					t.Errorf("%d log lines of a panic in the shell, want 4", n)
				}
				if n := strings.Count(log, "sluice: recovered from panic: deliberate panic in the filter"); n != 4 {
					t.Errorf("%d log lines of a panic in the filter, want 4", n)
				}
				if strings.Contains(log, "Caught") || strings.Contains(log, "fatal error") {
					t.Errorf("Envoy's log shows a crash:\n%s", boundedLog(log))
				}
			})
		}
	})
}

// TestEnvoyDynmodRefusedOld: an Envoy older than 1.38 (another dynamic-module API) refuses
// libsluice.so at start-up, and the module says which Envoys it needs.
func TestEnvoyDynmodRefusedOld(t *testing.T) {
	old := func(tg envoyproc.Target) bool { return !dynmodSpoken(tg) }
	forEachEnvoyWhere(t, old, "", func(t *testing.T, tg envoyproc.Target) {
		render := func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "dynmod-old", Config: panicConfig("open"), CatchAll: true})
		}
		e, err := tryStartEnvoyAs(t, tg, artDynmod, "", 1, render)
		if err == nil {
			e.Stop()
			t.Fatalf("envoy %s became ready with libsluice.so", tg.Version)
		}
		for _, want := range []string{"libsluice.so cannot load in this Envoy", "Envoy 1.38 or later", "use sluice.wasm"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("envoy %s's log lacks %q:\n%s", tg.Version, want, boundedLog(err.Error()))
			}
		}
	})
}
