package redisclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// dialNode connects to a node of the script path: TCP, then a TLS
// handshake when tlsConfig is set (within the same timeout). The server
// name, when the config has none, is the host of addr, as go-redis does.
func dialNode(addr string, timeout time.Duration, tlsConfig *tls.Config) (net.Conn, error) {
	if tlsConfig == nil {
		return net.DialTimeout("tcp", addr, timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	d := &tls.Dialer{NetDialer: &net.Dialer{}, Config: tlsConfig}
	return d.DialContext(ctx, "tcp", addr)
}

// connFailed records why a connection of the script path could not be
// made or used before its first reply (ConnError reports it).
func (r *router) connFailed(addr string, err error) {
	e := fmt.Errorf("redis node %s: %w", addr, err)
	r.lastErr.Store(&e)
}

// slotsFailed records why the slot table could not be read (through
// go-redis: the seed nodes' connections).
func (r *router) slotsFailed(err error) {
	e := fmt.Errorf("CLUSTER SLOTS: %w", err)
	r.lastErr.Store(&e)
}

func authError(err error, line string) error {
	if err != nil {
		return fmt.Errorf("AUTH: %w", err)
	}
	return errors.New("AUTH refused: " + strings.TrimSpace(line))
}

// ConnError returns why the last connection to a node of the named cluster
// failed on the script path (a refused dial, a TLS handshake or certificate
// error, a refused AUTH), or nil once a connection has answered since. It
// lets a caller that got StatusNetworkError say why.
func (c *Clusters) ConnError(name string) error {
	b, err := c.binding(name)
	if err != nil {
		return err
	}
	if e := b.router.lastErr.Load(); e != nil {
		return *e
	}
	return nil
}

// Ping checks that every master of the named cluster answers PING within
// the Init timeout, through go-redis (slot table, TLS, AUTH), and returns the
// first failure as go-redis words it, such as a certificate that does not
// verify. It is for start-up checks: calls never need it.
func (c *Clusters) Ping(name string) error {
	b, err := c.binding(name)
	if err != nil {
		return err
	}
	ctx, cancel := contextWithTimeout(b.timeout)
	defer cancel()
	err = b.client.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error {
		if err := n.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis node %s: %w", n.Options().Addr, err)
		}
		return nil
	})
	if err != nil && c.opts.TLS != nil {
		// A server that refuses the client's certificate says so in an
		// alert after the handshake, which a client that writes first may
		// only see as a reset connection: read before writing.
		for _, addr := range c.addrs[name] {
			if perr := probeTLS(addr, b.timeout, c.opts.TLS); perr != nil {
				return fmt.Errorf("redis node %s: %w", addr, perr)
			}
		}
	}
	return err
}

// probeTLS connects to addr over TLS and reads before writing anything: an
// alert the server sends after the handshake (a missing or refused client
// certificate) is the error; a server that waits for a command is nil.
func probeTLS(addr string, timeout time.Duration, tlsConfig *tls.Config) error {
	nc, err := dialNode(addr, timeout, tlsConfig)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetReadDeadline(time.Now().Add(min(timeout, 300*time.Millisecond)))
	var b [1]byte
	_, err = nc.Read(b[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	return err
}
