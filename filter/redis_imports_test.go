package filter_test

import (
	"slices"
	"strings"
	"testing"
)

// The calls only sluice-redis.wasm imports: Higress's Redis extension, which upstream Envoy
// lacks, so sluice.wasm must import neither. (The calls that resume a paused stream and run
// the guard's tick are imported by both artifacts: the rls backend uses them too.)
var redisOnlyImports = []string{
	"proxy_redis_call",
	"proxy_redis_init",
}

// Both artifacts' imports, listed and pinned.
func TestRedisModuleImports(t *testing.T) {
	plain, plainExports := moduleImportsExports(t, "")
	redis, redisExports := moduleImportsExports(t, "redis")
	t.Logf("sluice.wasm imports env: %s", strings.Join(plain["env"], " "))
	t.Logf("sluice-redis.wasm imports env: %s", strings.Join(redis["env"], " "))
	for _, n := range redisOnlyImports {
		if slices.Contains(plain["env"], n) {
			t.Errorf("sluice.wasm imports env.%s", n)
		}
	}
	want := slices.Sorted(slices.Values(append(slices.Clone(wantProxyImports), redisOnlyImports...)))
	if !slices.Equal(redis["env"], want) {
		t.Errorf("sluice-redis.wasm env imports:\n got %s\nwant %s", strings.Join(redis["env"], " "), strings.Join(want, " "))
	}
	if !slices.Equal(redis["wasi_snapshot_preview1"], plain["wasi_snapshot_preview1"]) {
		t.Errorf("WASI imports differ: %v vs %v", redis["wasi_snapshot_preview1"], plain["wasi_snapshot_preview1"])
	}
	const cb = "proxy_on_redis_call_response"
	if slices.Contains(plainExports, cb) || !slices.Contains(redisExports, cb) {
		t.Errorf("%s: exported by sluice.wasm %v, by sluice-redis.wasm %v", cb, slices.Contains(plainExports, cb), slices.Contains(redisExports, cb))
	}
	wantRedisExports := slices.Sorted(slices.Values(append(slices.Clone(plainExports), cb)))
	if !slices.Equal(redisExports, wantRedisExports) {
		t.Errorf("sluice-redis.wasm exports %v, want %v", redisExports, wantRedisExports)
	}
}
