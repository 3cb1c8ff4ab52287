package topk

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
)

// checkBound checks the Space-Saving guarantees against exact counts: every key heavier
// than total/k has a counter, and Count−Err ≤ true ≤ Count with Err ≤ total/k.
func checkBound(t *testing.T, s *Summary, exact map[uint64]uint64) {
	t.Helper()
	var total uint64
	for _, c := range exact {
		total += c
	}
	if s.Total() != total {
		t.Fatalf("total %d, want %d", s.Total(), total)
	}
	bound := total / uint64(s.Cap())
	have := map[uint64]bool{}
	for _, e := range s.Top(s.Cap()) {
		have[e.ID] = true
		tr := exact[e.ID]
		if e.Count < tr || e.Count-e.Err > tr || e.Err > bound {
			t.Fatalf("key %d: count %d err %d, true %d, bound %d", e.ID, e.Count, e.Err, tr, bound)
		}
	}
	for id, c := range exact {
		if c > bound && !have[id] {
			t.Fatalf("key %d weighs %d > N/k = %d but has no counter", id, c, bound)
		}
	}
}

func TestBoundsRandomStreams(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 50; round++ {
		k := 4 + rng.IntN(60)
		s := New(k)
		exact := map[uint64]uint64{}
		keys := 1 + rng.IntN(500)
		for i := 0; i < 5000; i++ {
			// Skewed: low ids far more often.
			id := uint64(rng.IntN(1 + rng.IntN(keys)))
			w := uint64(1 + rng.IntN(3))
			exact[id] += w
			e, fresh := s.Add(id, w)
			if fresh {
				e.SetShown([]byte(strconv.FormatUint(id, 10)))
			}
		}
		checkBound(t, s, exact)
		for _, e := range s.Top(k) {
			if string(e.Shown()) != strconv.FormatUint(e.ID, 10) {
				t.Fatalf("key %d shown as %q", e.ID, e.Shown())
			}
		}
	}
}

// TestFiveAbusersAmongTenThousand: 10,000 background keys sending a few requests each and
// 5 abusive keys sending far more, interleaved: the top 5 of a 64-counter summary are the
// 5, each within the stated error.
func TestFiveAbusersAmongTenThousand(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := New(64)
	exact := map[uint64]uint64{}
	add := func(id uint64) {
		exact[id]++
		e, fresh := s.Add(id, 1)
		if fresh {
			e.SetShown([]byte("key-" + strconv.FormatUint(id, 10)))
		}
	}
	for i := 0; i < 100_000; i++ {
		if rng.IntN(10) == 0 {
			add(1_000_000 + uint64(rng.IntN(5))) // 10% of the traffic from 5 keys: ~2,000 each
		} else {
			add(uint64(rng.IntN(10_000))) // ~9 each
		}
	}
	top := s.Top(5)
	for _, e := range top {
		if e.ID < 1_000_000 {
			t.Fatalf("top 5 has background key %d (count %d err %d): %v", e.ID, e.Count, e.Err, top)
		}
		if e.Count-e.Err > exact[e.ID] || e.Count < exact[e.ID] {
			t.Fatalf("abuser %d: count %d err %d, true %d", e.ID, e.Count, e.Err, exact[e.ID])
		}
	}
	checkBound(t, s, exact)
}

// TestMemoryFlatAndNoAllocs: a million distinct keys allocate nothing and leave the heap
// where it was.
func TestMemoryFlatAndNoAllocs(t *testing.T) {
	s := New(256)
	for i := uint64(0); i < 1000; i++ {
		s.Add(i, 1)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	id := uint64(1 << 40)
	allocs := testing.AllocsPerRun(1_000_000, func() {
		id++
		e, fresh := s.Add(id, 1)
		if fresh {
			e.SetShown([]byte("x"))
		}
	})
	runtime.GC()
	runtime.ReadMemStats(&after)
	if allocs != 0 {
		t.Fatalf("%v allocations per Add", allocs)
	}
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<10 {
		t.Fatalf("heap grew by %d bytes over a million distinct keys", grew)
	}
	if s.Len() != 256 {
		t.Fatalf("len %d", s.Len())
	}
}

func TestMergeKeepsBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	exact := map[uint64]uint64{}
	merged := New(32)
	var since int64 = 42
	for w := 0; w < 4; w++ { // four workers
		s := New(32)
		for i := 0; i < 3000; i++ {
			id := uint64(rng.IntN(1 + rng.IntN(300)))
			exact[id]++
			if e, fresh := s.Add(id, 1); fresh {
				e.SetShown([]byte(strconv.FormatUint(id, 10)))
			}
		}
		got, err := merged.Merge(s.Append(nil, since))
		if err != nil || got != since {
			t.Fatalf("merge: %v, since %d", err, got)
		}
	}
	checkBound(t, merged, exact)
	d, err := Decode(merged.Append(nil, 7))
	if err != nil || d.Since != 7 || d.Total != merged.Total() || len(d.Entries) != merged.Len() {
		t.Fatalf("decode: %v %+v", err, d)
	}
}

func TestDecodeRefusesGarbage(t *testing.T) {
	s := New(8)
	for i := uint64(0); i < 20; i++ {
		if e, fresh := s.Add(i%9, i); fresh {
			e.SetShown([]byte("k" + strconv.FormatUint(i, 10)))
		}
	}
	good := s.Append(nil, 1)
	for n := 0; n < len(good); n++ {
		if _, err := Decode(good[:n]); err == nil {
			t.Fatalf("a truncation to %d bytes decoded", n)
		}
	}
	if _, err := Decode(good); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecode(f *testing.F) {
	s := New(4)
	s.Add(1, 2)
	f.Add(s.Append(nil, 3))
	f.Add([]byte{1, 0, 0, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m := New(4)
		Decode(b)
		m.Merge(b)
	})
}
