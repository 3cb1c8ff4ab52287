#!/usr/bin/env bash
# End-to-end scenarios of e2e/ against Envoy in Docker (make e2e-envoy).
#
# For every scenario that can run on Envoy: render its bootstrap (e2e/cmd/sluice-e2e-envoy),
# `docker compose up` Envoy (ENVOY_IMAGE: Envoy 1.33 up to 1.39, the newest release line
# checked) with sluice.wasm plus an upstream, wait for Envoy's /ready, run that scenario with
#   SLUICE_E2E_TARGET=envoy SLUICE_E2E_SCENARIO=NAME SLUICE_E2E_URL=http://127.0.0.1:PORT \
#     go test ./e2e -run 'TestScenarios/^NAME$'
# and take the containers down. Then the survival stage (named "survival"): hostile x-api-key
# values through one VM, after which Envoy's wasm stats and log must show no VM failure (see
# survival below). Exits non-zero if any scenario or the stage fails, or at once when there
# is no Docker engine.
#
#   ENVOY_IMAGE=envoyproxy/envoy:v1.39-latest ./e2e/envoy/run.sh           # everything
#   ./e2e/envoy/run.sh limit-token_bucket per-route survival                # some of it
set -euo pipefail

cd "$(dirname "$0")/../.."
export ENVOY_IMAGE="${ENVOY_IMAGE:-envoyproxy/envoy:v1.33-latest}"
export SLUICE_E2E_PORT="${SLUICE_E2E_PORT:-10000}"
export SLUICE_E2E_ADMIN_PORT="${SLUICE_E2E_ADMIN_PORT:-19901}"
GO="${GO:-go}"
compose_file=e2e/envoy/compose.yaml
project=sluice-e2e
base="http://127.0.0.1:$SLUICE_E2E_PORT"
admin="http://127.0.0.1:$SLUICE_E2E_ADMIN_PORT"

if ! command -v docker >/dev/null 2>&1; then
	echo "e2e-envoy: docker is not installed; these scenarios need a Docker engine that can pull $ENVOY_IMAGE." >&2
	echo "e2e-envoy: the same scenarios run against the embedded host with: go test ./e2e" >&2
	exit 1
fi
if ! docker info >/dev/null 2>&1; then
	echo "e2e-envoy: no usable Docker engine (\`docker info\` failed); these scenarios need one that can pull $ENVOY_IMAGE." >&2
	echo "e2e-envoy: the same scenarios run against the embedded host with: go test ./e2e" >&2
	exit 1
fi
if ! docker compose version >/dev/null 2>&1; then
	echo "e2e-envoy: \`docker compose\` (Compose v2) is not available." >&2
	exit 1
fi

work="$(mktemp -d)"
cleanup() {
	docker compose -p "$project" -f "$compose_file" down -v --remove-orphans >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "e2e-envoy: building sluice.wasm"
GOOS=wasip1 GOARCH=wasm "$GO" build -buildmode=c-shared -trimpath -o "$work/sluice.wasm" ./cmd/sluice-wasm
"$GO" run ./internal/wasmpatch/cmd/wasmpatch "$work/sluice.wasm"
"$GO" run ./e2e/cmd/sluice-e2e-envoy -out "$work/scenarios" -survival "$work/survival.yaml" >"$work/list"
"$GO" build -o "$work/sluice-load" ./e2e/cmd/sluice-load
chmod -R a+rX "$work" # the Envoy image runs as an unprivileged user
export SLUICE_E2E_WASM="$work/sluice.wasm"

echo "e2e-envoy: pulling $ENVOY_IMAGE"
docker pull -q "$ENVOY_IMAGE" >/dev/null

compose() {
	docker compose -p "$project" -f "$compose_file" "$@"
}

envoy_log() {
	compose logs --no-color envoy || true
}

# start_envoy NAME YAML WORKERS: (re)create Envoy with that bootstrap and wait for /ready.
start_envoy() {
	export SLUICE_E2E_YAML="$2" SLUICE_E2E_WORKERS="$3"
	if ! compose up -d --force-recreate --quiet-pull >/dev/null; then
		echo "e2e-envoy: $1: \`docker compose up\` failed" >&2
		return 1
	fi
	for _ in $(seq 1 120); do
		if [ "$(curl -fsS "$admin/ready" 2>/dev/null)" = "LIVE" ]; then
			return 0
		fi
		sleep 0.5
	done
	echo "e2e-envoy: $1: Envoy not ready within 60s; its log:" >&2
	envoy_log >&2
	return 1
}

# The survival stage: the attack that killed earlier builds on a proxy-wasm-cpp-host before
# PR #533 (Envoy 1.33–1.38) — two rules keyed on x-api-key (e2e.SurvivalConfig), 3,000
# requests with a 33 KiB x-api-key and 3,000 with a 96 KiB one, on one worker so that one VM
# takes them all. Every request must be admitted (200; the VM fails closed, so a dead VM
# shows as 503), and afterwards Envoy must show no sign of a VM failure:
#   - /stats?filter=wasm: the VM lifecycle stats (wasm.envoy.wasm.runtime.v8.created, a
#     counter, and .active, a gauge: source/extensions/common/wasm/stats_handler.h,
#     LIFECYCLE_STATS) unchanged by the load, and the plugin's reload counters
#     (wasm.sluice.vm_reload*, WASM_STATS) at 0;
#   - sluice's own sluice.errors (recovered panics, refused local replies) at 0;
#   - Envoy's log free of a failed VM call ("Function: proxy_on_… failed", cpp-host's
#     V8::getFailMessage), a trap on a restricted host call ("restricted_callback"), a Go
#     runtime crash written to stderr ("runtime.throw", "panic", "fatal error"), any guest log
#     line (Envoy runs at --log-level warn, so any "wasm log" line is a warning or worse) and
#     any "Failed".
# Header size: Envoy's default max_request_headers_kb (60) would answer 431 to the 96 KiB
# value before sluice sees it, and the attack needs the value inside the module; so the
# stage's bootstrap raises it to 128 (as a proxy configured for large headers would), and so
# does the upstream (e2e/envoy/upstream.yaml), which must accept what Envoy forwards.
# It runs inside an `if`, where errexit is off: every step checks its own status.
survival() {
	local ok=1 i size code line
	start_envoy survival "$work/survival.yaml" 1 || return 1
	for i in 1 2 3; do # warm up, and the VMs exist before the first snapshot
		code="$(curl -sS -o /dev/null -w '%{http_code}' -H "x-api-key: warm-$i" "$base/")" || code=000
		if [ "$code" != 200 ]; then
			echo "e2e-envoy: survival: a small request got $code" >&2
			envoy_log >&2
			return 1
		fi
	done
	if ! curl -fsS "$admin/stats?filter=wasm" >"$work/wasm-before" ||
		! grep -qE '^wasm\..*\.created: ' "$work/wasm-before"; then
		echo "e2e-envoy: survival: no wasm.<runtime>.created in Envoy's /stats?filter=wasm" >&2
		return 1
	fi
	for size in 33792 98304; do
		echo "e2e-envoy: survival: 3000 requests with a $size-byte x-api-key"
		if ! "$work/sluice-load" -url "$base/" -c 4 -warmup 0 -d 2m -n 3000 \
			-keys 26 -key-header x-api-key -key-bytes "$size" -want-status 200; then
			ok=""
		fi
	done
	if ! curl -fsS "$admin/stats?filter=wasm" >"$work/wasm-after" ||
		! curl -fsS "$admin/stats?filter=sluice" >"$work/sluice-stats"; then
		echo "e2e-envoy: survival: Envoy's admin endpoint did not answer after the load" >&2
		envoy_log >&2
		return 1
	fi
	echo "e2e-envoy: survival: Envoy's wasm stats after the load:"
	sed 's/^/  /' "$work/wasm-after"
	grep -E '^sluice\.(guest\.|errors)' "$work/sluice-stats" | sed 's/^/  /' || true
	if ! diff <(grep -E '\.(created|active): ' "$work/wasm-before") \
		<(grep -E '\.(created|active): ' "$work/wasm-after") >"$work/wasm-diff"; then
		echo "e2e-envoy: survival: VMs were created or destroyed during the load:" >&2
		cat "$work/wasm-diff" >&2
		ok=""
	fi
	if grep -E '\.vm_reload[a-z_]*: [1-9]' "$work/wasm-after" >&2; then
		echo "e2e-envoy: survival: the plugin's VM was reloaded (above)" >&2
		ok=""
	fi
	if grep -E '^sluice\.errors: [1-9]' "$work/sluice-stats" >&2; then
		echo "e2e-envoy: survival: the filter counted errors (above)" >&2
		ok=""
	fi
	envoy_log >"$work/envoy.log"
	if grep -nE 'Function: proxy_on_|wasm log|Failed|restricted_callback|runtime\.throw|panic|fatal error' \
		"$work/envoy.log" >"$work/bad-lines"; then
		echo "e2e-envoy: survival: Envoy's log shows a failure:" >&2
		while IFS= read -r line; do
			printf '  %.400s\n' "$line" >&2 # a failing request's line may carry a 96 KiB key
		done <"$work/bad-lines"
		ok=""
	fi
	[ -n "$ok" ]
}

wanted=" $* "
failed=()
ran=0
while read -r name workers; do
	if [ $# -gt 0 ] && [[ "$wanted" != *" $name "* ]]; then
		continue
	fi
	ran=$((ran + 1))
	echo "=== $name (Envoy $ENVOY_IMAGE, --concurrency $workers)"
	if ! start_envoy "$name" "$work/scenarios/$name/envoy.yaml" "$workers"; then
		failed+=("$name")
	elif ! SLUICE_E2E_TARGET=envoy SLUICE_E2E_SCENARIO="$name" SLUICE_E2E_URL="$base" \
		"$GO" test -count=1 -run "TestScenarios/^${name}\$" ./e2e; then
		envoy_log >&2
		failed+=("$name")
	fi
	compose down -v --remove-orphans >/dev/null
done <"$work/list"

if [ $# -eq 0 ] || [[ "$wanted" == *" survival "* ]]; then
	ran=$((ran + 1))
	echo "=== survival (Envoy $ENVOY_IMAGE, --concurrency 1)"
	if ! survival; then
		failed+=(survival)
	fi
	compose down -v --remove-orphans >/dev/null
fi

if [ "$ran" -eq 0 ]; then
	echo "e2e-envoy: no scenario matched: $*" >&2
	exit 1
fi
if [ "${#failed[@]}" -gt 0 ]; then
	echo "e2e-envoy: FAILED on $ENVOY_IMAGE: ${failed[*]}" >&2
	exit 1
fi
echo "e2e-envoy: $ran scenarios and stages passed on $ENVOY_IMAGE"
