package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
)

// top_keys.gauges in real Envoy (sluice.wasm; the dynamic module cannot set a gauge): the
// traffic of TestEnvoyAccessLogDecisions, and when the period of the abuse ends — a tick
// ends it, no request needed — wasmcustom.sluice.per-key.top_denied_1 … _5 hold the
// counts of that period's log line, rank by rank (the 5 abusers' 20 each when the burst
// fell in one period); the next, quiet, period sets them back to 0.
func TestEnvoyTopKeysGauges(t *testing.T) {
	cfg := strings.Replace(accessLogConfig, `"log_top":5}`, `"log_top":5,"gauges":5}`, 1)
	if cfg == accessLogConfig {
		t.Fatal("the configuration has no gauges")
	}
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		render := func(site EnvoySite) ([]byte, error) {
			return renderEnvoy(envoyBootstrap{EnvoySite: site, Name: "top-gauges", Config: cfg, CatchAll: true})
		}
		e := startEnvoyAs(t, tg, artWasm, 2, render, "--component-log-level", "wasm:info")
		p := envoyProxy(t, e)
		if refused := sendAccessLogTraffic(t, p.url); refused != accessLogAbusers*(accessLogAbuse-accessLogLimit) {
			t.Fatalf("%d refusals", refused)
		}
		counts := waitDeniedLine(t, e)
		t.Logf("the abuse's period: top 5 denials %v", counts)
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		for r, want := range counts {
			name := fmt.Sprintf("wasmcustom.sluice.per-key.top_denied_%d", r+1)
			if _, err := e.WaitStat(ctx, name, func(v int64) bool { return v == want }); err != nil {
				t.Fatalf("rank %d of the line %v: %v", r+1, counts, err)
			}
		}
		if counts[0]+counts[1]+counts[2]+counts[3]+counts[4] == int64(accessLogAbusers*(accessLogAbuse-accessLogLimit)) {
			for r, v := range counts {
				if v != accessLogAbuse-accessLogLimit {
					t.Errorf("rank %d: %d denials, want %d", r+1, v, accessLogAbuse-accessLogLimit)
				}
			}
		}
		quiet, cancelQuiet := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancelQuiet()
		if _, err := e.WaitStat(quiet, "wasmcustom.sluice.per-key.top_denied_1", func(v int64) bool { return v == 0 }); err != nil {
			t.Fatalf("after a quiet period: %v", err)
		}
		checkAccessLogHealthy(t, e, artWasm)
	})
}

var lineCount = regexp.MustCompile(`=(\d+)`)

// waitDeniedLine waits for the first top keys line of denials with more than one (a period
// of the abuse) and returns its 5 counts, largest first.
func waitDeniedLine(t *testing.T, e *envoyproc.Envoy) []int64 {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, m := range topDeniedLine.FindAllStringSubmatch(e.Log(), -1) {
			if m[1] == "1" {
				continue
			}
			var counts []int64
			for _, c := range lineCount.FindAllStringSubmatch(m[3], -1) {
				n, _ := strconv.ParseInt(c[1], 10, 64)
				counts = append(counts, n)
			}
			if len(counts) != 5 {
				t.Fatalf("line %q: %d keys, want 5", m[0], len(counts))
			}
			return counts
		}
	}
	t.Fatal("no top keys line of the abuse in Envoy's log")
	return nil
}
