// Package redisclient is a Redis Cluster client for raw RESP commands, used by the
// embedded host's Higress Redis extension (host/redis) and by `sluice serve`
// (serve/rls). Clusters routes through go-redis's ClusterClient (slot routing,
// MOVED/ASK, connection pooling) for plain commands; script calls (EVAL, EVALSHA,
// FCALL with a key: all the sluice guest and `sluice serve` send) go as they are over
// pipelined connections and their reply is Redis's own bytes (pipe.go); other
// commands' replies are re-encoded as RESP2.
//
// A caller binds a cluster name to credentials and a timeout (Init) and hands over
// one command as a RESP array of bulk strings (Call, or Do to wait for it).
// Timeouts and connection failures are a nonzero Status with no reply, never a
// panic; errors Redis itself answers (NOSCRIPT, WRONGTYPE, a CLUSTERDOWN that
// outlived the redirects) are StatusOK with the error reply, exactly as a raw
// connection would show them. Status values are those of Higress's
// proxy_on_redis_call_response (proxywasm.RedisStatus*).
//
// The package knows nothing of Wasm: host/redis wires Init and Call to the host calls
// and delivers the callback on the VM's thread.
package redisclient

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/internal/resp"
	"github.com/sluice-proxy/sluice/proxywasm"
)

// Status is the status passed to proxy_on_redis_call_response. Zero is
// success (the reply holds Redis's answer, which may be an error reply);
// every other value means no answer arrived and the reply is empty. Guests
// should treat any nonzero value as a failure (Higress's convention).
type Status int32

// Call statuses: Higress's, defined once in package proxywasm.
const (
	StatusOK           = Status(proxywasm.RedisStatusOK)
	StatusNetworkError = Status(proxywasm.RedisStatusNetworkError) // connection refused/reset, pool exhausted, cluster unreachable
	StatusTimeout      = Status(proxywasm.RedisStatusTimeout)      // no reply within the Init timeout
)

func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusNetworkError:
		return "network error"
	case StatusTimeout:
		return "timeout"
	}
	return "status " + strconv.Itoa(int(s))
}

// Errors returned synchronously by Init and Call (the hostcall's own result:
// the host maps them to NotFound / BadArgument).
var (
	ErrUnknownCluster = errors.New("redisclient: unknown redis cluster")
	ErrNotInitialized = errors.New("redisclient: redis cluster not initialized (proxy_redis_init)")
	ErrBadCommand     = errors.New("redisclient: command is not a RESP array of bulk strings")
)

// DefaultTimeout applies when Init is given a timeout of zero.
const DefaultTimeout = time.Second

// Options tune the clients. The zero value uses go-redis's defaults.
type Options struct {
	// PoolSize is the connection pool size per cluster node (go-redis
	// default: 10 × GOMAXPROCS).
	PoolSize int
	// MaxRedirects bounds MOVED/ASK/retry hops per command (default 3).
	MaxRedirects int
	// TLS, if set, makes every connection a TLS one: to the seed nodes and
	// to every node learnt from CLUSTER SLOTS, MOVED or ASK, on the
	// go-redis path and the script path alike. An empty ServerName is the
	// host of the address dialled (an IP for the nodes a cluster announces);
	// the config must not be modified once passed (tls.go).
	TLS *tls.Config
}

// Clusters holds the configured Redis clusters and the clients bound to
// them by Init. It is safe for concurrent use.
type Clusters struct {
	opts  Options
	addrs map[string][]string

	mu      sync.Mutex
	bound   map[string]*binding // by cluster name
	clients map[clientKey]*goredis.ClusterClient
	routers map[clientKey]*router
	closed  bool
}

type clientKey struct {
	name, user, pass string
	timeout          time.Duration
}

type binding struct {
	client  *goredis.ClusterClient
	router  *router // the script path (pipe.go)
	timeout time.Duration
}

// New returns Clusters serving the named clusters, each given by the
// addresses ("host:port") of one or more of its nodes. No connection is made
// until the first call.
func New(clusters map[string][]string, opts Options) *Clusters {
	addrs := make(map[string][]string, len(clusters))
	for name, a := range clusters {
		addrs[name] = append([]string(nil), a...)
	}
	return &Clusters{opts: opts, addrs: addrs, bound: map[string]*binding{}, clients: map[clientKey]*goredis.ClusterClient{}, routers: map[clientKey]*router{}}
}

// ParseFlag parses the value of a --redis-cluster flag,
// "NAME=ADDR,ADDR,...", into a name and its addresses.
func ParseFlag(s string) (name string, addrs []string, err error) {
	name, list, ok := strings.Cut(s, "=")
	if !ok || name == "" || list == "" {
		return "", nil, errors.New("redis cluster must be NAME=HOST:PORT[,HOST:PORT...]: " + strconv.Quote(s))
	}
	for _, a := range strings.Split(list, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return "", nil, errors.New("redis cluster " + strconv.Quote(name) + ": bad address " + strconv.Quote(a))
		}
		addrs = append(addrs, a)
	}
	return name, addrs, nil
}

// Init binds the cluster name to credentials and a per-call timeout
// (proxy_redis_init). Later calls on name use them; Inits with identical
// arguments share one client and its connection pool. An empty username
// with a password authenticates as the default user. Redis Cluster has only
// database 0, so there is no SELECT. Init does not connect: an unreachable
// cluster shows up as failed calls, not as a failed plugin start.
func (c *Clusters) Init(name, username, password string, timeout time.Duration) error {
	addrs, ok := c.addrs[name]
	if !ok {
		return ErrUnknownCluster
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	k := clientKey{name, username, password, timeout}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("redisclient: closed")
	}
	cl := c.clients[k]
	if cl == nil {
		maxRedirects := c.opts.MaxRedirects
		if maxRedirects == 0 {
			maxRedirects = 3
		}
		cl = goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs:    addrs,
			Username: username,
			Password: password,
			// RESP2 replies are what the guest decodes, and what Higress's
			// Envoy forwards.
			Protocol:              2,
			DisableIdentity:       true,
			DialTimeout:           timeout,
			ReadTimeout:           timeout,
			WriteTimeout:          timeout,
			ContextTimeoutEnabled: true,
			// A retried script could charge twice: only redirects retry.
			MaxRetries:   -1,
			MaxRedirects: maxRedirects,
			PoolSize:     c.opts.PoolSize,
			TLSConfig:    c.opts.TLS,
		})
		c.clients[k] = cl
		c.routers[k] = newRouter(k, cl, maxRedirects, c.opts.TLS)
	}
	c.bound[name] = &binding{client: cl, router: c.routers[k], timeout: timeout}
	return nil
}

// Call runs one command on the named cluster (proxy_redis_call). cmd is the
// guest's RESP array of bulk strings; it is copied, so the caller may reuse
// it. Call returns an error at once if the cluster is unknown or not
// initialized or cmd is malformed; otherwise it returns nil and calls cb
// exactly once, on another goroutine, with the status and the RESP2 reply,
// no later than the Init timeout after Call (plus scheduling; on the script
// path, plus the janitor's tick). Script calls (pipe.go) ignore ctx.
func (c *Clusters) Call(ctx context.Context, name string, cmd []byte, cb func(Status, []byte)) error {
	if b, err := c.binding(name); err != nil {
		return err
	} else if slot, ok := pipeSlot(cmd); ok {
		pc := &pcall{cmd: append([]byte(nil), cmd...), slot: slot, cb: cb, deadline: time.Now().Add(b.timeout)}
		if b.router.call(pc) {
			return nil
		}
	}
	b, args, err := c.prepare(name, cmd)
	if err != nil {
		return err
	}
	go func() {
		st, reply := b.do(ctx, args)
		cb(st, reply)
	}()
	return nil
}

// Do is the synchronous form of Call: it returns the status and the reply.
func (c *Clusters) Do(ctx context.Context, name string, cmd []byte) (Status, []byte, error) {
	if _, ok := pipeSlot(cmd); ok {
		type result struct {
			st    Status
			reply []byte
		}
		done := make(chan result, 1)
		if err := c.Call(ctx, name, cmd, func(st Status, reply []byte) { done <- result{st, reply} }); err != nil {
			return 0, nil, err
		}
		r := <-done
		return r.st, r.reply, nil
	}
	b, args, err := c.prepare(name, cmd)
	if err != nil {
		return 0, nil, err
	}
	st, reply := b.do(ctx, args)
	return st, reply, nil
}

// Close closes every client; pending calls fail.
func (c *Clusters) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var first error
	for k, cl := range c.clients {
		if err := cl.Close(); err != nil && first == nil {
			first = err
		}
		delete(c.clients, k)
	}
	for k, r := range c.routers {
		r.close()
		delete(c.routers, k)
	}
	clear(c.bound)
	return first
}

func (c *Clusters) binding(name string) (*binding, error) {
	c.mu.Lock()
	b := c.bound[name]
	c.mu.Unlock()
	if b == nil {
		if _, ok := c.addrs[name]; !ok {
			return nil, ErrUnknownCluster
		}
		return nil, ErrNotInitialized
	}
	return b, nil
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func (c *Clusters) prepare(name string, cmd []byte) (*binding, []any, error) {
	b, err := c.binding(name)
	if err != nil {
		return nil, nil, err
	}
	args, err := ParseCommand(cmd)
	if err != nil {
		return nil, nil, err
	}
	return b, args, nil
}

// ParseCommand decodes a RESP command (a non-empty array of bulk strings)
// into go-redis arguments, copying the bytes.
func ParseCommand(cmd []byte) ([]any, error) {
	v, err := resp.Parse(cmd)
	if err != nil {
		return nil, errors.Join(ErrBadCommand, err)
	}
	if v.Type != resp.Array || v.Null || len(v.Elems) == 0 {
		return nil, ErrBadCommand
	}
	args := make([]any, len(v.Elems))
	for i, e := range v.Elems {
		if e.Type != resp.BulkString || e.Null {
			return nil, ErrBadCommand
		}
		args[i] = string(e.Str)
	}
	return args, nil
}

func (b *binding) do(parent context.Context, args []any) (Status, []byte) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := context.WithTimeout(parent, b.timeout)
	defer cancel()
	type result struct {
		v   any
		err error
	}
	done := make(chan result, 1)
	go func() {
		cmd := goredis.NewCmd(ctx, args...)
		_ = b.client.Process(ctx, cmd)
		done <- result{cmd.Val(), cmd.Err()}
	}()
	// go-redis honours the deadline on its sockets; the select makes the
	// bound hold whatever state a connection or dial is in.
	select {
	case r := <-done:
		return encodeResult(r.v, r.err)
	case <-ctx.Done():
		return StatusTimeout, nil
	}
}

func encodeResult(v any, err error) (Status, []byte) {
	switch {
	case err == nil:
		return StatusOK, AppendReply(nil, v)
	case errors.Is(err, goredis.Nil):
		return StatusOK, append([]byte(nil), "$-1\r\n"...)
	}
	var rerr goredis.Error
	if errors.As(err, &rerr) && !isNetError(err) {
		return StatusOK, appendError(nil, rerr.Error())
	}
	if isTimeout(err) {
		return StatusTimeout, nil
	}
	return StatusNetworkError, nil
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isNetError(err error) bool {
	var ne net.Error
	return errors.As(err, &ne)
}

// AppendReply appends v, a reply value as go-redis returns it from a RESP2
// connection, in RESP2 form. go-redis does not keep simple strings apart
// from bulk strings, so both come back as bulk strings ("+OK" becomes
// "$2\r\nOK"); the guest's decoder treats the two alike.
func AppendReply(dst []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, "$-1\r\n"...)
	case string:
		return resp.AppendBulkString(dst, v)
	case []byte:
		return resp.AppendBulk(dst, v)
	case int64:
		return resp.AppendValue(dst, resp.Value{Type: resp.Integer, Int: v})
	case []any:
		dst = resp.AppendArrayHeader(dst, len(v))
		for _, e := range v {
			dst = AppendReply(dst, e)
		}
		return dst
	case error:
		return appendError(dst, v.Error())
	case bool: // RESP3 only; not produced with Protocol 2
		if v {
			return resp.AppendValue(dst, resp.Value{Type: resp.Integer, Int: 1})
		}
		return resp.AppendValue(dst, resp.Value{Type: resp.Integer})
	case float64: // RESP3 only
		return resp.AppendBulkString(dst, strconv.FormatFloat(v, 'g', -1, 64))
	}
	return appendError(dst, "ERR redisclient: reply of unsupported type")
}

func appendError(dst []byte, msg string) []byte {
	msg = strings.NewReplacer("\r", " ", "\n", " ").Replace(msg)
	return resp.AppendValue(dst, resp.Value{Type: resp.Error, Str: []byte(msg)})
}
