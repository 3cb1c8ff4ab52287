package shareddata

import (
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/sluice-proxy/sluice/proxywasm"
)

func TestSharedDataSemantics(t *testing.T) {
	d := New()
	if _, _, ok := d.Get("k"); ok {
		t.Fatal("Get on an empty map found a key")
	}
	// The cas is ignored when the key does not exist.
	if st := d.Set("k", []byte("v1"), 12345); st != proxywasm.StatusOK {
		t.Fatalf("Set(missing key, cas 12345) = %v, want OK", st)
	}
	v, cas1, ok := d.Get("k")
	if !ok || string(v) != "v1" || cas1 == 0 {
		t.Fatalf("Get = %q %d %v", v, cas1, ok)
	}
	// A stale or wrong cas fails.
	if st := d.Set("k", []byte("x"), cas1+1); st != proxywasm.StatusCASMismatch {
		t.Fatalf("Set(wrong cas) = %v, want CAS_MISMATCH", st)
	}
	// The right cas succeeds and changes the cas.
	if st := d.Set("k", []byte("v2"), cas1); st != proxywasm.StatusOK {
		t.Fatalf("Set(right cas) = %v", st)
	}
	v, cas2, _ := d.Get("k")
	if string(v) != "v2" || cas2 == cas1 || cas2 == 0 {
		t.Fatalf("after CAS set: %q cas %d (was %d)", v, cas2, cas1)
	}
	if st := d.Set("k", []byte("stale"), cas1); st != proxywasm.StatusCASMismatch {
		t.Fatalf("Set(stale cas) = %v, want CAS_MISMATCH", st)
	}
	// cas 0 is unconditional.
	if st := d.Set("k", []byte("v3"), 0); st != proxywasm.StatusOK {
		t.Fatalf("Set(cas 0) = %v", st)
	}
	v, cas3, _ := d.Get("k")
	if string(v) != "v3" || cas3 == cas2 {
		t.Fatalf("after cas-0 set: %q %d", v, cas3)
	}
	// Get returns a copy.
	v[0] = 'X'
	if v, _, _ := d.Get("k"); string(v) != "v3" {
		t.Fatalf("Get leaked its storage: %q", v)
	}
	if d.Len() != 1 || d.Bytes() != len("k")+len("v3") {
		t.Fatalf("Len %d Bytes %d", d.Len(), d.Bytes())
	}
	d.Set("longer-key", []byte("value"), 0)
	d.Set("k", []byte("a"), 0)
	if d.Bytes() != len("k")+1+len("longer-key")+len("value") {
		t.Fatalf("Bytes = %d", d.Bytes())
	}
	if got := fmt.Sprint(d.Keys()); got != "[k longer-key]" {
		t.Fatalf("Keys = %s", got)
	}
}

func TestSharedDataCASNeverZero(t *testing.T) {
	d := New()
	d.nextCAS.Store(^uint32(0) - 1)
	d.Set("a", nil, 0)
	d.Set("b", nil, 0)
	_, ca, _ := d.Get("a")
	_, cb, _ := d.Get("b")
	if ca != ^uint32(0) || cb != 1 {
		t.Fatalf("cas around the wrap: %d, %d", ca, cb)
	}
}

// Two writers that both saw "missing" both succeed: last write wins (Envoy's behaviour, the
// race the filter has to survive).
func TestSharedDataMissingKeyRace(t *testing.T) {
	d := New()
	_, casA, okA := d.Get("new")
	_, casB, okB := d.Get("new")
	if okA || okB || casA != 0 || casB != 0 {
		t.Fatal("key exists")
	}
	if st := d.Set("new", []byte("A"), casA); st != proxywasm.StatusOK {
		t.Fatalf("first create: %v", st)
	}
	if st := d.Set("new", []byte("B"), casB); st != proxywasm.StatusOK {
		t.Fatalf("second create (cas 0 on an existing key is unconditional): %v", st)
	}
	if v, _, _ := d.Get("new"); string(v) != "B" {
		t.Fatalf("value = %q, want B (last write wins)", v)
	}
	// With a nonzero cas remembered from an earlier life of the key, the second creator would
	// fail: Envoy only ignores the cas when the key does not exist at set time.
	_, cas, _ := d.Get("new")
	d.Set("new", []byte("C"), 0)
	if st := d.Set("new", []byte("D"), cas); st != proxywasm.StatusCASMismatch {
		t.Fatalf("stale cas on an existing key = %v", st)
	}
}

func TestSharedDataConcurrentCAS(t *testing.T) {
	d := New()
	const goroutines, each = 8, 500
	// The key exists before the race: a set on a missing key ignores its cas (Envoy's
	// semantics, TestSharedDataThroughGuest), so a goroutine whose first get found the key
	// missing would overwrite every increment made since, however many (seen: 11 lost of
	// 4,000 on a loaded machine). From an existing key on, CAS makes every increment count.
	if st := d.Set("n", []byte("0"), 0); st != proxywasm.StatusOK {
		t.Fatalf("create: %v", st)
	}
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				for {
					v, cas, _ := d.Get("n")
					n, _ := strconv.Atoi(string(v))
					if d.Set("n", []byte(strconv.Itoa(n+1)), cas) == proxywasm.StatusOK {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	v, _, _ := d.Get("n")
	if n, _ := strconv.Atoi(string(v)); n != goroutines*each {
		t.Fatalf("n = %d, want %d: every increment counted", n, goroutines*each)
	}
}
