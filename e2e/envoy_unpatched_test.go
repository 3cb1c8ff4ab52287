package e2e

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// buildUnpatchedWasm builds sluice.wasm as shippedWasm does (-trimpath) but leaves out
// wasmpatch.PatchFile: the Go runtime's poll_oneoff calls go to the host.
func buildUnpatchedWasm(t *testing.T) string {
	t.Helper()
	skipShort(t, "builds the wasm module (go build)")
	out, err := buildGuest("sluice-unpatched.wasm", "./cmd/sluice-wasm", "", false)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := wasmpatch.PollOneoff(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(patched) == string(b) {
		t.Fatal("the unpatched build is unchanged by wasmpatch.PollOneoff: it is not the control")
	}
	return out
}

// cppHostHasPollOneoff reports whether an Envoy version's proxy-wasm-cpp-host answers
// poll_oneoff (PR #533, first in Envoy 1.39.0); ok is false when the version is not a
// release number (ENVOY=docker:IMAGE).
func cppHostHasPollOneoff(version string) (has, ok bool) {
	m := releaseRE.FindStringSubmatch(version)
	if m == nil {
		return false, false
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return major > 1 || (major == 1 && minor >= 39), true
}

var releaseRE = regexp.MustCompile(`^([0-9]+)\.([0-9]+)\.[0-9]+`)

// vmDeathLines are what Envoy logs when the unpatched module's VM dies: the guest's runtime
// throws on poll_oneoff's ENOSYS (its stderr reaches Envoy's log through fd_write as "wasm
// log" lines), and the call into the VM traps.
var vmDeathLines = []*regexp.Regexp{
	regexp.MustCompile(`wasm log .*fatal error: $|wasm log .*poll_oneoff failed`),
	regexp.MustCompile(`Function: proxy_on_[a-z_]+ failed: Uncaught RuntimeError: unreachable`),
}

// TestEnvoyUnpatched is the control of TestEnvoySurvival: the same traffic, the module built
// without the wasmpatch shim, so the Go runtime's poll_oneoff calls reach the host.
//
// Envoy before 1.39 (cpp-host without PR #533, here 1.36.4) answers ENOSYS. What this test
// saw there, every run: the VM dies within the first few thousand requests — the guest's
// collection at the start of a callback restarts the world, the runtime's netpoll calls
// poll_oneoff, ENOSYS, runtime.throw, whose usleep calls it again: "panic during panic",
// abort, "Function: proxy_on_… failed: Uncaught RuntimeError: unreachable"; FAIL_CLOSED
// answers every later request 503 and the VM never comes back. The index follows the guest's
// collections, so its allocation rate: 159 to 485 in six runs of an early build, 1,973 to
// 3,455 in six of the current one, once beyond 4,000; so the control sends until it has seen
// the death (unpatchedDeadAnswers dead answers), at most unpatchedMaxRequests.
// Envoy keeps the dead VM: wasm.envoy.wasm.runtime.v8 created and active do not move and no
// vm_reload is counted, so of checkEnvoyHealthy's signals the log is the one that fires —
// the test asserts that it does (the harness sees the death), and that the lifecycle counters
// stay as they are (so that a change there is noticed). When exactly the VM dies is not
// deterministic and is not asserted, only that it does within unpatchedMaxRequests.
//
// From 1.39 on (here 1.40.0) cpp-host answers poll_oneoff itself (no events, success, as the
// shim does): the unpatched module survives the stage exactly as the shipped one.
func TestEnvoyUnpatched(t *testing.T) {
	wasm := buildUnpatchedWasm(t)
	window := steadyWindow(30 * time.Minute)
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		t.Parallel()
		fixed, ok := cppHostHasPollOneoff(tg.Version)
		if !ok {
			t.Skipf("envoy %q: not a release number, so whether its cpp-host has PR #533 is unknown", tg.Version)
		}
		e := startEnvoy(t, tg, 1, renderEnvoySurvivalStage(wasm, window))
		p := envoyProxy(t, e)
		if fixed {
			checkSurvived(t, e, artWasm, sendSurvivalTraffic(t, p.url, envoySurvivalRequests, 3*time.Minute, nil))
			return
		}
		// Until the VM has answered unpatchedDeadAnswers requests dead, or at most
		// unpatchedMaxRequests.
		res := sendSurvivalTraffic(t, p.url, unpatchedMaxRequests, 3*time.Minute, func(r *survivalResult) bool {
			return r.statuses[503] >= unpatchedDeadAnswers
		})
		checkVMDeath(t, e, res)
	})
}

// The control's traffic on an Envoy whose cpp-host lacks PR #533: at most
// unpatchedMaxRequests, ending once unpatchedDeadAnswers requests got the dead VM's 503
// (enough to see FAIL_CLOSED keep it dead).
const (
	unpatchedMaxRequests = 16000
	unpatchedDeadAnswers = 300
)

// checkVMDeath asserts what an Envoy without cpp-host PR #533 does with the unpatched
// module (see TestEnvoyUnpatched).
func checkVMDeath(t *testing.T, e *envoyproc.Envoy, res survivalResult) {
	t.Helper()
	if res.errors != 0 {
		t.Errorf("%d requests sent, %d transport errors (first: %v)", res.sent, res.errors, res.firstErr)
	}
	for s := range res.statuses {
		if s != 200 && s != 429 && s != 503 {
			t.Errorf("statuses %v: want only 200, 429 and (from the VM's death on) 503", res.statuses)
		}
	}
	if res.statuses[503] == 0 {
		t.Fatalf("statuses %v: no 503 — the VM did not die", res.statuses)
	}
	// FAIL_CLOSED: once a client got the dead VM's 503, it gets nothing else.
	for g, seq := range res.perClient {
		for i, s := range seq {
			if s == 503 {
				for j, later := range seq[i+1:] {
					if later != 503 {
						t.Errorf("client %d: response %d is %d after a 503 at %d: the VM came back", g, i+1+j, later, i)
						break
					}
				}
				break
			}
		}
	}
	signals, lines := envoyFailureSignals(e, 1)
	logSignal := false
	for _, s := range signals {
		logSignal = logSignal || strings.HasSuffix(s, "failure lines in the log")
	}
	if !logSignal {
		t.Errorf("the VM died (%d × 503) but checkEnvoyHealthy's log signal did not fire (signals: %v)", res.statuses[503], signals)
	}
	for _, re := range vmDeathLines {
		found := false
		for _, l := range lines {
			found = found || re.MatchString(l)
		}
		if !found {
			t.Errorf("no log line matching %q among the %d failure lines", re, len(lines))
		}
	}
	st, err := e.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	if c, a := st["wasm.envoy.wasm.runtime.v8.created"], st["wasm.envoy.wasm.runtime.v8.active"]; c != 4 || a != 3 {
		t.Errorf("wasm.envoy.wasm.runtime.v8 created %d, active %d: FAIL_CLOSED kept the dead VM so far (4 and 3)", c, a)
	}
	if v := st["wasm.sluice.vm_reload"]; v != 0 {
		t.Errorf("wasm.sluice.vm_reload = %d: FAIL_CLOSED reloaded nothing so far", v)
	}
	if v := st["http.ingress_http.downstream_rq_5xx"]; v != int64(res.statuses[503]) {
		t.Errorf("http.ingress_http.downstream_rq_5xx = %d, want the %d 503s the clients got", v, res.statuses[503])
	}
	t.Logf("the VM died at request %d: statuses %v in %v; signals %v", res.first, res.statuses, res.elapsed.Round(time.Millisecond), signals)
}
