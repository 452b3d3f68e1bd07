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
before=$(git ls-files -co --exclude-standard '*.gen.go' | xargs -r sha256sum)
go generate ./...
after=$(git ls-files -co --exclude-standard '*.gen.go' | xargs -r sha256sum)
if [ "$before" != "$after" ]; then
  echo "generated code is stale: run go generate ./... and commit the result" >&2
  exit 1
fi
# The OpenAPI description, through a real linter (errors fail; the three
# warnings are the operations endpoints, which have no 4xx to document).
if command -v npx >/dev/null; then
  npx --yes @redocly/cli@2.77.0 lint --format=summary api/openapi.yaml
else
  echo "npx not found: api/openapi.yaml was not linted" >&2
  exit 1
fi
