package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/wasmpatch"
)

var (
	redisWasmOnce sync.Once
	redisWasmPath string
	redisWasmErr  error
)

// buildRedisWasm builds sluice-redis.wasm (cmd/sluice-wasm with -tags redis) once.
func buildRedisWasm(t testing.TB) string {
	t.Helper()
	skipShort(t, "builds sluice-redis.wasm (go build, GOOS=wasip1)")
	redisWasmOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-redis-wasm-")
		if err != nil {
			redisWasmErr = err
			return
		}
		out := filepath.Join(dir, "sluice-redis.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-tags", "redis", "-o", out, ".")
		cmd.Dir = "../sluice-wasm"
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if msg, err := cmd.CombinedOutput(); err != nil {
			redisWasmErr = fmt.Errorf("building sluice-redis.wasm: %v\n%s", err, msg)
			return
		}
		if redisWasmErr = wasmpatch.PatchFile(out); redisWasmErr != nil {
			return
		}
		redisWasmPath = out
	})
	if redisWasmErr != nil {
		t.Fatal(redisWasmErr)
	}
	return redisWasmPath
}

// Three `sluice run` servers (in this process, each with its own host, shared data and Redis
// clients) share one Redis Cluster: 3,000 concurrent HTTP requests on one key, limit 100
// per hour, exactly 100 admitted across the three.
func TestRunThreeInstancesShareRedisLimits(t *testing.T) {
	c := testCluster(t)
	withRedisClusters(t, redisClusterFlag{"redis": c.Addrs})
	rule := fmt.Sprintf("run-%d", time.Now().UnixNano())
	cfgPath := writeFile(t, "sluice.json", `{"rules":[{"name":"`+rule+`","key":[{"header":"x-api-key"}],
"algorithm":"sliding_window","limit":100,"window":"1h","backend":"redis"}],
"failure_mode":"closed","redis":{"cluster":"redis","timeout_ms":5000,"instances":3}}`)
	var addrs []string
	for i := 0; i < 3; i++ {
		rs, _, _ := startTestRun(t, runConfig{wasm: buildRedisWasm(t), configPath: cfgPath, clusters: clusterFlag{}, workers: 2})
		addrs = append(addrs, rs.listenAddr)
	}
	const requests = 3000
	start := time.Now()
	r := fire(t, addrs, requests, 0, "k1")
	t.Logf("%d HTTP requests through 3 sluice run instances in %v: %d admitted, %d denied, %d other", requests, time.Since(start).Round(time.Millisecond), r.ok, r.denied, r.other)
	if r.ok != 100 || r.denied != requests-100 {
		t.Fatalf("admitted %d denied %d other %d, want exactly 100 admitted", r.ok, r.denied, r.other)
	}
}
