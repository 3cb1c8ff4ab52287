package host

import (
	"sort"
	"sync"
)

// SharedData is the shared-data map of one vm_id, with Envoy's semantics: Get returns the
// value and its cas; Set with cas 0 is unconditional; Set with a nonzero cas fails with
// StatusCASMismatch when the key exists and its cas differs; the cas is ignored when the key
// does not exist. Each successful Set gives the key a new, never-zero cas. There is no delete.
// Safe for concurrent use.
type SharedData struct {
	mu      sync.RWMutex
	m       map[string]*sharedEntry
	bytes   int
	nextCAS uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

func newSharedData() *SharedData {
	return &SharedData{m: map[string]*sharedEntry{}, nextCAS: 1}
}

// Get returns a copy of the value and its cas; ok is false when the key does not exist.
func (d *SharedData) Get(key string) (value []byte, cas uint32, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e, ok := d.m[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// getInto appends the value of key to buf (no allocation when buf has room).
func (d *SharedData) getInto(key []byte, buf []byte) ([]byte, uint32, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e, ok := d.m[string(key)]
	if !ok {
		return buf, 0, false
	}
	return append(buf, e.value...), e.cas, true
}

// Set stores a copy of value under key; see the type's doc for cas.
func (d *SharedData) Set(key string, value []byte, cas uint32) Status {
	return d.set([]byte(key), value, cas)
}

func (d *SharedData) set(key, value []byte, cas uint32) Status {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[string(key)]
	if ok {
		if cas != 0 && cas != e.cas {
			return StatusCASMismatch
		}
		d.bytes += len(value) - len(e.value)
		e.value = append(e.value[:0], value...)
		e.cas = d.casLocked()
		return StatusOK
	}
	d.m[string(key)] = &sharedEntry{value: append([]byte(nil), value...), cas: d.casLocked()}
	d.bytes += len(key) + len(value)
	return StatusOK
}

func (d *SharedData) casLocked() uint32 {
	c := d.nextCAS
	d.nextCAS++
	if d.nextCAS == 0 {
		d.nextCAS = 1
	}
	return c
}

// Len is the number of keys.
func (d *SharedData) Len() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.m)
}

// Bytes is the total size of keys and values.
func (d *SharedData) Bytes() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.bytes
}

// Keys returns the keys, sorted (for tests; the ABI has no listing).
func (d *SharedData) Keys() []string {
	d.mu.RLock()
	keys := make([]string, 0, len(d.m))
	for k := range d.m {
		keys = append(keys, k)
	}
	d.mu.RUnlock()
	sort.Strings(keys)
	return keys
}
