package e2e

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/e2e/envoyproc"
	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

// redisWasm is sluice-redis.wasm built as `make wasm` builds it (-trimpath -tags redis, then
// wasmpatch), once per test binary, next to shippedWasm's module.
var redisWasm = sync.OnceValues(func() (string, error) {
	return buildGuest("sluice-redis.wasm", "./cmd/sluice-wasm", "redis", true)
})

// TestEnvoyRedisModuleRefused: sluice-redis.wasm imports Higress's Redis host calls
// (env.proxy_redis_init, env.proxy_redis_call), which stock Envoy does not have. Envoy
// refuses the module at start-up and exits with status 1 (1.36.4 and 1.40.0); its log
// names the missing import — V8's link stops at the first one, so it names
// env.proxy_redis_init only — then "Unable to create Wasm plugin sluice". Each Envoy runs
// with one of the scenarios' plain configurations (no redis backend): the module, not the
// configuration, is refused.
func TestEnvoyRedisModuleRefused(t *testing.T) {
	skipShort(t, "builds sluice-redis.wasm (go build) and runs real Envoy")
	wasm, err := redisWasm()
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"proxy_redis_init", "proxy_redis_call"} {
		if !wasmpatch.ImportsFunction(mod, "env", f) {
			t.Fatalf("sluice-redis.wasm does not import env.%s", f)
		}
	}
	forEachEnvoy(t, func(t *testing.T, tg envoyproc.Target) {
		t.Parallel()
		sc := Scenario{Name: "redis-module-refused", Config: `{"rules":[{"name":"r","key":[{"remote_ip":true}],"algorithm":"fixed_window","limit":5,"window":"1s"}]}`}
		e, err := tryStartEnvoy(t, tg, 2, func(site EnvoySite) ([]byte, error) {
			site.WasmPath = wasm
			return RenderEnvoy(sc, site)
		})
		if err == nil {
			t.Fatalf("envoy %s became ready with sluice-redis.wasm; its log:\n%s", tg.Version, boundedLog(e.Log()))
		}
		// Start's error when the process exited before /ready: its exit status and log.
		text := err.Error()
		for _, want := range []string{
			"exited before it was ready (exit status 1)",
			"Failed to load Wasm module due to a missing import: env.proxy_redis_init",
			"Unable to create Wasm plugin sluice",
		} {
			if !strings.Contains(text, want) {
				t.Errorf("envoy %s: %q not in:\n%s", tg.Version, want, boundedLog(text))
			}
		}
	})
}
