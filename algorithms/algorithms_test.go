package algorithms

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"
)

var p5 = Params{Limit: 5, Window: time.Second}

const ms = time.Millisecond

func TestNewValidates(t *testing.T) {
	tests := []struct {
		k    Kind
		p    Params
		want string
	}{
		{TokenBucket, Params{Limit: 0, Window: time.Second}, "limit must be at least 1"},
		{FixedWindow, Params{Limit: -3, Window: time.Second}, "limit must be at least 1"},
		{LeakyBucket, Params{Limit: MaxLimit + 1, Window: time.Second}, "limit must be at most 1000000000"},
		{SlidingLog, Params{Limit: MaxSlidingLogLimit + 1, Window: time.Second}, "limit must be at most 10000 for sliding_log"},
		{SlidingWindow, Params{Limit: 1, Window: 0}, "window must be positive"},
		{SlidingWindow, Params{Limit: 1, Window: -time.Second}, "window must be positive"},
		{TokenBucket, Params{Limit: 1, Window: MaxWindow + 1}, "window must be at most 366d"},
		{TokenBucket, Params{Limit: 1, Window: time.Second, Burst: -1}, "burst must not be negative"},
		{LeakyBucket, Params{Limit: 1, Window: time.Second, Burst: MaxLimit + 1}, "burst must be at most 1000000000"},
		{TokenBucket, Params{Limit: 1, Window: MaxWindow, Burst: 101},
			"burst is too large for this limit and window: refilling it would take more than 100 years"},
		{Kind(0), p5, "algorithm is unknown: 0"},
		{Kind(9), p5, "algorithm is unknown: 9"},
	}
	for _, tt := range tests {
		l, err := New(tt.k, tt.p)
		var pe *ParamError
		if err == nil || !errors.As(err, &pe) || err.Error() != tt.want || l != nil {
			t.Errorf("New(%v, %+v) = %v, %v; want error %q", tt.k, tt.p, l, err, tt.want)
		}
	}
	// The edges are accepted.
	for _, tt := range []struct {
		k Kind
		p Params
	}{
		{SlidingLog, Params{Limit: MaxSlidingLogLimit, Window: MaxWindow}},
		{FixedWindow, Params{Limit: MaxLimit, Window: MaxWindow}},
		{SlidingWindow, Params{Limit: MaxLimit, Window: 1}},
		{TokenBucket, Params{Limit: 1, Window: MaxWindow, Burst: 100}},
		{LeakyBucket, Params{Limit: MaxLimit, Window: 1, Burst: MaxLimit}},
	} {
		if _, err := New(tt.k, tt.p); err != nil {
			t.Errorf("New(%v, %+v): %v", tt.k, tt.p, err)
		}
	}
}

func TestNewNormalisesBurst(t *testing.T) {
	for _, tt := range []struct {
		k         Kind
		burst     int64
		wantBurst int64
	}{
		{TokenBucket, 0, 5}, {TokenBucket, 9, 9}, {LeakyBucket, 0, 5}, {LeakyBucket, 2, 2},
		{FixedWindow, 9, 5}, {SlidingLog, 0, 5}, {SlidingWindow, 9, 5},
	} {
		l := mustNew(t, tt.k, Params{Limit: 5, Window: time.Second, Burst: tt.burst})
		if got := l.Params(); got.Burst != tt.wantBurst || got.Limit != 5 || got.Window != time.Second || l.Kind() != tt.k {
			t.Errorf("%v burst %d: Params() = %+v, Kind %v", tt.k, tt.burst, got, l.Kind())
		}
	}
}

func TestKindNames(t *testing.T) {
	for _, k := range Kinds {
		if got, ok := ParseKind(k.String()); !ok || got != k {
			t.Errorf("ParseKind(%q) = %v, %v", k.String(), got, ok)
		}
	}
	if _, ok := ParseKind("gcra"); ok || Kind(0).String() != "unknown" {
		t.Error("unknown names must not parse")
	}
}

// bucketSteps holds for the token bucket and the leaky bucket alike: as
// meters they are the same (tokens = burst − level). 5 per second is one
// unit every 200 ms.
var bucketSteps = []step{
	{0, 1, true, 4, 0, 200 * ms},
	{0, 1, true, 3, 0, 400 * ms},
	{0, 1, true, 2, 0, 600 * ms},
	{0, 1, true, 1, 0, 800 * ms},
	{0, 1, true, 0, 0, time.Second},
	{0, 1, false, 0, 200 * ms, time.Second},
	{100 * ms, 1, false, 0, 100 * ms, 900 * ms},
	{200 * ms, 1, true, 0, 0, time.Second},
	{300 * ms, 2, false, 0, 300 * ms, 900 * ms}, // 0.5 tokens: 1.5 missing
	{600 * ms, 2, true, 0, 0, time.Second},
	{5 * time.Second, 1, true, 4, 0, 200 * ms},
	{5*time.Second + 50*ms, 4, true, 0, 0, 950 * ms},            // 4.25 - 4
	{5*time.Second + 50*ms, 6, false, 0, time.Second, 950 * ms}, // above burst: never
}

func TestTokenBucketSteps(t *testing.T) { runSteps(t, mustNew(t, TokenBucket, p5), bucketSteps) }
func TestLeakyBucketSteps(t *testing.T) { runSteps(t, mustNew(t, LeakyBucket, p5), bucketSteps) }

func TestBucketBurstAboveLimit(t *testing.T) {
	// 2 per second with a burst of 4: a full bucket takes 4, then one
	// every 500 ms.
	steps := []step{
		{0, 4, true, 0, 0, 2 * time.Second},
		{0, 1, false, 0, 500 * ms, 2 * time.Second},
		{500 * ms, 1, true, 0, 0, 2 * time.Second},
		{10 * time.Second, 3, true, 1, 0, 1500 * ms},
	}
	for _, k := range []Kind{TokenBucket, LeakyBucket} {
		t.Run(k.String(), func(t *testing.T) {
			runSteps(t, mustNew(t, k, Params{Limit: 2, Window: time.Second, Burst: 4}), steps)
		})
	}
}

func TestFixedWindowSteps(t *testing.T) {
	runSteps(t, mustNew(t, FixedWindow, p5), []step{
		{0, 1, true, 4, 0, time.Second},
		{0, 3, true, 1, 0, time.Second},
		{100 * ms, 1, true, 0, 0, 900 * ms},
		{500 * ms, 1, false, 0, 500 * ms, 500 * ms},
		{999 * ms, 1, false, 0, 1 * ms, 1 * ms},
		{time.Second, 1, true, 4, 0, time.Second},
		{1500 * ms, 5, false, 4, 500 * ms, 500 * ms},
		{1500 * ms, 4, true, 0, 0, 500 * ms},
		{3 * time.Second, 6, false, 5, time.Second, 0}, // above limit: never
	})
}

func TestSlidingWindowSteps(t *testing.T) {
	runSteps(t, mustNew(t, SlidingWindow, p5), []step{
		{0, 1, true, 4, 0, 2 * time.Second},
		{0, 4, true, 0, 0, 2 * time.Second},
		// cur=5: wait for the next window, until 5×(1−e) <= 4: e = 200 ms.
		{500 * ms, 1, false, 0, 700 * ms, 1500 * ms},
		{1200 * ms, 1, true, 0, 0, 1800 * ms}, // 5×0.8 + 1 = 5
		// 5×0.7 + 1 + 1 = 5.5 > 5; fits once 5×(1−e) <= 3: e = 400 ms.
		{1300 * ms, 1, false, 0, 100 * ms, 1700 * ms},
		{1400 * ms, 1, true, 0, 0, 1600 * ms},
		{1900 * ms, 2, true, 0, 0, 1100 * ms},         // 5×0.1 + 2 + 2 = 4.5
		{1900 * ms, 1, false, 0, 100 * ms, 1100 * ms}, // 0.5+4+1 > 5; next window: 4×(1−e) <= 4
		{4 * time.Second, 5, true, 0, 0, 2 * time.Second},
		{4 * time.Second, 6, false, 0, time.Second, 2 * time.Second},
	})
}

func TestSlidingLogSteps(t *testing.T) {
	runSteps(t, mustNew(t, SlidingLog, p5), []step{
		{0, 1, true, 4, 0, time.Second},
		{0, 1, true, 3, 0, time.Second},
		{400 * ms, 3, true, 0, 0, time.Second},
		{500 * ms, 1, false, 0, 500 * ms, 900 * ms}, // the two at t0 expire at 1 s
		{500 * ms, 3, false, 0, 900 * ms, 900 * ms}, // needs the three at 400 ms gone too
		{time.Second, 2, true, 0, 0, time.Second},
		{time.Second, 1, false, 0, 400 * ms, time.Second},
		{1400 * ms, 3, true, 0, 0, time.Second},
		{1400 * ms, 6, false, 0, time.Second, time.Second}, // above limit: never
	})
}

// Regression: a fixed window admits 2×limit across a window boundary, by
// design; the sliding algorithms refuse that burst.
func TestFixedWindowAdmitsTwiceLimitAcrossBoundary(t *testing.T) {
	burst := func(l Limiter) (admitted int) {
		var state []byte
		for _, at := range []time.Duration{999 * ms, 1001 * ms} {
			for range 5 {
				var d Decision
				state, d = decide(t, l, state, t0+int64(at), 1)
				if d.Allowed {
					admitted++
				}
			}
		}
		return admitted
	}
	if got := burst(mustNew(t, FixedWindow, p5)); got != 10 {
		t.Errorf("fixed_window admitted %d of 10 across the boundary, want all 10", got)
	}
	if got := burst(mustNew(t, SlidingLog, p5)); got != 5 {
		t.Errorf("sliding_log admitted %d of 10 within 2 ms, want 5", got)
	}
	// sliding_window: at 1001 ms the previous 5 still weigh 5×0.999 = 4.995.
	if got := burst(mustNew(t, SlidingWindow, p5)); got != 5 {
		t.Errorf("sliding_window admitted %d of 10 within 2 ms, want 5", got)
	}
}

// Regression: a token bucket that floored its accumulator would never refill
// half a token per 100 ms poll and starve this client. Exact refill admits
// one request every 200 ms: 5/s.
func TestTokenBucketPolledEvery100msIsNotStarved(t *testing.T) {
	for _, k := range []Kind{TokenBucket, LeakyBucket} {
		t.Run(k.String(), func(t *testing.T) {
			l := mustNew(t, k, Params{Limit: 5, Window: time.Second, Burst: 1})
			var state []byte
			admitted := 0
			for i := 0; i <= 100; i++ { // 0 ms .. 10 s
				var d Decision
				state, d = decide(t, l, state, t0+int64(i)*int64(100*ms), 1)
				if d.Allowed != (i%2 == 0) {
					t.Fatalf("poll %d at %v: allowed=%v", i, time.Duration(i)*100*ms, d.Allowed)
				}
				if d.Allowed {
					admitted++
				}
			}
			if admitted != 51 { // the full bucket at 0, then 5/s for 10 s
				t.Fatalf("admitted %d, want 51", admitted)
			}
		})
	}
}

// Regression: a log that never prunes locks a key out for good. A key quiet
// for a full window is fully available, and its state is back to one entry.
func TestSlidingLogQuietKeyIsFullyAvailable(t *testing.T) {
	l := mustNew(t, SlidingLog, Params{Limit: 100, Window: time.Minute})
	var state []byte
	for i := range 100 {
		state, _ = decide(t, l, state, t0+int64(i)*int64(time.Millisecond), 1)
	}
	full := len(state)
	w := logWidth(uint64(time.Minute)) // 5 bytes hold 2 minutes in ns
	if full != logHeaderSize+100*w {
		t.Fatalf("100 entries 1 ms apart take %d bytes, want %d + 100 × %d", full, logHeaderSize, w)
	}
	if _, d := decide(t, l, state, t0+int64(time.Minute)-1, 1); d.Allowed {
		t.Fatal("admitted before anything expired")
	}
	quiet := t0 + int64(99*time.Millisecond+time.Minute)
	if !l.Idle(state, quiet) || l.Idle(state, quiet-1) {
		t.Fatal("Idle must turn true exactly one window after the last request")
	}
	var d Decision
	state, d = decide(t, l, state, quiet, 1)
	if !d.Allowed || d.Remaining != 99 {
		t.Fatalf("after a quiet window: %+v, want allowed with 99 remaining", d)
	}
	if len(state) != logHeaderSize+w {
		t.Fatalf("state not pruned: %d bytes (was %d)", len(state), full)
	}
	for i := 1; i < 100; i++ {
		if state, d = decide(t, l, state, quiet, 1); !d.Allowed {
			t.Fatalf("request %d after the quiet window denied", i+1)
		}
	}
}

// Remaining counts down honestly, for every algorithm.
func TestRemainingCountsDown(t *testing.T) {
	forEachKind(t, p5, func(t *testing.T, l Limiter) {
		var state []byte
		for want := int64(4); want >= 0; want-- {
			var d Decision
			out, d := decide(t, l, state, t0, 1)
			if !d.Allowed || d.Remaining != want {
				t.Fatalf("got %+v, want allowed with Remaining %d", d, want)
			}
			checkRemaining(t, l, out, t0, d)
			state = out
		}
		if _, d := decide(t, l, state, t0, 1); d.Allowed || d.Remaining != 0 {
			t.Fatalf("sixth request: %+v", d)
		}
	})
}

// For every algorithm and a range of parameters: every denial's RetryAfter
// is exact (admitted at now+RetryAfter, denied 1 ns earlier), Remaining is
// honest, and a denied request leaves the state as it was.
func TestRetryAfterIsExact(t *testing.T) {
	params := []Params{
		p5,
		{Limit: 3, Window: 7 * time.Second, Burst: 2},
		{Limit: 7, Window: 3 * time.Second, Burst: 11},
		{Limit: 1, Window: time.Hour},
		{Limit: 1000, Window: time.Nanosecond * 999_999_937},
	}
	for i, p := range params {
		forEachKind(t, p, func(t *testing.T, l Limiter) {
			reqs := workload(uint64(i), 600, p.Window, capacity(l)+1, p.Window/3)
			var state []byte
			denied := 0
			for _, r := range reqs {
				out, d := decide(t, l, state, r.at, r.cost)
				checkDecision(t, l, state, out, r.at, r.cost, d)
				if r.cost == 1 && d.Remaining < 50 {
					checkRemaining(t, l, out, r.at, d)
				}
				if !d.Allowed {
					denied++
				}
				state = out
			}
			if denied == 0 || denied == len(reqs) {
				t.Fatalf("workload not discriminating: %d of %d denied", denied, len(reqs))
			}
		})
	}
}

// The clock going backwards never unblocks a key, never panics, and the
// waits it reports are measured from the caller's clock.
func TestClockGoingBackwards(t *testing.T) {
	forEachKind(t, p5, func(t *testing.T, l Limiter) {
		var state []byte
		late := t0 + int64(10*time.Second)
		for range 5 {
			state, _ = decide(t, l, state, late, 1)
		}
		_, atLate := decide(t, l, state, late, 1)
		for _, back := range []time.Duration{time.Nanosecond, 300 * ms, time.Second, time.Hour, 1000 * time.Hour} {
			now := late - int64(back)
			out, d := decide(t, l, state, now, 1)
			if d.Allowed {
				t.Fatalf("clock back by %v unblocked the key: %+v", back, d)
			}
			if d.RetryAfter != atLate.RetryAfter+back || d.Remaining != 0 {
				t.Fatalf("back by %v: RetryAfter %v, want %v + %v", back, d.RetryAfter, atLate.RetryAfter, back)
			}
			checkDecision(t, l, state, out, now, 1, d)
		}
		// Admitted while behind: charged at the recorded time, so the key
		// is not refilled any earlier than if the clock had stood still.
		l2 := mustNew(t, l.Kind(), Params{Limit: 5, Window: time.Second, Burst: 5})
		var s []byte
		s, _ = decide(t, l2, s, late, 1)
		s, d := decide(t, l2, s, late-int64(time.Hour), 4)
		if !d.Allowed {
			t.Fatalf("capacity left but denied: %+v", d)
		}
		if _, d := decide(t, l2, s, late, 1); d.Allowed {
			t.Fatal("request charged in the past made room at the recorded time")
		}
		// Nonsense instants never panic.
		for _, now := range []int64{-1, math.MinInt64, math.MaxInt64, 0} {
			out, d, err := l.Decide(nil, state, now, 1)
			if err != nil || d.Remaining < 0 || d.RetryAfter < 0 {
				t.Fatalf("now=%d: %+v, %v", now, d, err)
			}
			_ = out
			l.Idle(state, now)
		}
	})
}

// A cost above the capacity can never be admitted: denied, uncharged, with
// RetryAfter = Window as a back-off, even on a fresh key.
func TestCostAboveCapacity(t *testing.T) {
	forEachKind(t, Params{Limit: 5, Window: time.Second, Burst: 3}, func(t *testing.T, l Limiter) {
		out, d := decide(t, l, nil, t0, capacity(l)+1)
		if d.Allowed || d.RetryAfter != time.Second || len(out) != 0 || d.Remaining != capacity(l) {
			t.Fatalf("fresh key: %+v, state %x", d, out)
		}
		state, _ := decide(t, l, nil, t0, 1)
		out, d = decide(t, l, state, t0, math.MaxInt64)
		if d.Allowed || d.RetryAfter != time.Second || !bytes.Equal(out, state) {
			t.Fatalf("cost MaxInt64: %+v", d)
		}
		if _, d := decide(t, l, state, t0, capacity(l)-1); !d.Allowed {
			t.Fatalf("the rest of the capacity was refused: %+v", d)
		}
	})
}

func TestInvalidCost(t *testing.T) {
	forEachKind(t, p5, func(t *testing.T, l Limiter) {
		for _, cost := range []int64{0, -1, math.MinInt64} {
			if _, _, err := l.Decide(nil, nil, t0, cost); !errors.Is(err, ErrInvalidCost) {
				t.Errorf("cost %d: err %v", cost, err)
			}
		}
	})
}

func TestIdle(t *testing.T) {
	forEachKind(t, p5, func(t *testing.T, l Limiter) {
		if !l.Idle(nil, t0) {
			t.Fatal("empty state is not idle")
		}
		state, _ := decide(t, l, nil, t0+int64(300*ms), 1)
		if l.Idle(state, t0+int64(300*ms)) {
			t.Fatal("charged state is idle")
		}
		// Find the first instant it is idle; there the key must decide
		// exactly like a fresh one, for every cost.
		at := t0 + int64(300*ms)
		for !l.Idle(state, at) {
			at += int64(ms)
			if at > t0+int64(3*time.Second) {
				t.Fatal("never idle")
			}
		}
		for cost := int64(1); cost <= 6; cost++ {
			_, a := decide(t, l, state, at, cost)
			_, b := decide(t, l, nil, at, cost)
			if a != b {
				t.Fatalf("idle state decides %+v, fresh %+v", a, b)
			}
		}
		if l.Idle([]byte{9, 9}, at) {
			t.Fatal("a corrupt state is idle")
		}
	})
}

func TestCorruptStates(t *testing.T) {
	p := Params{Limit: 5, Window: time.Second, Burst: 5}
	forEachKind(t, p, func(t *testing.T, l Limiter) {
		good, _ := decide(t, l, nil, t0, 2)
		other := TokenBucket
		if l.Kind() == TokenBucket {
			other = LeakyBucket
		}
		bad := map[string][]byte{
			"one byte":      {stateVersion},
			"version 0":     append([]byte{0}, good[1:]...),
			"next version":  append([]byte{good[0] + 1}, good[1:]...),
			"foreign kind":  append([]byte{stateVersion, byte(other)}, good[2:]...),
			"truncated":     good[:len(good)-1],
			"trailing byte": append(append([]byte{}, good...), 0x01),
			"all 0xff":      append([]byte{stateVersion, byte(l.Kind())}, bytes.Repeat([]byte{0xff}, len(good)-2)...),
		}
		for name, s := range bad {
			if _, _, err := l.Decide(nil, s, t0, 1); !isCorrupt(err) {
				t.Errorf("%s (%x): err %v", name, s, err)
			}
		}
	})
}

// Values that fit the layout but break an invariant are rejected too.
func TestInconsistentStates(t *testing.T) {
	u := func(k Kind, words ...uint64) []byte {
		b := appendHeader(nil, k)
		for _, w := range words {
			b = appendU64(b, w)
		}
		return b
	}
	sec := uint64(time.Second)
	T := uint64(t0)
	tests := []struct {
		name  string
		k     Kind
		state []byte
	}{
		{"tokens above burst", TokenBucket, u(TokenBucket, T, 6, 0)},
		{"fraction at burst", TokenBucket, u(TokenBucket, T, 5, 1)},
		{"fraction >= window", TokenBucket, u(TokenBucket, T, 1, sec)},
		{"negative time", TokenBucket, u(TokenBucket, 1<<63, 1, 0)},
		{"fraction >= limit", LeakyBucket, u(LeakyBucket, T, 5, T)},
		{"level above burst", LeakyBucket, u(LeakyBucket, T+sec+1, 0, T)},
		{"negative tat", LeakyBucket, u(LeakyBucket, 1<<63, 0, T)},
		{"unaligned window", FixedWindow, u(FixedWindow, T+1, 1)},
		{"zero count", FixedWindow, u(FixedWindow, T, 0)},
		{"count above limit", FixedWindow, u(FixedWindow, T, 6)},
		{"unaligned window", SlidingWindow, u(SlidingWindow, T+1, 0, 1)},
		{"prev above limit", SlidingWindow, u(SlidingWindow, T, 6, 1)},
		{"both counters zero", SlidingWindow, u(SlidingWindow, T, 0, 0)}, // a current counter of 0 is a give-back's (refund.go)
		{"explicit count 1", SlidingLog, []byte{1, 4, 10<<1 | 1, 1}},
		{"explicit count 0", SlidingLog, []byte{1, 4, 10<<1 | 1, 0}},
		{"above limit", SlidingLog, []byte{1, 4, 10<<1 | 1, 3, 1<<1 | 1, 3}},
		{"not increasing", SlidingLog, []byte{1, 4, 10 << 1, 0}},
		{"wider than window", SlidingLog, appendEntry(appendEntry(appendHeader(nil, SlidingLog), -1, t0, 1), t0, t0+int64(time.Second), 1)},
		{"truncated varint", SlidingLog, []byte{1, 4, 0x80}},
		{"missing count", SlidingLog, []byte{1, 4, 10<<1 | 1}},
		{"time overflow", SlidingLog, []byte{1, 4, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}},
		{"delta overflow", SlidingLog, append(appendEntry(appendHeader(nil, SlidingLog), -1, maxTime, 1), 2<<1)},
	}
	for _, tt := range tests {
		l := mustNew(t, tt.k, Params{Limit: 5, Window: time.Second})
		if _, _, err := l.Decide(nil, tt.state, t0, 1); !isCorrupt(err) {
			t.Errorf("%v %s: err %v", tt.k, tt.name, err)
		}
	}
}

// Decide appends to dst without allocating when dst has MaxStateSize
// capacity, for every algorithm, admitted and denied.
func TestDecideDoesNotAllocate(t *testing.T) {
	forEachKind(t, Params{Limit: 100, Window: time.Second}, func(t *testing.T, l Limiter) {
		a := make([]byte, 0, l.MaxStateSize())
		b := make([]byte, 0, l.MaxStateSize())
		now := t0
		allocs := testing.AllocsPerRun(1000, func() {
			out, _, err := l.Decide(b[:0], a, now, 1)
			if err != nil {
				panic(err)
			}
			a, b = out, a
			now += int64(3 * ms) // ~one third of the requests denied
		})
		if allocs != 0 {
			t.Fatalf("%v allocs per Decide", allocs)
		}
	})
}

// At the edges of the accepted parameters no arithmetic overflows: every
// decision stays exact over workloads with gaps from 0 to decades.
func TestExtremeParams(t *testing.T) {
	year := int64(365 * 24 * time.Hour)
	for _, tt := range []struct {
		k Kind
		p Params
	}{
		{TokenBucket, Params{Limit: MaxLimit, Window: time.Nanosecond, Burst: MaxLimit}},
		{TokenBucket, Params{Limit: 1, Window: MaxWindow, Burst: 100}},
		{TokenBucket, Params{Limit: 3, Window: MaxWindow - 1, Burst: 299}},
		{TokenBucket, Params{Limit: MaxLimit, Window: MaxWindow, Burst: 1}},
		{LeakyBucket, Params{Limit: MaxLimit, Window: time.Nanosecond, Burst: MaxLimit}},
		{LeakyBucket, Params{Limit: 1, Window: MaxWindow, Burst: 100}},
		{LeakyBucket, Params{Limit: MaxLimit - 1, Window: MaxWindow - 1, Burst: 3}},
		{FixedWindow, Params{Limit: MaxLimit, Window: MaxWindow}},
		{FixedWindow, Params{Limit: 1, Window: time.Nanosecond}},
		{SlidingWindow, Params{Limit: MaxLimit, Window: MaxWindow}},
		{SlidingWindow, Params{Limit: MaxLimit, Window: 3}},
		{SlidingWindow, Params{Limit: 2, Window: MaxWindow - 7}},
		{SlidingLog, Params{Limit: MaxSlidingLogLimit, Window: MaxWindow}},
		{SlidingLog, Params{Limit: 3, Window: time.Nanosecond}},
	} {
		t.Run(tt.k.String(), func(t *testing.T) {
			l := mustNew(t, tt.k, tt.p)
			var state []byte
			now := t0
			gaps := []int64{0, 1, 2, 1e3, int64(tt.p.Window) / 2, int64(tt.p.Window), 3, 7 * year, 0, 3 * year, 1}
			resets := 0
			for i := range 200 {
				cost := []int64{1, capacity(l), capacity(l) / 2, 2, capacity(l) + 1}[i%5]
				if cost < 1 {
					cost = 1
				}
				if now > maxTime-int64(MaxFillTime)-8*year { // keep now+RetryAfter below maxTime
					now = t0
					state = nil
					resets++
				}
				out, d := decide(t, l, state, now, cost)
				checkDecision(t, l, state, out, now, cost, d)
				state = out
				now += gaps[i%len(gaps)]
			}
			if resets == 0 || resets > 40 {
				t.Fatalf("%d resets: the workload did not span decades", resets)
			}
		})
	}
}

// Decide(state[:0], state, ...) rewrites the state in place: every
// algorithm reads the state before it writes over it.
func TestDecideInPlace(t *testing.T) {
	forEachKind(t, Params{Limit: 40, Window: time.Second, Burst: 30}, func(t *testing.T, l Limiter) {
		var ref []byte
		inPlace := make([]byte, 0, l.MaxStateSize())
		for i, r := range workload(7, 3000, time.Second, 5, 100*ms) {
			var want Decision
			ref, want = decide(t, l, ref, r.at, r.cost)
			out, got, err := l.Decide(inPlace[:0], inPlace, r.at, r.cost)
			if err != nil || got != want || !bytes.Equal(out, ref) {
				t.Fatalf("request %d: in place %+v %x %v, want %+v %x", i, got, out, err, want, ref)
			}
			inPlace = out
		}
	})
}

// A Limiter holds only immutable parameters: goroutines sharing one (each
// with its own state) decide exactly as they would alone. Run with -race.
func TestConcurrentUse(t *testing.T) {
	forEachKind(t, Params{Limit: 20, Window: time.Second, Burst: 10}, func(t *testing.T, l Limiter) {
		reqs := workload(11, 2000, time.Second, 3, 0)
		var want []Decision
		var state []byte
		for _, r := range reqs {
			var d Decision
			state, d = decide(t, l, state, r.at, r.cost)
			want = append(want, d)
		}
		errs := make(chan error, 4)
		for range 4 {
			go func() {
				buf := make([]byte, 0, l.MaxStateSize())
				var st []byte
				for i, r := range reqs {
					out, d, err := l.Decide(buf[:0], st, r.at, r.cost)
					if err != nil || d != want[i] {
						errs <- errors.New("concurrent decision differs")
						return
					}
					buf, st = st, out
				}
				errs <- nil
			}()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	})
}
