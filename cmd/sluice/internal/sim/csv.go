package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-proxy/sluice/algorithms"
)

// ErrCSV is wrapped by every error about a traffic file's content.
var ErrCSV = errors.New("bad traffic file")

// ReadCSV reads traffic from CSV lines of the form
//
//	timestamp,key[,cost[,actual[,duration]]]
//
// name is used in error messages and the description.
//
//   - timestamp is either absolute, in RFC 3339 ("2026-01-01T00:00:00.250Z"),
//     or an offset from the start: a number of seconds ("12", "12.25") or a Go
//     duration ("250ms", "1m30s"). All lines of one file use the same kind.
//     Offsets start at Epoch; absolute files start at their first timestamp,
//     rounded down to a whole second.
//   - key is any non-empty string (quote it if it contains a comma).
//   - cost is an integer >= 1, default 1: what the request reserves (for a
//     token budget, its estimate).
//   - actual, for a token budget (Options.Settle), is what the response
//     cost: an integer >= 0. Missing or empty, the response said nothing
//     (Usage.Actual NoUsage): the run settles it by its no_usage.
//   - duration is how long the request is in flight before it settles: a
//     number of seconds or a Go duration, >= 0; default 0, settled at once
//     (after its own decision).
//
// A file with an actual or a duration on any line has Traffic.Usage.
//
// Blank lines and lines starting with '#' are skipped, and so is a first line
// whose first field is "timestamp" (a header). Timestamps must not decrease:
// an out-of-order line is an error, not silently sorted, because the order of
// arrivals is what is being simulated (sort the file by time first). Errors
// name the line: `traffic.csv:7: cost "-2" must be an integer >= 1`. An
// empty file is an error.
func ReadCSV(r io.Reader, name string) (*Traffic, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.Comment = '#'
	cr.TrimLeadingSpace = true
	cr.ReuseRecord = true

	tr := &Traffic{}
	keys := map[string]int32{}
	var (
		absolute, seenAny bool
		prev              int64
		prevText          string
	)
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, fmt.Errorf("%w: %s:%d: %v", ErrCSV, name, pe.Line, pe.Err)
			}
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		fail := func(format string, args ...any) error {
			return fmt.Errorf("%w: %s:%d: %s", ErrCSV, name, line, fmt.Sprintf(format, args...))
		}
		for i := range rec {
			rec[i] = strings.TrimSpace(rec[i])
		}
		if !seenAny && strings.EqualFold(rec[0], "timestamp") {
			seenAny = true // a header line
			continue
		}
		if len(rec) < 2 || len(rec) > 5 {
			return nil, fail("%d fields, want timestamp,key[,cost[,actual[,duration]]]", len(rec))
		}
		at, isAbs, err := parseTimestamp(rec[0])
		if err != nil {
			return nil, fail("timestamp %q: %v", rec[0], err)
		}
		if len(tr.Requests) == 0 {
			absolute = isAbs
			if absolute {
				tr.Start = at - mod(at, int64(time.Second))
			} else {
				tr.Start = Epoch.UnixNano()
			}
		} else if isAbs != absolute {
			return nil, fail("timestamp %q mixes absolute times and offsets; use one kind per file", rec[0])
		}
		if !absolute {
			at += Epoch.UnixNano()
		}
		if len(tr.Requests) > 0 && at < prev {
			return nil, fail("timestamp %q is earlier than the previous line's %q; sort the file by time", rec[0], prevText)
		}
		if rec[1] == "" {
			return nil, fail("empty key")
		}
		cost := int64(1)
		if len(rec) >= 3 && rec[2] != "" {
			cost, err = strconv.ParseInt(rec[2], 10, 64)
			if err != nil || cost < 1 {
				return nil, fail("cost %q must be an integer >= 1", rec[2])
			}
		}
		k, ok := keys[rec[1]]
		if !ok {
			if len(tr.Keys) >= MaxKeys {
				return nil, fail("more than %d distinct keys", MaxKeys)
			}
			k = int32(len(tr.Keys))
			keys[rec[1]] = k
			tr.Keys = append(tr.Keys, rec[1])
		}
		if len(tr.Requests) >= MaxRequests {
			return nil, fail("more than %d requests; the simulator holds at most that many", MaxRequests)
		}
		u, err := usageFields(rec, fail)
		if err != nil {
			return nil, err
		}
		tr.addUsage(u)
		tr.Requests = append(tr.Requests, Request{At: at, Key: k, Cost: cost})
		seenAny = true
		prev, prevText = at, rec[0]
	}
	if len(tr.Requests) == 0 {
		return nil, fmt.Errorf("%w: %s: no requests (want lines of timestamp,key[,cost])", ErrCSV, name)
	}
	tr.End = tr.Requests[len(tr.Requests)-1].At + 1
	tr.Description = fmt.Sprintf("%s: %d requests from %d keys", name, len(tr.Requests), len(tr.Keys))
	return tr, nil
}

// usageFields reads a line's actual and duration fields, if any.
func usageFields(rec []string, fail func(format string, args ...any) error) (Usage, error) {
	u := Usage{Actual: NoUsage}
	if len(rec) >= 4 && rec[3] != "" {
		var err error
		u.Actual, err = strconv.ParseInt(rec[3], 10, 64)
		if err != nil || u.Actual < 0 || u.Actual > algorithms.MaxSettle {
			return u, fail("actual %q must be an integer from 0 to %d", rec[3], int64(algorithms.MaxSettle))
		}
	}
	if len(rec) == 5 && rec[4] != "" {
		d, isAbs, err := parseTimestamp(rec[4])
		if err != nil || isAbs {
			return u, fail("duration %q must be seconds (\"1.5\") or a duration (\"250ms\"), >= 0", rec[4])
		}
		u.In = d
	}
	return u, nil
}

// addUsage records the usage of the request about to be appended: the
// first usage given makes Usage, every earlier request without one.
func (tr *Traffic) addUsage(u Usage) {
	if u != (Usage{Actual: NoUsage}) && tr.Usage == nil {
		tr.Usage = make([]Usage, len(tr.Requests), cap(tr.Requests))
		for i := range tr.Usage {
			tr.Usage[i].Actual = NoUsage
		}
	}
	if tr.Usage != nil {
		tr.Usage = append(tr.Usage, u)
	}
}

// maxOffset keeps offsets well inside int64 nanoseconds after Epoch.
const maxOffset = 100 * 365 * 24 * time.Hour

// parseTimestamp returns Unix nanoseconds (absolute) or an offset in
// nanoseconds (relative).
func parseTimestamp(s string) (ns int64, absolute bool, err error) {
	if s == "" {
		return 0, false, errors.New("empty")
	}
	if strings.ContainsAny(s, "T") && strings.Contains(s, "-") {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, true, errors.New("not an RFC 3339 time (2026-01-01T00:00:00Z)")
		}
		if t.Year() < 1970 || t.Year() > 2200 {
			return 0, true, errors.New("year out of range 1970..2200")
		}
		return t.UnixNano(), true, nil
	}
	var d time.Duration
	if f, ferr := strconv.ParseFloat(s, 64); ferr == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || f > maxOffset.Seconds() {
			return 0, false, errors.New("offset out of range")
		}
		d = time.Duration(math.Round(f * 1e9))
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, false, errors.New("not an RFC 3339 time, a number of seconds or a duration like 250ms")
	}
	if d < 0 {
		return 0, false, errors.New("negative offset")
	}
	if d > maxOffset {
		return 0, false, errors.New("offset out of range")
	}
	return int64(d), false, nil
}

// mod is the non-negative remainder of a/b (b > 0).
func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}
