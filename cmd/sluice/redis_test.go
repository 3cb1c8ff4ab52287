package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// The Redis tests of this package share one cluster, started by the first test that needs
// it and stopped by TestMain; tests that do not need it do not start it.
var (
	clusterOnce sync.Once
	clusterDir  string
	cluster     *redistest.Cluster
	clusterErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if cluster != nil {
		cluster.Close()
	}
	if clusterDir != "" {
		os.RemoveAll(clusterDir)
	}
	os.Exit(code)
}

func testCluster(t testing.TB) *redistest.Cluster {
	t.Helper()
	redistest.SkipShort(t)
	clusterOnce.Do(func() {
		if clusterDir, clusterErr = os.MkdirTemp("", "sluice-run-redis-"); clusterErr != nil {
			return
		}
		cluster, clusterErr = redistest.Start(clusterDir, 3)
	})
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return cluster
}

// withRedisClusters sets what --redis-cluster would have set, for startRun.
func withRedisClusters(t testing.TB, c redisClusterFlag) {
	redisClusters = c
	t.Cleanup(func() { redisClusters = redisClusterFlag{} })
}

func writeFile(t testing.TB, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRedisClusterFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--redis-cluster", "noequals"}, "redis cluster must be NAME=HOST:PORT"},
		{[]string{"--redis-cluster", "rc=127.0.0.1"}, `bad address "127.0.0.1"`},
		{[]string{"--redis-cluster", "rc=127.0.0.1:1", "--redis-cluster", "rc=127.0.0.1:2"}, `redis cluster "rc" given twice`},
	} {
		var out, errOut bytes.Buffer
		code := dispatch(append([]string{"run"}, tc.args...), &out, &errOut)
		if code != 2 || !strings.Contains(errOut.String(), tc.msg) {
			t.Errorf("sluice run %v = %d, want 2 and %q; output:\n%s", tc.args, code, tc.msg, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := dispatch([]string{"run", "-h"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "-redis-cluster") {
		t.Errorf("usage does not list --redis-cluster:\n%s", out.String())
	}
}

// sluice run with --redis-cluster links Higress's Redis calls: the host/redis test guest
// sends PING through them and answers with the reply.
func TestRunRedisExtension(t *testing.T) {
	c := testCluster(t)
	withRedisClusters(t, redisClusterFlag{"rc": c.Addrs[:1]}) // one seed node is enough
	rs, out, _ := startTestRun(t, runConfig{
		wasm:       buildWasm(t, "../../host/redis/testdata/guest"),
		configPath: writeFile(t, "guest.conf", "rc - - 500"),
		clusters:   clusterFlag{},
	})
	for _, key := range []string{"a", "b", "c", "d"} { // keys on several nodes, routed from one seed
		resp, body := httpGet(t, "http://"+rs.listenAddr+"/", "x-redis", "SET run:"+key+" "+key+"|GET run:"+key+"x")
		if resp.StatusCode != 200 || body != "0:\"$2\\r\\nOK\\r\\n\"\n0:\"$-1\\r\\n\"" {
			t.Fatalf("%d %q\n%s", resp.StatusCode, body, out)
		}
	}
}

// Without --redis-cluster the calls are not linked: the guest's call is UNIMPLEMENTED.
func TestRunWithoutRedisCluster(t *testing.T) {
	withRedisClusters(t, redisClusterFlag{})
	rs, _, _ := startTestRun(t, runConfig{
		wasm:       buildWasm(t, "../../host/redis/testdata/guest"),
		configPath: writeFile(t, "guest.conf", "rc - - 500"),
		clusters:   clusterFlag{},
	})
	resp, body := httpGet(t, "http://"+rs.listenAddr+"/", "x-redis", "PING")
	if resp.StatusCode != 500 || body != "call 0 status=12 init=12" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
}
