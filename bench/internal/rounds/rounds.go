// Package rounds is what the Envoy benchmark commands share about rounds: the order the
// configurations of a round run in, and the median and range of a figure over the rounds.
package rounds

import (
	"fmt"
	"slices"
)

// Order is the order of n items in round r of rounds: rotated by r·n/rounds, so that the
// rounds start at items spread over the list, and reversed in odd rounds, so that
// neighbours take turns at going first.
func Order(n, r, rounds int) []int {
	order := make([]int, n)
	if n == 0 {
		return order
	}
	off := r * n / max(rounds, 1)
	for i := range order {
		order[i] = (off + i) % n
	}
	if r%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

// Spread is the median and the range of one figure over the rounds.
type Spread struct{ Med, Lo, Hi float64 }

// Summarize is v's median (the mean of the middle two for an even count) and range; the
// zero Spread for none.
func Summarize(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	m := s[n/2]
	if n%2 == 0 {
		m = (s[n/2-1] + s[n/2]) / 2
	}
	return Spread{m, s[0], s[n-1]}
}

// Ratio formats a ratio's spread: 0.93× (0.88–0.97).
func (s Spread) Ratio() string { return fmt.Sprintf("%.2f× (%.2f–%.2f)", s.Med, s.Lo, s.Hi) }

// Format formats an absolute figure's spread with verb (e.g. "%.0f"): 123 (118–130).
func (s Spread) Format(verb string) string {
	return fmt.Sprintf(verb+" ("+verb+"–"+verb+")", s.Med, s.Lo, s.Hi)
}
