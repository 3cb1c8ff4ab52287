package redisclient

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-proxy/sluice/internal/redistest"
)

// startTLSCluster starts a Redis Cluster that speaks TLS only (no cleartext
// port, TLS on the cluster bus too), requiring client certificates.
func startTLSCluster(t *testing.T) (*redistest.Cluster, *redistest.Certs) {
	return redistest.StartTLSTest(t, "redis.sluice.test")
}

// keysOnEveryNode returns one key served by each node of c.
func keysOnEveryNode(t *testing.T, c *redistest.Cluster) []string {
	t.Helper()
	keys := make([]string, len(c.Addrs))
	found := 0
	for i := 0; found < len(keys) && i < 10000; i++ {
		k := "tls-" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		n, err := c.NodeOf(k)
		if err != nil {
			t.Fatal(err)
		}
		if keys[n] == "" {
			keys[n] = k
			found++
		}
	}
	if found < len(keys) {
		t.Fatal("no key for some node")
	}
	return keys
}

// Every connection is TLS: from one seed, the script path and the go-redis
// path reach every master (the nodes it learns from CLUSTER SLOTS; the
// cluster has no cleartext port). A wrong CA, a missing client certificate
// or a name the certificate does not hold fail every call, and ConnError
// and Ping say why in crypto/tls's words.
func TestTLSCluster(t *testing.T) {
	c, certs := startTLSCluster(t)
	keys := keysOnEveryNode(t, c)
	other, err := os.ReadFile(certs.OtherCAFile)
	if err != nil {
		t.Fatal(err)
	}
	otherPool := x509.NewCertPool()
	otherPool.AppendCertsFromPEM(other)
	client := []tls.Certificate{certs.Client}

	open := func(t *testing.T, tc *tls.Config) *Clusters {
		t.Helper()
		cl := New(map[string][]string{"rc": c.Addrs[:1]}, Options{TLS: tc})
		if err := cl.Init("rc", "", "", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}

	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{
		{"ip", &tls.Config{RootCAs: certs.Pool, Certificates: client}},
		{"server name", &tls.Config{RootCAs: certs.Pool, Certificates: client, ServerName: certs.ServerName}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := open(t, tc.tls)
			for i, k := range keys {
				if st, r := evalEcho(t, cl, k, i); st != StatusOK || !strings.Contains(r, k) {
					t.Fatalf("EVAL on node %d: %v %q", i, st, r)
				}
				if st, r := do(t, cl, "SET", k, "v"); st != StatusOK || r != "$2\r\nOK\r\n" {
					t.Fatalf("SET on node %d: %v %q", i, st, r)
				}
			}
			if n := waitScriptPath(t, cl).sent.Load(); n != int64(len(keys)) {
				t.Errorf("%d calls on the script path, want %d", n, len(keys))
			}
			if err := cl.Ping("rc"); err != nil {
				t.Errorf("Ping: %v", err)
			}
			if err := cl.ConnError("rc"); err != nil {
				t.Errorf("ConnError: %v", err)
			}
		})
	}

	for _, tc := range []struct {
		name, want string
		tls        *tls.Config
	}{
		{"wrong CA", "certificate signed by unknown authority", &tls.Config{RootCAs: otherPool, Certificates: client}},
		{"no client certificate", "certificate required", &tls.Config{RootCAs: certs.Pool}},
		{"wrong name", "not other.sluice.test", &tls.Config{RootCAs: certs.Pool, Certificates: client, ServerName: "other.sluice.test"}},
		{"cleartext", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := open(t, tc.tls)
			if st, r := evalEcho(t, cl, keys[0], 1); st == StatusOK {
				t.Fatalf("EVAL answered: %q", r)
			}
			if st, r := do(t, cl, "SET", keys[0], "v"); st == StatusOK {
				t.Fatalf("SET answered: %q", r)
			}
			err := cl.Ping("rc")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Ping: %v; want an error with %q", err, tc.want)
			}
			if tc.tls == nil || tc.name == "no client certificate" {
				// A cleartext client's calls fail (the server closes), no
				// TLS error to name; a server refusing the client's
				// certificate says why only to a client that reads first
				// (Ping), go-redis sees a reset connection.
				return
			}
			// The script path keeps the reason of the last failed connection.
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := cl.ConnError("rc")
				if err != nil && strings.Contains(err.Error(), tc.want) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("ConnError: %v; want an error with %q", err, tc.want)
				}
				evalEcho(t, cl, keys[0], 1)
			}
		})
	}
}
