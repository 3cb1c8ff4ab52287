// Package topk is a bounded heavy-hitter summary: Space-Saving (Metwally, Agrawal and El
// Abbadi) with a fixed number of counters, a min-heap over them and an open-addressing
// index by key id. Memory is fixed at New whatever the number of distinct keys, and Add
// allocates nothing.
//
// The error bound: after weights totalling N were added to a summary of k counters, every
// key whose true weight exceeds N/k has a counter, and every counter's Count exceeds its
// key's true weight by at most its Err, itself at most N/k (the smallest count). Count−Err is
// a lower bound of the true weight. Merging summaries (Merge) keeps both properties, with N
// the total of everything merged.
//
// The filter (sluice.wasm and libsluice.so) keeps one summary per rule and kind in each
// worker and merges it into shared data; the embedded host decodes that encoding for its
// admin (Decode). Neutral: it imports nothing of the filter or the host.
package topk

import (
	"encoding/binary"
	"errors"
	"sort"
)

// SharedPrefix starts the shared-data key of every summary the filter shares:
// SharedPrefix + PLUGIN + ":" + RULE + ":" + KIND, and + ":last" for the finished period.
const SharedPrefix = "sluice:top:"

// MaxShown is the most bytes of a key's shown form a counter keeps.
const MaxShown = 140

// MaxCapacity bounds New's capacity (and what Decode accepts).
const MaxCapacity = 1 << 16

// Entry is one counter: a key's id, its estimated weight, the most that estimate may exceed
// the true weight, and the key as shown.
type Entry struct {
	ID    uint64
	Count uint64
	Err   uint64
	n     uint8
	shown [MaxShown]byte
}

// Shown returns the key as shown (valid until the counter is reused).
func (e *Entry) Shown() []byte { return e.shown[:e.n] }

// SetShown keeps up to MaxShown bytes of b as the key's shown form.
func (e *Entry) SetShown(b []byte) { e.n = uint8(copy(e.shown[:], b)) }

// Summary is a Space-Saving summary. The zero value is not usable: call New.
type Summary struct {
	ents  []Entry
	heap  []int32 // entry indexes, a min-heap by Count
	pos   []int32 // entry index → heap position
	table []int32 // open addressing by ID: entry index + 1, 0 empty
	mask  uint64
	total uint64
}

// New returns a summary of capacity counters (1..MaxCapacity; clamped).
func New(capacity int) *Summary {
	capacity = min(max(capacity, 1), MaxCapacity)
	size := 1
	for size < 2*capacity {
		size <<= 1
	}
	return &Summary{
		ents:  make([]Entry, 0, capacity),
		heap:  make([]int32, 0, capacity),
		pos:   make([]int32, capacity),
		table: make([]int32, size),
		mask:  uint64(size - 1),
	}
}

// Cap is the number of counters.
func (s *Summary) Cap() int { return cap(s.ents) }

// Len is the number of counters in use.
func (s *Summary) Len() int { return len(s.ents) }

// Total is the weight added since the last Reset.
func (s *Summary) Total() uint64 { return s.total }

// Reset empties the summary, keeping its memory.
func (s *Summary) Reset() {
	s.ents, s.heap, s.total = s.ents[:0], s.heap[:0], 0
	clear(s.table)
}

// Add adds weight w to key id. fresh is true when the key had no counter (it took a free
// counter or the smallest one's): the caller then sets its shown form.
func (s *Summary) Add(id, w uint64) (e *Entry, fresh bool) {
	return s.add(id, w, 0)
}

func (s *Summary) add(id, w, err uint64) (*Entry, bool) {
	s.total += w
	if i := s.find(id); i >= 0 {
		s.ents[i].Count += w
		s.ents[i].Err += err
		s.down(int(s.pos[i]))
		return &s.ents[i], false
	}
	if len(s.ents) < cap(s.ents) {
		i := len(s.ents)
		s.ents = append(s.ents, Entry{ID: id, Count: w, Err: err})
		s.heap = append(s.heap, int32(i))
		s.pos[i] = int32(len(s.heap) - 1)
		s.up(len(s.heap) - 1)
		s.insert(id, i)
		return &s.ents[i], true
	}
	i := int(s.heap[0])
	m := s.ents[i].Count
	s.remove(s.ents[i].ID)
	s.ents[i] = Entry{ID: id, Count: m + w, Err: m + err}
	s.insert(id, i)
	s.down(0)
	return &s.ents[i], true
}

func (s *Summary) find(id uint64) int {
	for j := mix(id) & s.mask; ; j = (j + 1) & s.mask {
		v := s.table[j]
		if v == 0 {
			return -1
		}
		if s.ents[v-1].ID == id {
			return int(v - 1)
		}
	}
}

func (s *Summary) insert(id uint64, i int) {
	j := mix(id) & s.mask
	for s.table[j] != 0 {
		j = (j + 1) & s.mask
	}
	s.table[j] = int32(i + 1)
}

// remove deletes id from the index (backward-shift deletion: no tombstones).
func (s *Summary) remove(id uint64) {
	j := mix(id) & s.mask
	for s.table[j] == 0 || s.ents[s.table[j]-1].ID != id {
		if s.table[j] == 0 {
			return
		}
		j = (j + 1) & s.mask
	}
	for {
		s.table[j] = 0
		k := j
		for {
			k = (k + 1) & s.mask
			v := s.table[k]
			if v == 0 {
				return
			}
			home := mix(s.ents[v-1].ID) & s.mask
			// v may move to j when its home is not cyclically within (j, k].
			if (k > j && (home <= j || home > k)) || (k < j && home <= j && home > k) {
				s.table[j] = v
				j = k
				break
			}
		}
	}
}

func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return x
}

func (s *Summary) less(a, b int) bool {
	return s.ents[s.heap[a]].Count < s.ents[s.heap[b]].Count
}

func (s *Summary) swap(a, b int) {
	s.heap[a], s.heap[b] = s.heap[b], s.heap[a]
	s.pos[s.heap[a]] = int32(a)
	s.pos[s.heap[b]] = int32(b)
}

func (s *Summary) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !s.less(i, parent) {
			return
		}
		s.swap(i, parent)
		i = parent
	}
}

func (s *Summary) down(i int) {
	n := len(s.heap)
	for {
		m := i
		if l := 2*i + 1; l < n && s.less(l, m) {
			m = l
		}
		if r := 2*i + 2; r < n && s.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// Top returns up to n counters, largest Count first (ties by ID), as copies.
func (s *Summary) Top(n int) []Entry {
	out := make([]Entry, len(s.ents))
	copy(out, s.ents)
	sort.Slice(out, func(a, b int) bool {
		if out[a].Count != out[b].Count {
			return out[a].Count > out[b].Count
		}
		return out[a].ID < out[b].ID
	})
	if n < len(out) {
		out = out[:n]
	}
	return out
}

// The encoding (Append, Decode): version byte, then uvarints: since (Unix ns), total,
// capacity, counters; then per counter: id as 8 bytes, count, err, shown length, shown bytes.
const version = 2

// ErrCorrupt is Decode's error for bytes that are not a summary.
var ErrCorrupt = errors.New("topk: not a summary encoding")

// Append appends the encoding of s, with since (when it began, Unix ns), to dst.
func (s *Summary) Append(dst []byte, since int64) []byte {
	dst = append(dst, version)
	dst = binary.AppendUvarint(dst, uint64(since))
	dst = binary.AppendUvarint(dst, s.total)
	dst = binary.AppendUvarint(dst, uint64(cap(s.ents)))
	dst = binary.AppendUvarint(dst, uint64(len(s.ents)))
	for i := range s.ents {
		e := &s.ents[i]
		dst = binary.LittleEndian.AppendUint64(dst, e.ID)
		dst = binary.AppendUvarint(dst, e.Count)
		dst = binary.AppendUvarint(dst, e.Err)
		dst = append(dst, e.n)
		dst = append(dst, e.Shown()...)
	}
	return dst
}

// Decoded is a decoded summary.
type Decoded struct {
	Since   int64
	Total   uint64
	Cap     int // the summary's counters: ErrorBound is Total/Cap
	Entries []Entry
}

// ErrorBound is the most a count of d exceeds its key's true weight.
func (d Decoded) ErrorBound() uint64 {
	if d.Cap == 0 || len(d.Entries) < d.Cap {
		return 0 // never full: every count is exact
	}
	return d.Total / uint64(d.Cap)
}

// Decode reads an encoding (Append's). It never panics.
func Decode(b []byte) (Decoded, error) {
	var d Decoded
	err := walk(b, func(since int64, total uint64, capacity int) { d.Since, d.Total, d.Cap = since, total, capacity },
		func(e *Entry) { d.Entries = append(d.Entries, *e) })
	return d, err
}

// Merge adds an encoding's counters (with their errors) and total into s, and returns the
// encoding's since.
func (s *Summary) Merge(b []byte) (int64, error) {
	var since int64
	var total, added uint64
	err := walk(b, func(sn int64, t uint64, _ int) { since, total = sn, t }, func(e *Entry) {
		x, _ := s.add(e.ID, e.Count, e.Err)
		if x.n == 0 {
			x.SetShown(e.Shown())
		}
		added += e.Count
	})
	if err == nil && total > added {
		s.total += total - added // weight the encoding counted but no longer holds a counter of
	}
	return since, err
}

func walk(b []byte, head func(int64, uint64, int), each func(*Entry)) error {
	if len(b) < 1 || b[0] != version {
		return ErrCorrupt
	}
	b = b[1:]
	var v [4]uint64
	for i := range v {
		x, n := binary.Uvarint(b)
		if n <= 0 {
			return ErrCorrupt
		}
		v[i], b = x, b[n:]
	}
	if v[2] > MaxCapacity || v[3] > v[2] {
		return ErrCorrupt
	}
	head(int64(v[0]), v[1], int(v[2]))
	var e Entry
	for i := uint64(0); i < v[3]; i++ {
		if len(b) < 8 {
			return ErrCorrupt
		}
		e.ID, b = binary.LittleEndian.Uint64(b), b[8:]
		c, n := binary.Uvarint(b)
		if n <= 0 {
			return ErrCorrupt
		}
		e.Count, b = c, b[n:]
		c, n = binary.Uvarint(b)
		if n <= 0 || len(b) < n+1 {
			return ErrCorrupt
		}
		e.Err, b = c, b[n:]
		l := int(b[0])
		if l > MaxShown || len(b) < 1+l {
			return ErrCorrupt
		}
		e.SetShown(b[1 : 1+l])
		b = b[1+l:]
		each(&e)
	}
	return nil
}
