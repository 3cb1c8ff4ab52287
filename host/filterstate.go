package host

import (
	"sync"
)

// Filter state: proxy_set_property as Envoy serves it (Context::setProperty in
// source/extensions/common/wasm/context.cc): the path, as the guest gave it, names a value
// of the current stream (Envoy: the filter state object "wasm." + path, mutable, living as
// long as the stream's filter chain); a second set of the same path replaces the value.
// Without a stream — a root context is the effective one — there is no stream info to
// write to: NOT_FOUND. proxy_get_property reads it back for the same stream: a path that
// is none of the properties the host knows is looked up as a filter state name (Envoy's
// Context::FindValue falls back to the filter state "wasm." + name). Other streams never
// see it. Options.AccessLog and Response.FilterState give it to the embedder once the
// request is over.

// FilterState is one value a filter set for a request with proxy_set_property: Name is the
// path as the filter gave it (Envoy names the filter state object "wasm." + Name: read
// with %FILTER_STATE(wasm.NAME:PLAIN)%).
type FilterState struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// maxFilterState bounds the values a stream keeps (beyond it a set of a new name is
// refused with BAD_ARGUMENT): a filter writing a new name per call would otherwise grow
// the stream without bound. Envoy sets no bound; sluice writes six.
const maxFilterState = 256

// streamRecord is what a stream keeps for after the request: the filter state and the
// details of the filter's local reply. The worker writes it; the caller reads it when the
// request is over, possibly while the worker still owns a stream given up (client gone):
// hence the lock, taken only by those writes and by the reader.
type streamRecord struct {
	mu      sync.Mutex
	state   []FilterState
	details string // the details of the filter's last local reply ("" without one)
}

// set records name = value, replacing an earlier value of name; false when the stream
// already holds maxFilterState other names.
func (r *streamRecord) set(name, value []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.state {
		if r.state[i].Name == string(name) {
			r.state[i].Value = string(value)
			return true
		}
	}
	if len(r.state) >= maxFilterState {
		return false
	}
	r.state = append(r.state, FilterState{Name: string(name), Value: string(value)})
	return true
}

// get returns the value of name.
func (r *streamRecord) get(name []byte) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.state {
		if r.state[i].Name == string(name) {
			return r.state[i].Value, true
		}
	}
	return "", false
}

// setDetails keeps the details of a local reply.
func (r *streamRecord) setDetails(d string) {
	r.mu.Lock()
	r.details = d
	r.mu.Unlock()
}

// snapshot returns a copy of the filter state (nil: none) and the local reply's details.
func (r *streamRecord) snapshot() ([]FilterState, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.state) == 0 {
		return nil, r.details
	}
	return append([]FilterState(nil), r.state...), r.details
}

// hcSetProperty is proxy_set_property(path, path_size, value, value_size).
func hcSetProperty(v *vm, s []uint64) Status {
	path, ok1 := v.read(u32(s[0]), u32(s[1]))
	value, ok2 := v.read(u32(s[2]), u32(s[3]))
	if !ok1 || !ok2 {
		return StatusInvalidMemoryAccess
	}
	c := v.cur
	if c == nil {
		return StatusNotFound
	}
	if !c.rec.set(path, value) {
		return StatusBadArgument
	}
	return StatusOK
}

// filterStateProperty is proxy_get_property's fallback for the effective stream: the
// value the filter set under path (one segment: Envoy looks up the first segment, and a
// string value has no fields for further ones).
func (c *stream) filterStateProperty(path []byte) (string, bool) {
	for _, b := range path {
		if b == 0 {
			return "", false
		}
	}
	return c.rec.get(path)
}
