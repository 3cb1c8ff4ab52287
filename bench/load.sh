#!/usr/bin/env bash
# Load test of sluice run on this machine (loopback only, bounded): throughput and latency
# with the filter vs. the same host without it, plus a plain Go echo server for context.
#
#   ./bench/load.sh                       # 10 s per run, 64 connections, 1 round
#   ROUNDS=3 DURATION=10s CONC=64 ./bench/load.sh
#   TOOLS="sluice-load wrk" (default: both when wrk is installed)
#   PIN=1: the server on CPU 0 (so GOMAXPROCS=1 and sluice run --workers 1), the load
#          generator on CPU 1 (needs taskset and 2 CPUs): they no longer compete for a core
#
# Configurations (every server on one port at a time, the built-in echo as upstream,
# --workers = number of CPUs):
#   echo       sluice-load -serve: a Go net/http echo, no Proxy-Wasm host
#   noop       sluice run with a no-op Proxy-Wasm module (host/testdata/guests/minimal):
#              the host's own cost
#   nomatch    sluice run, sluice.wasm, one rule that matches no request
#   allow-ip   sluice run, sluice.wasm, one token_bucket rule keyed on the client IP with a
#              limit that is never reached, headers "both" (one hot key: every request of
#              the single client updates the same shared-data entry)
#   allow-1k   as allow-ip but keyed on X-Key, requests spread over 1,000 keys
# Prints one line per run and a Markdown table of medians over the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-1}"
DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-2s}"
CONC="${CONC:-64}"
PORT="${PORT:-18080}"
CONFIGS="${CONFIGS:-echo noop nomatch allow-ip allow-1k}"
if [ -z "${TOOLS:-}" ]; then
	TOOLS="sluice-load"
	command -v wrk >/dev/null && TOOLS="$TOOLS wrk"
fi
GO="${GO:-go}"
srv_pin=() gen_pin=()
if [ "${PIN:-0}" = 1 ]; then
	srv_pin=(taskset -c 0) gen_pin=(taskset -c 1)
fi

work="$(mktemp -d)"
server=""
stop_server() {
	if [ -n "$server" ]; then
		kill -INT "$server" 2>/dev/null || true
		wait "$server" 2>/dev/null || true
		server=""
	fi
}
trap 'stop_server; rm -rf "$work"' EXIT

echo "load: building into $work" >&2
GOOS=wasip1 GOARCH=wasm "$GO" build -buildmode=c-shared -trimpath -o "$work/sluice.wasm" ./cmd/sluice-wasm
"$GO" run ./internal/wasmpatch/cmd/wasmpatch "$work/sluice.wasm"
(cd host/testdata/guests/minimal && GOOS=wasip1 GOARCH=wasm "$GO" build -buildmode=c-shared -trimpath -o "$work/noop.wasm" .)
"$GO" build -trimpath -o "$work/sluice" ./cmd/sluice
"$GO" build -trimpath -o "$work/sluice-load" ./bench/cmd/sluice-load
cat >"$work/allow-ip.json" <<'JSON'
{"rules":[{"name":"per-ip","key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}],
 "response":{"headers":"both"}}
JSON
cat >"$work/allow-1k.json" <<'JSON'
{"rules":[{"name":"per-key","key":[{"header":"x-key"}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}],
 "response":{"headers":"both"}}
JSON
cat >"$work/nomatch.json" <<'JSON'
{"rules":[{"name":"never","match":{"headers":[{"name":"x-never","exact":"1"}]},"key":[{"remote_ip":true}],"algorithm":"token_bucket","limit":1000000000,"window":"1s"}],
 "response":{"headers":"both"}}
JSON

start_server() {
	local cfg="$1"
	# A server already on the port would answer the readiness probe and be measured instead.
	if curl -s -o /dev/null "http://127.0.0.1:$PORT/" 2>/dev/null; then
		echo "load: 127.0.0.1:$PORT is already in use; set PORT to a free port" >&2
		return 1
	fi
	case "$cfg" in
	echo) "${srv_pin[@]}" "$work/sluice-load" -serve "127.0.0.1:$PORT" >/dev/null & ;;
	noop) "${srv_pin[@]}" "$work/sluice" run --wasm "$work/noop.wasm" --listen "127.0.0.1:$PORT" --log-level error >/dev/null & ;;
	*) "${srv_pin[@]}" "$work/sluice" run --wasm "$work/sluice.wasm" --config "$work/$cfg.json" --listen "127.0.0.1:$PORT" --log-level error >/dev/null & ;;
	esac
	server=$!
	for _ in $(seq 1 600); do
		if ! kill -0 "$server" 2>/dev/null; then
			echo "load: $cfg exited before serving" >&2
			return 1
		fi
		if curl -fs -o /dev/null "http://127.0.0.1:$PORT/" 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "load: $cfg did not start" >&2
	return 1
}

# measure CFG TOOL -> prints "rps p50_ms p99_ms"
measure() {
	local cfg="$1" tool="$2" keys=0
	[ "$cfg" = allow-1k ] && keys=1000
	case "$tool" in
	sluice-load)
		"${gen_pin[@]}" "$work/sluice-load" -url "http://127.0.0.1:$PORT/load" -c "$CONC" -d "$DURATION" -warmup "$WARMUP" -keys "$keys" -json |
			sed -E 's/.*"rps":([0-9.]+).*"p50_ms":([0-9.]+).*"p99_ms":([0-9.]+).*/\1 \2 \3/'
		;;
	wrk)
		local script=""
		if [ "$keys" -gt 0 ]; then
			script="$work/keys.lua"
			printf 'local i = 0\nrequest = function()\n  i = (i + 1) %% %d\n  wrk.headers["X-Key"] = "k" .. i\n  return wrk.format(nil)\nend\n' "$keys" >"$script"
		fi
		"${gen_pin[@]}" wrk -t2 -c"$CONC" -d"$WARMUP" ${script:+-s "$script"} "http://127.0.0.1:$PORT/load" >/dev/null
		"${gen_pin[@]}" wrk -t2 -c"$CONC" -d"$DURATION" --latency ${script:+-s "$script"} "http://127.0.0.1:$PORT/load" |
			awk '
				function ms(v) { if (v ~ /us$/) return v/1000; if (v ~ /ms$/) return v+0; if (v ~ /s$/) return v*1000; return v }
				$1 == "50%" { p50 = ms($2) } $1 == "99%" { p99 = ms($2) }
				$1 == "Requests/sec:" { rps = $2 }
				/Non-2xx/ { bad = $NF }
				END { if (bad != "") print "load: wrk saw " bad " non-2xx responses" > "/dev/stderr"; printf "%s %.3f %.3f\n", rps, p50, p99 }'
		;;
	esac
}

results="$work/results"
: >"$results"
for round in $(seq 1 "$ROUNDS"); do
	for cfg in $CONFIGS; do
		start_server "$cfg"
		for tool in $TOOLS; do
			r="$(measure "$cfg" "$tool")"
			echo "round $round  $cfg  $tool  rps/p50/p99: $r" >&2
			echo "$cfg $tool $r" >>"$results"
		done
		stop_server
	done
done

echo
echo "| configuration | tool | req/s | p50 (ms) | p99 (ms) | req/s vs noop | req/s vs nomatch |"
echo "|---|---|---:|---:|---:|---:|---:|"
awk -v configs="$CONFIGS" -v tools="$TOOLS" '
	function median(key,   n, i, j, t, a) {
		n = split(vals[key], a, " ")
		for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
	}
	{ k = $1 SUBSEP $2; vals[k SUBSEP "rps"] = vals[k SUBSEP "rps"] " " $3; vals[k SUBSEP "p50"] = vals[k SUBSEP "p50"] " " $4; vals[k SUBSEP "p99"] = vals[k SUBSEP "p99"] " " $5 }
	END {
		nc = split(configs, cs, " "); nt = split(tools, ts, " ")
		for (t = 1; t <= nt; t++) {
			noop = median("noop" SUBSEP ts[t] SUBSEP "rps"); nm = median("nomatch" SUBSEP ts[t] SUBSEP "rps")
			for (c = 1; c <= nc; c++) {
				k = cs[c] SUBSEP ts[t]
				if (vals[k SUBSEP "rps"] == "") continue
				rps = median(k SUBSEP "rps")
				vn = noop > 0 ? sprintf("%+.1f%%", (rps / noop - 1) * 100) : "-"
				vm = nm > 0 ? sprintf("%+.1f%%", (rps / nm - 1) * 100) : "-"
				printf "| %s | %s | %.0f | %.3f | %.3f | %s | %s |\n", cs[c], ts[t], rps, median(k SUBSEP "p50"), median(k SUBSEP "p99"), vn, vm
			}
		}
	}' "$results"
