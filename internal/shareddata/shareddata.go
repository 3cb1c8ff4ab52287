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
	"sync/atomic"

	"github.com/sluice-proxy/sluice/proxywasm"
)

// Map is one shared-data map. Safe for concurrent use; the zero value is not: use New.
//
// The keys are spread over shards, each behind its own mutex, so that threads working on
// different keys (Envoy's workers, in the dynamic module) do not queue on one lock; the cas
// counter is one for the whole map.
type Map struct {
	shards  [shards]shard
	nextCAS atomic.Uint32 // the last cas given
}

// shards is the number of shards, a power of two.
const shards = 64

type shard struct {
	mu    sync.Mutex
	m     map[string]*entry
	bytes int
	_     [40]byte // a cache line of its own
}

type entry struct {
	value []byte
	cas   uint32
}

// New returns an empty map.
func New() *Map {
	d := &Map{}
	for i := range d.shards {
		d.shards[i].m = map[string]*entry{}
	}
	return d
}

// shardOf is the shard of key (FNV-1a over its bytes).
func shardOf[K string | []byte](d *Map, key K) *shard {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return &d.shards[h&(shards-1)]
}

// Get returns a copy of the value and its cas; ok is false when the key does not exist.
func (d *Map) Get(key string) (value []byte, cas uint32, ok bool) {
	sh := shardOf(d, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), e.value...), e.cas, true
}

// GetInto appends the value of key to buf (no allocation when buf has room) and returns it
// with its cas; ok is false when the key does not exist.
func (d *Map) GetInto(key []byte, buf []byte) (value []byte, cas uint32, ok bool) {
	sh := shardOf(d, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[string(key)]
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
	sh := shardOf(d, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[string(key)]
	if ok {
		if cas != 0 && cas != e.cas {
			return proxywasm.StatusCASMismatch
		}
		sh.bytes += len(value) - len(e.value)
		e.value = append(e.value[:0], value...)
		e.cas = d.newCAS()
		return proxywasm.StatusOK
	}
	sh.m[string(key)] = &entry{value: append([]byte(nil), value...), cas: d.newCAS()}
	sh.bytes += len(key) + len(value)
	return proxywasm.StatusOK
}

// newCAS is the next cas: 1, 2, …, 2^32−1, then 1 again (never 0).
func (d *Map) newCAS() uint32 {
	for {
		c := d.nextCAS.Add(1)
		if c != 0 {
			return c
		}
	}
}

// Len is the number of keys.
func (d *Map) Len() int {
	n := 0
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Bytes is the total size of keys and values.
func (d *Map) Bytes() int {
	n := 0
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		n += sh.bytes
		sh.mu.Unlock()
	}
	return n
}

// Keys returns the keys, sorted (for tests and the admin; the ABI has no listing).
func (d *Map) Keys() []string {
	var keys []string
	for i := range d.shards {
		sh := &d.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			keys = append(keys, k)
		}
		sh.mu.Unlock()
	}
	sort.Strings(keys)
	return keys
}
