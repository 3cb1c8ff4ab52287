package filter

import "testing"

// streamTable keeps streams in a direct-mapped array and sends ids whose
// slot is taken to a map: every id must be found, replaced and removed
// exactly, whichever side holds it.
func TestStreamTable(t *testing.T) {
	var tb streamTable
	ids := []uint32{2, 3, 2 + streamSlots, 2 + 2*streamSlots, 3 + streamSlots, 1 << 31}
	for _, id := range ids {
		tb.put(id, &stream{})
	}
	if tb.len() != len(ids) {
		t.Fatalf("len %d, want %d", tb.len(), len(ids))
	}
	for _, id := range ids {
		if s := tb.get(id); s == nil || s.id != id {
			t.Errorf("get(%d) = %v", id, s)
		}
	}
	if tb.get(4) != nil || tb.get(4+streamSlots) != nil {
		t.Error("absent id found")
	}
	// Replacing an id keeps one entry, in the array and in the map.
	for _, id := range []uint32{2, 2 + streamSlots} {
		s := &stream{}
		tb.put(id, s)
		if tb.get(id) != s || tb.len() != len(ids) {
			t.Errorf("replace %d: got %p want %p, len %d", id, tb.get(id), s, tb.len())
		}
	}
	// Free the slot, then re-add an id that the map holds: it must not be
	// found twice.
	if tb.remove(2) == nil {
		t.Fatal("remove(2) found nothing")
	}
	s := &stream{}
	tb.put(2+streamSlots, s)
	if tb.get(2+streamSlots) != s || tb.len() != len(ids)-1 {
		t.Errorf("re-put of a mapped id: len %d", tb.len())
	}
	for _, id := range ids {
		tb.remove(id)
	}
	if tb.len() != 0 || tb.remove(2) != nil {
		t.Errorf("after removing all: len %d", tb.len())
	}
	for _, id := range ids {
		if tb.get(id) != nil {
			t.Errorf("get(%d) after remove", id)
		}
	}
}
