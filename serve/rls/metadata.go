package rls

import (
	"strconv"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is the response's dynamic metadata with
// Options.DynamicMetadata, in envoyproxy/ratelimit's structure
// (RESPONSE_DYNAMIC_METADATA), which Envoy's ratelimit filter puts in the
// stream's dynamic metadata under envoy.filters.http.ratelimit:
//
//	domain       the request's domain
//	descriptors  one struct per descriptor of the request, in order:
//	             entries ["key=value", …], limit (a limit override, as
//	             "requests_per_unit:N unit:UNIT"), hitsAddend (the
//	             descriptor's own, when set)
//	hitsAddend   the request's hits_addend, when not 0
//	metadata     the configured metadata of the descriptors that passed
//	             (not OVER_LIMIT; unlimited ones do not count), merged in
//	             descriptor order: the first value of a key wins, and two
//	             structs under one key are merged the same way; absent when
//	             none has any
func dynamicMetadata(req *pb.RateLimitRequest, items []item, sts []*pb.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	f := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	ds := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		ds = append(ds, structpb.NewStructValue(descriptorStruct(d)))
	}
	f["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: ds})
	if h := req.GetHitsAddend(); h != 0 {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range items {
		it := &items[i]
		if it.unlimited || sts[i].GetCode() == pb.RateLimitResponse_OVER_LIMIT {
			continue
		}
		if l := it.limit(); l != nil && l.Metadata != nil {
			mergeFirst(passed, l.Metadata)
		}
	}
	if len(passed.Fields) > 0 {
		f["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: f}
}

func descriptorStruct(d *ratelimitv3.RateLimitDescriptor) *structpb.Struct {
	es := make([]*structpb.Value, 0, len(d.GetEntries()))
	for _, e := range d.GetEntries() {
		es = append(es, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
	}
	f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: es})}
	if o := d.GetLimit(); o != nil {
		var b strings.Builder
		b.WriteString("requests_per_unit:")
		b.WriteString(strconv.FormatUint(uint64(o.GetRequestsPerUnit()), 10))
		b.WriteString(" unit:")
		b.WriteString(o.GetUnit().String())
		if m := o.GetUnitMultiplier(); m != nil {
			b.WriteString(" unit_multiplier:")
			b.WriteString(strconv.FormatUint(uint64(m.GetValue()), 10))
		}
		f["limit"] = structpb.NewStringValue(b.String())
	}
	if h := d.GetHitsAddend(); h != nil {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: f}
}

// mergeFirst merges src into dst: a key dst lacks is added (a copy), two
// structs under one key are merged recursively, and otherwise dst's value
// stays.
func mergeFirst(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		cur, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = cloneValue(v)
			continue
		}
		if cs, vs := cur.GetStructValue(), v.GetStructValue(); cs != nil && vs != nil {
			mergeFirst(cs, vs)
		}
	}
}

// cloneValue copies v, so that merging never writes into the
// configuration's metadata.
func cloneValue(v *structpb.Value) *structpb.Value {
	if s := v.GetStructValue(); s != nil {
		c := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(s.Fields))}
		for k, e := range s.Fields {
			c.Fields[k] = cloneValue(e)
		}
		return structpb.NewStructValue(c)
	}
	return v
}
