package rounds_test

import (
	"slices"
	"testing"

	"github.com/sluice-proxy/sluice/bench/internal/rounds"
)

// Summarize: the median (of the middle two for an even count) and range, without sorting
// its argument; Ratio and Format print them.
func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want rounds.Spread
	}{
		{nil, rounds.Spread{}},
		{[]float64{2}, rounds.Spread{2, 2, 2}},
		{[]float64{3, 1, 2}, rounds.Spread{2, 1, 3}},
		{[]float64{4, 1, 3, 2}, rounds.Spread{2.5, 1, 4}},
		{[]float64{0.9, 1.1, 0.95, 1.0, 5}, rounds.Spread{1.0, 0.9, 5}},
	} {
		if got := rounds.Summarize(c.in); got != c.want {
			t.Errorf("rounds.Summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
	in := []float64{3, 1, 2}
	rounds.Summarize(in)
	if in[0] != 3 {
		t.Error("summarize sorted its argument")
	}
	if got, want := (rounds.Spread{0.934, 0.881, 0.97}).Ratio(), "0.93× (0.88–0.97)"; got != want {
		t.Errorf("Ratio() = %q, want %q", got, want)
	}
	if got, want := (rounds.Spread{0.4567, 0.4, 0.5}).Format("%.3f"), "0.457 (0.400–0.500)"; got != want {
		t.Errorf("Format() = %q, want %q", got, want)
	}
	if got, want := (rounds.Spread{12000.4, 11000, 13000}).Format("%.0f"), "12000 (11000–13000)"; got != want {
		t.Errorf("Format() = %q, want %q", got, want)
	}
}

// Order: every round runs every item once; the rounds start at items spread over the list; odd
// rounds run backwards, so that of two neighbours each goes first in some round.
func TestRoundOrder(t *testing.T) {
	const n, nr = 18, 5
	starts := map[int]bool{}
	before := map[[2]int]bool{}
	for r := range nr {
		o := rounds.Order(n, r, nr)
		seen := map[int]bool{}
		for _, i := range o {
			if i < 0 || i >= n || seen[i] {
				t.Fatalf("round %d: %v is not a permutation of 0..%d", r, o, n-1)
			}
			seen[i] = true
		}
		if len(seen) != n {
			t.Fatalf("round %d: %v misses items", r, o)
		}
		starts[o[0]] = true
		for k := 1; k < n; k++ {
			before[[2]int{o[k-1], o[k]}] = true
		}
	}
	if len(starts) != nr {
		t.Errorf("rounds start at %v, want %d different items", starts, nr)
	}
	for i := range n - 1 {
		if !before[[2]int{i, i + 1}] || !before[[2]int{i + 1, i}] {
			t.Errorf("neighbours %d and %d: not each first in some round", i, i+1)
		}
	}
	if got := rounds.Order(4, 0, 1); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Errorf("round 0: %v, want the list's order", got)
	}
	if got := rounds.Order(4, 1, 2); !slices.Equal(got, []int{1, 0, 3, 2}) {
		t.Errorf("round 1 of 2: %v, want rotated by 2 and reversed", got)
	}
	if got := rounds.Order(0, 3, 5); len(got) != 0 {
		t.Errorf("no items: %v", got)
	}
}
