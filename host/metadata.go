package host

import (
	"context"
	"encoding/binary"
	"math"
	"sort"
	"strings"

	"github.com/sluice-proxy/sluice/proxywasm"
)

// Metadata is a stream's dynamic metadata as Envoy keeps it (StreamInfo's
// filter_metadata): a namespace, named after the filter that wrote it
// ("envoy.filters.http.jwt_authn"), maps to a structure of JSON-like values — string,
// float64 (a protobuf Struct's numbers are doubles), bool, map[string]any, []any. The guest
// reads it as the properties metadata.filter_metadata.<namespace>.<field>... (Envoy's
// Context::getProperty), encoded as Envoy's serializeValue encodes them: a string as is, a
// number as the 8 bytes of a little-endian double, a boolean as one byte, a structure in the
// pairs encoding (its fields sorted by name; values encoded the same way), a list as pairs
// of its elements' encodings and empty values. A path through a list is NOT_FOUND.
type Metadata map[string]map[string]any

type metadataKey struct{}

// WithMetadata returns ctx carrying md: Handler serves a request whose context carries
// Metadata with it as the stream's dynamic metadata (what `sluice run` sets from a JWT it
// verified, as Envoy's jwt_authn does before the filter).
func WithMetadata(ctx context.Context, md Metadata) context.Context {
	return context.WithValue(ctx, metadataKey{}, md)
}

// MetadataFrom returns the Metadata ctx carries, or nil.
func MetadataFrom(ctx context.Context) Metadata {
	md, _ := ctx.Value(metadataKey{}).(Metadata)
	return md
}

const metadataProp = "metadata\x00filter_metadata\x00"

// metadataProperty answers a property path (without its trailing NUL) under
// metadata.filter_metadata from md.
func metadataProperty(md Metadata, path string) (string, []byte, bool) {
	rest, ok := strings.CutPrefix(path, metadataProp)
	if !ok || md == nil {
		return "", nil, false
	}
	segs := strings.Split(rest, "\x00")
	ns, ok := md[segs[0]]
	if !ok {
		return "", nil, false
	}
	var v any = ns
	for _, s := range segs[1:] {
		m, ok := v.(map[string]any)
		if !ok {
			return "", nil, false
		}
		if v, ok = m[s]; !ok {
			return "", nil, false
		}
	}
	if s, ok := v.(string); ok {
		return s, nil, true
	}
	b, ok := encodeMetadata(v)
	return "", b, ok
}

// encodeMetadata encodes a non-string value as Envoy's serializeValue does.
func encodeMetadata(v any) ([]byte, bool) {
	switch v := v.(type) {
	case string:
		return []byte(v), true
	case float64:
		return binary.LittleEndian.AppendUint64(nil, math.Float64bits(v)), true
	case bool:
		if v {
			return []byte{1}, true
		}
		return []byte{0}, true
	case map[string]any:
		names := make([]string, 0, len(v))
		for k := range v {
			names = append(names, k)
		}
		sort.Strings(names)
		kv := make([][2]string, 0, len(v))
		for _, k := range names {
			b, ok := encodeMetadata(v[k])
			if !ok {
				return nil, false
			}
			kv = append(kv, [2]string{k, string(b)})
		}
		return proxywasm.AppendPairs(nil, kv), true
	case []any:
		kv := make([][2]string, 0, len(v))
		for _, x := range v {
			b, ok := encodeMetadata(x)
			if !ok {
				return nil, false
			}
			kv = append(kv, [2]string{string(b), ""})
		}
		return proxywasm.AppendPairs(nil, kv), true
	}
	return nil, false
}
