package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/sluice-proxy/sluice/config"
)

// checkServices refuses to start `sluice run` when a rule of the configuration needs a
// service the command line does not give (missingServices).
func checkServices(cfg runConfig, in runInputs) error {
	return missingServices(in.pluginConfig, moduleBuild(in.wasm), cfg.clusters, redisClusters)
}

// missingServices reports the first rule of a sluice configuration (the top level, then
// each _rules_ entry) whose remote backend names a service the host was not given: backend
// "rls" needs --cluster for its rls.cluster, backend "redis" --redis-cluster for its
// redis.cluster. Without them the filter would fail open (or closed) on every request, each
// with a warning. A configuration that is not valid for build is left to the filter, which
// refuses it and says why.
func missingServices(data []byte, build config.Build, clusters map[string]string, redis map[string][]string) error {
	c, err := config.ParseFor(data, build)
	if err != nil {
		return nil
	}
	type part struct {
		c     *config.Config
		where string
	}
	parts := []part{{c, ""}}
	for _, s := range c.Scopes {
		parts = append(parts, part{s.Config, fmt.Sprintf(" (in _rules_ entry %q)", s.Name)})
	}
	for _, p := range parts {
		for _, r := range p.c.Rules {
			switch {
			case r.Backend == config.BackendRLS && p.c.RLS != nil:
				name := p.c.RLS.Cluster
				if _, ok := clusters[name]; !ok {
					return fmt.Errorf("rule %q%s uses backend \"rls\" on cluster %q, which no --cluster gives: add %s",
						r.Name, p.where, name, flagHint("--cluster", name, "http://HOST:PORT"))
				}
			case r.Backend == config.BackendRedis && p.c.Redis != nil:
				name := p.c.Redis.Cluster
				if _, ok := redis[name]; !ok {
					return fmt.Errorf("rule %q%s uses backend \"redis\" on Redis cluster %q, which no --redis-cluster gives: add %s",
						r.Name, p.where, name, flagHint("--redis-cluster", name, "HOST:PORT[,HOST:PORT...]"))
				}
			}
		}
	}
	return nil
}

// shellPlain matches what a shell takes unquoted.
var shellPlain = regexp.MustCompile(`^[A-Za-z0-9_.:/,+-]+$`)

// flagHint is the flag to add for service name: `--flag NAME=VALUE`, quoted when a shell
// would need it (Istio's cluster names hold '|').
func flagHint(flag, name, value string) string {
	if shellPlain.MatchString(name) {
		return flag + " " + name + "=" + value
	}
	return flag + " '" + strings.ReplaceAll(printable(name), "'", `'\''`) + "=" + value + "'"
}

// errNoConfigFile is reload's error without --config.
var errNoConfigFile = errors.New("no --config to reload: the embedded default stays")

// reloadOn reloads the configuration (reload) for every value on hup until ctx ends.
func (rs *runServer) reloadOn(ctx context.Context, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-rs.done:
			return
		case <-hup:
			rs.reload(ctx)
		}
	}
}

// reload is SIGHUP, as `sluice serve` does it: --config is read again and given to the
// host (host.Reconfigure: a new root context on every worker, the old one drains). A
// configuration that cannot be read, that `sluice check` refuses, that needs a service the
// command line does not give, or that the filter refuses leaves the one in force serving.
// Either way one line is logged; the error is returned.
func (rs *runServer) reload(ctx context.Context) error {
	rs.reloadMu.Lock()
	defer rs.reloadMu.Unlock()
	log := rs.host.Options().Logger
	const refused = "sluice run: SIGHUP: configuration not reloaded; the previous one stays"
	if rs.configPath == "" {
		log.Warn("sluice run: SIGHUP: " + errNoConfigFile.Error())
		return errNoConfigFile
	}
	name := printable(rs.configPath)
	data, err := os.ReadFile(rs.configPath)
	if err != nil {
		log.Error(refused, "config", name, "error", err)
		return err
	}
	// The configuration in force is a sluice configuration: check the new one as the module
	// will (the errors once, not once per worker), and its services.
	if _, perr := config.ParseFor(rs.pluginConfig, rs.build); perr == nil {
		if _, err := config.ParseFor(data, rs.build); err != nil {
			lines, _ := configErrorLinesAt("", data, err, nil)
			log.Error(refused, "config", name, "errors", strings.Join(lines, "; "))
			return err
		}
		if err := missingServices(data, rs.build, rs.clusters, redisClusters); err != nil {
			log.Error(refused, "config", name, "error", err)
			return err
		}
	}
	if err := rs.host.Reconfigure(ctx, 0, data); err != nil {
		log.Error(refused, "config", name, "error", err)
		return err
	}
	rs.pluginConfig = data
	log.Info("sluice run: SIGHUP: configuration reloaded", "config", name, "bytes", len(data))
	return nil
}
