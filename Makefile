.PHONY: help build generate test bench load load-sdk load-instructions load-reads lint lint-deploy robustness

# A bare make lists the targets: each target's line carries its summary
# after "## ", and help prints those.
.DEFAULT_GOAL := help
help: ## List the targets (this list)
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  make %-18s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# The three commands for this machine, into $(BIN), stamped with the
# version (the tag of HEAD, or git describe's name for it) and the
# revision, which --version, the start-up log line and idemsvc_build_info
# report. (The Docker image builds static ones, stamped the same way.)
BIN ?= bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS = -X github.com/idemsvc/idemsvc/internal/buildinfo.Version=$(VERSION) \
	-X github.com/idemsvc/idemsvc/internal/buildinfo.Revision=$(REVISION)
build: ## Build idemsvc, idemproxy and idemctl into bin/ (BIN=), stamped with the version
	mkdir -p $(BIN)
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/idemsvc ./cmd/idemproxy ./cmd/idemctl

# Regenerate code from its sources (api/openapi.yaml).
generate: ## Regenerate the Go and TypeScript code from api/openapi.yaml
	go generate ./... ./clients/go/...
	clients/ts/scripts/deps.sh && cd clients/ts && npm run generate

# The test suite, against real Redis started by the tests.
test: ## The test suite, against real Redis (installs what it needs)
	scripts/test.sh

# The benchmarks of every package that has any (found by their func
# Benchmark lines, so a package that moves or gains benchmarks is not
# missed) and, for comparison, the bare scripts through redis-benchmark.
# BenchmarkReaderLeavesOthersTheirShare is left to make load-reads: it is
# a latency measurement that runs once whatever -benchtime says, on an
# idemsvc binary and a Redis of its own, for half a minute.
BENCH_PACKAGES = $(shell git grep -l '^func Benchmark' -- '*_test.go' | xargs -n1 dirname | sort -u | sed 's|^|./|')
bench: ## Every package's benchmarks, 3 runs each, and the bare scripts through redis-benchmark
	go test -run '^$$' -bench . -skip '^BenchmarkReaderLeavesOthersTheirShare$$' -benchtime 3s -count 3 $(BENCH_PACKAGES)
	benchmarks/redis-baseline.sh

# idemsvc over HTTP under idembench, side by side with a bare chi handler.
load: ## idemsvc over HTTP under idembench, beside a bare chi handler
	benchmarks/http-load.sh

# The caller's whole path: a service behind the Go SDK's middleware beside
# the same service alone, an Express app behind the TypeScript SDK's beside
# it alone and behind an in-process library, and idemsvc beside a bare
# handler, closed and open loop, interleaved (docs/performance-ts.md).
load-sdk: ## Services behind the Go and TypeScript SDKs' middleware beside the same services alone
	benchmarks/caller-load.sh

# Instructions per request of idemsvc and the bare handler, counted by
# callgrind: exact where the loads above are noisy.
load-instructions: ## Instructions per request, counted by callgrind
	benchmarks/http-instructions.sh

# One tenant's begin p99 alone and beside another replaying 1 MiB records
# as fast as its read budget lets it (a latency measurement: not in test).
load-reads: ## One tenant's begin p99 alone and beside another replaying 1 MiB records
	go test -count=1 -v -run '^$$' -bench BenchmarkReaderLeavesOthersTheirShare -benchtime 1x ./cmd/idemsvc/

# Go (gofmt, vet, tidy), generated code's freshness, the OpenAPI linters.
lint: ## gofmt, vet, tidy, generated code, OpenAPI linters, import cycles, doc links, mypy
	scripts/lint.sh

# The deployment files: compose, helm lint, kubeconform, the dashboard.
lint-deploy: ## The deployment files: compose, helm lint, kubeconform, the dashboard
	scripts/lint-deploy.sh

# Every Redis topology under every failpoint, checked for linearizability
# and the promise's invariants; ROBUSTNESS_DURATION is shared between the
# scenarios, ROBUSTNESS_SCENARIOS picks some (comma-separated).
ROBUSTNESS_DURATION ?= 10m
robustness: ## Every Redis topology under every failpoint, checked for linearizability
	ROBUSTNESS_DURATION=$(ROBUSTNESS_DURATION) go test -count=1 -v -timeout 60m -run 'TestRobustness$$' ./internal/testkit/robustness/
