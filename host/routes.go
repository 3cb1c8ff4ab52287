package host

import (
	"fmt"
	"strings"
)

// Route is a named route of the embedded host (Options.Routes, `sluice run --route`), what
// Envoy's route configuration gives a request before the filter runs: a route name, and the
// cluster the route sends to. The guest reads them as properties: xds.route_name and
// xds.cluster_name, as upstream Envoy serves them from 1.33 on, and — in profiles with
// LegacyWasmAttributes (higress, permissive) — route_name and cluster_name too, as Higress's
// Envoy (and upstream Envoy before 1.33) serves them.
type Route struct {
	// Name is the route name (Envoy's route.name; Istio: the VirtualService's http[].name,
	// or "name.match-name"; Higress: the Ingress's "namespace/name").
	Name string
	// PathPrefix selects the requests: their :path (before '?') starts with it. The route
	// with the longest matching prefix wins.
	PathPrefix string
	// Cluster is the upstream cluster name ("" = the property is NOT_FOUND), e.g. Istio's
	// "outbound|8080||backend.default.svc.cluster.local".
	Cluster string
}

func checkRoutes(routes []Route) error {
	seen := map[string]bool{}
	for i, r := range routes {
		switch {
		case r.Name == "":
			return fmt.Errorf("host: Routes[%d]: empty name", i)
		case !strings.HasPrefix(r.PathPrefix, "/"):
			return fmt.Errorf("host: Routes[%d] (%q): path prefix %q does not start with /", i, r.Name, r.PathPrefix)
		case seen[r.PathPrefix]:
			return fmt.Errorf("host: Routes[%d] (%q): path prefix %q given twice", i, r.Name, r.PathPrefix)
		}
		seen[r.PathPrefix] = true
	}
	return nil
}

// route returns the route name and cluster for a request path (with its query): those of
// the route with the longest prefix of the path before '?', or "", "".
func (h *Host) route(path string) (name, cluster string) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	best := -1
	for i, r := range h.opts.Routes {
		if strings.HasPrefix(path, r.PathPrefix) && (best < 0 || len(r.PathPrefix) > len(h.opts.Routes[best].PathPrefix)) {
			best = i
		}
	}
	if best < 0 {
		return "", ""
	}
	return h.opts.Routes[best].Name, h.opts.Routes[best].Cluster
}
