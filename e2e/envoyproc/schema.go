package envoyproc

import (
	"errors"
	"fmt"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"
)

// ParseBootstrap parses a bootstrap (YAML) strictly as Envoy's v3 schema: unknown fields
// refused, in every nested Any too, and each message's validation rules checked. The types
// the project's bootstraps use are linked by this package (types.go); another Any type must
// be linked by the caller. Every problem found is in the error.
func ParseBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return nil, err
	}
	if err := b.ValidateAll(); err != nil {
		return nil, err
	}
	return &b, ValidateAnys(&b)
}

// ValidateAnys unpacks every Any inside m, however deeply nested (ValidateAll does not
// descend into them), validates each unpacked message and recurses into it. Every problem
// found is in the error.
func ValidateAnys(m proto.Message) error {
	var errs []error
	var check func(m proto.Message)
	check = func(m proto.Message) {
		protorange.Range(m.ProtoReflect(), func(v protopath.Values) error {
			msg, ok := v.Index(-1).Value.Interface().(interface{ Interface() proto.Message })
			if !ok {
				return nil
			}
			a, ok := msg.Interface().(*anypb.Any)
			if !ok {
				return nil
			}
			inner, err := a.UnmarshalNew()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %v", v.Path, err))
				return nil
			}
			if val, ok := inner.(interface{ ValidateAll() error }); ok {
				if err := val.ValidateAll(); err != nil {
					errs = append(errs, fmt.Errorf("%s: %v", a.GetTypeUrl(), err))
				}
			}
			check(inner)
			return nil
		})
	}
	check(m)
	return errors.Join(errs...)
}
