// Package shareddata is Proxy-Wasm's shared-data map with Envoy's compare-and-swap rule,
// written once for every place that needs it: the embedded host (one map per vm_id), the
// dynamic module (one map per process), the filter's test fake and the simulator.
//
// The rule (proxy-wasm-cpp-host src/shared_data.cc, SharedData::set): Get returns the value
// and its cas; Set with cas 0 is unconditional; Set with a nonzero cas fails with
// CAS_MISMATCH when the key exists and its cas differs; the cas is ignored when the key does
// not exist (the key is created). Every successful Set gives the key a fresh cas from one
// counter that starts at 1 and skips 0. There is no delete, TTL or listing in the ABI.
package shareddata

import (
	"sort"
	"sync"

	"github.com/sluice-proxy/sluice/proxywasm"
)

// Map is one shared-data map. Safe for concurrent use; the zero value is not: use New.
type Map struct {
	mu      sync.RWMutex
	m       map[string]*entry
	bytes   int
	nextCAS uint32
}

type entry struct {
	value []byte
	cas   uint32
}

// New returns an empty map.
func New() *Map { return &Map{m: map[string]*entry{}, nextCAS: 1} }

// Get returns a copy of the value and its cas; ok is false when the key does not exist.
func (d *Map) Get(key string) (value []byte, cas uint32, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e, ok := d.m[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// GetInto appends the value of key to buf (no allocation when buf has room) and returns it
// with its cas; ok is false when the key does not exist.
func (d *Map) GetInto(key []byte, buf []byte) (value []byte, cas uint32, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e, ok := d.m[string(key)]
	if !ok {
		return buf, 0, false
	}
	return append(buf, e.value...), e.cas, true
}

// Set stores a copy of value under key with the package's CAS rule: StatusOK, or
// StatusCASMismatch.
func (d *Map) Set(key string, value []byte, cas uint32) proxywasm.Status {
	return d.SetBytes([]byte(key), value, cas)
}

// SetBytes is Set with the key as bytes (no allocation when the key exists).
func (d *Map) SetBytes(key, value []byte, cas uint32) proxywasm.Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[string(key)]
	if ok {
		if cas != 0 && cas != e.cas {
			return proxywasm.StatusCASMismatch
		}
		d.bytes += len(value) - len(e.value)
		e.value = append(e.value[:0], value...)
		e.cas = d.casLocked()
		return proxywasm.StatusOK
	}
	d.m[string(key)] = &entry{value: append([]byte(nil), value...), cas: d.casLocked()}
	d.bytes += len(key) + len(value)
	return proxywasm.StatusOK
}

func (d *Map) casLocked() uint32 {
	c := d.nextCAS
	d.nextCAS++
	if d.nextCAS == 0 {
		d.nextCAS = 1
	}
	return c
}

// Len is the number of keys.
func (d *Map) Len() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.m)
}

// Bytes is the total size of keys and values.
func (d *Map) Bytes() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.bytes
}

// Keys returns the keys, sorted (for tests and the admin; the ABI has no listing).
func (d *Map) Keys() []string {
	d.mu.RLock()
	keys := make([]string, 0, len(d.m))
	for k := range d.m {
		keys = append(keys, k)
	}
	d.mu.RUnlock()
	sort.Strings(keys)
	return keys
}
