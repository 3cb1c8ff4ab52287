// Package sim replays traffic through the rate-limiting algorithms of sluice
// in virtual time and reports what each one admitted.
//
// Nothing here sleeps or reads a clock: a request's time is a number (Unix
// nanoseconds) handed to algorithms.Limiter.Decide, so a day of traffic runs
// in a fraction of a second and every run is reproducible. Traffic comes
// from built-in patterns (Generate) or a CSV file (ReadCSV); Run feeds it
// through one limiter, keeping each key's encoded state exactly as the filter
// would; WriteReport renders results as one self-contained HTML page.
package sim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/cmd/sluice/internal/svgchart"
)

// Epoch is where generated traffic starts, and time zero of a CSV file that
// uses offsets. It is a multiple of every window up to a day, so window
// boundaries of fixed_window fall on round offsets from the start.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// MaxRequests bounds the size of one traffic (about 24 bytes a request).
const MaxRequests = 10_000_000

// MaxKeys bounds the number of distinct keys of one traffic.
const MaxKeys = 1_000_000

// Request is one offered request.
type Request struct {
	// At is the arrival time in Unix nanoseconds.
	At int64
	// Key indexes Traffic.Keys.
	Key int32
	// Cost is the number of units the request consumes (>= 1).
	Cost int64
}

// Usage is what a request of a token budget cost when its response ended,
// and when that was.
type Usage struct {
	// Actual is the response's cost in units (>= 0), or NoUsage: the
	// response said nothing (settled by the rule's no_usage).
	Actual int64
	// In is how long the request is in flight (ns): it settles at
	// Request.At + In.
	In int64
}

// NoUsage is Usage.Actual of a response that gave no cost.
const NoUsage = -1

// Traffic is a sequence of requests sorted by time.
type Traffic struct {
	// Description says where the traffic came from, for the report.
	Description string
	// Start and End bound the simulated span [Start, End) in Unix
	// nanoseconds; every request lies inside it.
	Start, End int64
	// Keys are the distinct keys, indexed by Request.Key.
	Keys []string
	// Requests in non-decreasing At order.
	Requests []Request
	// Usage, when not nil, is each request's usage (Usage[i] of
	// Requests[i]): a CSV with actual or duration columns. Nil: every
	// response says nothing and ends at once.
	Usage []Usage
}

// usage is request i's usage.
func (t *Traffic) usage(i int) Usage {
	if t.Usage == nil {
		return Usage{Actual: NoUsage}
	}
	return t.Usage[i]
}

// The names of the built-in patterns.
const (
	Steady        = "steady"
	BoundaryBurst = "boundary-burst"
	Poisson       = "poisson"
	IdleBurst     = "idle-burst"
	Flood         = "flood"
)

// PatternNames lists the built-in patterns.
var PatternNames = []string{Steady, BoundaryBurst, Poisson, IdleBurst, Flood}

// Pattern describes generated traffic. Every key gets the same pattern
// (Poisson: an independent stream per key); requests are merged in time
// order.
//
//   - steady: one request every 1/Rate seconds.
//   - boundary-burst: around every boundary b of Window (a multiple of
//     Window since the Unix epoch, as fixed_window aligns them), Burst
//     requests evenly spaced in [b−Spread, b) and Burst more in [b, b+Spread).
//   - poisson: arrivals with exponential gaps of mean 1/Rate seconds, from a
//     generator seeded with Seed (the same Seed gives the same traffic).
//   - idle-burst: silence for Idle, then Burst requests evenly spaced over
//     Spread, repeated until Duration.
//   - flood: a key flood: Attackers keys sending AttackerRequests
//     each, Innocents clients sending InnocentRequests each and Heavy keys
//     sending HeavyRequests each, all in one random order (seeded with Seed)
//     spread evenly over Duration. Keys are named "attacker-N",
//     "innocent-N" and "heavy-N" (Run reports each class; Keys is unused).
type Pattern struct {
	Name     string
	Duration time.Duration
	// Rate is requests per second per key (steady, poisson).
	Rate float64
	// Burst is the number of requests on each side of a boundary
	// (boundary-burst) or in each burst (idle-burst).
	Burst int
	// Spread is how long one side of a burst lasts.
	Spread time.Duration
	// Idle is the quiet time before each burst (idle-burst).
	Idle time.Duration
	// Window is the period whose boundaries boundary-burst targets.
	Window time.Duration
	// Keys is the number of clients, named "client-1", "client-2", ...
	Keys int
	// Seed seeds the Poisson generator.
	Seed uint64
	// Cost of every request.
	Cost int64
	// The flood's classes: how many keys, and requests per key.
	Attackers, AttackerRequests int
	Innocents, InnocentRequests int
	Heavy, HeavyRequests        int
}

// DefaultPattern returns the pattern name with parameters chosen to show a
// rule of limit per window at work: ten windows of traffic at twice the
// limit (steady), 1.2 times the limit (poisson), limit requests on each side
// of every boundary within a twentieth of a window, or twice the limit after
// three idle windows. It does not check its arguments; Generate does.
func DefaultPattern(name string, limit int64, window time.Duration) Pattern {
	p := Pattern{Name: name, Duration: 10 * window, Window: window, Keys: 1, Seed: 1, Cost: 1,
		Spread: window / 20, Idle: 3 * window}
	perSecond := float64(limit) / window.Seconds()
	switch name {
	case Steady:
		p.Rate = 2 * perSecond
	case Poisson:
		p.Rate = 1.2 * perSecond
	case BoundaryBurst:
		p.Burst = int(min(limit, math.MaxInt32))
	case IdleBurst:
		p.Burst = int(min(2*limit, math.MaxInt32))
	case Flood:
		// The flood: innocents at half their limit, heavy
		// hitters at ten times it, in a tenth of a window (so the buckets
		// refill a tenth of their limit meanwhile).
		p.Duration = max(window/10, 1)
		p.Attackers, p.AttackerRequests = 20_000, 1
		p.Innocents, p.InnocentRequests = 100, int(max(1, min(limit/2, 10_000)))
		p.Heavy, p.HeavyRequests = 5, int(min(10*limit, 100_000))
	}
	if p.Spread <= 0 {
		p.Spread = 1
	}
	return p
}

// String describes the pattern with its parameters.
func (p Pattern) String() string {
	var b strings.Builder
	d := func(d time.Duration) string { return svgchart.FormatDuration(d.Seconds()) }
	fmt.Fprintf(&b, "%s for %s", p.Name, d(p.Duration))
	switch p.Name {
	case Steady, Poisson:
		fmt.Fprintf(&b, ", %g requests/s", p.Rate)
		if p.Name == Poisson {
			fmt.Fprintf(&b, ", seed %d", p.Seed)
		}
	case BoundaryBurst:
		fmt.Fprintf(&b, ", %d requests in the %s before and %d in the %s after every %s boundary", p.Burst, d(p.Spread), p.Burst, d(p.Spread), d(p.Window))
	case IdleBurst:
		fmt.Fprintf(&b, ", idle %s then %d requests in %s, repeated", d(p.Idle), p.Burst, d(p.Spread))
	case Flood:
		fmt.Fprintf(&b, ", %d attacker keys × %d, %d innocent × %d, %d heavy × %d requests in random order (seed %d)",
			p.Attackers, p.AttackerRequests, p.Innocents, p.InnocentRequests, p.Heavy, p.HeavyRequests, p.Seed)
	}
	if p.Keys > 1 && p.Name != Flood {
		fmt.Fprintf(&b, ", per key, %d keys", p.Keys)
	}
	if p.Cost != 1 {
		fmt.Fprintf(&b, ", cost %d", p.Cost)
	}
	return b.String()
}

// ErrPattern is wrapped by every error about a pattern's parameters.
var ErrPattern = errors.New("bad traffic pattern")

// Generate produces the traffic of p, starting at Epoch.
func Generate(p Pattern) (*Traffic, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	start := Epoch.UnixNano()
	end := start + int64(p.Duration)
	tr := &Traffic{Description: p.String(), Start: start, End: end}
	if p.Name == Flood {
		tr.Keys, tr.Requests = p.flood(start)
	} else {
		tr.Keys, tr.Requests = p.requests(p.arrivals(start, end), start, end)
	}
	if len(tr.Requests) > MaxRequests {
		return nil, p.errorf("offers %d requests; the simulator holds at most %d", len(tr.Requests), MaxRequests)
	}
	if p.Keys > 1 && p.Name != Flood {
		slices.SortStableFunc(tr.Requests, func(a, b Request) int { return cmp.Compare(a.At, b.At) })
	}
	if len(tr.Requests) == 0 {
		return nil, p.errorf("offers no request in %s (is the duration shorter than one window or idle period?)", p.Duration)
	}
	return tr, nil
}

// errorf is an error about the parameters of p, wrapping ErrPattern.
func (p Pattern) errorf(format string, args ...any) error {
	return fmt.Errorf("%w %s: %s", ErrPattern, p.Name, fmt.Sprintf(format, args...))
}

// check refuses an unknown pattern, parameters out of range, and a pattern
// too big to hold, before anything is allocated for it.
func (p Pattern) check() error {
	if !slices.Contains(PatternNames, p.Name) {
		return fmt.Errorf("%w: unknown pattern %q (want one of %s)", ErrPattern, p.Name, strings.Join(PatternNames, ", "))
	}
	if p.Duration <= 0 {
		return p.errorf("duration %s must be positive", p.Duration)
	}
	if p.Name == Flood {
		return p.checkFlood()
	}
	if p.Keys < 1 || p.Keys > MaxKeys {
		return p.errorf("keys %d must be between 1 and %d", p.Keys, MaxKeys)
	}
	if p.Cost < 1 {
		return p.errorf("cost %d must be at least 1", p.Cost)
	}
	perKey, err := p.perKey()
	if err != nil {
		return err
	}
	if total := perKey * float64(p.Keys); total > MaxRequests*1.1 {
		return p.errorf("would offer about %.0f requests; the simulator holds at most %d (lower the rate, duration or keys)", total, MaxRequests)
	}
	return nil
}

// perKey checks the parameters the pattern's shape uses and returns about
// how many requests it offers per key.
func (p Pattern) perKey() (float64, error) {
	switch p.Name {
	case Steady, Poisson:
		if !(p.Rate > 0) || math.IsInf(p.Rate, 0) {
			return 0, p.errorf("rate %g must be a positive number of requests per second", p.Rate)
		}
		return p.Rate * p.Duration.Seconds(), nil
	case BoundaryBurst, IdleBurst:
		if p.Burst < 1 {
			return 0, p.errorf("burst %d must be at least 1", p.Burst)
		}
		if p.Spread <= 0 {
			return 0, p.errorf("spread %s must be positive", p.Spread)
		}
		if p.Name == BoundaryBurst {
			if p.Window <= 0 {
				return 0, p.errorf("window %s must be positive", p.Window)
			}
			return 2 * float64(p.Burst) * (float64(p.Duration)/float64(p.Window) + 1), nil
		}
		if p.Idle <= 0 {
			return 0, p.errorf("idle %s must be positive", p.Idle)
		}
		return float64(p.Burst) * (float64(p.Duration)/float64(p.Idle+p.Spread) + 1), nil
	}
	return 0, nil
}

// arrivals returns one key's arrival times in [start, end) for the patterns
// every key shares (nil for poisson, where each key draws its own).
func (p Pattern) arrivals(start, end int64) []int64 {
	var times []int64
	switch p.Name {
	case Steady:
		gap := 1e9 / p.Rate
		for i := 0; ; i++ {
			t := start + int64(float64(i)*gap)
			if t >= end {
				break
			}
			times = append(times, t)
		}
	case BoundaryBurst:
		w, s := int64(p.Window), int64(p.Spread)
		for b := (start/w + 1) * w; b < end; b += w {
			if b-s < start || b+s > end {
				continue
			}
			for i := range int64(p.Burst) {
				times = append(times, b-s+i*s/int64(p.Burst))
			}
			for i := range int64(p.Burst) {
				times = append(times, b+i*s/int64(p.Burst))
			}
		}
	case IdleBurst:
		s := int64(p.Spread)
		for t0 := start + int64(p.Idle); t0 < end; t0 += int64(p.Idle) + s {
			for i := range int64(p.Burst) {
				if t := t0 + i*s/int64(p.Burst); t < end {
					times = append(times, t)
				}
			}
		}
	}
	return times
}

// requests names the keys and gives each its requests, key after key: at
// times, or for poisson at arrivals drawn from the key's own generator.
func (p Pattern) requests(times []int64, start, end int64) (keys []string, reqs []Request) {
	for k := range p.Keys {
		keys = append(keys, fmt.Sprintf("client-%d", k+1))
		if p.Name == Poisson {
			rng := rand.New(rand.NewPCG(p.Seed, uint64(k)))
			t := float64(start)
			for {
				t += rng.ExpFloat64() / p.Rate * 1e9
				if t >= float64(end) {
					break
				}
				reqs = append(reqs, Request{At: int64(t), Key: int32(k), Cost: p.Cost})
			}
			continue
		}
		for _, t := range times {
			reqs = append(reqs, Request{At: t, Key: int32(k), Cost: p.Cost})
		}
	}
	return keys, reqs
}

// The key classes of the flood pattern, by key-name prefix.
var ClassPrefixes = []string{"attacker-", "innocent-", "heavy-"}

// checkFlood checks the flood's parameters.
func (p Pattern) checkFlood() error {
	if p.Duration <= 0 {
		return p.errorf("duration %s must be positive", p.Duration)
	}
	if p.Cost < 1 {
		return p.errorf("cost %d must be at least 1", p.Cost)
	}
	keys, total := 0, 0
	for _, c := range [][2]int{{p.Attackers, p.AttackerRequests}, {p.Innocents, p.InnocentRequests}, {p.Heavy, p.HeavyRequests}} {
		if c[0] < 0 || c[1] < 0 || c[0] > MaxKeys || c[1] > MaxRequests {
			return p.errorf("%d keys × %d requests out of range", c[0], c[1])
		}
		if c[1] > 0 {
			keys += c[0]
			total += c[0] * c[1]
		}
	}
	switch {
	case keys > MaxKeys:
		return p.errorf("%d keys; the simulator holds at most %d", keys, MaxKeys)
	case total > MaxRequests:
		return p.errorf("would offer %d requests; the simulator holds at most %d", total, MaxRequests)
	}
	return nil
}

// flood returns the flood's keys and requests: every request of every key
// in one seeded random order, the i-th of n at start + i × Duration / n.
func (p Pattern) flood(start int64) (keys []string, reqs []Request) {
	for ci, c := range [][2]int{{p.Attackers, p.AttackerRequests}, {p.Innocents, p.InnocentRequests}, {p.Heavy, p.HeavyRequests}} {
		if c[1] == 0 {
			continue
		}
		for k := range c[0] {
			id := int32(len(keys))
			keys = append(keys, ClassPrefixes[ci]+strconv.Itoa(k+1))
			for range c[1] {
				reqs = append(reqs, Request{Key: id, Cost: p.Cost})
			}
		}
	}
	rng := rand.New(rand.NewPCG(p.Seed, 15))
	rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	n := uint64(len(reqs))
	for i := range reqs {
		hi, lo := bits.Mul64(uint64(i), uint64(p.Duration))
		q, _ := bits.Div64(hi, lo, n) // i < n: the quotient is below Duration
		reqs[i].At = start + int64(q)
	}
	return keys, reqs
}
