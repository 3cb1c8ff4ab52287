package algorithms

import (
	"bytes"
	"testing"
	"time"
)

// fuzzParams are the parameters every state-decoder fuzz target uses:
// small enough that random bytes sometimes form a valid state.
var fuzzParams = Params{Limit: 5, Window: time.Second, Burst: 7}

// fuzzDecoder feeds arbitrary bytes, instants and costs to Decide and Idle
// of kind k. Decide must never panic; it returns either an error wrapping
// ErrCorruptState, or a decision that is consistent: in range, a denial
// that leaves the state unchanged and whose RetryAfter is exact, an
// admission whose new state decodes again.
func fuzzDecoder(f *testing.F, k Kind) {
	l := mustNew(f, k, fuzzParams)
	// Seeds: states the limiter really produces, and damaged ones.
	var state []byte
	for i := range 12 {
		f.Add(append([]byte(nil), state...), t0+int64(i)*int64(90*ms), int64(1+i%3))
		state, _ = decide(f, l, state, t0+int64(i)*int64(90*ms), int64(1+i%3))
	}
	f.Add([]byte{}, int64(0), int64(1))
	f.Add([]byte{stateVersion, byte(k)}, t0, int64(1))
	f.Add([]byte{stateVersion + 1, byte(k), 0, 0}, t0, int64(2))
	f.Add(append([]byte{stateVersion, byte(k)}, bytes.Repeat([]byte{0xff}, 24)...), t0, int64(1))
	f.Add(append([]byte{stateVersion, byte(k)}, bytes.Repeat([]byte{0x80}, 30)...), t0, int64(1))
	f.Add(state[:len(state)-1], t0, int64(1))
	f.Fuzz(func(t *testing.T, state []byte, now, cost int64) {
		now &= 1<<61 - 1 // keep now+RetryAfter below the clamp at maxTime
		if cost < 1 {
			if _, _, err := l.Decide(nil, state, now, cost); err != ErrInvalidCost {
				t.Fatalf("cost %d: err %v", cost, err)
			}
			return
		}
		idle := l.Idle(state, now)
		out, d, err := l.Decide(make([]byte, 0, l.MaxStateSize()), state, now, cost)
		if err != nil {
			if !isCorrupt(err) || idle {
				t.Fatalf("err %v (idle %v) is not a corrupt-state error", err, idle)
			}
			return
		}
		checkDecision(t, l, state, out, now, cost, d)
		if d.Allowed {
			if _, _, err := l.Decide(nil, out, now, 1); err != nil {
				t.Fatalf("state written by Decide does not decode: %v", err)
			}
		}
		if idle {
			if _, fresh := decide(t, l, nil, now, cost); fresh != d {
				t.Fatalf("idle state decided %+v, a fresh key %+v", d, fresh)
			}
		}
	})
}

func FuzzDecodeTokenBucket(f *testing.F) { fuzzDecoder(f, TokenBucket) }
func FuzzDecodeLeakyBucket(f *testing.F) { fuzzDecoder(f, LeakyBucket) }
func FuzzDecodeFixedWindow(f *testing.F) { fuzzDecoder(f, FixedWindow) }
func FuzzDecodeSlidingLog(f *testing.F) {
	// Also seeds of the version-1 format and of a log out of order.
	var adm []admission
	for i := range int64(4) {
		adm = append(adm, admission{t0 + i*int64(90*ms), 1 + i%2})
	}
	f.Add(legacyState(adm, time.Second), t0+int64(300*ms), int64(1))
	f.Add(legacyState(adm[:2], time.Second), t0+int64(950*ms), int64(2))
	f.Add(outOfOrder(), t0+int64(time.Second), int64(1))
	f.Add(outOfOrder(), t0+int64(1200*ms), int64(3))
	fuzzDecoder(f, SlidingLog)
}
func FuzzDecodeSlidingWindow(f *testing.F) { fuzzDecoder(f, SlidingWindow) }
