package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluice-proxy/sluice/host"
)

// `sluice run --route NAME=PATH_PREFIX` names the routes requests take, as Envoy's route
// configuration does before the filter runs: the filter sees the name as the route property
// (xds.route_name; route_name too with --profile higress), so match.routes and Higress's
// _match_route_ / _match_route_prefix_ can be tried locally. The longest matching prefix
// wins; a request no route matches has no route. --route-cluster NAME=CLUSTER gives a named
// route its upstream cluster name (xds.cluster_name / cluster_name), for _match_service_.
func init() {
	runHooks = append(runHooks, runHook{flags: routeFlags, apply: routeApply})
}

// runRoutes holds the parsed --route and --route-cluster flags of the current `sluice run`.
var runRoutes routeFlag

type routeFlag struct {
	routes   []host.Route
	clusters map[string]string // route name -> cluster
}

type routeValue struct{ f *routeFlag }

func (v routeValue) String() string {
	if v.f == nil {
		return ""
	}
	var s []string
	for _, r := range v.f.routes {
		s = append(s, r.Name+"="+r.PathPrefix)
	}
	return strings.Join(s, " ")
}

func (v routeValue) Set(s string) error {
	name, prefix, ok := strings.Cut(s, "=")
	if !ok || name == "" || prefix == "" {
		return fmt.Errorf("want NAME=PATH_PREFIX, got %q", s)
	}
	if err := checkFlagText(name); err != nil {
		return fmt.Errorf("route name %s: %v", strconv.Quote(name), err)
	}
	if !strings.HasPrefix(prefix, "/") || checkFlagText(prefix) != nil || strings.ContainsAny(prefix, "?# ") {
		return fmt.Errorf("route %s: path prefix %s must start with / and have no spaces, control characters, ? or #", strconv.Quote(name), strconv.Quote(prefix))
	}
	for _, r := range v.f.routes {
		if r.PathPrefix == prefix {
			return fmt.Errorf("path prefix %s given twice (routes %s and %s)", strconv.Quote(prefix), strconv.Quote(r.Name), strconv.Quote(name))
		}
	}
	v.f.routes = append(v.f.routes, host.Route{Name: name, PathPrefix: prefix})
	return nil
}

type routeClusterValue struct{ f *routeFlag }

func (v routeClusterValue) String() string {
	if v.f == nil {
		return ""
	}
	var s []string
	for k, c := range v.f.clusters {
		s = append(s, k+"="+c)
	}
	return strings.Join(s, " ")
}

func (v routeClusterValue) Set(s string) error {
	name, cluster, ok := strings.Cut(s, "=")
	if !ok || name == "" || cluster == "" {
		return fmt.Errorf("want ROUTE=CLUSTER, got %q", s)
	}
	if err := checkFlagText(cluster); err != nil {
		return fmt.Errorf("cluster %s: %v", strconv.Quote(cluster), err)
	}
	if _, dup := v.f.clusters[name]; dup {
		return fmt.Errorf("route %s: cluster given twice", strconv.Quote(name))
	}
	v.f.clusters[name] = cluster
	return nil
}

// checkFlagText refuses text that would not survive a log line or an Envoy name: control
// characters and invalid UTF-8.
func checkFlagText(s string) error {
	if !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("has control characters or invalid UTF-8")
	}
	return nil
}

func routeFlags(fs *flag.FlagSet) {
	runRoutes = routeFlag{clusters: map[string]string{}}
	fs.Var(routeValue{&runRoutes}, "route", "NAME=PATH_PREFIX: requests whose path starts with PATH_PREFIX take the route NAME, the route name the filter sees (xds.route_name; route_name too with --profile higress); the longest prefix wins (repeatable)")
	fs.Var(routeClusterValue{&runRoutes}, "route-cluster", "ROUTE=CLUSTER: the upstream cluster name the filter sees for the route ROUTE (xds.cluster_name; cluster_name too with --profile higress), e.g. outbound|8080||api.default.svc.cluster.local (repeatable)")
}

func routeApply(opts *host.Options) (func(), error) {
	for name := range runRoutes.clusters {
		found := false
		for i := range runRoutes.routes {
			if runRoutes.routes[i].Name == name {
				runRoutes.routes[i].Cluster = runRoutes.clusters[name]
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("--route-cluster %s: no --route of that name", strconv.Quote(name))
		}
	}
	opts.Routes = append(opts.Routes, runRoutes.routes...)
	if len(runRoutes.routes) > 0 && opts.Logger != nil {
		opts.Logger.Info("routes", "routes", routeValue{&runRoutes}.String())
	}
	return nil, nil
}
