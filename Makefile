# DSec build. `make up` runs DSec on this host; `make test` runs every test.
SHELL := /bin/bash
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN     := bin/dsec
TOOLS   := internal/image/builtin/assets/dsectools.wasm
GUEST   := internal/image/builtin/assets/dsec-guest
DATA    ?= /var/lib/dsec

.PHONY: all build up test unit race lint python bench bench-smoke bench-container bench-vm bench-burst bench-hollow bench-trajectory bench-function bench-images deps-runtime deps-test deps-bench clean FORCE

all: build

deps-runtime:
	@scripts/deps.sh runtime

deps-test:
	@scripts/deps.sh test

deps-bench:
	@scripts/deps.sh bench

# The function tier's tools, compiled to WebAssembly and embedded in dsec.
$(TOOLS): $(shell find tools/wasm -name '*.go') go.mod
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -o $@ ./tools/wasm/dsectools

# The in-sandbox agent, a static binary embedded in dsec (the
# toolkit/dsec-guest layer). Always handed to go build, which rewrites it
# only when its sources or $(VERSION) changed.
$(GUEST): FORCE
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "-s -w -X main.version=$(VERSION)" -o $@ ./cmd/dsec-guest

build: $(TOOLS) $(GUEST)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/dsec

# Runs DSec on its embedded defaults (API on 127.0.0.1:7878, data in $(DATA)).
up: deps-runtime build
	$(BIN) up --data-dir $(DATA)

# gofmt and vet, for Linux and for macOS: the CLI and the Go client
# build there (Linux-only code sits in _linux.go files with _other.go
# stubs). Both Mac arches, as build tags and generated files differ.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	GOOS=darwin GOARCH=amd64 $(GO) vet ./...
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/dsec

# Unit and integration tests with the race detector (privileged tests run:
# CI is root).
race: build
	$(GO) test -race -count=1 -timeout 20m ./...

# The Python SDK: mypy --strict over it, its tests and benchmarks (the
# settings are sdk/python/pyproject.toml's), once more as a Mac sees them
# (nothing Linux-only outside a platform check), then its tests against a
# real server.
python: build
	cd sdk/python && /usr/bin/python3 -m mypy && /usr/bin/python3 -m mypy --platform darwin
	cd sdk/python && DSEC_BIN=$(CURDIR)/$(BIN) /usr/bin/python3 -m pytest -q tests

test: deps-test lint race python bench-smoke
	@echo "make test: all passed"

# Benchmark sizes. `make bench` measures (figures: docs/bench.md);
# `make bench-smoke`, part of `make test`, runs every benchmark once at its
# smallest size and asserts nothing about speed, so that a benchmark that
# can no longer start fails the suite.
ifeq ($(SMOKE),1)
BT_TIME   := 1x
API_BENCH := --concurrency 2 --duration 1s --warmup 0s --idle-sandboxes 20
DENSITY   := 20
LAZY_MB   := 32
VM_BOOTS  := 1
SDK_BENCH := --cycles 2 --parallel 2 --parallel-cycles 4 --execs 5
BURST     ?= 20
HOLLOW    ?= 4
HOLLOW_BURST ?= 40
else
BT_TIME   := 2s
API_BENCH := --concurrency 1,2,8,32 --duration 5s --idle-sandboxes 4000
DENSITY   := 4000
LAZY_MB   := 1024
VM_BOOTS  := 5
SDK_BENCH :=
BURST     ?= 2000
endif
# bt picks a benchmark's iterations: $(call bt,N) is N, or 1x when smoking.
bt = $(if $(filter 1,$(SMOKE)),1x,$(1))

# Every part below. A part that fails (a target missed that is asserted,
# such as all 2,000 creates of the burst) does not stop the others: their
# figures are still measured, and `make bench` fails at the end.
bench: deps-bench build
	@$(MAKE) -k --no-print-directory bench-container bench-vm bench-burst bench-hollow bench-trajectory bench-function bench-images || \
		{ echo "make bench: a part failed (see above); the others ran"; exit 1; }

# In-process benchmarks of functions and layers, then the whole system
# measured through its API by `dsec bench` against a fresh `dsec up`.
bench-function: deps-bench build
	$(GO) test -run '^$$' -bench 'InstantiateGoTool' -benchtime $(BT_TIME) ./internal/wasmopt/
	$(GO) test -run '^$$' -bench 'CallTiny|CallGoTool' -benchtime $(BT_TIME) -cpu 1,2 ./internal/function/
	$(GO) test -run '^$$' -bench 'CreateExecDelete' -benchtime $(BT_TIME) -cpu 2,8 ./internal/function/
	$(GO) test -run '^$$' -bench 'IdleSandboxMemory' -benchtime $(call bt,3x) ./internal/function/
	$(GO) test -run '^$$' -bench 'BuildDir200MB|BuildTar' -benchtime $(call bt,2x) ./internal/image/layer/
	$(GO) test -run '^$$' -bench 'MountLayer|RootAssembly' -benchtime $(call bt,2000x) ./internal/image/layercache/
	$(GO) test -run '^$$' -bench 'PageCacheShared' -benchtime 1x ./internal/image/layercache/
	scripts/bench.sh $(BIN) $(API_BENCH)

# Images loaded on demand: reads through a lazily loaded blob against a
# local one, and a cold node's first command, eager against lazy, from
# the JetStream store (in process, then behind a 1 Gbit/s link).
bench-images: deps-bench build
	$(GO) test -run '^$$' -bench 'WarmRead|ColdRead' -benchtime $(call bt,10x) ./internal/image/lazyblob/
	DSEC_BENCH_LAZY_MB=$(LAZY_MB) $(GO) test -run '^$$' -bench 'FirstCommand' -benchtime $(call bt,3x) -timeout 30m ./internal/image/layercache/

bench-smoke:
	$(MAKE) --no-print-directory bench SMOKE=1

# The container tier: DSec against crun and runc of the same root, exec
# round trips, where a create's time goes, 4,000 idle sandboxes, then the
# same through the Python SDK against a fresh `dsec up`.
bench-container: deps-bench build
	$(GO) test -run '^$$' -bench 'VsOCI' -benchtime $(call bt,10x) -timeout 30m ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkCycle$$' -benchtime $(call bt,400x) ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkExec$$' -benchtime $(call bt,2000x) ./internal/container/
	$(GO) test -run '^$$' -bench 'CreatePhases' -benchtime $(call bt,300x) ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkMonitor$$' -benchtime $(call bt,10x) ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkPhaseChange$$' -benchtime $(call bt,100x) ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkGrade$$' -benchtime $(call bt,20x) ./internal/daemon/
	DSEC_BENCH_DENSITY=$(DENSITY) $(GO) test -run '^$$' -bench 'Density' -benchtime 1x -timeout 60m ./internal/container/
	/usr/bin/python3 sdk/python/bench/bench_container.py --dsec $(BIN) $(SDK_BENCH)

# The VM tiers under this machine's accelerator (TCG here): boot to ready,
# QEMU's memory, 4 creates at once, the vm tier, a microVM's snapshot,
# a network's cost.
bench-vm: deps-bench build
	$(GO) test -run '^$$' -bench '^BenchmarkCreate$$' -benchtime $(call bt,8x) -timeout 20m ./internal/vm/vmtier/
	$(GO) test -run '^$$' -bench 'CreateParallel4' -benchtime $(call bt,3x) -timeout 20m ./internal/vm/vmtier/
	$(GO) test -run '^$$' -bench 'CreateVM' -benchtime $(call bt,6x) -timeout 20m ./internal/vm/vmtier/
	$(GO) test -run '^$$' -bench '^BenchmarkSnapshot$$' -benchtime $(call bt,3x) -timeout 20m ./internal/vm/vmtier/
	set -o pipefail; DSEC_TEST_MICROVM_NETBENCH=$(VM_BOOTS) $(GO) test -run 'TestNetworkBootTime' -count=1 -v -timeout 20m ./internal/vm/vmtier/ | grep -E 'boot|network|PASS|FAIL'

# Trajectories: one append to the log, snapshots of a container's
# writable layer, then, through the API of one `dsec up`, the cost of
# recording, resume of a 40-step rollout, fork(16) and snapshots
# (smaller with SMOKE=1: -short).
bench-trajectory: deps-bench build
	$(GO) test -run '^$$' -bench 'Append' -benchtime $(call bt,500x) ./internal/trajectory/
	$(GO) test -run '^$$' -bench 'Snapshot' -benchtime $(call bt,3x) -timeout 20m ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkTrajectory$$' -benchtime 1x -timeout 30m $(if $(filter 1,$(SMOKE)),-short) ./internal/daemon/

# Container creates fired at once (2,000): through the Go client
# (`dsec bench`), then the asyncio SDK, each against a fresh `dsec up`.
bench-burst: deps-bench build
	scripts/bench.sh $(BIN) --scenarios create-burst --burst $(BURST)
	/usr/bin/python3 sdk/python/bench/bench_burst.py --dsec $(BIN) --burst $(BURST)

# The control plane over hollow nodes: HOLLOW simulated nodes, HOLLOW_BURST
# vm creates at once (only the hollow nodes offer the vm tier there).
HOLLOW ?= 64
HOLLOW_BURST ?= 10000
bench-hollow: deps-bench build
	scripts/bench-hollow.sh $(BIN) $(HOLLOW) --scenarios create-burst --burst $(HOLLOW_BURST)

clean:
	rm -rf bin $(TOOLS) $(GUEST)
