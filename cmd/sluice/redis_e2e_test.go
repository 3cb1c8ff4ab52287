package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
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
func buildRedisWasm(t *testing.T) string {
	t.Helper()
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
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 64, MaxIdleConnsPerHost: 64}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	const requests = 3000
	var ok, denied, other atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < requests; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "http://"+addrs[i%3]+"/v1/items", nil)
			req.Header.Set("x-api-key", "k1")
			resp, err := client.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == 200:
				ok.Add(1)
			case resp.StatusCode == 429 && resp.Header.Get("Retry-After") != "":
				denied.Add(1)
			default:
				other.Add(1)
			}
		}(i)
	}
	wg.Wait()
	t.Logf("%d HTTP requests through 3 sluice run instances in %v: %d admitted, %d denied, %d other", requests, time.Since(start).Round(time.Millisecond), ok.Load(), denied.Load(), other.Load())
	if ok.Load() != 100 || denied.Load() != requests-100 {
		t.Fatalf("admitted %d denied %d other %d, want exactly 100 admitted", ok.Load(), denied.Load(), other.Load())
	}
}
