package integration

import (
	"testing"

	"github.com/sluice-proxy/sluice/filter/abi"
	"github.com/sluice-proxy/sluice/filter/filtertest"
	"github.com/sluice-proxy/sluice/host"
)

// sharedStore is the shared-data contract (Envoy's semantics) the filter's
// store relies on. One conformance suite runs against every implementation
// we test with: the native fake and the embedded host's map.
type sharedStore interface {
	Get(key string) ([]byte, uint32, bool)
	Set(key string, value []byte, cas uint32) abi.Status
}

type hostShared struct{ d *host.SharedData }

func (h hostShared) Get(k string) ([]byte, uint32, bool) { return h.d.Get(k) }
func (h hostShared) Set(k string, v []byte, cas uint32) abi.Status {
	return abi.Status(h.d.Set(k, v, cas))
}

func TestSharedDataConformance(t *testing.T) {
	impls := map[string]func(t *testing.T) sharedStore{
		"fake": func(*testing.T) sharedStore { return filtertest.NewSharedData() },
		"host": func(t *testing.T) sharedStore {
			return hostShared{startHost(t, perIPConfig, 1).h.SharedData()}
		},
	}
	for name, mk := range impls {
		t.Run(name, func(t *testing.T) {
			s := mk(t)
			if _, _, ok := s.Get("k"); ok {
				t.Fatal("missing key found")
			}
			// A nonzero cas on a missing key is ignored: the key is created.
			if st := s.Set("k", []byte("a"), 12345); st != abi.StatusOK {
				t.Fatalf("create with nonzero cas: %v", st)
			}
			v, cas1, ok := s.Get("k")
			if !ok || string(v) != "a" || cas1 == 0 {
				t.Fatalf("get: %q %d %v", v, cas1, ok)
			}
			if st := s.Set("k", []byte("b"), cas1); st != abi.StatusOK {
				t.Fatalf("set with current cas: %v", st)
			}
			v, cas2, _ := s.Get("k")
			if string(v) != "b" || cas2 == 0 || cas2 == cas1 {
				t.Fatalf("after update: %q cas %d (was %d)", v, cas2, cas1)
			}
			if st := s.Set("k", []byte("c"), cas1); st != abi.StatusCASMismatch {
				t.Fatalf("stale cas: %v, want CAS_MISMATCH", st)
			}
			if v, _, _ := s.Get("k"); string(v) != "b" {
				t.Fatalf("value changed by a failed set: %q", v)
			}
			// cas 0 is unconditional.
			if st := s.Set("k", []byte("d"), 0); st != abi.StatusOK {
				t.Fatalf("cas 0: %v", st)
			}
			if v, cas3, _ := s.Get("k"); string(v) != "d" || cas3 == cas2 || cas3 == 0 {
				t.Fatalf("after cas 0: %q %d", v, cas3)
			}
			// Two writers creating a key with cas 0 both succeed; the last
			// write wins. (Why the store never creates with cas 0.)
			if s.Set("n", []byte("w1"), 0) != abi.StatusOK || s.Set("n", []byte("w2"), 0) != abi.StatusOK {
				t.Fatal("cas-0 creations must both succeed")
			}
			if v, _, _ := s.Get("n"); string(v) != "w2" {
				t.Fatalf("last write: %q", v)
			}
			// Empty values are values.
			if s.Set("e", nil, 0) != abi.StatusOK {
				t.Fatal("empty value")
			}
			if v, _, ok := s.Get("e"); !ok || len(v) != 0 {
				t.Fatalf("empty value read back: %q %v", v, ok)
			}
		})
	}
}
