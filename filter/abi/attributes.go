package abi

// AttributeSetter is implemented by a Host that records attributes of the current request
// for the proxy's access log and the filters after this one. Each attribute's Name is
// NAMESPACE.FIELD ("sluice.rule"). Imports sets each with proxy_set_property: Envoy stores
// it as the filter state object wasm.NAMESPACE.FIELD (a string: %FILTER_STATE(…:PLAIN)%);
// the dynamic module sets field FIELD of the dynamic metadata namespace NAMESPACE
// (%DYNAMIC_METADATA(NAMESPACE:FIELD)%). SetAttributes returns the first failure, if any.
type AttributeSetter interface {
	SetAttributes(attrs []Header) Status
}
