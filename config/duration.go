package config

import (
	"strconv"
	"time"
)

// durationUnits are the units of a configuration duration, longest first.
// A duration is one or more <digits><unit> groups with strictly decreasing
// units: "500ms", "1s", "1m30s", "1h", "1d", "1d12h".
var durationUnits = [...]struct {
	name string
	d    time.Duration
}{
	{"d", 24 * time.Hour},
	{"h", time.Hour},
	{"ms", time.Millisecond}, // before "m" so "ms" is not read as "m" + "s"
	{"m", time.Minute},
	{"s", time.Second},
}

// unitRank orders units from longest (0) to shortest (4).
func unitRank(d time.Duration) int {
	switch d {
	case 24 * time.Hour:
		return 0
	case time.Hour:
		return 1
	case time.Minute:
		return 2
	case time.Second:
		return 3
	}
	return 4
}

// ParseDuration parses a configuration duration: one or more groups of
// decimal digits followed by a unit (d, h, m, s, ms), each unit at most once
// and from the longest to the shortest ("1m30s", not "30s1m"). There is no
// sign, no fraction and no space. It reports false for anything else and on
// overflow. Zero ("0s") parses; callers decide whether it is allowed.
func ParseDuration(s string) (time.Duration, bool) {
	if s == "" {
		return 0, false
	}
	var total time.Duration
	last := -1
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i || j-i > 18 {
			return 0, false
		}
		n, err := strconv.ParseInt(s[i:j], 10, 64)
		if err != nil {
			return 0, false
		}
		unit := time.Duration(0)
		for _, u := range durationUnits {
			if len(s)-j >= len(u.name) && s[j:j+len(u.name)] == u.name {
				unit = u.d
				j += len(u.name)
				break
			}
		}
		if unit == 0 {
			return 0, false
		}
		r := unitRank(unit)
		if r <= last {
			return 0, false
		}
		last = r
		if n > int64((1<<63-1-total)/unit) {
			return 0, false
		}
		total += time.Duration(n) * unit
		i = j
	}
	return total, true
}

// FormatDuration formats d in the syntax ParseDuration reads ("1m30s",
// "500ms", "1d"). A duration that is not a positive whole number of
// milliseconds falls back to time.Duration.String.
func FormatDuration(d time.Duration) string {
	if d <= 0 || d%time.Millisecond != 0 {
		return d.String()
	}
	var b []byte
	for _, u := range [...]struct {
		name string
		d    time.Duration
	}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}} {
		if n := d / u.d; n > 0 {
			b = strconv.AppendInt(b, int64(n), 10)
			b = append(b, u.name...)
			d -= n * u.d
		}
	}
	return string(b)
}
