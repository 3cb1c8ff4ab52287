package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/config"
)

// `sluice check --explain SAMPLE ...`: for a sample request, which rules of the top-level
// configuration apply to it, with which key parts, and which parameters — an override, a
// plan, or the rule's own. A sample is given piece by piece:
//
//	method=POST  path=/api/x?k=1  header:NAME=VALUE  metadata:NAMESPACE:PATH=VALUE
//	attribute:NAME=VALUE  route=NAME
//
// A metadata value is a string (jwt_authn's claims as strings; a number as its decimal form
// matches "exact" numbers). The client address is taken as present.

// explainSample is a sample request.
type explainSample struct {
	method, path string
	route        string
	hasRoute     bool
	headers      map[string]string
	props        map[string][]byte // by property path (config.ValueRef.Prop)
}

// addExplain adds one piece of a sample.
func (s *explainSample) add(piece string) error {
	k, v, ok := strings.Cut(piece, "=")
	if !ok {
		return fmt.Errorf("--explain %s: want KIND=VALUE (method=, path=, header:NAME=, metadata:NS:PATH=, attribute:NAME=, route=)", printable(piece))
	}
	switch {
	case k == "method":
		s.method = v
	case k == "path":
		s.path = v
	case k == "route":
		s.route, s.hasRoute = v, true
	case strings.HasPrefix(k, "header:"):
		s.headers[strings.ToLower(k[len("header:"):])] = v
	case strings.HasPrefix(k, "metadata:"):
		ns, p, ok := strings.Cut(k[len("metadata:"):], ":")
		if !ok || ns == "" || p == "" {
			return fmt.Errorf("--explain %s: want metadata:NAMESPACE:PATH=VALUE", printable(piece))
		}
		s.props["metadata\x00filter_metadata\x00"+ns+"\x00"+strings.ReplaceAll(p, ".", "\x00")] = []byte(v)
	case strings.HasPrefix(k, "attribute:"):
		s.props[strings.ReplaceAll(k[len("attribute:"):], ".", "\x00")] = []byte(v)
	default:
		return errors.New("--explain " + printable(piece) + ": unknown kind " + printable(k))
	}
	return nil
}

func newExplainSample() *explainSample {
	return &explainSample{method: "GET", path: "/", headers: map[string]string{}, props: map[string][]byte{}}
}

func (s *explainSample) header(name string) (string, bool) {
	v, ok := s.headers[name]
	return v, ok
}

func (s *explainSample) prop(p string) ([]byte, bool) {
	v, ok := s.props[p]
	return v, ok && len(v) > 0
}

// value returns what a key part or a table's "by" reads from the sample.
func (s *explainSample) value(k config.KeyPart) (string, bool) {
	switch {
	case k.RemoteIP:
		return "(client address)", true
	case k.Header != "":
		v, ok := s.headers[k.Header]
		return v, ok && v != ""
	case k.Query != "":
		u, err := url.ParseRequestURI(s.path)
		if err != nil {
			return "", false
		}
		v := u.Query().Get(k.Query)
		return v, v != ""
	case k.Cookie != "":
		r := http.Request{Header: http.Header{"Cookie": {s.headers["cookie"]}}}
		c, err := r.Cookie(k.Cookie)
		if err != nil || c.Value == "" {
			return "", false
		}
		return c.Value, true
	case k.Path:
		return config.NormalizePath(s.path), s.path != ""
	case k.Method:
		return s.method, s.method != ""
	case !k.Value.IsZero():
		v, ok := s.prop(k.Value.Prop)
		return string(v), ok
	}
	return "", false
}

// explain prints, for each top-level rule of c, what the sample gets.
func explain(w io.Writer, indent string, c *config.Config, s *explainSample) {
	fmt.Fprintln(w, indent+"explain "+s.method+" "+printable(s.path)+":")
	for _, r := range c.Rules {
		fmt.Fprintln(w, indent+"  "+r.Name+": "+explainRule(r, s))
	}
}

func explainRule(r *config.Rule, s *explainSample) string {
	m := &r.Match
	if !m.Matches(s.method, s.path, s.header) || !m.MatchesRoute(s.route, s.hasRoute) || !m.MatchesValues(s.prop) {
		return "does not apply (match)"
	}
	var parts []string
	for _, k := range r.Key {
		v, ok := s.value(k)
		if !ok {
			return "key part " + k.String() + " missing: missing_key " + r.MissingKey.String()
		}
		parts = append(parts, k.String()+"="+strconv.Quote(v))
	}
	e, how := r.Plans.Lookup(nil, false), "rule's own"
	if o := r.Overrides; o != nil {
		if v, ok := s.value(o.By); ok && o.Entries[v] != nil {
			e, how = o.Entries[v], "override "+strconv.Quote(v)
		}
	}
	if !strings.HasPrefix(how, "override") && r.Plans != nil {
		v, ok := s.value(r.Plans.By)
		e = r.Plans.Lookup([]byte(v), ok)
		switch {
		case e == nil:
			how = "rule's own (no plan)"
		case ok && r.Plans.Entries[v] != nil:
			how = "plan " + strconv.Quote(v)
		default:
			how = "default plan " + strconv.Quote(e.Name)
		}
	}
	par := algorithms.Params{Limit: r.Limit, Window: r.Window, Burst: r.Burst}
	if e != nil {
		par = e.Params
	}
	out := "applies, key " + strings.Join(parts, " ") + ", " + strconv.FormatInt(par.Limit, 10) + "/" + config.FormatDuration(par.Window)
	if r.Algorithm == algorithms.TokenBucket || r.Algorithm == algorithms.LeakyBucket {
		out += " burst " + strconv.FormatInt(par.Burst, 10)
	}
	return out + " (" + how + ")"
}
