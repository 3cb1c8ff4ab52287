package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// A configuration reload while requests are held: they are neither dropped nor released
// early. The root context that held them drains, ticking, and releases each at its slot;
// new requests meet the new configuration.

// shapeConfigV2 changes the shaped rule's rate (20/s): a real update.
var shapeConfigV2 = strings.Replace(shapeConfig, `"limit":10`, `"limit":20`, 1)

// checkHeldThroughReload checks the 10 results of a burst, sent before the reload, on a
// fresh key: one at once, nine held to their slots (+100 ms … +900 ms), every one 200.
func checkHeldThroughReload(t *testing.T, res []shapeResult) {
	t.Helper()
	var delays []int
	for i, r := range res {
		if r.err != nil || r.status != 200 {
			t.Fatalf("request %d across the reload: %d %v", i, r.status, r.err)
		}
		if r.delayMS != "" {
			ms, _ := strconv.Atoi(r.delayMS)
			delays = append(delays, ms)
		}
	}
	sort.Ints(delays)
	if len(delays) != 9 {
		t.Fatalf("%d requests were held, want 9: %v", len(delays), delays)
	}
	for k, ms := range delays {
		slot := (k + 1) * 100
		if ms < slot-20 || ms > slot+int(shapeLate/time.Millisecond) {
			t.Errorf("held request %d: held %d ms, its slot %d ms", k, ms, slot)
		}
	}
	t.Logf("held across the reload: %v ms", delays)
}

// TestRunShapingAcrossReload: SIGHUP while nine requests are held.
func TestRunShapingAcrossReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte(shapeConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := sluiceCmd(t, path, 2)
	p := startHostCmd(t, cmd)
	done := make(chan []shapeResult, 1)
	go func() {
		res, _, _ := shapeBurst(t, p.url, "reload", 10)
		done <- res
	}()
	time.Sleep(250 * time.Millisecond) // the first two released, seven still held
	if err := os.WriteFile(path, []byte(shapeConfigV2), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// Confirm the new configuration is in force while the burst is still held: a fresh
	// key's second request is held 50 ms under the new rate, 100 ms under the old.
	for i := 0; ; i++ {
		res, _, _ := shapeBurst(t, p.url, "probe-"+strconv.Itoa(i), 2)
		if heldAtMost(res, 75) {
			break
		}
		if i == 20 {
			t.Fatal("the new configuration is not in force 20 probes after SIGHUP")
		}
	}
	select {
	case <-done:
		t.Fatal("the burst was released before the reload was in force: the test did not reload while holding")
	default:
	}
	checkHeldThroughReload(t, <-done)
	// The new rate: a fresh key's burst of 3 is held 50 ms apart.
	res, _, _ := shapeBurst(t, p.url, "after", 3)
	var ms []int
	for _, r := range res {
		if r.delayMS != "" {
			v, _ := strconv.Atoi(r.delayMS)
			ms = append(ms, v)
		}
	}
	sort.Ints(ms)
	if len(ms) != 2 || ms[0] > 50+int(shapeLate/time.Millisecond) || ms[1] < 100-20 || ms[1] > 100+int(shapeLate/time.Millisecond) {
		t.Errorf("after the reload, a burst of 3 was held %v ms, want about [50 100] (20/s)", ms)
	}
	checkHostHealthy(t, p)
}

// TestEnvoyShapingAcrossReload: an LDS update while nine requests are held. The update
// replaces the listener's filter chain in place; the old one drains (--drain-time-s 5),
// its root context ticking, and releases the held requests at their slots.
func TestEnvoyShapingAcrossReload(t *testing.T) {
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		l := startLDSEnvoy(t, tg, 2, "", shapeConfig, "--drain-time-s", "5")
		e := l.e
		p := envoyProxy(t, e)
		done := make(chan []shapeResult, 1)
		go func() {
			res, _, _ := shapeBurst(t, p.url, "reload", 10)
			done <- res
		}()
		time.Sleep(250 * time.Millisecond)
		l.push("2", shapeConfigV2)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		waitStat(ctx, t, e, "listener_manager.lds.update_success", 2)
		select {
		case <-done:
			t.Fatal("the burst was released before the update was in force: the test did not reload while holding")
		default:
		}
		checkHeldThroughReload(t, <-done)
		st := stats(t, e, `wasmcustom\.sluice\.db\.`)
		if st["wasmcustom.sluice.db.delayed"] != 9 || st["wasmcustom.sluice.db.held"] != 0 || st["wasmcustom.sluice.db.delay_abandoned"] != 0 {
			t.Errorf("after the reload: %v, want 9 delayed, 0 held, 0 abandoned", st)
		}
		checkReloadHealthy(t, e) // the update's canary VM is one more created
	})
}

// heldAtMost reports whether every held request of res was held at most ms milliseconds
// (and one was held).
func heldAtMost(res []shapeResult, ms int) bool {
	held := false
	for _, r := range res {
		if r.delayMS == "" {
			continue
		}
		v, err := strconv.Atoi(r.delayMS)
		if err != nil || v > ms {
			return false
		}
		held = true
	}
	return held
}
