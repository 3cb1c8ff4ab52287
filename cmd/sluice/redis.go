package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-proxy/sluice/host"
	"github.com/sluice-proxy/sluice/host/redis"
	"github.com/sluice-proxy/sluice/internal/redisclient"
)

// --redis-cluster NAME=ADDR,ADDR,... (repeatable) gives the filter Higress's Redis host
// calls (proxy_redis_init / proxy_redis_call) on a Redis Cluster reached through the given
// seed nodes. NAME is what the filter passes as the service — the "redis.cluster" of the
// sluice configuration. Without the flag the calls are not linked and a module that
// imports them (sluice-redis.wasm) gets UNIMPLEMENTED from them.
func init() {
	runHooks = append(runHooks, runHook{flags: redisFlags, apply: redisApply})
}

// redisClusters holds the parsed --redis-cluster flags of the current `sluice run`.
var redisClusters = redisClusterFlag{}

type redisClusterFlag map[string][]string

func (f redisClusterFlag) String() string {
	var s []string
	for name, addrs := range f {
		s = append(s, name+"="+strings.Join(addrs, ","))
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

func (f redisClusterFlag) Set(v string) error {
	name, addrs, err := redisclient.ParseFlag(v)
	if err != nil {
		return err
	}
	if _, dup := f[name]; dup {
		return fmt.Errorf("redis cluster %q given twice", name)
	}
	f[name] = addrs
	return nil
}

func redisFlags(fs *flag.FlagSet) {
	redisClusters = redisClusterFlag{}
	fs.Var(redisClusters, "redis-cluster", "NAME=HOST:PORT[,HOST:PORT...]: a Redis Cluster for the filter's proxy_redis_call, NAME being its redis.cluster (repeatable)")
	runRedisTLS = redisTLSFlags{}
	runRedisTLS.register(fs) // the --redis-tls flags of `sluice serve` (serve_tls.go)
}

// runRedisTLS holds the --redis-tls flags of the current `sluice run`.
var runRedisTLS redisTLSFlags

func redisApply(opts *host.Options) (func(), error) {
	if len(redisClusters) == 0 {
		return nil, nil
	}
	tlsConfig, warnings, err := runRedisTLS.config()
	if err != nil {
		return nil, err
	}
	c := redisclient.New(redisClusters, redisclient.Options{TLS: tlsConfig})
	opts.Extensions = append(opts.Extensions, redis.NewExtension(c, nil))
	if opts.Logger != nil {
		for _, w := range warnings {
			opts.Logger.Warn("redis extension: " + w)
		}
		opts.Logger.Info("redis extension", "clusters", redisClusters.String())
		// go-redis's own messages (failed dials while a node is down) go to the run's log.
		goredis.SetLogger(redisLogger{opts.Logger})
	}
	return func() { c.Close() }, nil
}

// redisLogger sends go-redis's internal log lines to slog, at warning level.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.Warn("redis client: " + fmt.Sprintf(format, v...))
}
