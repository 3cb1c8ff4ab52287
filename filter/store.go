package filter

import (
	"encoding/binary"
	"errors"

	"github.com/sluice-proxy/sluice/algorithms"
	"github.com/sluice-proxy/sluice/filter/abi"
)

// The shared-data store of one rule: a fixed table of MaxKeys slots.
//
// Proxy-Wasm shared data has no delete, no TTL and no listing, so a key per
// client would grow without bound. Instead every rule owns exactly MaxKeys
// shared-data entries ("slots"), created on first use and reused forever.
// A client key is hashed (seeded 64-bit hash of the key bytes) to
// slotCandidates candidate slots; a slot's value is
//
//	[0]     format version (slotVersion)
//	[1:9]   identity: the 64-bit hash of the key that owns the slot
//	[9:]    the algorithm's state
//
// A request uses, in order: a candidate slot its identity already owns;
// else the first candidate slot that is missing, unreadable or whose
// occupant is idle (Limiter.Idle: equivalent to a fresh key), which it
// claims; else — every candidate held by a live key, i.e. the table is at
// capacity — it evicts the candidate whose occupant is closest to fresh
// (the least Limiter.Used; the first such on a tie) and starts fresh in its
// place. A key is therefore only ever decided against its own state: no
// client is denied because of another key. The price is the evicted key's
// Used, which it regains if it comes back (it starts fresh); that bound and
// why it holds is in RATIONALE.md ("Why evict the least-used key?").
// Reading stops at a missing candidate: a key claims the first claimable
// candidate, and a slot never disappears, so a key cannot own a slot after
// one that is still missing. Two distinct keys with the same 64-bit
// identity are treated as one key (probability ~2⁻⁶⁴ per pair).
//
// Updates are get + compare-and-swap. Envoy ignores the CAS of a set on a
// key that does not exist (and treats cas 0 as unconditional), so a slot is
// created with a fixed nonzero createCAS: if the key is still missing the
// set creates it, and if another worker created it in the meantime the set
// fails with CAS_MISMATCH (unless its token happens to equal createCAS,
// probability ~2⁻³²) and the request retries against the new value. Updates
// of an existing slot — a claim and an eviction too — always carry the
// token returned by the get, so of two keys racing for one slot exactly one
// wins and the other decides again on what it then reads.
const (
	slotVersion  = 1
	slotHeader   = 9
	createCAS    = 0x9E3779B9
	defaultSeed  = 0x736c75696365 // "sluice"
	slotKeyExtra = 16             // hex digits of a slot number

	// slotCandidates is how many slots a key may occupy (fewer when the
	// table is smaller). More candidates make a key at its limit harder to
	// evict (each of the others must be at least as used) at the cost of
	// one shared-data read per candidate for a key's first request once
	// the table is full.
	slotCandidates = 4
)

// errStore is wrapped by every store failure (a host call failing, CAS
// retries exhausted).
var errStore = errors.New("shared-data store failure")

// SharedData is the part of the host a slot table uses: Proxy-Wasm shared
// data (abi.Host has it).
type SharedData interface {
	GetSharedData(key []byte) ([]byte, uint32, abi.Status)
	SetSharedData(key, value []byte, cas uint32) abi.Status
}

// slotStore keeps one rule's per-key state in shared data.
type slotStore struct {
	host   SharedData
	lim    algorithms.Limiter
	prefix int    // len of the key prefix in kbuf
	kbuf   []byte // prefix + slot number kslot (when keyed)
	kslot  uint64
	keyed  bool
	vbuf   []byte // encoded value to write
	slots  uint64
	ncand  int // candidates per key: min(slotCandidates, slots)
	// noEvict: a key whose candidates are all live is refused
	// (errKeysInFlight), not given a victim's slot (concurrency.go).
	noEvict bool
}

func newSlotStore(h SharedData, lim algorithms.Limiter, prefix string, maxKeys int) *slotStore {
	if maxKeys < 1 {
		maxKeys = 1
	}
	s := &slotStore{
		host:   h,
		lim:    lim,
		prefix: len(prefix),
		kbuf:   make([]byte, 0, len(prefix)+slotKeyExtra),
		vbuf:   make([]byte, slotHeader, slotHeader+lim.MaxStateSize()),
		slots:  uint64(maxKeys),
		ncand:  min(slotCandidates, maxKeys),
	}
	s.kbuf = append(s.kbuf, prefix...)
	return s
}

// entry is what load found for a key: the slot to write and the state to
// decide against.
type entry struct {
	slot   uint64
	cas    uint32
	exists bool
	ident  uint64 // identity written back
	state  []byte // nil = a fresh key; aliases a host buffer
	// evicted is set when writing e pushes out a live key, whose Used (the
	// quota it may regain) is evictedUsed.
	evicted     bool
	evictedUsed int64
}

// candidate returns the i-th candidate slot of identity h: the first is h
// modulo the table, the others come from remixing h (the second is the
// one the two-candidate table used, so slots written before keep being
// found). Two candidates may coincide (the table is small, or by chance);
// load reads a repeated one once.
func (s *slotStore) candidate(h uint64, i int) uint64 {
	if i == 0 {
		return h % s.slots
	}
	return mix64(h^(uint64(i)*0x9E3779B97F4A7C15)) % s.slots
}

// key returns the shared-data key of slot. A request reads and then writes
// the same slot, so the key of the last slot is kept.
func (s *slotStore) key(slot uint64) []byte {
	if !s.keyed || s.kslot != slot {
		s.kbuf = appendHex(s.kbuf[:s.prefix], slot)
		s.kslot, s.keyed = slot, true
	}
	return s.kbuf
}

// slotInfo is one slot as read.
type slotInfo struct {
	cas    uint32
	exists bool
	valid  bool
	ident  uint64
	state  []byte
}

func (s *slotStore) read(slot uint64) (slotInfo, error) {
	v, cas, st := s.host.GetSharedData(s.key(slot))
	switch st {
	case abi.StatusOK:
	case abi.StatusNotFound:
		return slotInfo{}, nil
	default:
		return slotInfo{}, storeErr("get", st)
	}
	si := slotInfo{cas: cas, exists: true}
	if len(v) >= slotHeader && v[0] == slotVersion {
		si.valid = true
		si.ident = binary.LittleEndian.Uint64(v[1:9])
		si.state = v[slotHeader:]
	}
	return si, nil
}

// claimable reports whether a slot can be taken over by a new key without
// evicting anyone.
func (s *slotStore) claimable(si *slotInfo, now int64) bool {
	return !si.exists || !si.valid || s.lim.Idle(si.state, now)
}

// load finds the slot for identity h at now: its own, else a free one,
// else the least-used candidate, evicted (see the top of this file).
func (s *slotStore) load(h uint64, now int64, e *entry) error {
	var (
		free      = -1 // the first claimable candidate
		victim    = -1 // the least-used live candidate
		freeSlot  uint64
		freeInfo  slotInfo
		vSlot     uint64
		vInfo     slotInfo
		vUsed     int64
		prevSlots [slotCandidates]uint64
	)
	for i := 0; i < s.ncand; i++ {
		slot := s.candidate(h, i)
		dup := false
		for _, p := range prevSlots[:i] {
			dup = dup || p == slot
		}
		prevSlots[i] = slot
		if dup {
			continue
		}
		si, err := s.read(slot)
		if err != nil {
			return err
		}
		if si.valid && si.ident == h {
			*e = entry{slot: slot, cas: si.cas, exists: true, ident: h, state: si.state}
			return nil
		}
		if free < 0 && s.claimable(&si, now) {
			free, freeSlot, freeInfo = i, slot, si
			if !si.exists {
				break // no later candidate can be h's (see the top of this file)
			}
			continue
		}
		if free < 0 {
			if u := s.lim.Used(si.state, now); victim < 0 || u < vUsed {
				victim, vSlot, vInfo, vUsed = i, slot, si, u
			}
		}
	}
	if free >= 0 {
		*e = entry{slot: freeSlot, cas: freeInfo.cas, exists: freeInfo.exists, ident: h}
		return nil
	}
	if s.noEvict {
		return errKeysInFlight
	}
	*e = entry{slot: vSlot, cas: vInfo.cas, exists: true, ident: h, evicted: true, evictedUsed: vUsed}
	return nil
}

// stateBuf returns an empty slice for a new state, placed after the slot
// header in the buffer store writes from: a state decided into it (and not
// grown beyond it) is stored without a copy.
func (s *slotStore) stateBuf() []byte { return s.vbuf[slotHeader:slotHeader] }

// store writes state for e with compare-and-swap. ok is false when another
// writer got there first (reload and decide again).
func (s *slotStore) store(e *entry, state []byte) (ok bool, err error) {
	v := s.vbuf[:slotHeader]
	if n := slotHeader + len(state); n <= cap(v) && (len(state) == 0 || &state[0] == &v[:n][slotHeader]) {
		v = v[:n] // state is already in place (stateBuf)
	} else {
		v = append(v, state...)
		s.vbuf = v
	}
	v[0] = slotVersion
	binary.LittleEndian.PutUint64(v[1:slotHeader], e.ident)
	cas := e.cas
	if !e.exists {
		cas = createCAS
	}
	switch st := s.host.SetSharedData(s.key(e.slot), v, cas); st {
	case abi.StatusOK:
		return true, nil
	case abi.StatusCASMismatch:
		return false, nil
	default:
		return false, storeErr("set", st)
	}
}

// KeyTable is one rule's slot table on its own, for tools that replay
// traffic through the filter's store outside a proxy (sluice simulate): the
// same hashing, candidates, claims, evictions and compare-and-swap as a local
// rule of the filter, deciding one request at a time.
type KeyTable struct {
	s    *slotStore
	seed uint64
	e    entry
	buf  []byte
	// Evicted counts the live keys pushed out, EvictedUsed their Used (the
	// filter's evicted and evicted_used metrics).
	Evicted, EvictedUsed int64
}

// NewKeyTable returns the table of a rule with limiter lim and max_keys
// maxKeys, its slots named prefix + slot number in sd, keys hashed with
// seed.
func NewKeyTable(sd SharedData, lim algorithms.Limiter, prefix string, maxKeys int, seed uint64) *KeyTable {
	return &KeyTable{s: newSlotStore(sd, lim, prefix, maxKeys), seed: seed, buf: make([]byte, 0, lim.MaxStateSize())}
}

// Decide decides a request of cost for key at now and, when it is admitted,
// writes the key's new state, as the filter does for a local rule.
func (t *KeyTable) Decide(key []byte, now, cost int64) (algorithms.Decision, error) {
	h := hashKey(t.seed, key)
	for i := 0; i < MaxCASRetries; i++ {
		st, err := t.State(key, now)
		if err != nil {
			return algorithms.Decision{}, err
		}
		ns, d, err := t.s.lim.Decide(t.buf[:0], st, now, cost)
		if errors.Is(err, algorithms.ErrCorruptState) {
			t.e.state = nil
			ns, d, err = t.s.lim.Decide(t.buf[:0], nil, now, cost)
		}
		if err != nil || !d.Allowed {
			return d, err
		}
		t.buf = ns
		t.e.ident = h
		ok, err := t.s.store(&t.e, ns)
		if err != nil {
			return d, err
		}
		if ok {
			if t.e.evicted {
				t.Evicted++
				t.EvictedUsed += t.e.evictedUsed
			}
			return d, nil
		}
	}
	return algorithms.Decision{}, errCASExhausted
}

// State returns the state key would be decided against at now (nil: a
// fresh key), aliasing the table's storage until the next call.
func (t *KeyTable) State(key []byte, now int64) ([]byte, error) {
	if err := t.s.load(hashKey(t.seed, key), now, &t.e); err != nil {
		return nil, err
	}
	return t.e.state, nil
}

type storeError struct {
	op string
	st abi.Status
}

func (e *storeError) Error() string {
	return "shared data " + e.op + ": " + e.st.String()
}

func (e *storeError) Unwrap() error { return errStore }

func storeErr(op string, st abi.Status) error { return &storeError{op, st} }

// hashKey is the identity of a key: FNV-1a 64 over seed and key bytes,
// finished with a 64-bit mixer so that both the low bits (slot) and the high
// bits are well distributed. It is not cryptographic (see RATIONALE).
func hashKey(seed uint64, key []byte) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037) ^ seed
	for _, c := range key {
		h ^= uint64(c)
		h *= prime
	}
	h ^= uint64(len(key))
	return mix64(h)
}

// mix64 is the splitmix64 finalizer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
