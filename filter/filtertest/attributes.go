package filtertest

import "github.com/sluice-proxy/sluice/filter/abi"

var _ abi.AttributeSetter = (*Host)(nil)

// SetAttributes implements abi.AttributeSetter: the attributes are kept by name in
// Attributes until the next request.
func (h *Host) SetAttributes(attrs []abi.Header) abi.Status {
	if h.Attributes == nil {
		h.Attributes = map[string]string{}
	}
	for _, a := range attrs {
		h.Attributes[a.Name] = string(a.Value)
	}
	return abi.StatusOK
}
