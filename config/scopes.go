package config

import (
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// Scopes: Higress's per-route, per-domain and per-service configurations.
//
// Higress turns the matchRules of its WasmPlugin into one list in the plugin
// configuration, "_rules_": each entry is the matchRule's config object with
// the match keys added to it —
//
//	{"rules": [...],                                  <- defaultConfig: the global configuration
//	 "_rules_": [
//	   {"_match_route_": ["default/checkout"], "rules": [...], ...},
//	   {"_match_domain_": ["*.example.com"], "rules": [...]}]}
//
// and its plugin SDKs (higress-group/wasm-go pkg/matcher/rule_matcher.go,
// RuleMatcher.GetMatchConfig and ParseRuleConfig; the C++ SDK's
// plugins/wasm-cpp/common/route_rule_matcher.h does the same) select one
// configuration per request: the first entry of "_rules_", in order, whose
// condition holds; the global configuration when none does; nothing (the
// plugin does not act) when there is no global configuration either. Higress
// writes route-level (ingress) matchRules before domain-level ones (its
// console, and hgctl's plugin installer, build them in that order), which is
// where "route level over domain level over global" comes from; the SDK
// itself only keeps the order. sluice selects exactly as the SDK does, with
// the differences documented on Config.Select.
//
// Each entry's condition (its kind) is decided by which keys it has, as the
// SDK decides its category: _match_route_ (with _match_service_: both must
// hold), else _match_domain_, else _match_service_, else
// _match_route_prefix_. Where the SDK silently ignores a key (domains or
// route prefixes beside routes, services beside domains, …) sluice refuses the
// configuration instead: the entry would apply to more requests than it says.
//
// An entry is a complete sluice configuration of its own ("rules" required,
// "response", "failure_mode", "client_ip", "redis" as at the top level,
// nothing inherited from the top level), as Higress's own rate-limit plugins
// parse their rule configurations (wrapper.ParseConfig, not
// ParseOverrideConfig): a matchRule's config replaces the global one for the
// requests it selects. "rules" may be empty in an entry, which exempts the
// requests it selects from every limit. An entry may name itself with
// "scope" (default "rules_<i>"): its rules' counters, shared-data keys and
// metrics (sluice.<scope>.<rule>.allowed, …) are its own.

// Match keys of a "_rules_" entry (Higress's names).
const (
	RulesKey            = "_rules_"
	MatchRouteKey       = "_match_route_"
	MatchDomainKey      = "_match_domain_"
	MatchServiceKey     = "_match_service_"
	MatchRoutePrefixKey = "_match_route_prefix_"
	scopeNameKey        = "scope"
)

// Bounds of scopes.
const (
	MaxScopes         = 1000 // entries of "_rules_"
	MaxScopeValues    = 1000 // values of one _match_* list, or of match.routes
	MaxRouteNameLen   = 512  // bytes of a route name or route prefix
	MaxDomainLen      = 255  // bytes of a _match_domain_ value (253 + wildcard and brackets)
	MaxScopeNameLen   = 64
	defaultScopeName  = "rules_"
	maxServicePortLen = 5
)

// ScopeKind is the condition of a scope, decided by its match keys as
// Higress's SDK decides an entry's category.
type ScopeKind uint8

const (
	ScopeRoute        ScopeKind = iota // _match_route_: the route name is one of Routes
	ScopeRouteService                  // _match_route_ and _match_service_: both hold
	ScopeDomain                        // _match_domain_: the request's host matches one of Domains
	ScopeService                       // _match_service_: the upstream cluster is one of Services
	ScopeRoutePrefix                   // _match_route_prefix_: the route name starts with one of RoutePrefixes
)

var scopeKindNames = [...]string{
	ScopeRoute: "route", ScopeRouteService: "route+service", ScopeDomain: "domain",
	ScopeService: "service", ScopeRoutePrefix: "route_prefix",
}

// String returns "route", "route+service", "domain", "service" or "route_prefix".
func (k ScopeKind) String() string { return enumName(scopeKindNames[:], int(k)) }

// Scope is one entry of "_rules_": the requests it selects and the
// configuration that applies to them instead of the top-level one.
type Scope struct {
	Index int    // position in "_rules_"
	Name  string // "scope", or "rules_<Index>"; unique, letters, digits, '-' and '_'
	Kind  ScopeKind
	// Routes are exact route names (_match_route_); RoutePrefixes prefixes of
	// route names (_match_route_prefix_).
	Routes, RoutePrefixes []string
	Domains               []DomainMatch  // _match_domain_
	Services              []ServiceMatch // _match_service_
	// Config is the entry's own configuration (Scopes always empty).
	Config *Config
}

// DomainMatch is one _match_domain_ value: Host exactly ("api.example.com"),
// a suffix after a leading '*' ("*.example.com": Host ".example.com"), a
// prefix before a trailing '*' ("api.*": Host "api."), or "*" (every host:
// Host "", DomainSuffix).
type DomainMatch struct {
	Host string // lower-case
	Kind DomainKind
}

// DomainKind says how a DomainMatch compares.
type DomainKind uint8

const (
	DomainExact  DomainKind = iota
	DomainSuffix            // written with a leading '*'
	DomainPrefix            // written with a trailing '*'
)

// ServiceMatch is one _match_service_ value, "FQDN" or "FQDN:PORT"
// ("backend.default.svc.cluster.local:8080"). It is compared with the
// request's cluster name as Higress (Istio) names clusters,
// "outbound|PORT|SUBSET|FQDN": the FQDN exactly, and the port when given.
type ServiceMatch struct {
	FQDN string
	Port string // "" = any port
}

// ScopeRequest is what selecting a scope reads from a request. Each method is
// called at most once per Select, and only when a scope needs its value; ok is
// false when the request has no such value (no route, no cluster, no
// :authority).
type ScopeRequest interface {
	// RouteName is the name of the route the proxy chose (Envoy's route
	// name: route_name, xds.route_name).
	RouteName() (name string, ok bool)
	// Authority is the :authority (Host) header, port included if sent.
	Authority() (host string, ok bool)
	// ClusterName is the upstream cluster of the route (cluster_name,
	// xds.cluster_name).
	ClusterName() (name string, ok bool)
}

// Select returns the scope whose configuration applies to a request: the
// first entry of "_rules_" (in order) that selects it, or nil — then the
// top-level configuration applies (HasGlobal), or nothing does. It allocates
// nothing.
//
// Differences from Higress's SDK, each on the side of limiting: host names
// compare case-insensitively (DNS names do, and Envoy routes
// "API.example.com" to the virtual host of "api.example.com", so a client
// changing case must not leave a domain's scope), and a request without
// :authority only fails the domain conditions (the SDK skips the plugin
// altogether for it, global configuration included).
func (c *Config) Select(r ScopeRequest) *Scope {
	if len(c.Scopes) == 0 {
		return nil
	}
	var route, host, cluster string
	var haveRoute, haveHost, haveCluster, routeOK, hostOK, clusterOK bool
	for _, s := range c.Scopes {
		switch s.Kind {
		case ScopeRoute, ScopeRouteService, ScopeRoutePrefix:
			if !haveRoute {
				route, routeOK = r.RouteName()
				haveRoute = true
			}
			if !routeOK || !s.matchRoute(route) {
				continue
			}
			if s.Kind != ScopeRouteService {
				return s
			}
			fallthrough
		case ScopeService:
			if !haveCluster {
				cluster, clusterOK = r.ClusterName()
				haveCluster = true
			}
			if clusterOK && s.MatchService(cluster) {
				return s
			}
		case ScopeDomain:
			if !haveHost {
				host, hostOK = r.Authority()
				haveHost = true
			}
			if hostOK && s.MatchHost(host) {
				return s
			}
		}
	}
	return nil
}

// HasGlobal reports whether the top-level configuration applies to the
// requests no scope selects: false only for a configuration of "_rules_"
// alone.
func (c *Config) HasGlobal() bool { return len(c.Rules) > 0 || len(c.Scopes) == 0 }

func (s *Scope) matchRoute(name string) bool {
	if s.Kind == ScopeRoutePrefix {
		for _, p := range s.RoutePrefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
	for _, r := range s.Routes {
		if r == name {
			return true
		}
	}
	return false
}

// MatchRoute reports whether a route name meets the scope's route condition
// (exact names, or prefixes for ScopeRoutePrefix). Other kinds: false.
func (s *Scope) MatchRoute(name string) bool {
	switch s.Kind {
	case ScopeRoute, ScopeRouteService, ScopeRoutePrefix:
		return s.matchRoute(name)
	}
	return false
}

// MatchHost reports whether an :authority value matches one of the scope's
// domains: the port is removed as Higress does (the text after the last ':'
// unless it is inside an IPv6 literal's brackets), then compared
// case-insensitively.
func (s *Scope) MatchHost(authority string) bool {
	host := stripPort(authority)
	for _, d := range s.Domains {
		switch d.Kind {
		case DomainExact:
			if strings.EqualFold(host, d.Host) {
				return true
			}
		case DomainSuffix:
			if len(host) >= len(d.Host) && strings.EqualFold(host[len(host)-len(d.Host):], d.Host) {
				return true
			}
		case DomainPrefix:
			if len(host) >= len(d.Host) && strings.EqualFold(host[:len(d.Host)], d.Host) {
				return true
			}
		}
	}
	return false
}

// MatchService reports whether a cluster name of the form
// "DIRECTION|PORT|SUBSET|FQDN" (exactly four '|'-separated parts, as Higress
// requires) names one of the scope's services. Other names never match.
func (s *Scope) MatchService(cluster string) bool {
	// Split without allocating: parts 1 (port) and 3 (FQDN).
	var bars [3]int
	n := 0
	for i := 0; i < len(cluster); i++ {
		if cluster[i] == '|' {
			if n == 3 {
				return false
			}
			bars[n] = i
			n++
		}
	}
	if n != 3 {
		return false
	}
	port, fqdn := cluster[bars[0]+1:bars[1]], cluster[bars[2]+1:]
	for _, m := range s.Services {
		if m.FQDN == fqdn && (m.Port == "" || m.Port == port) {
			return true
		}
	}
	return false
}

// stripPort removes a port from an :authority value as Higress's SDK does
// (stripPortFromHost, after Envoy's header_utility.cc): from the last ':',
// unless that ':' is inside "[...]".
func stripPort(h string) string {
	i := strings.LastIndexByte(h, ':')
	if i < 0 {
		return h
	}
	if j := strings.LastIndexByte(h, ']'); j < 0 || j < i {
		return h[:i]
	}
	return h
}

// MatchesRoute reports whether the route condition of m holds for a request
// whose route name is name (ok false: the request has no route, which no
// condition matches). Match.Matches does not look at Routes: a request is
// selected by m when both hold. The zero Routes matches every request.
func (m *Match) MatchesRoute(name string, ok bool) bool {
	if len(m.Routes) == 0 {
		return true
	}
	if !ok {
		return false
	}
	for _, r := range m.Routes {
		if r == name {
			return true
		}
	}
	return false
}

// Which part of a document the parser is parsing (parser.part).
type docPart uint8

const (
	partWhole  docPart = iota // a whole configuration
	partGlobal                // the top level of a configuration with "_rules_"
	partEntry                 // one entry of "_rules_"
)

var entryFields = []string{MatchRouteKey, MatchDomainKey, MatchServiceKey, MatchRoutePrefixKey, scopeNameKey}

// topFields returns the top-level field names the part may have.
func (p *parser) topFields() []string {
	switch p.part {
	case partGlobal:
		return append(topFields[:len(topFields):len(topFields)], RulesKey)
	case partEntry:
		return append(topFields[:len(topFields):len(topFields)], entryFields...)
	}
	return topFields
}

// hasScopes reports whether root is an object with a "_rules_" member.
func hasScopes(root jsonv.Value) bool {
	if !root.IsObject() {
		return false
	}
	found := false
	root.ForEach(func(k, _ jsonv.Value) bool {
		found = k.String() == RulesKey
		return !found
	})
	return found
}

// scoped parses a configuration with "_rules_" (data is the whole document,
// root its parsed top level): the top level without "_rules_" as the global
// configuration (absent when "_rules_" is its only member), then each entry
// as a configuration of its own, with its match keys.
func (p *parser) scoped(data []byte, root jsonv.Value) *Config {
	var c *Config
	var list jsonv.Value
	others, lists := 0, 0
	root.ForEach(func(k, v jsonv.Value) bool {
		if k.String() != RulesKey {
			others++
		} else if lists++; lists == 1 {
			list = v
		} else if others == 0 {
			p.fail(k, RulesKey, "duplicate field") // else the global part says so
		}
		return true
	})
	if others > 0 {
		g := &parser{part: partGlobal, build: p.build}
		c = g.parse(data)
		p.errs = append(p.errs, g.errs...)
	}
	if c == nil {
		c = &Config{Response: Response{Status: DefaultStatus, Body: DefaultBody, Headers: HeadersBoth, GRPCStatus: DefaultGRPCStatus}}
	}
	items, ok := p.boundedArray(RulesKey, list, MaxScopes, "entries", "must contain at least one entry (omit it when nothing is scoped)")
	if !ok {
		return c
	}
	names := map[string]int{}
	seen := map[string]int{}
	for i, it := range items {
		path := RulesKey + "[" + strconv.Itoa(i) + "]"
		s := p.scope(path, i, it)
		if s == nil {
			continue
		}
		if j, dup := names[s.Name]; dup {
			at := it.Get(scopeNameKey)
			if !at.Exists() {
				at = jsonv.Value{Index: it.Index + len(it.Raw)}
			}
			p.fail(at, path+"."+scopeNameKey, "duplicate scope name "+Quote(s.Name, maxShownValue)+" (also "+RulesKey+"["+strconv.Itoa(j)+"])")
		} else {
			names[s.Name] = i
		}
		if key := s.conditionKey(); key != "" {
			if j, dup := seen[key]; dup {
				p.failEnd(it, path, "selects the same requests as "+RulesKey+"["+strconv.Itoa(j)+"], which comes first and wins: this entry would never apply")
			} else {
				seen[key] = i
			}
		}
		c.Scopes = append(c.Scopes, s)
	}
	// Rule counters and metrics are sluice.<scope>.<rule>.…; a top-level rule
	// whose name is "<scope>.<rule>" would share them.
	global := map[string]bool{}
	for _, r := range c.Rules {
		global[r.Name] = true
	}
	for _, s := range c.Scopes {
		if s.Config == nil {
			continue
		}
		for _, r := range s.Config.Rules {
			if r.Backend == BackendRLS && len(s.Name)+1+len(r.Name) > MaxRuleNameLen {
				p.fail(jsonv.Value{Index: root.Index + len(root.Raw)}, RulesKey+"["+strconv.Itoa(s.Index)+"].rules["+strconv.Itoa(r.Index)+"].name",
					"the rate-limit service names this rule "+strconv.Quote(s.Name+"."+r.Name)+", longer than "+strconv.Itoa(MaxRuleNameLen)+" bytes; shorten the scope or the rule name")
			}
			if global[s.Name+"."+r.Name] {
				p.fail(jsonv.Value{Index: root.Index + len(root.Raw)}, RulesKey+"["+strconv.Itoa(s.Index)+"].rules["+strconv.Itoa(r.Index)+"].name",
					"scope "+Quote(s.Name, maxShownValue)+" and rule "+Quote(r.Name, maxShownValue)+" give the same counter names as the top-level rule "+Quote(s.Name+"."+r.Name, maxShownValue)+"; rename one")
			}
		}
	}
	return c
}

// scope parses one "_rules_" entry.
func (p *parser) scope(path string, i int, v jsonv.Value) *Scope {
	if !v.IsObject() {
		p.fail(v, path, show(v)+" is not an object")
		return nil
	}
	// The entry's configuration, parsed as a document of its own; its
	// errors are moved under path.
	q := &parser{part: partEntry, build: p.build}
	cfg := q.parse([]byte(v.Raw))
	for _, e := range q.errs {
		e.at += v.Index
		if e.path == "" {
			e.path = path
		} else if strings.HasPrefix(e.path, "[") {
			e.path = path + e.path
		} else {
			e.path = path + "." + e.path
		}
		p.errs = append(p.errs, e)
	}
	s := &Scope{Index: i, Name: defaultScopeName + strconv.Itoa(i), Config: cfg}
	var has [4]bool
	var given [4]jsonv.Value
	v.ForEach(func(k, x jsonv.Value) bool {
		switch k.String() {
		case MatchRouteKey:
			has[0], given[0] = true, x
		case MatchServiceKey:
			has[1], given[1] = true, x
		case MatchDomainKey:
			has[2], given[2] = true, x
		case MatchRoutePrefixKey:
			has[3], given[3] = true, x
		case scopeNameKey:
			if n, ok := p.str(path+"."+scopeNameKey, x); ok {
				if msg := checkScopeName(n); msg != "" {
					p.fail(x, path+"."+scopeNameKey, show(x)+" "+msg)
				} else {
					s.Name = n
				}
			}
		}
		return true
	})
	if has[0] {
		s.Routes = p.routeList(path+"."+MatchRouteKey, given[0], false)
	}
	if has[1] {
		s.Services = p.serviceList(path+"."+MatchServiceKey, given[1])
	}
	if has[2] {
		s.Domains = p.domainList(path+"."+MatchDomainKey, given[2])
	}
	if has[3] {
		s.RoutePrefixes = p.routeList(path+"."+MatchRoutePrefixKey, given[3], true)
	}
	// The kind, as the SDK decides the category; keys it would ignore are
	// errors.
	ignored := func(j int, by string) {
		p.fail(given[j], path+"."+[]string{MatchRouteKey, MatchServiceKey, MatchDomainKey, MatchRoutePrefixKey}[j],
			"cannot be combined with "+by+": Higress selects such an entry by "+by+" alone; give it an entry of its own")
	}
	switch {
	case has[0]:
		s.Kind = ScopeRoute
		if has[1] {
			s.Kind = ScopeRouteService
		}
		if has[2] {
			ignored(2, MatchRouteKey)
		}
		if has[3] {
			ignored(3, MatchRouteKey)
		}
	case has[2]:
		s.Kind = ScopeDomain
		if has[1] {
			ignored(1, MatchDomainKey)
		}
		if has[3] {
			ignored(3, MatchDomainKey)
		}
	case has[1]:
		s.Kind = ScopeService
		if has[3] {
			ignored(3, MatchServiceKey)
		}
	case has[3]:
		s.Kind = ScopeRoutePrefix
	default:
		p.failEnd(v, path, `needs one of "`+MatchRouteKey+`", "`+MatchDomainKey+`", "`+MatchServiceKey+`", "`+MatchRoutePrefixKey+`"`)
		return nil
	}
	return s
}

// conditionKey is a canonical form of the scope's condition: two scopes with
// the same key select the same requests. "" for a scope whose values did not
// parse.
func (s *Scope) conditionKey() string {
	var parts []string
	add := func(tag string, vals []string) {
		v := append([]string(nil), vals...)
		sort.Strings(v)
		parts = append(parts, tag+strconv.Itoa(len(v)))
		for _, x := range v {
			parts = append(parts, strconv.Quote(x))
		}
	}
	switch s.Kind {
	case ScopeRoute, ScopeRouteService:
		if len(s.Routes) == 0 {
			return ""
		}
		add("r", s.Routes)
		if s.Kind == ScopeRoute {
			break
		}
		fallthrough
	case ScopeService:
		if len(s.Services) == 0 {
			return ""
		}
		var v []string
		for _, m := range s.Services {
			v = append(v, m.FQDN+":"+m.Port)
		}
		add("s", v)
	case ScopeDomain:
		if len(s.Domains) == 0 {
			return ""
		}
		var v []string
		for _, d := range s.Domains {
			v = append(v, strconv.Itoa(int(d.Kind))+d.Host)
		}
		add("d", v)
	case ScopeRoutePrefix:
		if len(s.RoutePrefixes) == 0 {
			return ""
		}
		add("p", s.RoutePrefixes)
	}
	return strconv.Itoa(int(s.Kind)) + " " + strings.Join(parts, " ")
}

// stringList parses a non-empty list of distinct non-empty strings, each
// checked by check (which returns "" or what is wrong). Items that fail are
// reported and left out.
func (p *parser) stringList(path string, v jsonv.Value, what string, check func(string) string) []string {
	items, ok := p.boundedArray(path, v, MaxScopeValues, "values", "must not be empty")
	if !ok {
		return nil
	}
	out := make([]string, 0, len(items))
	for i, it := range items {
		ip := path + "[" + strconv.Itoa(i) + "]"
		s, ok := p.str(ip, it)
		if !ok {
			continue
		}
		if msg := check(s); msg != "" {
			p.fail(it, ip, show(it)+" "+msg)
			continue
		}
		if containsString(out, s) {
			p.fail(it, ip, "duplicate "+what+" "+Quote(s, maxShownValue))
			continue
		}
		out = append(out, s)
	}
	return out
}

// checkRouteName accepts a route name (or route name prefix): 1 to
// MaxRouteNameLen bytes of valid UTF-8 without control characters. Envoy
// route names are free text; Istio builds them from VirtualService names
// ("http-name" or "http-name.match-name"), Higress from Ingress names
// ("namespace/name").
func checkRouteName(s string) string {
	switch {
	case s == "":
		return "is empty"
	case len(s) > MaxRouteNameLen:
		return "is longer than " + strconv.Itoa(MaxRouteNameLen) + " bytes"
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return "must not contain control characters"
		}
	}
	return ""
}

func (p *parser) routeList(path string, v jsonv.Value, prefixes bool) []string {
	what := "route name"
	if prefixes {
		what = "route prefix"
	}
	return p.stringList(path, v, what, checkRouteName)
}

// checkDomain accepts a _match_domain_ value: a host name or IP address
// (IPv6 in brackets) without a port, optionally with one '*' at the start
// ("*.example.com") or the end ("api.*"), or "*" alone.
func checkDomain(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > MaxDomainLen {
		return "is longer than " + strconv.Itoa(MaxDomainLen) + " bytes"
	}
	if s == "*" {
		return ""
	}
	h := s
	switch {
	case strings.HasPrefix(h, "*"):
		h = h[1:]
	case strings.HasSuffix(h, "*"):
		h = h[:len(h)-1]
	}
	if strings.Contains(h, "*") {
		return `may have one "*", at its start or its end`
	}
	if strings.HasPrefix(h, "[") {
		j := strings.IndexByte(h, ']')
		if j < 0 {
			return "has no closing bracket"
		}
		for _, c := range []byte(h[1:j]) {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == ':' || c == '.') {
				return "is not an IPv6 address in brackets"
			}
		}
		if j != len(h)-1 {
			return "must not have a port: the request's host is compared without its port"
		}
		return ""
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		case c == ':':
			return "must not have a port: the request's host is compared without its port"
		default:
			return "is not a host name"
		}
	}
	return ""
}

func (p *parser) domainList(path string, v jsonv.Value) []DomainMatch {
	vals := p.stringList(path, v, "domain", checkDomain)
	if vals == nil {
		return nil
	}
	out := make([]DomainMatch, 0, len(vals))
	for _, s := range vals {
		d := DomainMatch{Host: strings.ToLower(s)}
		switch {
		case s == "*":
			d.Host, d.Kind = "", DomainSuffix
		case strings.HasPrefix(s, "*"):
			d.Host, d.Kind = d.Host[1:], DomainSuffix
		case strings.HasSuffix(s, "*"):
			d.Host, d.Kind = d.Host[:len(d.Host)-1], DomainPrefix
		}
		out = append(out, d)
	}
	return out
}

// checkService accepts a _match_service_ value, "FQDN" or "FQDN:PORT".
func checkService(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > MaxDomainLen+1+maxServicePortLen {
		return "is too long"
	}
	fqdn, port, hasPort := strings.Cut(s, ":")
	if hasPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 || len(port) > maxServicePortLen || port[0] == '0' || port[0] == '+' {
			return "has a bad port (want FQDN or FQDN:PORT, PORT 1..65535)"
		}
	}
	if fqdn == "" {
		return "has no service name (want FQDN or FQDN:PORT)"
	}
	for i := 0; i < len(fqdn); i++ {
		c := fqdn[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "is not a service name (want FQDN or FQDN:PORT, e.g. backend.default.svc.cluster.local:8080)"
		}
	}
	return ""
}

func (p *parser) serviceList(path string, v jsonv.Value) []ServiceMatch {
	vals := p.stringList(path, v, "service", checkService)
	if vals == nil {
		return nil
	}
	out := make([]ServiceMatch, 0, len(vals))
	for _, s := range vals {
		fqdn, port, _ := strings.Cut(s, ":")
		out = append(out, ServiceMatch{FQDN: fqdn, Port: port})
	}
	return out
}

// routes parses match.routes.
func (p *parser) routes(path string, v jsonv.Value, m *Match) {
	m.Routes = p.stringList(path, v, "route name", checkRouteName)
}

// plainList joins values with ',' for a summary, each bare when plain
// (plainText) and without a ',', else quoted.
func plainList(vals []string) string {
	var b strings.Builder
	for i, v := range vals {
		if i > 0 {
			b.WriteByte(',')
		}
		if strings.IndexByte(v, ',') >= 0 {
			b.WriteString(Quote(v, noCut))
		} else {
			b.WriteString(plainText(v, noCut))
		}
	}
	return b.String()
}

// String returns the value as written in the configuration.
func (d DomainMatch) String() string {
	switch {
	case d.Kind == DomainSuffix:
		return "*" + d.Host
	case d.Kind == DomainPrefix:
		return d.Host + "*"
	}
	return d.Host
}

// String returns the value as written in the configuration.
func (m ServiceMatch) String() string {
	if m.Port == "" {
		return m.FQDN
	}
	return m.FQDN + ":" + m.Port
}

// Summary describes the scope's condition on one line, e.g.
//
//	scope checkout (_rules_[0]): route default/checkout,default/cart
//	scope rules_1 (_rules_[1]): domain *.example.com
//	scope rules_2 (_rules_[2]): route default/api and service api.default.svc.cluster.local:8080
//
// followed, in `sluice check`, by the scope's rules (Rule.Summary).
func (s *Scope) Summary() string {
	var b strings.Builder
	b.WriteString("scope ")
	b.WriteString(s.Name)
	b.WriteString(" (" + RulesKey + "[" + strconv.Itoa(s.Index) + "]): ")
	switch s.Kind {
	case ScopeRoute, ScopeRouteService:
		b.WriteString("route ")
		b.WriteString(plainList(s.Routes))
		if s.Kind == ScopeRouteService {
			b.WriteString(" and ")
			b.WriteString(serviceSummary(s.Services))
		}
	case ScopeService:
		b.WriteString(serviceSummary(s.Services))
	case ScopeDomain:
		v := make([]string, len(s.Domains))
		for i, d := range s.Domains {
			v[i] = d.String()
		}
		b.WriteString("domain ")
		b.WriteString(plainList(v))
	case ScopeRoutePrefix:
		b.WriteString("route_prefix ")
		b.WriteString(plainList(s.RoutePrefixes))
	}
	if s.Config != nil && len(s.Config.Rules) == 0 {
		b.WriteString(" (no rules: exempt)")
	}
	return b.String()
}

func serviceSummary(ms []ServiceMatch) string {
	v := make([]string, len(ms))
	for i, m := range ms {
		v[i] = m.String()
	}
	return "service " + plainList(v)
}
