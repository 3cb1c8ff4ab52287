package filter

import (
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Scopes (config "_rules_", Higress's matchRules) and route names.
//
// A configuration with "_rules_" configures one Plugin per entry besides the
// root context's own (the top-level rules): each has its own rules, stores
// (shared-data keys sluice:<plugin>:<scope>.<rule>:…), metrics
// (sluice.<scope>.<rule>.allowed, …), response, failure_mode, client_ip and
// Redis backend. proxy_on_request_headers selects one of them per request
// (config.Config.Select, Higress's order: the first entry that selects the
// request, else the top level) and the stream belongs to it from then on:
// its response headers, its Redis replies.
//
// The route and cluster names come from properties. Upstream Envoy has
// served them only as xds.route_name and xds.cluster_name since 1.33
// (changelogs/1.33.0.yaml: "Remove previously deprecated xDS attributes from
// get_property, use xds attributes instead"; PR #36619); Wasm has had xds.*
// since PR #31620 (January 2024). Higress's Envoy keeps the older route_name and
// cluster_name (higress-group/envoy, source/extensions/common/wasm/context.cc,
// Context::findValue; its SDKs read those) and has xds.* too. sluice asks for
// route_name first — on Higress that is what its own plugins select by — then
// xds.route_name, and remembers which one answered, so on Envoy ≥ 1.33 a
// request costs one property call after the first.

// Property paths (segments separated by NUL).
const (
	propRouteName      = "route_name"
	propXDSRouteName   = "xds\x00route_name"
	propClusterName    = "cluster_name"
	propXDSClusterName = "xds\x00cluster_name"
	hdrAuthority       = ":authority"
)

const (
	havePropRoute = 1 << iota
	havePropCluster
	havePropAuthority
)

// reqProps is what scope selection and match.routes read from the request,
// each fetched at most once per request. It implements config.ScopeRequest.
// Byte slices alias host buffers valid for the current callback only.
type reqProps struct {
	host                            abi.Host
	have                            uint8
	route, cluster, authority       []byte
	routeOK, clusterOK, authorityOK bool
	// The xds.* name answered last time: ask for it first (kept across
	// requests).
	routeXDS, clusterXDS bool
}

var _ config.ScopeRequest = (*reqProps)(nil)

func (r *reqProps) reset(h abi.Host) {
	r.host = h
	r.have = 0
}

// lookup reads the property legacy or xds, the one that answered last time
// first; xdsFirst records which one answered.
func (r *reqProps) lookup(xdsFirst *bool, legacy, xds string) ([]byte, bool) {
	first, second := legacy, xds
	if *xdsFirst {
		first, second = xds, legacy
	}
	if v, st := r.host.GetProperty(first); st == abi.StatusOK {
		return v, true
	}
	v, st := r.host.GetProperty(second)
	if st != abi.StatusOK {
		return nil, false
	}
	*xdsFirst = !*xdsFirst
	return v, true
}

// RouteName implements config.ScopeRequest.
func (r *reqProps) RouteName() (string, bool) {
	if r.have&havePropRoute == 0 {
		r.have |= havePropRoute
		r.route, r.routeOK = r.lookup(&r.routeXDS, propRouteName, propXDSRouteName)
	}
	return unsafeString(r.route), r.routeOK
}

// ClusterName implements config.ScopeRequest.
func (r *reqProps) ClusterName() (string, bool) {
	if r.have&havePropCluster == 0 {
		r.have |= havePropCluster
		r.cluster, r.clusterOK = r.lookup(&r.clusterXDS, propClusterName, propXDSClusterName)
	}
	return unsafeString(r.cluster), r.clusterOK
}

// Authority implements config.ScopeRequest.
func (r *reqProps) Authority() (string, bool) {
	if r.have&havePropAuthority == 0 {
		r.have |= havePropAuthority
		r.authority, r.authorityOK = nil, false
		if v, st := r.host.GetHeader(abi.MapRequestHeaders, hdrAuthority); st == abi.StatusOK {
			r.authority, r.authorityOK = v, true
		}
	}
	return unsafeString(r.authority), r.authorityOK
}

// selectPlugin returns the Plugin whose configuration applies to the current
// request: a scope's, p's own (the top level), or nil when nothing applies
// (a configuration of "_rules_" alone, and no entry selects the request).
// p.props must be reset for the request.
func (p *Plugin) selectPlugin() *Plugin {
	if len(p.scopes) == 0 {
		return p
	}
	if sc := p.cfg.Select(&p.props); sc != nil {
		q := p.scopes[sc.Index]
		q.props = p.props // what selection read, for match.routes
		return q
	}
	if !p.cfg.HasGlobal() {
		return nil
	}
	return p
}

// routeMatches reports whether r's match.routes (if any) holds.
func (p *Plugin) routeMatches(m *config.Match) bool {
	if len(m.Routes) == 0 {
		return true
	}
	name, ok := p.props.RouteName()
	return m.MatchesRoute(name, ok)
}

// ruleID is a rule's identity in shared-data keys, Redis keys and metric
// names: its name, or "<scope>.<name>" for a rule of a "_rules_" entry
// (config refuses a top-level rule whose name would be the same).
func ruleID(scope *config.Scope, name string) string {
	if scope == nil {
		return name
	}
	return scope.Name + "." + name
}

// configs is the number of configurations of a root context: its own and
// its scopes'. configAt(i) returns them: 0 is p, i > 0 scope i-1.
func (p *Plugin) configs() int { return 1 + len(p.scopes) }

func (p *Plugin) configAt(i int) *Plugin {
	if i == 0 {
		return p
	}
	return p.scopes[i-1]
}
