package config

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"

	"github.com/sluice-proxy/sluice/config/internal/jsonv"
)

// ValueRef names a value the proxy knows about a request beyond its
// headers: a field of the stream's dynamic metadata (what a filter before
// sluice wrote, e.g. jwt_authn's verified claims) or one of the documented
// request and connection attributes. Exactly one of Namespace (with Path) and
// Attribute is set in a parsed configuration; the zero ValueRef names nothing.
type ValueRef struct {
	// Namespace is the dynamic-metadata namespace (the filter that wrote
	// it, e.g. "envoy.filters.http.jwt_authn"); Path the field within it,
	// segments joined by dots ("payload.sub").
	Namespace, Path string
	// Attribute is an attribute name, one of Attributes.
	Attribute string
	// Prop is the property path the filter asks the proxy for, segments
	// separated by NUL: "metadata\x00filter_metadata\x00<ns>\x00payload\x00sub"
	// or "connection\x00requested_server_name". Set whenever the ValueRef
	// names something.
	Prop string
}

// IsZero reports whether v names nothing.
func (v ValueRef) IsZero() bool { return v.Prop == "" }

// String is "metadata:<ns>:<path>" or "attribute:<name>", as in a Summary.
func (v ValueRef) String() string {
	if v.Attribute != "" {
		return "attribute:" + v.Attribute
	}
	return "metadata:" + plainText(v.Namespace, noCut) + ":" + plainText(v.Path, noCut)
}

// ValueMatch is a match condition on a ValueRef: its value is Exact, or,
// with Absent, the request does not have it (or it is empty).
type ValueMatch struct {
	Ref    ValueRef
	Exact  string
	Absent bool
	// Envoy hands a metadata number to a Wasm filter as the 8 bytes of a
	// little-endian IEEE 754 double: when Exact is a number, numBits is its
	// encoding, so that {"exact": "42"} holds for the number 42 too.
	num     bool
	numBits uint64
}

// Attributes are the request and connection attributes a key part or a
// match condition may name (Envoy's attribute names; the dynamic module
// reads the same ones by their ABI identifiers).
var Attributes = []string{
	"xds.route_name",
	"xds.cluster_name",
	"connection.requested_server_name",
	"connection.tls_version",
	"connection.subject_peer_certificate",
	"connection.dns_san_peer_certificate",
	"connection.uri_san_peer_certificate",
	"connection.sha256_peer_certificate_digest",
}

// Bounds of metadata references.
const (
	MaxMetadataNamespace = 256 // bytes
	MaxMetadataPath      = 8   // segments
	MaxMetadataSegment   = 256 // bytes per segment
)

// Property paths of dynamic metadata: Envoy's "metadata" attribute is the
// stream's envoy.config.core.v3.Metadata, whose filter_metadata maps a
// namespace to a Struct.
const metadataPropPrefix = "metadata\x00filter_metadata\x00"

var (
	valueRefFields   = []string{"namespace", "path"}
	metaMatchFields  = []string{"namespace", "path", "exact", "absent"}
	attrMatchFields  = []string{"name", "exact", "absent"}
	maxValueMatches  = 16
	allKeySourceText = `"remote_ip", "header", "query", "cookie", "path", "method", "metadata", "attribute"`
)

// metadataRef reads {"namespace": NS, "path": "a.b"}.
func (p *parser) metadataRef(path string, v jsonv.Value, f map[string]jsonv.Value) (ValueRef, bool) {
	var r ValueRef
	good := true
	if x, ok := f["namespace"]; ok {
		if s, ok := p.str(path+".namespace", x); !ok {
			good = false
		} else if s == "" || len(s) > MaxMetadataNamespace || strings.IndexByte(s, 0) >= 0 || hasSpaceOrControl(s) {
			p.fail(x, path+".namespace", show(x)+" is not a metadata namespace (1–256 bytes, no spaces or control characters)")
			good = false
		} else {
			r.Namespace = s
		}
	} else {
		p.failEnd(v, path+".namespace", `is required (the filter that wrote the metadata, e.g. "envoy.filters.http.jwt_authn")`)
		good = false
	}
	if x, ok := f["path"]; ok {
		if s, ok := p.str(path+".path", x); !ok {
			good = false
		} else if msg := checkMetadataPath(s); msg != "" {
			p.fail(x, path+".path", show(x)+" "+msg)
			good = false
		} else if p.build == BuildDynamic && strings.Contains(s, ".") {
			// The ABI has no getter for a nested field: the value would always be missing.
			p.fail(x, path+".path", show(x)+" is a nested field: "+p.build.String()+" reads only a top-level key of a namespace (sluice.wasm reads nested fields)")
			good = false
		} else {
			r.Path = s
		}
	} else {
		p.failEnd(v, path+".path", `is required (the field within the namespace, e.g. "payload.sub")`)
		good = false
	}
	if !good {
		return ValueRef{}, false
	}
	r.Prop = metadataPropPrefix + r.Namespace + "\x00" + strings.ReplaceAll(r.Path, ".", "\x00")
	return r, true
}

// checkMetadataPath says what is wrong with a metadata path, or "".
func checkMetadataPath(s string) string {
	segs := strings.Split(s, ".")
	if len(segs) > MaxMetadataPath {
		return "has more than " + strconv.Itoa(MaxMetadataPath) + " segments"
	}
	for _, g := range segs {
		if g == "" || len(g) > MaxMetadataSegment || strings.IndexByte(g, 0) >= 0 || hasSpaceOrControl(g) {
			return `is not a metadata path (field names of 1–256 bytes joined by ".")`
		}
	}
	return ""
}

// attributeRef reads an attribute name.
func (p *parser) attributeRef(path string, x jsonv.Value) (ValueRef, bool) {
	s, ok := p.str(path, x)
	if !ok {
		return ValueRef{}, false
	}
	if !containsString(Attributes, s) {
		msg := show(x) + " is not a supported attribute (" + strings.Join(Attributes, ", ") + ")"
		if g := suggest(s, Attributes); g != "" {
			msg += ` (did you mean "` + g + `"?)`
		}
		p.fail(x, path, msg)
		return ValueRef{}, false
	}
	return ValueRef{Attribute: s, Prop: strings.ReplaceAll(s, ".", "\x00")}, true
}

// keyValueSource reads a key part's "metadata" or "attribute" source into k;
// false when one is given and wrong.
func (p *parser) keyValueSource(ip string, f map[string]jsonv.Value, k *KeyPart) bool {
	good := true
	if x, ok := f["metadata"]; ok {
		if mf, ok := p.object(ip+".metadata", x, valueRefFields); !ok {
			good = false
		} else if r, ok := p.metadataRef(ip+".metadata", x, mf); ok {
			k.Value = r
		} else {
			good = false
		}
	}
	if x, ok := f["attribute"]; ok {
		if r, ok := p.attributeRef(ip+".attribute", x); ok {
			k.Value = r
		} else {
			good = false
		}
	}
	return good
}

// valueMatches reads a match's "metadata" and "attributes" conditions.
func (p *parser) valueMatches(path string, f map[string]jsonv.Value, m *Match) {
	if x, ok := f["metadata"]; ok {
		items, _ := p.boundedArray(path+".metadata", x, maxValueMatches, "conditions", "must not be empty (omit it to match any metadata)")
		for i, it := range items {
			ip := path + ".metadata[" + strconv.Itoa(i) + "]"
			mf, ok := p.object(ip, it, metaMatchFields)
			if !ok {
				continue
			}
			r, ok := p.metadataRef(ip, it, mf)
			if vm, ok2 := p.valueCondition(ip, it, mf, r); ok && ok2 {
				m.Values = append(m.Values, vm)
			}
		}
	}
	if x, ok := f["attributes"]; ok {
		items, _ := p.boundedArray(path+".attributes", x, maxValueMatches, "conditions", "must not be empty (omit it to match any attributes)")
		for i, it := range items {
			ip := path + ".attributes[" + strconv.Itoa(i) + "]"
			mf, ok := p.object(ip, it, attrMatchFields)
			if !ok {
				continue
			}
			var r ValueRef
			if n, ok := mf["name"]; !ok {
				p.failEnd(it, ip+".name", "is required")
				continue
			} else if r, ok = p.attributeRef(ip+".name", n); !ok {
				continue
			}
			if vm, ok := p.valueCondition(ip, it, mf, r); ok {
				m.Values = append(m.Values, vm)
			}
		}
	}
}

// valueCondition reads "exact" or "absent" of a condition on r.
func (p *parser) valueCondition(ip string, it jsonv.Value, f map[string]jsonv.Value, r ValueRef) (ValueMatch, bool) {
	vm := ValueMatch{Ref: r}
	e, hasExact := f["exact"]
	if hasExact {
		s, ok := p.str(ip+".exact", e)
		if !ok {
			return vm, false
		}
		vm.Exact = s
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			vm.num, vm.numBits = true, math.Float64bits(f)
		}
	}
	a, hasAbsent := f["absent"]
	switch {
	case hasAbsent && hasExact:
		p.fail(a, ip+".absent", `cannot be combined with "exact"; give one of them`)
		return vm, false
	case hasAbsent:
		b, ok := p.boolean(ip+".absent", a)
		if !ok {
			return vm, false
		}
		if !b {
			p.fail(a, ip+".absent", `must be true (use "exact" to match a value)`)
			return vm, false
		}
		vm.Absent = true
	case !hasExact:
		p.failEnd(it, ip+".exact", `is required (or "absent": true to match a request without the value)`)
		return vm, false
	}
	return vm, true
}

// MatchesValues reports whether every metadata and attribute condition of
// m holds, get returning a value by its property path (ValueRef.Prop) and
// whether the request has it. An empty value is absent.
func (m *Match) MatchesValues(get func(prop string) ([]byte, bool)) bool {
	for i := range m.Values {
		c := &m.Values[i]
		v, ok := get(c.Ref.Prop)
		if c.Absent {
			if ok && len(v) > 0 {
				return false
			}
			continue
		}
		if !ok {
			return false
		}
		if string(v) != c.Exact && !(c.num && len(v) == 8 && binary.LittleEndian.Uint64(v) == c.numBits) {
			return false
		}
	}
	return true
}

// valuesString describes m's value conditions as in a Summary.
func (m *Match) valuesString() []string {
	var out []string
	for _, c := range m.Values {
		if c.Absent {
			out = append(out, c.Ref.String()+":absent")
		} else {
			out = append(out, c.Ref.String()+"="+strconv.Quote(c.Exact))
		}
	}
	return out
}
