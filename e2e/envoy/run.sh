#!/usr/bin/env bash
# End-to-end scenarios of e2e/ against Envoy in Docker (make e2e-envoy).
#
# For every scenario that can run on Envoy: render its bootstrap (e2e/cmd/sluice-e2e-envoy),
# `docker compose up` Envoy (ENVOY_IMAGE, >= 1.33) with sluice.wasm plus an upstream, wait
# for Envoy's /ready, run that scenario with
#   SLUICE_E2E_TARGET=envoy SLUICE_E2E_SCENARIO=NAME SLUICE_E2E_URL=http://127.0.0.1:PORT \
#     go test ./e2e -run 'TestScenarios/^NAME$'
# and take the containers down. Exits non-zero if any scenario fails, or at once when there
# is no Docker engine.
#
#   ENVOY_IMAGE=envoyproxy/envoy:v1.34-latest ./e2e/envoy/run.sh           # all scenarios
#   ./e2e/envoy/run.sh limit-token_bucket per-route                         # some of them
set -euo pipefail

cd "$(dirname "$0")/../.."
export ENVOY_IMAGE="${ENVOY_IMAGE:-envoyproxy/envoy:v1.33-latest}"
export SLUICE_E2E_PORT="${SLUICE_E2E_PORT:-10000}"
export SLUICE_E2E_ADMIN_PORT="${SLUICE_E2E_ADMIN_PORT:-19901}"
GO="${GO:-go}"
compose_file=e2e/envoy/compose.yaml
project=sluice-e2e

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
"$GO" run ./e2e/cmd/sluice-e2e-envoy -out "$work/scenarios" >"$work/list"
chmod -R a+rX "$work" # the Envoy image runs as an unprivileged user
export SLUICE_E2E_WASM="$work/sluice.wasm"

echo "e2e-envoy: pulling $ENVOY_IMAGE"
docker pull -q "$ENVOY_IMAGE" >/dev/null

wanted=" $* "
failed=()
ran=0
while read -r name workers; do
	if [ $# -gt 0 ] && [[ "$wanted" != *" $name "* ]]; then
		continue
	fi
	ran=$((ran + 1))
	echo "=== $name (Envoy $ENVOY_IMAGE, --concurrency $workers)"
	export SLUICE_E2E_YAML="$work/scenarios/$name/envoy.yaml" SLUICE_E2E_WORKERS="$workers"
	docker compose -p "$project" -f "$compose_file" up -d --force-recreate --quiet-pull >/dev/null
	ready=""
	for _ in $(seq 1 120); do
		if [ "$(curl -fsS "http://127.0.0.1:$SLUICE_E2E_ADMIN_PORT/ready" 2>/dev/null)" = "LIVE" ]; then
			ready=1
			break
		fi
		sleep 0.5
	done
	if [ -z "$ready" ]; then
		echo "e2e-envoy: $name: Envoy not ready within 60s; its log:" >&2
		docker compose -p "$project" -f "$compose_file" logs envoy >&2 || true
		failed+=("$name")
	elif ! SLUICE_E2E_TARGET=envoy SLUICE_E2E_SCENARIO="$name" SLUICE_E2E_URL="http://127.0.0.1:$SLUICE_E2E_PORT" \
		"$GO" test -count=1 -run "TestScenarios/^${name}\$" ./e2e; then
		docker compose -p "$project" -f "$compose_file" logs envoy >&2 || true
		failed+=("$name")
	fi
	docker compose -p "$project" -f "$compose_file" down -v --remove-orphans >/dev/null
done <"$work/list"

if [ "$ran" -eq 0 ]; then
	echo "e2e-envoy: no scenario matched: $*" >&2
	exit 1
fi
if [ "${#failed[@]}" -gt 0 ]; then
	echo "e2e-envoy: FAILED on $ENVOY_IMAGE: ${failed[*]}" >&2
	exit 1
fi
echo "e2e-envoy: $ran scenarios passed on $ENVOY_IMAGE"
