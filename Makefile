# DSec build. `make up` runs DSec on this host; `make test` runs every test.
SHELL := /bin/bash
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN     := bin/dsec
TOOLS   := internal/builtin/assets/dsectools.wasm
GUEST   := internal/builtin/assets/dsec-guest
DATA    ?= /var/lib/dsec

.PHONY: all build up test unit race lint python bench bench-container bench-vm bench-burst deps-runtime deps-test deps-bench clean FORCE

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

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Unit and integration tests with the race detector (privileged tests run:
# CI is root).
race: build
	$(GO) test -race -count=1 -timeout 20m ./...

python: build
	cd sdk/python && DSEC_BIN=$(CURDIR)/$(BIN) /usr/bin/python3 -m pytest -q tests

test: deps-test lint race python
	@echo "make test: all passed"

# In-process benchmarks, then the whole system measured through its API by
# `dsec bench` against a fresh `dsec up` (figures: docs/bench.md).
bench: deps-bench build bench-container bench-vm bench-burst
	$(GO) test -run '^$$' -bench 'InstantiateGoTool' -benchtime 2s ./internal/wasmopt/
	$(GO) test -run '^$$' -bench 'CallTiny|CallGoTool' -benchtime 2s -cpu 1,2 ./internal/function/
	$(GO) test -run '^$$' -bench 'IdleSandboxMemory' -benchtime 3x ./internal/function/
	$(GO) test -run '^$$' -bench 'BuildDir200MB|BuildTar' -benchtime 2x ./internal/layer/
	$(GO) test -run '^$$' -bench 'MountLayer|RootAssembly' -benchtime 2000x ./internal/layercache/
	$(GO) test -run '^$$' -bench 'PageCacheShared' -benchtime 1x ./internal/layercache/
	scripts/bench.sh $(BIN) --concurrency 1,2,8,32 --duration 5s --idle-sandboxes 4000

# The container tier (issue 4): DSec against crun and runc of the same
# root, exec round trips, where a create's time goes, 4,000 idle sandboxes,
# then the same through the Python SDK against a fresh `dsec up`.
# The VM tiers under this machine's accelerator (TCG here): boot to ready,
# QEMU's memory, 4 creates at once, the vm tier, a network's cost.
bench-vm: deps-bench build
	$(GO) test -run '^$$' -bench '^BenchmarkCreate$$' -benchtime 8x -timeout 20m ./internal/microvm/
	$(GO) test -run '^$$' -bench 'CreateParallel4' -benchtime 3x -timeout 20m ./internal/microvm/
	$(GO) test -run '^$$' -bench 'CreateVM' -benchtime 6x -timeout 20m ./internal/microvm/
	DSEC_TEST_MICROVM_NETBENCH=1 $(GO) test -run 'TestNetworkBootTime' -count=1 -v -timeout 20m ./internal/microvm/ | grep -E 'boot|network|PASS|FAIL'

bench-container: deps-bench build
	$(GO) test -run '^$$' -bench 'VsOCI' -benchtime 10x -timeout 30m ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkCycle$$' -benchtime 400x ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkExec$$' -benchtime 2000x ./internal/container/
	$(GO) test -run '^$$' -bench 'CreatePhases' -benchtime 300x ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkMonitor$$' -benchtime 10x ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkPhaseChange$$' -benchtime 100x ./internal/container/
	$(GO) test -run '^$$' -bench '^BenchmarkGrade$$' -benchtime 20x ./internal/daemon/
	$(GO) test -run '^$$' -bench 'Density' -benchtime 1x -timeout 60m ./internal/container/
	/usr/bin/python3 sdk/python/bench/bench_container.py --dsec $(BIN)

# 2,000 container creates at once (issue 13): through the Go client
# (`dsec bench`), then the asyncio SDK, each against a fresh `dsec up`.
BURST ?= 2000
bench-burst: deps-bench build
	scripts/bench.sh $(BIN) --scenarios create-burst --burst $(BURST)
	/usr/bin/python3 sdk/python/bench/bench_burst.py --dsec $(BIN) --burst $(BURST)

clean:
	rm -rf bin $(TOOLS) $(GUEST)
