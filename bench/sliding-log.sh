#!/bin/sh
# sliding-log.sh: sliding_log with a full log against token_bucket, as
# ratios measured in one run. Each round runs both algorithms back to back
# (BenchmarkFullLog natively: limit 1000/s, 1000 entries; with WASM=1 also
# BenchmarkFullCycleSlidingLog, full request cycles through the compiled
# module in wazero, process CPU per request); the ratio is taken per round
# and the median and range over ROUNDS rounds (default 5) are printed.
#
#	bench/sliding-log.sh            # native only
#	ROUNDS=7 WASM=1 bench/sliding-log.sh
set -eu
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/algorithms.test" ./algorithms
if [ "${WASM:-0}" = 1 ]; then go test -c -o "$tmp/integration.test" ./e2e/integration; fi

# run BINARY DIR BENCH FIELD ROUND: "round case value" lines (FIELD: the
# column holding the figure, 3 = ns/op, 5 = cpu-ns/op)
run() {
	(cd "$2" && "$1" -test.run '^$' -test.bench "$3" -test.count 1 $6) |
		awk -v r="$5" -v f="$4" '/^Benchmark/ { n = $1; sub(/^Benchmark[^\/]*\//, "", n); sub(/-[0-9]+$/, "", n); print r, n, $f }'
}
for r in $(seq "$rounds"); do
	run "$tmp/algorithms.test" algorithms 'FullLog$' 3 "$r" ""
	if [ "${WASM:-0}" = 1 ]; then
		run "$tmp/integration.test" e2e/integration 'FullCycleSlidingLog$' 5 "$r" "-test.benchtime 3000x" | sed 's/ \([a-z_]*\)\// wasm-\1\//'
	fi
done >"$tmp/raw"

awk '
function srt(a, m,   i, j, t) { for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t } }
function med(a, m) { return (m % 2) ? a[(m+1)/2] : (a[m/2] + a[m/2+1]) / 2 }
{ v[$1 " " $2] = $3; if ($1 > n) n = $1 }
END {
	pairs = "sliding_log/admitted token_bucket/admitted ns;sliding_log/denied token_bucket/denied ns;" \
		"wasm-sliding_log/allow-1000 wasm-token_bucket/allow cpu-ns;wasm-sliding_log/deny-full-1000 wasm-token_bucket/deny cpu-ns"
	np = split(pairs, ps, ";")
	for (p = 1; p <= np; p++) {
		split(ps[p], c, " ")
		if (!((1 " " c[1]) in v)) continue
		for (r = 1; r <= n; r++) { x[r] = v[r " " c[1]] / v[r " " c[2]]; s[r] = v[r " " c[1]]; t[r] = v[r " " c[2]] }
		srt(x, n); srt(s, n); srt(t, n)
		printf "%-31s / %-25s %6.2fx (%.2f-%.2f); medians %.0f and %.0f %s/op\n", c[1], c[2], med(x, n), x[1], x[n], med(s, n), med(t, n), c[3]
	}
	printf "ratios sliding_log / token_bucket per round; medians of %d rounds\n", n
}' "$tmp/raw"
