package algorithms

import (
	"math/big"
	"math/rand/v2"
	"testing"
)

// u128.div and divCeil agree with math/big on quotients that fit 64 bits, and refuse the
// others: dividends with and without a high word, divisors small and large.
func TestU128Div(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	two64 := new(big.Int).Lsh(big.NewInt(1), 64)
	for i := range 20000 {
		x := u128{lo: rng.Uint64()}
		if i%2 == 1 {
			x.hi = rng.Uint64() >> rng.IntN(64)
		}
		d := rng.Uint64() >> rng.IntN(64)
		if d == 0 {
			d = 1
		}
		n := new(big.Int).Add(new(big.Int).Lsh(new(big.Int).SetUint64(x.hi), 64), new(big.Int).SetUint64(x.lo))
		wq, wr := new(big.Int).QuoRem(n, new(big.Int).SetUint64(d), new(big.Int))
		fits := wq.Cmp(two64) < 0
		q, r, ok := x.div(d)
		if ok != fits || ok && (q != wq.Uint64() || r != wr.Uint64()) {
			t.Fatalf("%+v / %d = %d r %d ok %v, want %v r %v fits %v", x, d, q, r, ok, wq, wr, fits)
		}
		wc := new(big.Int).Set(wq)
		if wr.Sign() != 0 {
			wc.Add(wc, big.NewInt(1))
		}
		c, ok := x.divCeil(d)
		if cf := wc.Cmp(two64) < 0; ok != cf || ok && c != wc.Uint64() {
			t.Fatalf("⌈%+v / %d⌉ = %d ok %v, want %v fits %v", x, d, c, ok, wc, cf)
		}
	}
}
