package dashboard

import (
	"reflect"
	"testing"
)

func TestRing(t *testing.T) {
	r := NewRing[int](3)
	if _, ok := r.Last(); ok || r.Len() != 0 || r.Cap() != 3 {
		t.Fatal("new ring not empty")
	}
	contents := func() []int {
		var out []int
		for i := 0; i < r.Len(); i++ {
			out = append(out, r.At(i))
		}
		return out
	}
	for i, want := range [][]int{{1}, {1, 2}, {1, 2, 3}, {2, 3, 4}, {3, 4, 5}, {4, 5, 6}, {5, 6, 7}} {
		r.Push(i + 1)
		if got := contents(); !reflect.DeepEqual(got, want) {
			t.Fatalf("after pushing %d: %v, want %v", i+1, got, want)
		}
		if last, ok := r.Last(); !ok || last != i+1 {
			t.Fatalf("Last = %d, %v", last, ok)
		}
	}
	for _, i := range []int{-1, 3} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("At(%d) did not panic", i)
				}
			}()
			r.At(i)
		}()
	}
	if NewRing[int](0).Cap() != 1 {
		t.Error("capacity 0 not raised to 1")
	}
}
