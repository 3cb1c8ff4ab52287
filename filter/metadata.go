package filter

import (
	"github.com/sluice-proxy/sluice/config"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// Key part tags of the values config.ValueRef names, after those of
// keys.go, so that keys of the other kinds keep their encoding.
const (
	tagMetadata = tagMethod + 1 + iota
	tagAttribute
)

// value returns the request's value of a metadata field or attribute by its
// property path (config.ValueRef.Prop): the bytes the proxy returns —
// a string as is; a number as Envoy serializes it, the 8 bytes of a
// little-endian double; a boolean as one byte; a structure in the pair
// encoding. Missing: the proxy has no such value, cannot read it, or it is
// empty. The bytes alias a host buffer valid for the current callback.
func (r *request) value(prop string) ([]byte, bool) {
	v, st := r.host.GetProperty(prop)
	if st != abi.StatusOK && (prop == propXDSRouteName || prop == propXDSClusterName) {
		// Higress's Envoy and older ones name them route_name, cluster_name.
		v, st = r.host.GetProperty(prop[len("xds\x00"):])
	}
	if st != abi.StatusOK || len(v) == 0 {
		return nil, false
	}
	return v, true
}

// appendValuePart appends a metadata or attribute key part of the current
// request; false when the request lacks the value (missing_key decides).
func appendValuePart(dst []byte, k *config.KeyPart, r *request) ([]byte, bool) {
	v, ok := r.value(k.Value.Prop)
	if !ok {
		return dst, false
	}
	tag := tagMetadata
	if k.Value.Attribute != "" {
		tag = tagAttribute
	}
	return appendPart(dst, tag, v), true
}

// valuesMatch reports whether m's metadata and attribute conditions hold.
func (p *Plugin) valuesMatch(m *config.Match) bool {
	return len(m.Values) == 0 || m.MatchesValues(p.req.valueF)
}
