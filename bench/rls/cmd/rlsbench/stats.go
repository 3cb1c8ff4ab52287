package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted, or 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted)) + 0.999999999)
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// spread is the median and range of one figure over the rounds.
type spread struct{ med, lo, hi float64 }

func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{med, s[0], s[len(s)-1]}
}

// format prints the median and the range with the given verb: "1.23 (1.10–1.31)".
func (s spread) format(verb string) string {
	return fmt.Sprintf(verb+" ("+verb+"–"+verb+")", s.med, s.lo, s.hi)
}

// redisCPU parses the used_cpu_sys and used_cpu_user lines of INFO cpu and
// returns their sum in seconds.
func redisCPU(info string) (float64, error) {
	var sum float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu %s: %w", k, err)
		}
		sum += f
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu: used_cpu_sys and used_cpu_user not found in %q", info)
	}
	return sum, nil
}

// procCPU parses /proc/PID/stat and returns utime+stime in clock ticks. The
// command name (field 2) is in parentheses and may hold spaces, so fields
// are counted after the last ')'.
func procCPU(stat string) (int64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no ')' in %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// After the name: state is field 3, utime field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the name", len(f))
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat utime: %w", err)
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat stime: %w", err)
	}
	return u + s, nil
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  int64
}

// commandStats parses INFO commandstats ("cmdstat_NAME:calls=N,usec=N,...")
// and adds each command's calls and usec to into.
func commandStats(info string, into map[string]cmdStat) error {
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			var dst *int64
			switch k {
			case "calls":
				dst = &st.calls
			case "usec":
				dst = &st.usec
			default:
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("INFO commandstats %s: %w", line, err)
			}
			*dst = n
		}
		c := into[strings.TrimPrefix(name, "cmdstat_")]
		c.calls += st.calls
		c.usec += st.usec
		into[strings.TrimPrefix(name, "cmdstat_")] = c
	}
	return nil
}

// ioStats parses total_reads_processed and total_writes_processed of INFO
// stats: the read and write calls Redis's event loop made on client
// sockets (a pipelined client's many commands can come in one read).
func ioStats(info string) (reads, writes int64, err error) {
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "total_reads_processed" && k != "total_writes_processed") {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("INFO stats %s: %w", k, err)
		}
		if k == "total_reads_processed" {
			reads = n
		} else {
			writes = n
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("INFO stats: total_reads_processed and total_writes_processed not found")
	}
	return reads, writes, nil
}

// commandTime is the time Redis spent executing the service's commands (INFO
// commandstats usec, wall time inside the command): the scripts' EVALSHA
// and EVAL, whose usec includes the commands they call (which commandstats
// also lists on their own), or else every command.
func commandTime(cmds map[string]cmdStat) (usec int64) {
	for _, n := range []string{"evalsha", "eval"} {
		usec += cmds[n].usec
	}
	if usec > 0 {
		return usec
	}
	for _, st := range cmds {
		usec += st.usec
	}
	return usec
}
