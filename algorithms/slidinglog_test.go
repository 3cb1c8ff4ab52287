package algorithms

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// appendEntry encodes a version-1 sliding_log entry at t (absolute when
// prev < 0, else as the delta from prev) with its count: the format an
// earlier sluice wrote, which Decide still reads.
func appendEntry(dst []byte, prev, t int64, count uint64) []byte {
	d := uint64(t)
	if prev >= 0 {
		d = uint64(t - prev)
	}
	if count == 1 {
		return binary.AppendUvarint(dst, d<<1)
	}
	return binary.AppendUvarint(binary.AppendUvarint(dst, d<<1|1), count)
}

// logModel is the sliding log as a list of admissions, decided the way
// the algorithm is specified, with nothing encoded.
type logModel struct {
	p   Params
	adm []admission
}

func (m *logModel) decide(now, cost int64) Decision {
	eff := clampNow(now)
	for _, a := range m.adm {
		eff = max(eff, a.at)
	}
	cutoff := eff - int64(m.p.Window)
	var used int64
	for _, a := range m.adm {
		if a.at > cutoff {
			used += a.cost
		}
	}
	d := Decision{Limit: m.p.Limit, Remaining: m.p.Limit - used}
	if cost <= m.p.Limit && used+cost <= m.p.Limit {
		m.adm = append(m.adm, admission{eff, cost})
		d.Allowed, d.Remaining, d.ResetAfter = true, m.p.Limit-used-cost, late(m.p.Window, eff, now)
		return d
	}
	d.RetryAfter = m.p.Window
	if used > 0 {
		d.ResetAfter = late(time.Duration(m.adm[len(m.adm)-1].at-cutoff), eff, now)
	}
	if cost <= m.p.Limit {
		need := used + cost - m.p.Limit
		for _, a := range m.adm {
			if a.at <= cutoff {
				continue
			}
			if need -= a.cost; need <= 0 {
				d.RetryAfter = late(time.Duration(a.at-cutoff), eff, now)
				break
			}
		}
	}
	return d
}

// used is the cost admitted in the window ending at max(now, newest).
func (m *logModel) used(now int64) int64 {
	eff := clampNow(now)
	for _, a := range m.adm {
		eff = max(eff, a.at)
	}
	var u int64
	for _, a := range m.adm {
		if a.at > eff-int64(m.p.Window) {
			u += a.cost
		}
	}
	return u
}

// units is the cost admitted in the window ending at the newest admission:
// the entries a log written by Decide holds.
func (m *logModel) units() int64 {
	if len(m.adm) == 0 {
		return 0
	}
	newest := m.adm[len(m.adm)-1].at
	var n int64
	for _, a := range m.adm {
		if a.at > newest-int64(m.p.Window) {
			n += a.cost
		}
	}
	return n
}

// Every field of every decision equals the model's, on random workloads
// with costs, repeated instants, gaps longer than the window and the clock
// stepping back — at windows from 1 ns (1-byte entries, rebased nearly on
// every admission) to days — and so do Used and Idle; a written log holds
// exactly one entry per unit of cost still in its window.
func TestSlidingLogMatchesModel(t *testing.T) {
	for _, p := range []Params{
		{Limit: 5, Window: time.Second},
		{Limit: 3, Window: time.Nanosecond},
		{Limit: 7, Window: 300 * time.Nanosecond},
		{Limit: 40, Window: 3 * time.Second},
		{Limit: 1000, Window: 2 * time.Hour},
		{Limit: 13, Window: 3 * 24 * time.Hour},
	} {
		l := mustNew(t, SlidingLog, p)
		w := logWidth(uint64(p.Window))
		for seed := uint64(1); seed <= 6; seed++ {
			m := &logModel{p: p}
			var state []byte
			for i, r := range workload(seed, 3000, p.Window, p.Limit+1, p.Window/2) {
				if u, want := l.Used(state, r.at), m.used(r.at); u != want {
					t.Fatalf("%+v seed %d request %d: Used %d, model %d", p, seed, i, u, want)
				}
				out, d := decide(t, l, state, r.at, r.cost)
				if want := m.decide(r.at, r.cost); d != want {
					t.Fatalf("%+v seed %d request %d (%+v): %+v, model %+v", p, seed, i, r, d, want)
				}
				if d.Allowed && int64(len(out)) != int64(logHeaderSize)+m.units()*int64(w) {
					t.Fatalf("%+v seed %d request %d: %d bytes for %d units of %d bytes", p, seed, i, len(out), m.units(), w)
				}
				state = out
				for _, at := range []int64{r.at, r.at + int64(p.Window)/2, r.at + int64(p.Window)} {
					idle := len(m.adm) == 0 || m.used(at) == 0 && at >= m.adm[len(m.adm)-1].at
					if l.Idle(state, at) != idle {
						t.Fatalf("%+v seed %d request %d: Idle at +%d = %v, model %v", p, seed, i, at-r.at, !idle, idle)
					}
				}
			}
		}
	}
}

// legacyState encodes admissions the way the version-1 format did: the
// entries in the window ending at the newest, one per instant with the
// cost admitted then.
func legacyState(adm []admission, window time.Duration) []byte {
	if len(adm) == 0 {
		return nil
	}
	newest := adm[len(adm)-1].at
	b := appendHeader(nil, SlidingLog)
	prev := int64(-1)
	for i := 0; i < len(adm); {
		t, count := adm[i].at, uint64(0)
		for ; i < len(adm) && adm[i].at == t; i++ {
			count += uint64(adm[i].cost)
		}
		if t > newest-int64(window) {
			b = appendEntry(b, prev, t, count)
			prev = t
		}
	}
	return b
}

// A log written by an earlier sluice (version 1) decides, measures and is
// idle exactly like the log this one writes for the same admissions, also
// when dst is the state's own buffer; a denial leaves it as it was, an
// admission writes the current format.
func TestSlidingLogReadsVersion1(t *testing.T) {
	for _, p := range []Params{{Limit: 5, Window: time.Second}, {Limit: 30, Window: time.Hour}} {
		l := mustNew(t, SlidingLog, p)
		for seed := uint64(1); seed <= 4; seed++ {
			m := &logModel{p: p}
			var state []byte
			converted := 0
			for i, r := range workload(seed, 1500, p.Window, p.Limit+1, p.Window/3) {
				old := legacyState(m.adm, p.Window)
				for _, at := range []int64{r.at, r.at + int64(p.Window)/2} {
					if l.Used(old, at) != l.Used(state, at) || l.Idle(old, at) != l.Idle(state, at) {
						t.Fatalf("%+v seed %d request %d: Used/Idle of version 1 %d/%v, current %d/%v", p, seed, i,
							l.Used(old, at), l.Idle(old, at), l.Used(state, at), l.Idle(state, at))
					}
				}
				if len(old) > l.MaxStateSize() {
					continue // not read: see slidinglog_legacy.go
				}
				_, want := decide(t, l, state, r.at, r.cost)
				for _, inPlace := range []bool{false, true} {
					buf := make([]byte, len(old), l.MaxStateSize())
					copy(buf, old)
					dst := make([]byte, 0, l.MaxStateSize())
					if inPlace {
						dst = buf[:0]
					}
					out, d, err := l.Decide(dst, buf, r.at, r.cost)
					if err != nil || d != want {
						t.Fatalf("%+v seed %d request %d in place %v: version 1 %+v %v, current %+v", p, seed, i, inPlace, d, err, want)
					}
					if !d.Allowed {
						if !bytes.Equal(out, old) {
							t.Fatalf("denial changed the version-1 state %x to %x", old, out)
						}
						continue
					}
					converted++
					if out[0] != logVersion {
						t.Fatalf("admission wrote version %d", out[0])
					}
					if u := l.Used(out, r.at); u != m.used(r.at)+r.cost {
						t.Fatalf("converted log: Used %d, want %d", u, m.used(r.at)+r.cost)
					}
				}
				state, _ = decide(t, l, state, r.at, r.cost)
				m.decide(r.at, r.cost)
			}
			if converted == 0 {
				t.Fatalf("%+v seed %d: no version-1 state was admitted", p, seed)
			}
		}
	}
	// A version-1 log longer than this limiter's MaxStateSize is corrupt:
	// 7 entries 140 ms apart take 5 bytes each after the first.
	l := mustNew(t, SlidingLog, Params{Limit: 7, Window: time.Second})
	var adm []admission
	for i := range int64(7) {
		adm = append(adm, admission{t0 + i*int64(140*ms), 1})
	}
	old := legacyState(adm, time.Second)
	if len(old) <= l.MaxStateSize() {
		t.Fatalf("%d bytes, not more than %d", len(old), l.MaxStateSize())
	}
	if _, _, err := l.Decide(nil, old, t0+int64(time.Second), 1); !isCorrupt(err) || l.Idle(old, t0+int64(time.Second)) || l.Used(old, t0+int64(time.Second)) != 0 {
		t.Fatalf("oversized version-1 log: err %v", err)
	}
}

// A log written under another window (another entry width) is read, and
// rewritten at this limiter's width on admission: a rule whose window
// changes keeps its counts, as long as they fit the new window.
func TestSlidingLogReadsOtherWidths(t *testing.T) {
	short := Params{Limit: 10, Window: time.Second}     // 4-byte entries
	long := Params{Limit: 10, Window: 10 * time.Minute} // 6-byte entries
	if logWidth(uint64(short.Window)) == logWidth(uint64(long.Window)) {
		t.Fatal("same width")
	}
	ls, ll := mustNew(t, SlidingLog, short), mustNew(t, SlidingLog, long)
	var ss, sl []byte
	for _, at := range []time.Duration{0, 100 * ms, 100 * ms, 400 * ms, 900 * ms, 950 * ms} {
		ss, _ = decide(t, ls, ss, t0+int64(at), 1)
		sl, _ = decide(t, ll, sl, t0+int64(at), 1)
	}
	for _, c := range []struct {
		name       string
		l          Limiter
		own, other []byte
	}{{"short reads long", ls, ss, sl}, {"long reads short", ll, sl, ss}} {
		for _, at := range []time.Duration{950 * ms, 999 * ms, time.Second, 1100 * ms, 1500 * ms, 2 * time.Second} {
			now := t0 + int64(at)
			for cost := int64(1); cost <= 6; cost++ {
				_, want := decide(t, c.l, c.own, now, cost)
				buf := append(make([]byte, 0, c.l.MaxStateSize()), c.other...)
				out, d, err := c.l.Decide(buf[:0], buf, now, cost) // in place
				if err != nil || d != want {
					t.Fatalf("%s at %v cost %d: %+v %v, want %+v", c.name, at, cost, d, err, want)
				}
				if d.Allowed && int(out[2]) != logWidth(uint64(c.l.Params().Window)) {
					t.Fatalf("%s: written at width %d", c.name, out[2])
				}
				if c.l.Used(c.other, now) != c.l.Used(c.own, now) || c.l.Idle(c.other, now) != c.l.Idle(c.own, now) {
					t.Fatalf("%s at %v: Used/Idle differ", c.name, at)
				}
			}
		}
	}
}

// outOfOrder is a log sluice never writes: its entries are not sorted.
// Only its ends are checked on reading.
func outOfOrder() []byte {
	b := append([]byte{logVersion, byte(SlidingLog), 4}, appendU64(nil, uint64(t0))...)
	for _, off := range []time.Duration{500 * ms, 100 * ms, 900 * ms, 200 * ms, 950 * ms} {
		b = binary.LittleEndian.AppendUint32(b, uint32(off))
	}
	return b
}

// A log whose entries are out of order gets decisions that are in range
// and consistent — Remaining within the limit, a denial exact (retrying at
// RetryAfter is admitted, 1 ns earlier is not), what it writes readable.
func TestSlidingLogOutOfOrder(t *testing.T) {
	l := mustNew(t, SlidingLog, Params{Limit: 5, Window: time.Second})
	state := outOfOrder()
	for at := 900 * ms; at <= 2100*ms; at += 50 * ms {
		for cost := int64(1); cost <= 6; cost++ {
			now := t0 + int64(at)
			out, d := decide(t, l, state, now, cost)
			checkDecision(t, l, state, out, now, cost, d)
			if d.Allowed {
				decide(t, l, out, now, 1)
			}
		}
	}
}

// Values that fit the version-2 layout but break an invariant are corrupt.
func TestSlidingLogInconsistentStates(t *testing.T) {
	l := mustNew(t, SlidingLog, Params{Limit: 5, Window: time.Second})
	good, _ := decide(t, l, nil, t0, 2)
	good, _ = decide(t, l, good, t0+int64(900*ms), 1)
	with := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for name, s := range map[string][]byte{
		"header only, short": good[:logHeaderSize-1],
		"width 0":            with(func(b []byte) []byte { b[2] = 0; return b }),
		"width 8":            with(func(b []byte) []byte { b[2] = 8; return append(b, 0, 0, 0, 0) }),
		"partial entry":      good[:len(good)-1],
		"above limit":        append(with(func(b []byte) []byte { b[2] = 1; return b[:logHeaderSize] }), 0, 0, 0, 0, 0, 1),
		"base too late":      with(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[3:], uint64(maxTime)+1); return b }),
		"newest too late":    with(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[3:], uint64(maxTime)-1); return b }),
		"wider than window":  with(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[len(b)-4:], uint32(time.Second)); return b }),
	} {
		if _, _, err := l.Decide(nil, s, t0, 1); !isCorrupt(err) || l.Idle(s, t0) || l.Used(s, t0) != 0 {
			t.Errorf("%s (%x): err %v", name, s, err)
		}
	}
}
