package filtertest

import (
	"testing"

	"github.com/sluice-proxy/sluice/filter/abi"
)

// The emulator's rules, on a store that already holds a key written with
// Envoy's: a created key gets the cas passed + 1, an existing key needs its
// current cas (0 included), and the values are the one map's.
func TestSharedDataProxytestSemantics(t *testing.T) {
	s := NewSharedData()
	s.Set("seed", []byte("s"), 0)
	_, seedCAS, _ := s.Get("seed")
	s.ProxytestSemantics = true
	for _, step := range []struct {
		key  string
		cas  uint32
		want abi.Status
		cas2 uint32 // the key's cas afterwards
	}{
		{"k", 7, abi.StatusOK, 8},
		{"k", 0, abi.StatusCASMismatch, 8},
		{"k", 7, abi.StatusCASMismatch, 8},
		{"k", 8, abi.StatusOK, 9},
		{"z", ^uint32(0), abi.StatusOK, 0},
		{"z", 0, abi.StatusOK, 1},
		{"seed", 0, abi.StatusCASMismatch, seedCAS},
		{"seed", seedCAS, abi.StatusOK, seedCAS + 1},
	} {
		v0, _, _ := s.Get(step.key)
		if st := s.Set(step.key, []byte{byte(step.cas)}, step.cas); st != step.want {
			t.Fatalf("Set(%s, cas %d) = %v, want %v", step.key, step.cas, st, step.want)
		}
		v, cas, ok := s.Get(step.key)
		want := v0
		if step.want == abi.StatusOK {
			want = []byte{byte(step.cas)}
		}
		if !ok || string(v) != string(want) || cas != step.cas2 {
			t.Fatalf("after Set(%s, cas %d): %q cas %d %v, want cas %d", step.key, step.cas, v, cas, ok, step.cas2)
		}
	}
	if s.Len() != 3 || len(s.Keys("")) != 3 {
		t.Fatalf("Len %d, Keys %v", s.Len(), s.Keys(""))
	}
}
