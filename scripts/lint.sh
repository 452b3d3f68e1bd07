#!/usr/bin/env bash
# Formatting, vet, a tidy go.mod, and generated code that matches its sources.
set -euo pipefail
cd "$(dirname "$0")/.."

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" $unformatted >&2
  exit 1
fi
go vet ./...
go mod tidy -diff
go generate ./...
if ! git diff --exit-code --stat; then
  echo "generated code is stale: run go generate ./... and commit the result" >&2
  exit 1
fi
