package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// parseRSS returns VmRSS in KiB from /proc/PID/status.
func parseRSS(status string) (int, error) {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, errors.New("/proc status: no VmRSS")
}

// workerStatFilter selects the per-worker connection counters in /stats.
const workerStatFilter = `worker_[0-9]+\.downstream_cx_total`

// workerConnections are the connections each worker accepted on the listener bound to
// 127.0.0.1:port, from its listener.127.0.0.1_PORT.worker_N.downstream_cx_total counters.
func workerConnections(stats map[string]int64, port int) map[int]int64 {
	prefix := "listener.127.0.0.1_" + strconv.Itoa(port) + ".worker_"
	m := map[int]int64{}
	for n, v := range stats {
		rest, ok := strings.CutPrefix(n, prefix)
		if !ok {
			continue
		}
		w, ok := strings.CutSuffix(rest, ".downstream_cx_total")
		if !ok {
			continue
		}
		if i, err := strconv.Atoi(w); err == nil {
			m[i] = v
		}
	}
	return m
}

// memSplit is where a process's resident memory is, from /proc/PID/smaps: file-backed
// pages (Envoy's binary and libraries, V8's compilers among them), anonymous executable
// pages (V8's compiled Wasm code) and the other anonymous pages (the C++ heap, V8's heaps,
// the Wasm linear memories, stacks), in MB.
type memSplit struct {
	fileMB, execMB, anonMB float64
}

// parseSmaps sums the Rss lines of /proc/PID/smaps by the kind of their mapping.
func parseSmaps(s string) (memSplit, error) {
	var sp memSplit
	kind, seen := 0, false // 0 file, 1 anonymous executable, 2 other anonymous
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && len(f[1]) == 4 {
			// A mapping's header: range perms offset dev inode [path].
			switch {
			case len(f) >= 6 && strings.HasPrefix(f[5], "/"):
				kind = 0
			case f[1][2] == 'x':
				kind = 1
			default:
				kind = 2
			}
			seen = true
			continue
		}
		if len(f) == 3 && f[0] == "Rss:" && seen {
			kb, err := strconv.Atoi(f[1])
			if err != nil {
				return sp, fmt.Errorf("smaps: %q: %w", line, err)
			}
			mb := float64(kb) / 1024
			switch kind {
			case 0:
				sp.fileMB += mb
			case 1:
				sp.execMB += mb
			default:
				sp.anonMB += mb
			}
		}
	}
	if !seen {
		return sp, errors.New("smaps: no mapping")
	}
	return sp, nil
}
