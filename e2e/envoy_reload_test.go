package e2e

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

//go:embed envoy/lds-bootstrap.yaml.tmpl
var ldsBootstrapTemplate string

//go:embed envoy/lds-listener.yaml.tmpl
var ldsListenerTemplate string

// The LDS templates use envoy.yaml.tmpl's functions (quote, indent).
var (
	ldsBootstrapTmpl = template.Must(template.Must(envoyTmpl.Clone()).New("lds-bootstrap").Parse(ldsBootstrapTemplate))
	ldsListenerTmpl  = template.Must(template.Must(envoyTmpl.Clone()).New("lds-listener").Parse(ldsListenerTemplate))
)

// ldsData is what the LDS templates render.
type ldsData struct {
	EnvoySite
	LDSPath      string // the LDS file (bootstrap)
	Version      string // version_info (listener)
	ListenerPort int    // the listener's port (listener)
	Config       string // the plugin configuration (listener)
}

func renderTmpl(tm *template.Template, d ldsData) ([]byte, error) {
	var b bytes.Buffer
	if err := tm.Execute(&b, d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ldsEnvoy is an Envoy whose listener comes from an LDS file the test rewrites.
type ldsEnvoy struct {
	t    *testing.T
	e    *envoyproc.Envoy
	site EnvoySite
	path string
	port int
}

// push replaces the LDS file atomically (write next to it, rename over it): the move Envoy
// watches for.
func (l *ldsEnvoy) push(version, config string) {
	l.t.Helper()
	if err := writeLDS(l.site, l.path, version, l.port, config); err != nil {
		l.t.Fatal(err)
	}
}

func writeLDS(site EnvoySite, path, version string, port int, config string) error {
	y, err := renderTmpl(ldsListenerTmpl, ldsData{EnvoySite: site, Version: version, ListenerPort: port, Config: config})
	if err != nil {
		return err
	}
	tmp := path + ".next"
	if err := os.WriteFile(tmp, y, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// startLDSEnvoy starts Envoy with its listener from an LDS file holding config (version
// "1") on port (0: any free port).
// wasm, when not empty, replaces the shipped module.
func startLDSEnvoy(t *testing.T, tg envoyproc.Target, workers int, wasm, config string, args ...string) *ldsEnvoy {
	t.Helper()
	return startLDSEnvoyAs(t, tg, artWasm, workers, wasm, config, args...)
}

// startLDSEnvoyAs is startLDSEnvoy for artifact a.
func startLDSEnvoyAs(t *testing.T, tg envoyproc.Target, a artifact, workers int, wasm, config string, args ...string) *ldsEnvoy {
	t.Helper()
	l := &ldsEnvoy{t: t, path: filepath.Join(t.TempDir(), "lds.yaml")}
	l.e = startEnvoyAs(t, tg, a, workers, func(site EnvoySite) ([]byte, error) {
		if wasm != "" {
			site.WasmPath = wasm
		}
		l.site = site
		if err := writeLDS(site, l.path, "1", 0, config); err != nil {
			return nil, err
		}
		return renderTmpl(ldsBootstrapTmpl, ldsData{EnvoySite: site, LDSPath: l.path})
	}, args...)
	return l
}

// TestEnvoyReload: a configuration-only update through LDS keeps every key's state, and a
// configuration sluice refuses is refused by Envoy while the configuration in force keeps
// serving, its state intact.
//
// What Envoy does, measured on 1.36.4 and 1.40.0 (2 workers) and asserted below:
//   - The update changes only the listener's filter chain, so Envoy updates the listener in
//     place (listener_manager.listener_in_place_updated 1): the socket, and so the port, is
//     kept; new connections get the new chain; the old chain drains (total_filter_chains_
//     draining 1, back to 0 once --drain-time-s has passed) and its connections end; its
//     root contexts get proxy_on_done and proxy_on_delete then (TestEnvoyReloadRoots).
//   - The VMs are kept: the plugin's vm_config (and so its VM key) is unchanged, so the new
//     plugin configuration finds the base VM and each thread's VM in cpp-host's caches and
//     only creates root contexts in them (proxy_on_context_create, proxy_on_vm_start,
//     proxy_on_configure). What is created is one canary clone per update, good or bad,
//     which configures first and is dropped: wasm.envoy.wasm.runtime.v8.created goes from
//     workers+3 to workers+4 with the good update and workers+5 with the refused one, while
//     active stays workers+2 (base, main thread, one per worker) throughout, drain
//     included.
//   - Shared data is per vm_id and the VMs live on, so a rule's slots (keyed by plugin name
//     and rule name) are the same after the update: the counts carry over.
//   - The refused update: the canary's proxy_on_configure answers false (the guest logs its
//     reason at critical: "wasm log ... rules[0].window"), Envoy logs "Wasm VM failed
//     Failed to configure base Wasm plugin", "Plugin sluice failed to load" and, from the
//     main thread and each worker, "Plugin configured to fail closed failed to load" (the
//     refused configuration's own thread-local slots, never used for a request), then
//     "Filesystem config update rejected: Error adding/updating listener(s) ingress: Unable
//     to create Wasm plugin sluice" (1.40.0 first "lds: listener 'ingress' config rejected");
//     listener_manager.lds.update_rejected 1, update_success unchanged, no listener
//     change. The chain in force is the previous one.
func TestEnvoyReload(t *testing.T) {
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		t.Parallel()
		const workers = 2
		// --drain-time-s 1: the old filter chain drains in a second, not Envoy's default 600.
		l := startLDSEnvoy(t, tg, workers, "", reloadConfigV1, "--drain-time-s", "1")
		e := l.e
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		p := envoyProxy(t, e)
		// A connection per request: a kept-alive connection stays on the chain it was
		// accepted by (the old one, while it drains).
		c := newClient(1)
		c.Transport.(*http.Transport).DisableKeepAlives = true
		send := func(what string, req Request, want Expect) {
			t.Helper()
			r, err := do(ctx, c, p.url, req)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if err := want.Verify(r.status, r.header, r.body); err != nil {
				t.Fatalf("%s: %v (headers %v)", what, err, r.header)
			}
		}
		k1 := get("/r", "X-Api-Key", "k1")
		k2 := get("/r", "X-Api-Key", "k2")
		extra := get("/extra", "X-Extra-Key", "x")
		checkVMs(t, e, "start", workers+3, workers+2)

		for i := 1; i <= 3; i++ {
			send(fmt.Sprintf("v1: k1 request %d", i), k1, perKey(200, 5-i))
		}
		send("v1: no extra rule yet", extra, Expect{Status: 200, Header: noRateLimitHeaders()})

		// The configuration-only update: a second rule, the first one unchanged.
		l.push("2", reloadConfigV2)
		waitStat(ctx, t, e, "listener_manager.lds.update_success", 2)
		pollNewConfig(ctx, t, c, p.url, extra)
		st := stats(t, e, "listener_manager")
		if st["listener_manager.listener_in_place_updated"] != 1 || st["listener_manager.lds.update_rejected"] != 0 {
			t.Errorf("after the update: %v, want one in-place update and no rejection", st)
		}
		if p2 := envoyProxy(t, e); p2.url != p.url {
			t.Errorf("the listener moved from %s to %s", p.url, p2.url)
		}
		// k1 goes on where it was: 2 more admitted, then denied, as without the update.
		send("v2: k1 request 4", k1, perKey(200, 1))
		send("v2: k1 request 5", k1, perKey(200, 0))
		send("v2: k1 over the limit", k1, perKey(429, 0))
		send("v2: k2 request 1", k2, perKey(200, 4))
		send("v2: k2 request 2", k2, perKey(200, 3))
		// The old chain drains (--drain-time-s 1): the VMs stay, only the canary was added.
		waitStat(ctx, t, e, "listener_manager.total_filter_chains_draining", 0)
		checkVMs(t, e, "after the update and its drain", workers+4, workers+2)

		// A configuration sluice refuses: Envoy rejects the listener update.
		l.push("3", reloadConfigBad)
		waitStat(ctx, t, e, "listener_manager.lds.update_rejected", 1)
		for _, want := range []string{
			`rules[0].window: "10x" is not a duration`,
			"Failed to configure base Wasm plugin",
			// Both versions; 1.40.0 also logs "lds: listener 'ingress' config rejected: …".
			"Filesystem config update rejected: Error adding/updating listener(s) ingress: Unable to create Wasm plugin sluice",
		} {
			// The subscription logs the rejection just after it counts it: poll for the line.
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(e.Log(), want) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if !strings.Contains(e.Log(), want) {
				t.Errorf("envoy's log does not say %q", want)
			}
		}
		st = stats(t, e, "listener_manager")
		if st["listener_manager.lds.update_success"] != 2 || st["listener_manager.listener_in_place_updated"] != 1 ||
			st["listener_manager.total_filter_chains_draining"] != 0 {
			t.Errorf("after the refused update: %v, want update_success 2, one in-place update, nothing draining", st)
		}
		// v2 keeps serving, with its state.
		send("refused: v2's extra rule still in force", extra, extraRule(200, 98))
		send("refused: k1 still over the limit", k1, perKey(429, 0))
		send("refused: k2 request 3", k2, perKey(200, 2))
		checkVMs(t, e, "after the refused update", workers+5, workers+2)
		checkReloadHealthy(t, e)
	})
}

// perKey is the per-key rule's answer (5 per hour, sliding_log, headers "both").
func perKey(status, remaining int) Expect {
	h := map[string]Check{
		hRateLimitPolicy: Exact(`"per-key";q=5;w=3600`),
		hLimit:           Exact("5"),
		hRemaining:       Exact(fmt.Sprint(remaining)),
		hRateLimit:       Matches(fmt.Sprintf(`^"per-key";r=%d;t=(35[0-9]{2}|3600)$`, remaining)),
	}
	if status == 429 {
		h[hRetryAfter] = IntIn(3500, 3600)
	} else {
		h[hRetryAfter] = Absent()
	}
	return Expect{Status: status, Header: h}
}

// extraRule is the answer of v2's second rule (100 per hour, fixed_window).
func extraRule(status, remaining int) Expect {
	return Expect{Status: status, Header: map[string]Check{
		hRateLimitPolicy: Exact(`"extra";q=100;w=3600`),
		hRemaining:       Exact(fmt.Sprint(remaining)),
	}}
}

// pollNewConfig sends req until v2's extra rule answers it (remaining 99: the first request
// it counts): new connections get the updated chain once the listener has warmed.
func pollNewConfig(ctx context.Context, t *testing.T, c *http.Client, base string, req Request) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, err := do(ctx, c, base, req)
		if err != nil {
			t.Fatal(err)
		}
		if r.header.Get(hRateLimitPolicy) != "" {
			if err := extraRule(200, 99).Verify(r.status, r.header, r.body); err != nil {
				t.Fatalf("the first request of the new configuration: %v", err)
			}
			return
		}
		if err := (Expect{Status: 200, Header: noRateLimitHeaders()}).Verify(r.status, r.header, r.body); err != nil {
			t.Fatalf("before the new configuration serves: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the updated configuration did not serve within 20s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitStat(ctx context.Context, t *testing.T, e *envoyproc.Envoy, name string, want int64) {
	t.Helper()
	if _, err := e.WaitStat(ctx, name, func(v int64) bool { return v == want }); err != nil {
		t.Fatal(err)
	}
}

func stats(t *testing.T, e *envoyproc.Envoy, filter string) map[string]int64 {
	t.Helper()
	st, err := e.Stats(filter)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// checkVMs asserts wasm.envoy.wasm.runtime.v8.created and .active.
func checkVMs(t *testing.T, e *envoyproc.Envoy, stage string, created, active int64) {
	t.Helper()
	st := stats(t, e, "wasm.envoy.wasm.runtime")
	if c, a := st["wasm.envoy.wasm.runtime.v8.created"], st["wasm.envoy.wasm.runtime.v8.active"]; c != created || a != active {
		t.Errorf("%s: V8 VMs created %d, active %d; want %d and %d", stage, c, a, created, active)
	}
}

// checkReloadHealthy: checkEnvoyHealthy without its VM counts (checkVMs has the ones an
// update gives) and without the lines the refused update logs on purpose.
func checkReloadHealthy(t *testing.T, e *envoyproc.Envoy) {
	t.Helper()
	st := stats(t, e, "wasm")
	for name, v := range st {
		if strings.Contains(name, "vm_reload") && !strings.HasSuffix(name, "backoff") && v != 0 {
			t.Errorf("%s = %d: the plugin's VM was reloaded", name, v)
		}
	}
	if v, ok := st["wasmcustom.sluice.errors"]; !ok || v != 0 {
		t.Errorf("wasmcustom.sluice.errors = %d (present: %v), want 0", v, ok)
	}
	expected := regexp.MustCompile(`is not a duration|Failed to configure base Wasm plugin|Plugin sluice failed to load|Plugin configured to fail closed failed to load|Unable to create Wasm plugin sluice|wasm log sluice sluice: sluice: invalid plugin configuration`)
	for _, l := range strings.Split(e.Log(), "\n") {
		if envoyFailureLines.MatchString(l) && !expected.MatchString(l) {
			t.Errorf("envoy log shows a failure: %.400s", l)
		}
	}
}

const (
	reloadConfigV1 = `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"sliding_log","limit":5,"window":"1h"}],
 "response":{"headers":"both"}}`
	// v2: v1's rule unchanged, and a rule on other requests.
	reloadConfigV2 = `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"sliding_log","limit":5,"window":"1h"},
  {"name":"extra","match":{"path_prefix":"/extra"},"key":[{"header":"x-extra-key"}],"algorithm":"fixed_window","limit":100,"window":"1h"}],
 "response":{"headers":"both"}}`
	// Refused by sluice (proxy_on_configure false): not a duration.
	reloadConfigBad = `{"rules":[{"name":"per-key","key":[{"header":"x-api-key"}],"algorithm":"sliding_log","limit":5,"window":"10x"}],
 "response":{"headers":"both"}}`
)

// rootProbeWasm is testdata/rootprobe built for wasip1 and patched as the shipped module
// is (its poll_oneoff, for Envoys before cpp-host #533), once per test binary.
var rootProbeWasm = sync.OnceValues(func() (string, error) {
	return buildGuest("rootprobe.wasm", "./e2e/testdata/rootprobe", "", true)
})

var probeLine = regexp.MustCompile(`^\[([0-9-]+ [0-9:.]+)\]\[([0-9]+)\].*rootprobe: ([a-z_]+) root=([0-9]+) config=(.*)$`)

// probeEvent is one line of testdata/rootprobe in Envoy's log.
type probeEvent struct {
	at            time.Time
	thread        string
	event, config string
}

func probeEvents(log string) []probeEvent {
	var evs []probeEvent
	for _, l := range strings.Split(log, "\n") {
		m := probeLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		at, _ := time.Parse("2006-01-02 15:04:05.000", m[1])
		evs = append(evs, probeEvent{at: at, thread: m[2], event: m[3], config: m[5]})
	}
	return evs
}

func countEvents(evs []probeEvent, event, config string) int {
	n := 0
	for _, ev := range evs {
		if ev.event == event && ev.config == config {
			n++
		}
	}
	return n
}

// TestEnvoyReloadRoots: what Envoy does to the root contexts of a configuration an update
// replaced, read from the log of testdata/rootprobe (each root's lifecycle callbacks) —
// the same LDS update as TestEnvoyReload, configuration "v1" then "v2". Measured on 1.36.4
// and 1.40.0 with 2 workers, and asserted:
//   - At start-up workers+2 roots are created and configured with v1 (context create,
//     proxy_on_vm_start, proxy_on_configure): the canary's, the main thread's and one per
//     worker; the base VM gets none.
//   - The update creates workers+2 roots with v2 in the same way (a new canary clone, then
//     the main thread's and the workers' VMs: those VMs are kept, their root ids go on
//     counting, so a worker that served a stream gives the new root another id).
//   - The old roots stay until the old filter chain has drained: then each of the
//     workers+1 kept VMs runs proxy_on_done and proxy_on_delete on its v1 root, the
//     --drain-time-s after the update (2 s here; not earlier than 1.5 s is asserted). The
//     canaries' roots never get either: a canary is dropped once configured. No v2 root
//     ends.
func TestEnvoyReloadRoots(t *testing.T) {
	skipShort(t, "builds the root probe (go build) and runs real Envoy")
	wasm, err := rootProbeWasm()
	if err != nil {
		t.Fatal(err)
	}
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		t.Parallel()
		const workers = 2
		l := startLDSEnvoy(t, tg, workers, wasm, "v1", "--drain-time-s", "2")
		e := l.e
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		p := envoyProxy(t, e)
		c := newClient(1)
		c.Transport.(*http.Transport).DisableKeepAlives = true
		if r, err := do(ctx, c, p.url, get("/")); err != nil || r.status != 200 {
			t.Fatalf("a request through v1: %v, %d", err, r.status)
		}
		evs := probeEvents(e.Log())
		for _, ev := range []string{"create", "vm_start"} {
			if n := countEvents(evs, ev, ""); n != workers+2 {
				t.Errorf("start-up: %d root %s, want %d", n, ev, workers+2)
			}
		}
		if n := countEvents(evs, "configure", "v1"); n != workers+2 {
			t.Errorf("start-up: %d roots configured with v1, want %d", n, workers+2)
		}
		l.push("2", "v2")
		waitStat(ctx, t, e, "listener_manager.lds.update_success", 2)
		// The old roots end when the old chain is gone: wait for their proxy_on_delete.
		deadline := time.Now().Add(30 * time.Second)
		for countEvents(probeEvents(e.Log()), "delete", "v1") < workers+1 {
			if time.Now().After(deadline) {
				t.Fatalf("the v1 roots did not all end within 30 s of the update")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if r, err := do(ctx, c, p.url, get("/")); err != nil || r.status != 200 {
			t.Fatalf("a request through v2: %v, %d", err, r.status)
		}
		evs = probeEvents(e.Log())
		if n := countEvents(evs, "configure", "v2"); n != workers+2 {
			t.Errorf("update: %d roots configured with v2, want %d", n, workers+2)
		}
		var firstV2 time.Time
		doneThreads := map[string]bool{}
		for _, ev := range evs {
			switch {
			case ev.event == "configure" && ev.config == "v2" && firstV2.IsZero():
				firstV2 = ev.at
			case ev.event == "done" && ev.config == "v1":
				doneThreads[ev.thread] = true
				if d := ev.at.Sub(firstV2); firstV2.IsZero() || d < 1500*time.Millisecond {
					t.Errorf("a v1 root got proxy_on_done %v after the first v2 configure, want the drain time (2 s) after it", d)
				}
			case ev.config == "v2" && (ev.event == "done" || ev.event == "delete"):
				t.Errorf("a v2 root ended: %+v", ev)
			}
		}
		if n := countEvents(evs, "done", "v1"); n != workers+1 || len(doneThreads) != workers+1 {
			t.Errorf("%d v1 roots got proxy_on_done on %d threads, want %d on %d (main thread and workers)", n, len(doneThreads), workers+1, workers+1)
		}
		if n := countEvents(evs, "delete", "v1"); n != workers+1 {
			t.Errorf("%d v1 roots got proxy_on_delete, want %d", n, workers+1)
		}
		checkVMs(t, e, "after the update and its drain", workers+4, workers+2)
	})
}
