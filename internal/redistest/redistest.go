// Package redistest starts a real Redis Cluster for tests: N masters, no
// replicas, on loopback ports, from the redis-server and redis-cli binaries
// on PATH (Debian's redis-server package; .ci/run installs it).
//
// Use one cluster per test binary, started in TestMain:
//
//	var cluster *redistest.Cluster
//
//	func TestMain(m *testing.M) { os.Exit(redistest.Main(m, 3, &cluster)) }
//
// The nodes run with cluster-require-full-coverage off, so killing or
// pausing one master only makes its own slots unavailable — the outage the
// Redis backend's failure modes are tested against.
package redistest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a running Redis Cluster of masters only. Its methods are not
// safe for concurrent use.
type Cluster struct {
	// Addrs are the masters' "127.0.0.1:port" addresses, node i at Addrs[i].
	Addrs []string
	// Replicas are the replicas' addresses (StartReplicated): node
	// len(Addrs)+i at Replicas[i], the replica of node i at start.
	Replicas []string
	nodes    []*node
	tls      *TLS
}

// TLS makes StartTLS's nodes speak TLS only, with Certs' server
// certificate: to clients, on the cluster bus and for replication.
type TLS struct {
	Certs *Certs
	// AuthClients is redis-server's tls-auth-clients: "yes" (a client
	// certificate signed by Certs.CAFile is required), "optional" (checked
	// if sent) or "no"; empty: "yes".
	AuthClients string
}

type node struct {
	port     int
	announce int // the client port the node announces (Announce); 0: its own
	dir      string
	tls      *TLS
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
}

// StartupTimeout bounds how long Start waits for the cluster to be ready.
var StartupTimeout = 30 * time.Second

// Main starts a cluster of the given number of masters in a temporary
// directory, stores it in *c, runs the tests and stops the cluster. It
// returns the exit code for os.Exit. A cluster that cannot start fails the
// test binary: without -short these tests are never skipped.
//
// Under go test -short (the unit tier, make test-unit) Main starts no
// cluster and leaves *c nil: the tests that use it call SkipShort first.
func Main(m *testing.M, masters int, c **Cluster) int {
	if !flag.Parsed() {
		flag.Parse() // testing's flags, -short among them, before m.Run
	}
	if testing.Short() {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "sluice-redis-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "redistest:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	cl, err := Start(dir, masters)
	if err != nil {
		fmt.Fprintln(os.Stderr, "redistest:", err)
		return 1
	}
	*c = cl
	defer cl.Close()
	return m.Run()
}

// SkipShort skips tb under go test -short: the unit tier starts no Redis
// Cluster (neither Main nor Start). Every test that uses a cluster, or the
// helper that hands it one, calls it first.
func SkipShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs a Redis Cluster (redis-server processes): not started under -short")
	}
}

// TimeoutBound is the upper bound a test puts on a wait that a timeout of d
// must end, such as a call to a paused node (which never answers: the test
// resumes it only after the call returned). What such a test pins is that d
// ends the wait at all, and not, say, the minute a hung call would take; the
// test's lower bound (at least d) and its status (a timeout) say that d is the
// timer that fired. The bound is generous, 10 d and at least 2 s, because
// other test binaries share the machine's cores and can delay any goroutine
// by hundreds of milliseconds: a wall-time bound near d would fail for the
// load, not for the code.
func TimeoutBound(d time.Duration) time.Duration { return max(10*d, 2*time.Second) }

// Start launches masters redis-server processes under dir, joins them into
// one cluster with redis-cli --cluster create and waits until every node
// reports cluster_state:ok with all 16384 slots assigned.
func Start(dir string, masters int) (*Cluster, error) { return StartTLS(dir, masters, nil) }

// StartTLS is Start for a cluster that serves TLS only, as t says (nil:
// cleartext). Addrs are then TLS ports, and Client connects with Certs'
// client certificate.
func StartTLS(dir string, masters int, t *TLS) (*Cluster, error) {
	if masters < 3 {
		return nil, errors.New("a Redis Cluster needs at least 3 masters")
	}
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("%s not found (apt-get install redis-server): %w", bin, err)
		}
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := start(filepath.Join(dir, "try"+strconv.Itoa(attempt)), masters, t)
		if err == nil {
			return c, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func start(dir string, masters int, t *TLS) (*Cluster, error) {
	ports, err := freePorts(masters)
	if err != nil {
		return nil, err
	}
	c := &Cluster{tls: t}
	for i, p := range ports {
		n := &node{port: p, dir: filepath.Join(dir, "node"+strconv.Itoa(i)), tls: t}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		c.Addrs = append(c.Addrs, "127.0.0.1:"+strconv.Itoa(p))
		if err := n.launch(); err != nil {
			c.Close()
			return nil, err
		}
	}
	deadline := time.Now().Add(StartupTimeout)
	for i := range c.nodes {
		if err := c.waitPing(i, deadline); err != nil {
			c.Close()
			return nil, err
		}
	}
	var args []string
	if t != nil {
		args = []string{"--tls", "--cacert", t.Certs.CAFile, "--cert", t.Certs.ClientCertFile, "--key", t.Certs.ClientKeyFile}
	}
	args = append(append(args, "--cluster", "create"), c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("[OK] All 16384 slots covered")) {
		c.Close()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitReady(time.Until(deadline)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// freePorts picks n ports p such that p and its cluster bus port p+10000 are
// both free, below the usual ephemeral range so outgoing connections do not
// race for them.
func freePorts(n int) ([]int, error) {
	var ports []int
	seen := map[int]bool{}
	for tries := 0; len(ports) < n && tries < 1000; tries++ {
		p := 20000 + rand.IntN(10000)
		if seen[p] {
			continue
		}
		seen[p] = true
		if portFree(p) && portFree(p+10000) {
			ports = append(ports, p)
		}
	}
	if len(ports) < n {
		return nil, errors.New("no free loopback ports for the cluster")
	}
	return ports, nil
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func (n *node) launch() error {
	port := []string{"--port", strconv.Itoa(n.port)}
	if t := n.tls; t != nil {
		auth := t.AuthClients
		if auth == "" {
			auth = "yes"
		}
		port = []string{"--port", "0", "--tls-port", strconv.Itoa(n.port), "--cluster-port", strconv.Itoa(n.port + 10000),
			"--tls-cert-file", t.Certs.ServerCertFile, "--tls-key-file", t.Certs.ServerKeyFile,
			"--tls-ca-cert-file", t.Certs.CAFile, "--tls-auth-clients", auth,
			"--tls-cluster", "yes", "--tls-replication", "yes"}
	}
	if n.announce != 0 {
		port = append(port, "--cluster-announce-port", strconv.Itoa(n.announce),
			"--cluster-announce-bus-port", strconv.Itoa(n.port+10000))
	}
	cmd := exec.Command("redis-server", append(port,
		"--bind", "127.0.0.1",
		"--protected-mode", "no",
		"--daemonize", "no",
		"--dir", n.dir,
		"--logfile", "redis.log",
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
		"--cluster-require-full-coverage", "no",
		"--appendonly", "no",
		"--save", "",
		"--enable-debug-command", "local",
	)...)
	cmd.Dir = n.dir
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	n.cmd = cmd
	n.done = make(chan struct{})
	go func(done chan struct{}) { cmd.Wait(); close(done) }(n.done)
	return nil
}

func (n *node) running() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

func (n *node) log() string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Client returns a plain (non-cluster) client of node i, for inspection.
// The caller closes it.
func (c *Cluster) Client(i int) *redis.Client {
	var tc *tls.Config
	if c.tls != nil {
		tc = &tls.Config{RootCAs: c.tls.Certs.Pool, Certificates: []tls.Certificate{c.tls.Certs.Client}}
	}
	return redis.NewClient(&redis.Options{Addr: c.addr(i), DialTimeout: time.Second,
		ReadTimeout: time.Second, MaxRetries: -1, Protocol: 2, DisableIdentity: true, TLSConfig: tc})
}

func (c *Cluster) waitPing(i int, deadline time.Time) error {
	cl := c.Client(i)
	defer cl.Close()
	for {
		if !c.nodes[i].running() {
			return fmt.Errorf("redis-server on %s exited:\n%s", c.addr(i), c.nodes[i].log())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := cl.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not answering: %v", c.addr(i), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitReady waits until every running node reports cluster_state:ok, knows
// every node and sees all slots assigned.
func (c *Cluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i, n := range c.nodes {
		if !n.running() {
			continue
		}
		cl := c.Client(i)
		var info string
		var err error
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err = cl.ClusterInfo(ctx).Result()
			cancel()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_slots_assigned:16384") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.nodes))+"\r") {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				return fmt.Errorf("cluster not ready on %s: %v\n%s", c.addr(i), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		cl.Close()
	}
	return nil
}

// Close kills every node. It is safe to call more than once.
func (c *Cluster) Close() {
	for _, n := range c.nodes {
		if n.running() {
			n.cmd.Process.Signal(syscall.SIGCONT) // a paused node must be able to die
			n.cmd.Process.Kill()
			<-n.done
		}
	}
}

// Pause stops node i with SIGSTOP: it keeps its connections open and answers
// nothing, like a node stuck in a long command or a network black hole.
func (c *Cluster) Pause(i int) error {
	if !c.nodes[i].running() {
		return errors.New("node not running")
	}
	return c.nodes[i].cmd.Process.Signal(syscall.SIGSTOP)
}

// Resume continues node i after Pause.
func (c *Cluster) Resume(i int) error {
	if !c.nodes[i].running() {
		return errors.New("node not running")
	}
	return c.nodes[i].cmd.Process.Signal(syscall.SIGCONT)
}

// Kill kills node i (SIGKILL) and waits for it to exit; its slots become
// unavailable until Restart.
func (c *Cluster) Kill(i int) error {
	n := c.nodes[i]
	if !n.running() {
		return errors.New("node not running")
	}
	n.cmd.Process.Signal(syscall.SIGCONT)
	if err := n.cmd.Process.Kill(); err != nil {
		return err
	}
	<-n.done
	return nil
}

// Restart starts node i again on the same port with its saved cluster
// configuration (so it rejoins as the owner of its slots, empty of data) and
// waits until the cluster is ready.
func (c *Cluster) Restart(i int) error {
	if c.nodes[i].running() {
		return errors.New("node still running")
	}
	if err := c.nodes[i].launch(); err != nil {
		return err
	}
	if err := c.waitPing(i, time.Now().Add(StartupTimeout)); err != nil {
		return err
	}
	return c.WaitReady(StartupTimeout)
}

// NodeOf returns the index of the node that serves the slot of key.
func (c *Cluster) NodeOf(key string) (int, error) {
	slot := Slot(key)
	for i, n := range c.nodes {
		if !n.running() {
			continue
		}
		cl := c.Client(i)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		//lint:ignore SA1019 the same CLUSTER SLOTS the client under test routes by (internal/redisclient)
		slots, err := cl.ClusterSlots(ctx).Result()
		cancel()
		cl.Close()
		if err != nil {
			continue
		}
		for _, s := range slots {
			if slot >= s.Start && slot <= s.End && len(s.Nodes) > 0 {
				if j := c.nodeAt(s.Nodes[0].Addr); j >= 0 {
					return j, nil
				}
			}
		}
	}
	return -1, fmt.Errorf("no node serves slot %d of %q", slot, key)
}

// Slot returns the cluster slot of key (CRC16 of its hash tag, mod 16384),
// computed locally as Redis does.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16([]byte(key)) % 16384)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis
// Cluster hashes keys with.
func crc16(b []byte) uint16 {
	var crc uint16
	for _, c := range b {
		crc ^= uint16(c) << 8
		for k := 0; k < 8; k++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// StartTLSTest starts, for tb, a Redis Cluster of three masters that speaks TLS only (no
// cleartext port, TLS on the cluster bus too) and requires client certificates, with
// certificates made for it (the server's for 127.0.0.1 and serverName); tb's cleanup
// stops it. It skips under -short, as SkipShort.
func StartTLSTest(tb testing.TB, serverName string) (*Cluster, *Certs) {
	tb.Helper()
	SkipShort(tb)
	certs, err := NewCerts(tb.TempDir(), serverName)
	if err != nil {
		tb.Fatal(err)
	}
	// Outside tb.TempDir: the nodes' sockets and files need a short path.
	dir, err := os.MkdirTemp("", "sluice-redis-tls-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	c, err := StartTLS(dir, 3, &TLS{Certs: certs, AuthClients: "yes"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c, certs
}
