package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// startServeReplica runs `sluice serve` as a child process (TestServeHelperProcess) on
// the cluster and returns its gRPC address.
func startServeReplica(t *testing.T, addrs []string, inline string) string {
	t.Helper()
	skipShort(t, "runs sluice serve as a child process")
	// A Redis timeout of 5 s, like the Redis backend's e2e test: a loaded machine must not
	// turn a slow Redis reply into UNAVAILABLE (and failure_mode closed into 503s).
	args := []string{"--listen", "127.0.0.1:0", "--redis-cluster", strings.Join(addrs, ","), "--inline-domains", inline, "--redis-timeout", "5s"}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServeHelperProcess$")
	cmd.Env = append(os.Environ(), "SLUICE_SERVE_HELPER=1", "SLUICE_SERVE_ARGS="+strings.Join(args, "\n"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	log := newLineLog(stderr)
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return log.wait(t, regexp.MustCompile(`grpc=(\S+)`), 20*time.Second)[1]
}

// startLoggedRun is startTestRun keeping the server's log (stderr).
func startLoggedRun(t *testing.T, cfg runConfig) (*runServer, *syncBuffer) {
	t.Helper()
	cfg.listen, cfg.logLevel, cfg.memoryMB, cfg.vmID = "127.0.0.1:0", "debug", 256, "sluice"
	ctx, cancel := context.WithCancel(context.Background())
	errOut := &syncBuffer{}
	rs, err := startRun(ctx, cfg, &syncBuffer{}, errOut)
	if err != nil {
		cancel()
		t.Fatalf("startRun: %v\n%s", err, errOut)
	}
	t.Cleanup(func() {
		cancel()
		rs.wait()
	})
	return rs, errOut
}

// fired counts the answers of fire: 200s, 429s carrying Retry-After, and
// anything else (other, each described in others), of which unavailable
// are the 503s.
type fired struct {
	ok, denied, other, unavailable int64
	others                         []string
}

// fire sends n concurrent GETs with header x-api-key: key, spread over
// addrs, at most inFlight at a time (0: all at once, over 64 connections
// per proxy), and counts the answers.
func fire(t *testing.T, addrs []string, n, inFlight int, key string) fired {
	t.Helper()
	conns := 64
	if inFlight > 0 {
		conns = inFlight
	}
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: conns, MaxIdleConnsPerHost: conns}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var okN, deniedN, otherN, unavailableN atomic.Int64
	var mu sync.Mutex
	var others []string
	note := func(s string) {
		otherN.Add(1)
		mu.Lock()
		others = append(others, s)
		mu.Unlock()
	}
	var sem chan struct{}
	if inFlight > 0 {
		sem = make(chan struct{}, inFlight)
	}
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		if sem != nil {
			sem <- struct{}{}
		}
		go func(i int) {
			defer wg.Done()
			if sem != nil {
				defer func() { <-sem }()
			}
			req, _ := http.NewRequest("GET", "http://"+addrs[i%len(addrs)]+"/v1/items", nil)
			req.Header.Set("x-api-key", key)
			resp, err := client.Do(req)
			if err != nil {
				note(err.Error())
				return
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == 200:
				okN.Add(1)
			case resp.StatusCode == 429 && resp.Header.Get("Retry-After") != "":
				deniedN.Add(1)
			default:
				if resp.StatusCode == 503 {
					unavailableN.Add(1)
				}
				note(fmt.Sprintf("%d %q", resp.StatusCode, body))
			}
		}(i)
	}
	wg.Wait()
	return fired{ok: okN.Load(), denied: deniedN.Load(), other: otherN.Load(), unavailable: unavailableN.Load(), others: others}
}

// Mesh-wide limits on the standard sluice.wasm: three `sluice run` proxies with backend
// "rls" call two `sluice serve` replicas (child processes) sharing a 3-master Redis
// Cluster through proxy_grpc_call; 3,000 concurrent requests on one key with a limit of 100
// admit exactly 100 across the three, for every algorithm.
func TestRunThreeProxiesShareRLSLimits(t *testing.T) {
	c := testCluster(t)
	replicas := []string{startServeReplica(t, c.Addrs, "mesh"), startServeReplica(t, c.Addrs, "mesh")}
	wasm := buildWasm(t, "../sluice-wasm")
	cache := t.TempDir() // one compilation for every proxy
	stamp := time.Now().UnixNano()
	for _, alg := range []string{"token_bucket", "sliding_window", "fixed_window", "sliding_log", "leaky_bucket"} {
		t.Run(alg, func(t *testing.T) {
			extra := ""
			if alg == "token_bucket" || alg == "leaky_bucket" {
				extra = `,"burst":100`
			}
			cfgPath := writeFile(t, "sluice.json", fmt.Sprintf(`{"rules":[{"name":"rls-%s-%d","key":[{"header":"x-api-key"}],
"algorithm":%q,"limit":100,"window":"1h"%s,"backend":"rls"}],
"failure_mode":"closed","rls":{"cluster":"rls","domain":"mesh","timeout_ms":5000}}`, alg, stamp, alg, extra))
			var addrs []string
			var logs []*syncBuffer
			for i := 0; i < 3; i++ {
				rs, errOut := startLoggedRun(t, runConfig{wasm: wasm, configPath: cfgPath, clusters: clusterFlag{"rls": "http://" + replicas[i%2]}, workers: 2, cacheDir: cache})
				addrs, logs = append(addrs, rs.listenAddr), append(logs, errOut)
			}
			const requests = 3000
			start := time.Now()
			r := fire(t, addrs, requests, 0, "k1")
			ok, denied, other, others := r.ok, r.denied, r.other, r.others
			t.Logf("%s: %d HTTP requests through 3 sluice run instances and 2 sluice serve replicas in %v: %d admitted, %d denied, %d other",
				alg, requests, time.Since(start).Round(time.Millisecond), ok, denied, other)
			if ok != 100 || denied != requests-100 {
				for _, l := range logs { // the host logs why a call failed at debug level
					for _, line := range strings.Split(l.String(), "\n") {
						if strings.Contains(line, "grpc call failed") {
							t.Log(line)
							break
						}
					}
				}
				t.Fatalf("admitted %d denied %d other %d (%q), want exactly 100 admitted", ok, denied, other, others)
			}
		})
	}
}

// failure_mode with the service down (nothing listens on the cluster's address): closed
// answers 503, open lets the request through, local limits on the proxy with the limit
// divided by rls.instances.
func TestRunRLSServiceDown(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + lis.Addr().String()
	lis.Close()
	wasm := buildWasm(t, "../sluice-wasm")
	cache := t.TempDir()
	for mode, want := range map[string][]int{"closed": {503, 503, 503}, "open": {200, 200, 200}, "local": {200, 200, 429}} {
		t.Run(mode, func(t *testing.T) {
			cfgPath := writeFile(t, "sluice.json", `{"rules":[{"name":"down","key":[{"header":"x-api-key"}],
"algorithm":"fixed_window","limit":10,"window":"1h","backend":"rls"}],
"failure_mode":"`+mode+`","rls":{"cluster":"rls","domain":"mesh","timeout_ms":2000,"instances":5}}`)
			rs, _, _ := startTestRun(t, runConfig{wasm: wasm, configPath: cfgPath, clusters: clusterFlag{"rls": down}, workers: 1, cacheDir: cache})
			var got []int
			for i := 0; i < 3; i++ {
				resp, _ := httpGet(t, "http://"+rs.listenAddr+"/v1/items", "x-api-key", "k")
				got = append(got, resp.StatusCode)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("statuses %v, want %v", got, want)
			}
		})
	}
}

// The README's example configuration for backend "rls" is one sluice.wasm loads.
func TestRLSExampleConfig(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := dispatch([]string{"check", "../../envoy/rls.json"}, &out, &errOut); code != 0 {
		t.Fatalf("sluice check envoy/rls.json: exit %d\n%s%s", code, out.String(), errOut.String())
	}
}
