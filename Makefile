.PHONY: build generate test bench load load-sdk load-instructions load-reads lint lint-deploy robustness

# The three commands for this machine, into $(BIN), stamped with the
# version (the tag of HEAD, or git describe's name for it) and the
# revision, which --version, the start-up log line and idemsvc_build_info
# report. (The Docker image builds static ones, stamped the same way.)
BIN ?= bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS = -X github.com/idemsvc/idemsvc/internal/buildinfo.Version=$(VERSION) \
	-X github.com/idemsvc/idemsvc/internal/buildinfo.Revision=$(REVISION)
build:
	mkdir -p $(BIN)
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/idemsvc ./cmd/idemproxy ./cmd/idemctl

# Regenerate code from its sources (api/openapi.yaml).
generate:
	go generate ./... ./clients/go/...
	clients/ts/scripts/deps.sh && cd clients/ts && npm run generate

# The test suite, against real Redis started by the tests.
test:
	scripts/test.sh

# Benchmarks of the hot paths and, for comparison, the bare scripts through redis-benchmark.
bench:
	go test -run '^$$' -bench . -benchtime 3s -count 3 ./internal/redisstore/ ./internal/handlers/
	benchmarks/redis-baseline.sh

# idemsvc over HTTP under idembench, side by side with a bare chi handler.
load:
	benchmarks/http-load.sh

# The caller's whole path: a service behind the Go SDK's middleware beside
# the same service alone, an Express app behind the TypeScript SDK's beside
# it alone and behind an in-process library, and idemsvc beside a bare
# handler, closed and open loop, interleaved (docs/performance-ts.md).
load-sdk:
	benchmarks/caller-load.sh

# Instructions per request of idemsvc and the bare handler, counted by
# callgrind: exact where the loads above are noisy.
load-instructions:
	benchmarks/http-instructions.sh

# One tenant's begin p99 alone and beside another replaying 1 MiB records
# as fast as its read budget lets it (a latency measurement: not in test).
load-reads:
	go test -count=1 -v -run '^$$' -bench BenchmarkReaderLeavesOthersTheirShare -benchtime 1x ./cmd/idemsvc/

# Go (gofmt, vet, tidy), generated code's freshness, the OpenAPI linters.
lint:
	scripts/lint.sh

# The deployment files: compose, helm lint, kubeconform, the dashboard.
lint-deploy:
	scripts/lint-deploy.sh

# Every Redis topology under every failpoint, checked for linearizability
# and the promise's invariants; ROBUSTNESS_DURATION is shared between the
# scenarios, ROBUSTNESS_SCENARIOS picks some (comma-separated).
ROBUSTNESS_DURATION ?= 10m
robustness:
	ROBUSTNESS_DURATION=$(ROBUSTNESS_DURATION) go test -count=1 -v -timeout 60m -run 'TestRobustness$$' ./internal/testkit/robustness/
