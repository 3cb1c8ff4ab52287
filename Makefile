# sluice task runner. `make run` and `make test` are the two commands of the quick start.
GO        ?= go
DIST      := dist
WASM      := $(DIST)/sluice.wasm
WASMREDIS := $(DIST)/sluice-redis.wasm
DYNMOD    := $(DIST)/libsluice.so
BIN       := $(DIST)/sluice
LISTEN    ?= 127.0.0.1:8080
ADMIN     ?= 127.0.0.1:9901

.PHONY: all build wasm dynmod test test-unit bench bench-envoy-perf bench-envoy-calls bench-rls bench-startup bench-compare check run e2e-envoy envoy-fetch envoy-run fuzz clean

# Real Envoy (e2e/envoyproc): ENVOY=/path/to/envoy (or docker:IMAGE) runs one binary;
# ENVOY_VERSIONS="1.36.4 1.40.0" chooses pinned versions, fetched into SLUICE_ENVOY_CACHE
# (default ~/.cache/sluice/envoy) when missing. make test runs the versions CI runs.
export ENVOY ENVOY_VERSIONS SLUICE_ENVOY_CACHE
ENVOY_VERSION ?= 1.40.0

all: build

build: $(BIN) wasm dynmod

# The Envoy dynamic module (Envoy >= 1.38): the same filter, native, built with cgo (a C
# compiler: Debian's gcc). docs/deploy.md, "Envoy dynamic module".
dynmod: SHELL := /bin/bash
dynmod: .SHELLFLAGS := -o pipefail -ec
dynmod:
	@mkdir -p $(DIST)
	CGO_ENABLED=1 $(GO) build -v -buildmode=c-shared -trimpath -o $(DYNMOD) ./cmd/sluice-dynmod 2>&1 | awk -f .ci/build-progress.awk
	@rm -f $(DIST)/libsluice.h

# Builds print a count of the packages they compile on a cold cache (.ci/build-progress.awk),
# nothing when it is warm; pipefail keeps a failing build failing.
wasm $(BIN): SHELL := /bin/bash
wasm $(BIN): .SHELLFLAGS := -o pipefail -ec
wasm:
	@mkdir -p $(DIST)
	GOOS=wasip1 GOARCH=wasm $(GO) build -v -buildmode=c-shared -trimpath -o $(WASM) ./cmd/sluice-wasm 2>&1 | awk -f .ci/build-progress.awk
	GOOS=wasip1 GOARCH=wasm $(GO) build -v -buildmode=c-shared -trimpath -tags redis -o $(WASMREDIS) ./cmd/sluice-wasm 2>&1 | awk -f .ci/build-progress.awk
	$(GO) run ./internal/wasmpatch/cmd/wasmpatch $(WASM) $(WASMREDIS)

# dist/sluice carries both modules (cmd/sluice/embedded.go), so it runs from anywhere: they
# are copied into cmd/sluice/embedded/ (not committed) and built in with -tags embedwasm.
$(BIN): FORCE wasm
	@mkdir -p $(DIST) cmd/sluice/embedded
	cp $(WASM) $(WASMREDIS) cmd/sluice/embedded/
	CGO_ENABLED=0 $(GO) build -v -trimpath -tags embedwasm -o $(BIN) ./cmd/sluice 2>&1 | awk -f .ci/build-progress.awk
FORCE:

# The OCI images envoy/'s manifests name, without Docker (cmd/sluice-images; docs/deploy.md, "Images"):
# dist/images/{sluice,sluice-redis,sluice-serve}/ (OCI image layouts, for crane push or skopeo
# copy) and docker-loadable tarballs beside them. The serve image holds a static sluice (no
# modules built in) per IMAGE_PLATFORMS; IMAGE_TAG overrides the version tag.
.PHONY: images
IMAGES          := $(DIST)/images
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
IMAGE_TAG       ?=
images: wasm
	@set -e; for p in $(IMAGE_PLATFORMS); do \
	  os=$${p%%/*}; arch=$${p#*/}; out=$(IMAGES)/bin/$$os-$$arch/sluice; \
	  echo "CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags='-s -w' -o $$out ./cmd/sluice"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags='-s -w' -o $$out ./cmd/sluice; \
	done
	$(GO) run ./cmd/sluice-images -out $(IMAGES) -wasm $(WASM) -redis-wasm $(WASMREDIS) $(if $(IMAGE_TAG),-tag $(IMAGE_TAG)) \
	  $(foreach p,$(IMAGE_PLATFORMS),-serve $(p)=$(IMAGES)/bin/$(subst /,-,$(p))/sluice)

# The whole test suite, real Envoy included (1.36.4 and 1.40.0, fetched on first use).
# Tests that need the compiled module build it themselves.
# bench/rls (its own module) proves the drop-in: sluice serve --charge-denied against the
# real envoyproxy/ratelimit, zero differences on one request sequence.
# Progress: with a cold build cache, vet counts the packages it compiles (.ci/build-progress.awk);
# the slow packages (TEST_SLOW) run with -v through .ci/test-progress.awk: one line per finished
# top-level test, a failing test's whole output. Two lanes, at most two test binaries at a time
# as `go test ./...` on 2 cores: e2e; the other packages one by one, then filter and cmd/sluice.
TEST_SLOW  := e2e e2e/integration filter cmd/sluice
TEST_FLAGS := -count=1 -timeout 40m
test: SHELL := /bin/bash
test: .SHELLFLAGS := -o pipefail -ec
test:
	$(GO) vet -v ./... 2>&1 | awk -f .ci/build-progress.awk
	@mod=$$($(GO) list -m); fast=$$($(GO) list ./... | grep -vxF $(foreach p,$(TEST_SLOW),-e $$mod/$(p))); \
	vtest() { echo "== go test -v ./$$1 (one line per finished top-level test)"; \
	  $(GO) test $(TEST_FLAGS) -v ./$$1 2>&1 | awk -v pkg=$$1 -f .ci/test-progress.awk; }; \
	rc=0; vtest $(firstword $(TEST_SLOW)) & lane=$$!; \
	echo "== go test -p 1 (the other packages)"; $(GO) test $(TEST_FLAGS) -p 1 $$fast || rc=1; \
	echo "== go test -race ./filter/dynmod (the dynamic module's shell: Envoy's workers are threads)"; \
	$(GO) test $(TEST_FLAGS) -race ./filter/dynmod || rc=1; \
	for p in $(wordlist 2,$(words $(TEST_SLOW)),$(TEST_SLOW)); do vtest $$p || rc=1; done; \
	wait $$lane || rc=1; \
	if [ $$rc != 0 ]; then echo "make test: FAIL (above)"; fi; exit $$rc
	cd bench/rls && $(GO) vet ./... && $(GO) test -count=1 -timeout 10m ./...

# The unit tier: go test -short runs no Redis Cluster, no Chromium, no Envoy and no subprocess
# (no go build of a module or guest, no child sluice); what needs one skips, saying which.
# Under a minute on 2 cores; make test stays the full gate.
test-unit:
	$(GO) test -short -count=1 ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# envoyproxy/ratelimit and `sluice serve` side by side on one Redis Cluster
# (bench/rls, a separate module: the product's go.mod never depends on the peer).
RLSBENCH_FLAGS ?=
bench-rls:
	cd bench/rls && $(GO) run ./cmd/rlsbench $(RLSBENCH_FLAGS)

# The same services where users run them, through one real Envoy (ENVOY=path, else 1.40.0,
# fetched), --concurrency 2: its ratelimit filter calling envoyproxy/ratelimit or `sluice serve`
# (as shipped, and with --charge-denied)
# (one Redis Cluster, the peer's file), and sluice.wasm backend "rls" with a lease against its
# local backend; goals checked, a dated block added to bench/rls/results.txt (rlsbench -envoy;
# e.g. RLSBENCH_ENVOY_FLAGS="-rounds 3 -duration 3s", "-out -" to write no file).
.PHONY: bench-rls-envoy
RLSBENCH_ENVOY_FLAGS ?= -rounds 5
bench-rls-envoy:
	cd bench/rls && $(GO) run ./cmd/rlsbench -envoy $(RLSBENCH_ENVOY_FLAGS)

# `sluice run` without a compilation cache: CPU and wall time to the first answer, idle VmRSS
# (Linux), median of STARTUP_ROUNDS interleaved rounds (bench/cmd/sluice-startup; more modules or
# binaries: STARTUP_FLAGS='-wasm a.wasm,b.wasm').
STARTUP_ROUNDS ?= 3
STARTUP_FLAGS ?=
bench-startup: build
	$(GO) run ./bench/cmd/sluice-startup -sluice $(BIN) -wasm $(WASM) -rounds $(STARTUP_ROUNDS) $(STARTUP_FLAGS)

# The embedded host's figures as ratios measured in one run, configurations interleaved, medians of
# rounds with their range (bench/cmd/sluice-compare: guest, cycle, sliding, startup by default;
# e.g. BENCH_COMPARE_FLAGS="-rounds 5 -sections guest").
BENCH_COMPARE_FLAGS ?=
bench-compare:
	$(GO) run ./bench/cmd/sluice-compare $(BENCH_COMPARE_FLAGS)

# sluice.wasm and libsluice.so where users run them: one real Envoy (ENVOY=path, else 1.40.0,
# fetched), --concurrency 2, against Envoy's native local_ratelimit, no-op modules (Wasm, C
# and Go dynamic modules) and no filter:
# throughput and CPU (every configuration in one process per round, runs interleaved),
# latency at half native's saturation, memory and start-up per family; ratios per round,
# medians and ranges of 5 rounds, written to bench/envoy/results.txt (bench/envoy; e.g.
# BENCH_ENVOY_FLAGS="-rounds 7 -d 5s" or "-phases startup -families tb-none").
.PHONY: bench-envoy
BENCH_ENVOY_FLAGS ?=
bench-envoy: wasm dynmod
	$(GO) run ./bench/envoy -wasm $(WASM) -dynmod $(DYNMOD) $(BENCH_ENVOY_FLAGS)

# Where Envoy's CPU goes with sluice in V8 (Linux perf; V8's perf map from a copy of the
# binary with perf_basic_prof set): shares per side, appended to bench/envoy-perf-results.txt.
ENVOY_PERF_FLAGS ?=
bench-envoy-perf:
	$(GO) run ./bench/cmd/envoy-perf $(ENVOY_PERF_FLAGS)
bench-envoy-calls: ; $(GO) run ./bench/cmd/envoy-calls $(ENVOY_CALLS_FLAGS)

# Short fuzzing pass over every fuzz target (FUZZTIME per target).
FUZZTIME ?= 10s
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

# gofmt, go vet and staticcheck over both modules (the product's and bench/rls), then go.mod
# tidy. staticcheck is pinned here and run with go run pkg@version: go.mod does not depend
# on it. It checks the default build and, merged with it, the filter's sluice_debug build (so
# that what only that build uses is not reported unused).
STATICCHECK := $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
check: SHELL := /bin/bash
check: .SHELLFLAGS := -o pipefail -ec
check:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	cd bench/rls && $(GO) vet ./...
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	echo "$(STATICCHECK) ./... (default build, and -tags sluice_debug ./filter/...)"; \
	$(STATICCHECK) -f binary ./... > "$$tmp/default"; \
	$(STATICCHECK) -f binary -tags sluice_debug ./filter/... > "$$tmp/debug"; \
	$(STATICCHECK) -merge "$$tmp/default" "$$tmp/debug"
	cd bench/rls && $(STATICCHECK) ./...
	$(GO) mod tidy
	git diff --exit-code go.mod go.sum

run: build
	$(BIN) run --wasm $(WASM) --listen $(LISTEN) --admin $(ADMIN)

# The Envoy suite alone: every scenario and stage through real Envoy, the module as shipped.
e2e-envoy:
	$(GO) test -count=1 -timeout 30m -run '^TestEnvoy' -v ./e2e

# Fetch the pinned Envoy binaries (ENVOY_VERSIONS, default the CI versions) and check V8.
envoy-fetch:
	$(GO) run ./e2e/cmd/sluice-envoy -fetch

# sluice in a real Envoy on this machine: envoy/envoy.yaml with sluice.wasm, or with
# ARTIFACT=dynmod envoy/envoy-dynmod.yaml with libsluice.so; Envoy ENVOY_VERSION (fetched
# when missing), listener 127.0.0.1:10000, admin 127.0.0.1:9901.
ARTIFACT ?= wasm
envoy-run: build
	$(GO) run ./e2e/cmd/sluice-envoy -version $(ENVOY_VERSION) $(if $(filter dynmod,$(ARTIFACT)),-dynmod $(DYNMOD),-wasm $(WASM))

clean:
	rm -rf $(DIST)
