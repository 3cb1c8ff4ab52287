package dynmod

import "github.com/sluice-proxy/sluice/filter/abi"

var _ abi.AttributeSetter = (*host)(nil)

// SetAttributes implements abi.AttributeSetter: each attribute NAMESPACE.FIELD becomes the
// string field FIELD of the stream's dynamic metadata namespace NAMESPACE, in one call
// into C (an Envoy without the callback drops them).
func (h *host) SetAttributes(attrs []abi.Header) abi.Status {
	if h.cur == nil {
		return abi.StatusBadArgument
	}
	var n int
	h.attrs, n = packHeaders(h.attrs[:0], attrs)
	h.env().setMetadata(h.cur, h.attrs, n)
	return abi.StatusOK
}
