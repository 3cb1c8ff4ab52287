package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Replicas, failover and announced addresses: the Redis side of the network-fault suite
// (e2e/fault_*_test.go).

// StartReplicated starts a cluster of masters masters as Start does, then one replica of
// each (a node that meets the cluster and is told CLUSTER REPLICATE), and waits until every
// replica's link to its master is up. Replicas[i] (node len(Addrs)+i) replicates Addrs[i].
func StartReplicated(dir string, masters int) (*Cluster, error) {
	c, err := Start(dir, masters)
	if err != nil {
		return nil, err
	}
	if err := c.addReplicas(filepath.Join(dir, "replicas")); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) addReplicas(dir string) error {
	masters := len(c.Addrs)
	ports, err := freePorts(masters)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(StartupTimeout)
	for i, p := range ports {
		n := &node{port: p, dir: filepath.Join(dir, "node"+strconv.Itoa(i))}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return err
		}
		c.nodes = append(c.nodes, n)
		c.Replicas = append(c.Replicas, "127.0.0.1:"+strconv.Itoa(p))
		if err := n.launch(); err != nil {
			return err
		}
		if err := c.waitPing(masters+i, deadline); err != nil {
			return err
		}
		id, err := c.do(i, "cluster", "myid")
		if err != nil {
			return err
		}
		if _, err := c.do(masters+i, "cluster", "meet", "127.0.0.1", strconv.Itoa(c.nodes[i].port)); err != nil {
			return err
		}
		if err := c.poll(deadline, "replica "+c.addr(masters+i)+" knowing its master", func() bool {
			_, err := c.do(masters+i, "cluster", "replicate", id)
			return err == nil
		}); err != nil {
			return err
		}
	}
	if err := c.WaitReplicas(time.Until(deadline)); err != nil {
		return err
	}
	return c.WaitReady(time.Until(deadline))
}

// WaitReplicas waits until every running replica's link to its master is up.
func (c *Cluster) WaitReplicas(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for i, n := range c.nodes {
		if !n.running() {
			continue
		}
		if err := c.poll(deadline, "replication link of "+c.addr(i), func() bool {
			info, err := c.do(i, "info", "replication")
			return err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up"))
		}); err != nil {
			return err
		}
	}
	return nil
}

// Failover makes node i, a replica, the master of its master's slots at once (CLUSTER
// FAILOVER TAKEOVER: no agreement from the other masters, so it works with its master
// dead), and waits until every running node routes those slots to it.
func (c *Cluster) Failover(i int) error {
	if _, err := c.do(i, "cluster", "failover", "takeover"); err != nil {
		return err
	}
	deadline := time.Now().Add(StartupTimeout)
	return c.poll(deadline, "slots served by "+c.addr(i), func() bool {
		for j, n := range c.nodes {
			if !n.running() {
				continue
			}
			nodes, err := c.do(j, "cluster", "nodes")
			if err != nil {
				return false
			}
			for _, l := range strings.Split(nodes, "\n") {
				if strings.Contains(l, c.announced(i)+"@") && !strings.Contains(l, "master") {
					return false
				}
			}
		}
		return true
	})
}

// Announce makes node i announce port (a proxy in front of it) as its client port in CLUSTER
// SLOTS, CLUSTER NODES and MOVED replies; its cluster bus port stays its own, so the nodes
// still talk to each other directly. It waits until every running node knows the port.
func (c *Cluster) Announce(i, port int) error {
	n := c.nodes[i]
	if _, err := c.do(i, "config", "set", "cluster-announce-bus-port", strconv.Itoa(n.port+10000)); err != nil {
		return err
	}
	if _, err := c.do(i, "config", "set", "cluster-announce-port", strconv.Itoa(port)); err != nil {
		return err
	}
	n.announce = port
	want := "127.0.0.1:" + strconv.Itoa(port) + "@"
	return c.poll(time.Now().Add(StartupTimeout), "every node knowing "+want, func() bool {
		for j, m := range c.nodes {
			if m.running() {
				if nodes, err := c.do(j, "cluster", "nodes"); err != nil || !strings.Contains(nodes, want) {
					return false
				}
			}
		}
		return true
	})
}

// Nodes is the number of nodes (masters and replicas).
func (c *Cluster) Nodes() int { return len(c.nodes) }

// Port is node i's own client port.
func (c *Cluster) Port(i int) int { return c.nodes[i].port }

// addr is node i's own address.
func (c *Cluster) addr(i int) string { return "127.0.0.1:" + strconv.Itoa(c.nodes[i].port) }

// announced is the address node i announces.
func (c *Cluster) announced(i int) string {
	if p := c.nodes[i].announce; p != 0 {
		return "127.0.0.1:" + strconv.Itoa(p)
	}
	return c.addr(i)
}

// nodeAt is the index of the node whose own or announced address is addr, or -1.
func (c *Cluster) nodeAt(addr string) int {
	for i := range c.nodes {
		if addr == c.addr(i) || addr == c.announced(i) {
			return i
		}
	}
	return -1
}

// do runs one command on node i and returns its reply as text.
func (c *Cluster) do(i int, args ...any) (string, error) {
	cl := c.Client(i)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := cl.Do(ctx, args...).Result()
	if err != nil {
		return "", fmt.Errorf("%s: %v: %w", c.addr(i), args, err)
	}
	return fmt.Sprint(v), nil
}

// poll calls cond every 20 ms until it holds or deadline passes.
func (c *Cluster) poll(deadline time.Time, what string, cond func() bool) error {
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("redistest: timed out waiting for " + what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
