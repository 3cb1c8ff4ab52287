package dynmod

import (
	"encoding/binary"
	"math"
	"strings"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// Metadata and attributes (config.ValueRef) through the dynamic-module ABI.
//
// The ABI reads one top-level key of a dynamic-metadata namespace, as a string, a number or
// a boolean; it has no getter for a field nested in a structure. So a metadata path of one
// segment ("sub": what header_to_metadata or ext_authz writes as a key of its own) is read;
// a nested one ("payload.sub") is refused with the configuration (config: BuildDynamic),
// and would be missing here. Values are handed to the filter as Envoy's Wasm host encodes them, so that a key
// is the same in both artifacts: a string as is, a number as the 8 bytes of a little-endian
// double, a boolean as one byte.

const metadataPrefix = "metadata\x00filter_metadata\x00"

// valueAttributes are the attributes config.Attributes names that are not answered in
// GetProperty's switch, by property path (envoy_dynamic_module_type_attribute_id).
var valueAttributes = map[string]attribute{
	"connection\x00requested_server_name":          30,
	"connection\x00tls_version":                    31,
	"connection\x00subject_peer_certificate":       33,
	"connection\x00dns_san_peer_certificate":       35,
	"connection\x00uri_san_peer_certificate":       37,
	"connection\x00sha256_peer_certificate_digest": 38,
}

// valueProperty answers a metadata or attribute property path; NOT_FOUND for any other.
func (h *host) valueProperty(path string) ([]byte, abi.Status) {
	if h.cur == nil {
		return nil, abi.StatusNotFound
	}
	n := len(h.buf)
	var ok bool
	if rest, isMeta := strings.CutPrefix(path, metadataPrefix); isMeta {
		ns, key, found := strings.Cut(rest, "\x00")
		if !found || ns == "" || key == "" || strings.IndexByte(key, 0) >= 0 {
			return nil, abi.StatusNotFound
		}
		h.buf, ok = h.env().metadata(h.cur, ns, key, h.buf)
	} else if id, known := valueAttributes[path]; known {
		h.buf, ok = h.env().attribute(h.cur, id, h.buf)
	}
	if !ok {
		return nil, abi.StatusNotFound
	}
	return h.buf[n:len(h.buf):len(h.buf)], abi.StatusOK
}

// appendMetadata appends a metadata value of sl_metadata's kind (1 string, 2 number, 3
// boolean) to dst; false for none.
func appendMetadata(dst []byte, kind int, s []byte, num float64) ([]byte, bool) {
	switch kind {
	case 1:
		return append(dst, s...), true
	case 2:
		return binary.LittleEndian.AppendUint64(dst, math.Float64bits(num)), true
	case 3:
		if num != 0 {
			return append(dst, 1), true
		}
		return append(dst, 0), true
	}
	return dst, false
}
