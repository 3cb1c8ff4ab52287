#!/usr/bin/env bash
# Where one request's CPU goes, guest instructions included, without a function listener:
# BenchmarkCycle runs in process (host.Exchange, one worker) with wazero built with its
# perfmap tag, which writes /tmp/perf-PID.map with the address range of every compiled
# guest function (per basic block); Linux perf samples the process (cpu-clock: a software
# event, so it works in VMs without a PMU) and the samples are summed per function and per
# side: WASM (the guest's compiled code, named as in the module), HOST (package host),
# WAZERO (its entry and exit trampolines), GO (the Go runtime: allocation, GC, maps,
# scheduling) and KERNEL.
#
#   ./bench/guest-perf.sh                      # sluice/allow/headers-both/1000-keys
#   BENCH='^sluice$/^allow$/^headers-none$' TOP=40 SECONDS_=10 ./bench/guest-perf.sh
#   SLUICE_BENCH_WASM=/tmp/x.wasm ./bench/guest-perf.sh   # a module built elsewhere
#
# GOMAXPROCS is 1 by default (PROCS to change), so the request runs on one thread and the
# figures are not mixed with the scheduler's hand-offs between two. Needs perf; Linux only.
set -euo pipefail
cd "$(dirname "$0")/.."

BENCH="${BENCH:-^sluice\$/^allow\$/^headers-both\$/^1000-keys\$}"
TOP="${TOP:-50}"
SECS="${SECONDS_:-10}"
PROCS="${PROCS:-1}"
command -v perf >/dev/null || { echo "guest-perf.sh: perf is not installed" >&2; exit 1; }

dir="$(mktemp -d)"
trap 'rm -rf "$dir"; [ -n "${pid:-}" ] && { kill "$pid" 2>/dev/null; rm -f "/tmp/perf-$pid.map"; }; true' EXIT
go test -tags perfmap -c -o "$dir/cycle.test" ./bench/cycle
# Enough iterations to outlast warm-up and the sampling; killed once sampled.
(cd bench/cycle && GOMAXPROCS="$PROCS" exec "$dir/cycle.test" -test.run '^$' -test.bench "^BenchmarkCycle\$/$BENCH" \
	-test.benchtime 100000000x >"$dir/bench.txt" 2>&1) &
pid=$!
# The map is written when the module has been compiled; then let the first run pass.
for _ in $(seq 1 600); do
	[ -s "/tmp/perf-$pid.map" ] && break
	sleep 0.1
done
[ -s "/tmp/perf-$pid.map" ] || { echo "guest-perf.sh: no /tmp/perf-$pid.map (is the benchmark running?)" >&2; cat "$dir/bench.txt" >&2; exit 1; }
# Every compiled module adds to the map, and the benchmark compiles the module twice (its
# b.N=1 run, then the measured one): sample once the map has grown a second time (or not for
# 20 s: both compiles were quick) and stopped growing.
alive() { # fails, with the benchmark's output, once it has exited
	kill -0 "$pid" 2>/dev/null && return 0
	echo "guest-perf.sh: the benchmark exited before it was sampled:" >&2
	cat "$dir/bench.txt" >&2
	exit 1
}
stable() { # waits until the map has not grown for 2 s; prints its size
	local last=-1 still=0 size
	while [ "$still" -lt 4 ]; do
		alive
		size=$(stat -c %s "/tmp/perf-$pid.map")
		if [ "$size" = "$last" ]; then still=$((still + 1)); else still=0 last=$size; fi
		sleep 0.5
	done
	echo "$last"
}
first=$(stable) && [ -n "$first" ] || exit 1
for _ in $(seq 1 40); do
	alive
	[ "$(stat -c %s "/tmp/perf-$pid.map")" -gt "$first" ] && break
	sleep 0.5
done
stable >/dev/null
perf record -q -e cpu-clock -F 5000 -p "$pid" -o "$dir/perf.data" -- sleep "$SECS" >/dev/null 2>&1
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
perf report -i "$dir/perf.data" --stdio --sort sym 2>/dev/null >"$dir/report.txt" # reads the map
rm -f "/tmp/perf-$pid.map"
awk -v top="$TOP" '
	/^ +[0-9.]+%/ {
		pct = $1; sub(/%/, "", pct)
		kind = $2; $1 = ""; $2 = ""; sym = substr($0, 3)
		if (match(sym, /^\[[0-9]+\/[0-9]+\]\./)) {
			sym = substr(sym, RLENGTH + 1); sub(/:::::L[0-9]+$/, "", sym)
			gsub(/github\.com_sluice_proxy_sluice_/, "", sym); side = "WASM"
		} else if (kind == "[k]") { side = "KERNEL"; sym = "(kernel)" }
		else if (sym ~ /wazero|^trampoline/) side = "WAZERO"
		else if (sym ~ /sluice\/host\./) side = "HOST"
		else side = "GO"
		f[side " " sym] += pct; s[side] += pct
	}
	END {
		printf "share of the process CPU by side:"
		for (k in s) printf " %s %.1f%%", k, s[k]
		printf "\n\n"
		n = 0
		for (k in f) line[n++] = sprintf("%7.2f%%  %s", f[k], k)
		cmd = "sort -rn | head -" top
		for (i = 0; i < n; i++) print line[i] | cmd
		close(cmd)
	}' "$dir/report.txt"
