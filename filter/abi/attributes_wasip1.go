//go:build wasip1

package abi

import "unsafe"

// proxy_set_property: Envoy (every version sluice supports) stores path and value as the
// filter state object "wasm." + path of the current stream (Context::setProperty).
//
//go:wasmimport env proxy_set_property
func proxySetProperty(path unsafe.Pointer, pathSize uint32, value unsafe.Pointer, valueSize uint32) uint32

var _ AttributeSetter = (*Imports)(nil)

// SetAttributes implements AttributeSetter: one proxy_set_property per attribute.
func (*Imports) SetAttributes(attrs []Header) Status {
	first := StatusOK
	for i := range attrs {
		a := &attrs[i]
		st := Status(proxySetProperty(strPtr(a.Name), uint32(len(a.Name)), bytesPtr(a.Value), uint32(len(a.Value))))
		if st != StatusOK && first == StatusOK {
			first = st
		}
	}
	return first
}
