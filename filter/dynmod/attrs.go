package dynmod

// The attributes the filter reads (envoy_dynamic_module_type_attribute_id, counted from 0 in
// the ABI header's enum).
const (
	attrSourceAddress attribute = 24
	attrRouteName     attribute = 61
	attrClusterName   attribute = 62
)
