.PHONY: generate test bench lint

# Regenerate code from its sources (api/openapi.yaml).
generate:
	go generate ./...

# The test suite, against real Redis started by the tests.
test:
	scripts/test.sh

# Benchmarks of the hot paths and, for comparison, the bare scripts through redis-benchmark.
bench:
	go test -run '^$$' -bench . -benchtime 3s -count 3 ./internal/statemachine/
	benchmarks/redis-baseline.sh

lint:
	scripts/lint.sh
