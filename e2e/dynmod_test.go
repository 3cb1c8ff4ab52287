package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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
				do := func(h ...string) int { return getStatus(t, p.url+"/x", h...) }
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
				// Each names the function that panicked.
				if n := strings.Count(log, "(sluice_panictest) at github.com/sluice-proxy/sluice/filter/dynmod.panicHook "); n != 4 {
					t.Errorf("%d of the shell's panic lines name panicHook, want 4", n)
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

// statusOf sends GET path with header x-key: key to url and returns the status.
func statusOf(t *testing.T, url, path, key string) int {
	t.Helper()
	return getStatus(t, url+path, "x-key", key)
}

// getStatus sends GET url with the headers (name, value, …) and returns the status, its body
// read and closed.
func getStatus(t *testing.T, url string, headers ...string) int {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func reloadConfig(body string) string {
	return `{"rules":[{"name":"per-key","key":[{"header":"x-key"}],"algorithm":"sliding_log","limit":5,"window":"1h"}],"response":{"body":"` + body + `\n"}}`
}

// TestEnvoyDynmodReload: a configuration update through LDS makes a new filter configuration
// of the same library (no restart) that keeps every key's state (the per-process map); a
// configuration the module refuses is refused by Envoy while the one in force keeps serving;
// the drained configuration is destroyed without a fault.
func TestEnvoyDynmodReload(t *testing.T) {
	forEachEnvoyWhere(t, dynmodSpoken, "", func(t *testing.T, tg envoyproc.Target) {
		l := startLDSEnvoyAs(t, tg, artDynmod, 2, "", reloadConfig("first"), "--drain-time-s", "1")
		u, err := l.e.URL("ingress")
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if got := statusOf(t, u, "/a", "k"); got != 200 {
				t.Fatalf("request %d: %d", i, got)
			}
		}
		waitStat := func(name string, want int64) {
			t.Helper()
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if envoyStat(t, l.e, name) == want {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s = %d, want %d", name, envoyStat(t, l.e, name), want)
				}
			}
		}
		l.push("2", reloadConfig("second"))
		waitStat("listener_manager.lds.update_success", 2)
		got := []int{statusOf(t, u, "/a", "k"), statusOf(t, u, "/a", "k"), statusOf(t, u, "/a", "k")}
		if got[0] != 200 || got[1] != 200 || got[2] != 429 {
			t.Fatalf("after the update: %v, want 200 200 429 (3 of 5 spent before it)", got)
		}
		l.push("3", `{"rules":[{"name":"per-key","key":[{"header":"x-key"}],"algorithm":"sliding_log","limit":5,"window":"10x"}]}`)
		waitStat("listener_manager.lds.update_rejected", 1)
		if s := statusOf(t, u, "/a", "k"); s != 429 {
			t.Fatalf("after the refused update: %d, want 429 (the configuration in force, its state intact)", s)
		}
		if s := statusOf(t, u, "/a", "other"); s != 200 {
			t.Fatalf("another key: %d", s)
		}
		if !strings.Contains(l.e.Log(), `rules[0].window: "10x" is not a duration`) {
			t.Errorf("the refused configuration's reason is not in Envoy's log")
		}
		// The first configuration drained (--drain-time-s 1) and was destroyed: still healthy.
		waitStat("listener_manager.total_filter_chains_draining", 0)
		if s := statusOf(t, u, "/a", "k"); s != 429 {
			t.Fatalf("after the drain: %d", s)
		}
		signals, lines := dynmodFailureSignals(l.e)
		for _, s := range append(signals, lines...) {
			if !strings.Contains(s, "Failed to initialize dynamic module") { // the refused update's
				t.Errorf("%s", s)
			}
		}
	})
}

// TestEnvoyDynmodTwoConfigs: one libsluice.so serves two filters of one chain and a second
// listener's filter, each configuration its own rules, in one process (one Go runtime).
func TestEnvoyDynmodTwoConfigs(t *testing.T) {
	forEachEnvoyWhere(t, dynmodSpoken, "", func(t *testing.T, tg envoyproc.Target) {
		render := func(site EnvoySite) ([]byte, error) {
			y, err := renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "dynmod-two-configs", CatchAll: true,
				Config: `{"rules":[{"name":"outer","key":[{"header":"x-key"}],"algorithm":"fixed_window","limit":4,"window":"1h"}]}`})
			if err != nil {
				return nil, err
			}
			// A second sluice filter in the same chain, with its own rule.
			inner := `          - name: sluice-inner
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
              dynamic_module_config: {name: "sluice", do_not_close: true}
              filter_name: sluice-inner
              filter_config:
                "@type": type.googleapis.com/google.protobuf.StringValue
                value: '{"rules":[{"name":"inner","match":{"path_prefix":"/tight/"},"key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":2,"window":"1h"}]}'
          - name: envoy.filters.http.router
`
			s := strings.Replace(string(y), "          - name: envoy.filters.http.router\n", inner, 1)
			return []byte(s), nil
		}
		e, err := tryStartEnvoyAs(t, tg, artDynmod, "", 2, render)
		if err != nil {
			t.Fatal(err)
		}
		u, _ := e.URL("ingress")
		var tight, loose []int
		for i := 0; i < 3; i++ {
			tight = append(tight, statusOf(t, u, "/tight/x", "a"))
		}
		for i := 0; i < 3; i++ {
			loose = append(loose, statusOf(t, u, "/x", "b"))
		}
		if fmt.Sprint(tight) != "[200 200 429]" || fmt.Sprint(loose) != "[200 200 200]" {
			t.Fatalf("tight %v (inner's limit 2), loose %v (outer's limit 4 only)", tight, loose)
		}
		st, err := e.Stats(`dynamicmodulescustom\.`)
		if err != nil {
			t.Fatal(err)
		}
		if st["dynamicmodulescustom.sluice.outer.allowed"] != 6 || st["dynamicmodulescustom.sluice.inner.allowed"] != 2 || st["dynamicmodulescustom.sluice.inner.denied"] != 1 {
			t.Errorf("stats: %v", st)
		}
		checkHealthyAs(t, e, artDynmod, 2)
	})
}

// TestEnvoyDynmodHotRestart: a new libsluice.so reaches a running Envoy by a hot restart: the
// new process (--restart-epoch 1) loads the library from its own search path, takes over the
// listener and serves; the old one exits. Per-key state is the process's: it starts empty.
func TestEnvoyDynmodHotRestart(t *testing.T) {
	lib, err := shippedDynmod()
	if err != nil {
		t.Fatal(err)
	}
	forEachEnvoyWhere(t, dynmodSpoken, "", func(t *testing.T, tg envoyproc.Target) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		render := func(site EnvoySite) ([]byte, error) {
			y, err := renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "dynmod-hot-restart", CatchAll: true, Config: reloadConfig("x")})
			if err != nil {
				return nil, err
			}
			// The listener's port is fixed: the new process takes over the old one's socket.
			return []byte(strings.Replace(string(y), "socket_address: {address: 127.0.0.1, port_value: 0}\n    filter_chains", fmt.Sprintf("socket_address: {address: 127.0.0.1, port_value: %d}\n    filter_chains", port), 1)), nil
		}
		baseID := strconv.Itoa(10000 + os.Getpid()%50000)
		old, err := tryStartEnvoyAs(t, tg, artDynmod, lib, 1, render, "--base-id", baseID, "--restart-epoch", "0")
		if err != nil {
			t.Fatal(err)
		}
		u := fmt.Sprintf("http://127.0.0.1:%d", port)
		for i := 0; i < 5; i++ {
			statusOf(t, u, "/a", "k")
		}
		if s := statusOf(t, u, "/a", "k"); s != 429 {
			t.Fatalf("the old process: %d, want 429", s)
		}
		// The new version: another file, in another directory.
		dir := t.TempDir()
		b, err := os.ReadFile(lib)
		if err != nil {
			t.Fatal(err)
		}
		next := filepath.Join(dir, "libsluice.so")
		if err := os.WriteFile(next, b, 0o755); err != nil {
			t.Fatal(err)
		}
		e, err := tryStartEnvoyAs(t, tg, artDynmod, next, 1, render, "--base-id", baseID, "--restart-epoch", "1",
			"--parent-shutdown-time-s", "2", "--drain-time-s", "1")
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-old.Exited():
		case <-time.After(30 * time.Second):
			t.Fatal("the old process did not exit after the hot restart")
		}
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", e.PID()))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(maps), next) {
			t.Fatalf("the new process did not load %s", next)
		}
		if s := statusOf(t, u, "/a", "k"); s != 200 {
			t.Fatalf("the new process: %d, want 200 (its per-key state starts empty)", s)
		}
		checkHealthyAs(t, e, artDynmod, 1)
	})
}
