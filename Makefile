.PHONY: generate test bench load lint

# Regenerate code from its sources (api/openapi.yaml).
generate:
	go generate ./...

# The test suite, against real Redis started by the tests.
test:
	scripts/test.sh

# Benchmarks of the hot paths and, for comparison, the bare scripts through redis-benchmark.
bench:
	go test -run '^$$' -bench . -benchtime 3s -count 3 ./internal/statemachine/ ./internal/handlers/
	benchmarks/redis-baseline.sh

# idemsvc over HTTP under idembench, side by side with a bare chi handler.
load:
	benchmarks/http-load.sh

lint:
	scripts/lint.sh
