#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The quick lint (make lint): formatting, vet, tidy go.mod files,
# generated code (Go, and the TypeScript SDK's types) that matches its
# sources, the OpenAPI description through Redocly and Spectral's OWASP
# ruleset, the TypeScript SDK's import graph (no circles), the Markdown's
# relative links and anchors, and the Python SDK's type hints. The
# deployment files have their own, heavier lint: scripts/lint-deploy.sh
# (make lint-deploy).
set -euo pipefail
cd "$(dirname "$0")/.."

# What a fresh machine may lack: git (the file lists), gcc (cgo, for
# go vet of packages that use it), curl; Node.js below.
. scripts/apt.sh
ensure_tools

unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" $unformatted >&2
  exit 1
fi
# Every hand-written source file says its licence (generated ones are
# their generators').
unlicensed=$(git ls-files '*.go' '*.ts' '*.mjs' '*.js' '*.sh' '*.py' .ci/run |
  grep -v -E '\.gen\.go$|(^|/)schema\.ts$' |
  while read -r f; do head -3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || echo "$f"; done)
if [ -n "$unlicensed" ]; then
  echo "no SPDX-License-Identifier line at the top of:" $unlicensed >&2
  exit 1
fi
# And the metadata that states it agrees with LICENSE: the npm package's
# license, the OpenAPI description's info.license and the Python package's.
licence_says=()
grep -q '^ *Apache License$' LICENSE && grep -q '^ *Version 2.0, January 2004$' LICENSE || licence_says+=("LICENSE")
grep -q '^  "license": "Apache-2.0",$' clients/ts/package.json || licence_says+=("clients/ts/package.json")
sed -n '/^info:/,/^[^ ]/p' api/openapi.yaml | grep -A1 '^  license:$' | grep '^    name: Apache-2.0$' >/dev/null ||
  licence_says+=("api/openapi.yaml (info.license.name)")
grep -q '^license = { text = "Apache-2.0" }$' clients/python/pyproject.toml || licence_says+=("clients/python/pyproject.toml")
if [ ${#licence_says[@]} -gt 0 ]; then
  echo "not Apache-2.0 as the repository's licence is:" "${licence_says[@]}" >&2
  exit 1
fi
# Two modules, one workspace (go.work): idemsvc and its Go client.
go vet ./... ./clients/go/...
go mod tidy -diff
(cd clients/go && go mod tidy -diff)
# The client requires the oapi-codegen runtime and nothing else directly.
direct=$(cd clients/go && GOWORK=off go list -m -f '{{if not (or .Main .Indirect)}}{{.Path}}{{end}}' all | sed '/^$/d')
if [ "$direct" != "github.com/oapi-codegen/runtime" ]; then
  echo "clients/go requires more than the oapi-codegen runtime:" $direct >&2
  exit 1
fi
# The service binary links neither the Go client nor an OpenAPI library.
if go list -deps ./cmd/idemsvc | grep -E '^github.com/idemsvc/idemsvc/clients/go$|kin-openapi|jsonschema'; then
  echo "cmd/idemsvc links the packages above" >&2
  exit 1
fi
# The domain (internal/statemachine) is the bottom floor: it imports no
# Redis client and nothing of idemsvc's; the Redis adapter
# (internal/redisstore) imports it, never the other way round.
if go list -deps ./internal/statemachine | grep -E 'redis|^github.com/idemsvc/idemsvc/' | grep -v '^github.com/idemsvc/idemsvc/internal/statemachine$'; then
  echo "internal/statemachine imports the packages above: the domain must not" >&2
  exit 1
fi
# The binaries link no test-only module (the console's browser tests
# drive Chromium with chromedp; the robustness suite, under
# internal/testkit, checks histories with porcupine and injects faults
# with toxiproxy; redistest can start containers) and no test kit.
testonly='^github.com/(chromedp|anishathalye/porcupine|Shopify/toxiproxy|testcontainers|moby|getkin/kin-openapi)(/|$)|^go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp|^github.com/idemsvc/idemsvc/internal/testkit/'
if go list -deps ./cmd/... | grep -E "$testonly"; then
  echo "a binary under cmd/ links the test-only packages above" >&2
  exit 1
fi
# No import cycles: the Go toolchain refuses them already ("import cycle
# not allowed"), so go vet above fails on one; the floors are kept by the
# checks above and by the domain's.
before=$(git ls-files -co --exclude-standard '*.gen.go' | xargs -r sha256sum)
go generate ./... ./clients/go/...
after=$(git ls-files -co --exclude-standard '*.gen.go' | xargs -r sha256sum)
if [ "$before" != "$after" ]; then
  echo "generated code is stale: run go generate ./... and commit the result" >&2
  exit 1
fi
# The OpenAPI description, through a real linter (errors fail; the three
# warnings are the operations endpoints, which have no 4xx to document). It
# runs on Node: installed from Debian's packages where it is missing.
command -v node >/dev/null || apt_install nodejs
command -v npx >/dev/null || apt_install npm
npx --yes @redocly/cli@2.77.0 lint --format=summary api/openapi.yaml
# And through Spectral's OWASP ruleset, pinned, with .spectral.yaml's
# waivers: any error or warning fails. Spectral finds the ruleset package
# in a node_modules beside .spectral.yaml, so both, and api/, are linked
# into a folder of their own beside npx's copy of the packages.
spectral=(npx --yes -p @stoplight/spectral-cli@6.16.3 -p @stoplight/spectral-owasp-ruleset@2.0.1)
bin=$("${spectral[@]}" -c 'command -v spectral')
spectral_dir=$(mktemp -d)
trap 'rm -rf "$spectral_dir"' EXIT
ln -s "$(dirname "$(dirname "$bin")")" "$spectral_dir/node_modules"
ln -s "$PWD/.spectral.yaml" "$spectral_dir/.spectral.yaml"
ln -s "$PWD/api" "$spectral_dir/api"
(cd "$spectral_dir" && "$bin" lint --fail-severity=warn api/openapi.yaml)
# The TypeScript SDK's types, generated from the same description.
clients/ts/scripts/deps.sh
(cd clients/ts && npm run --silent generate >/dev/null)
if ! git diff --exit-code --stat -- clients/ts/src/schema.ts; then
  echo "clients/ts/src/schema.ts is stale: run make generate and commit the result" >&2
  exit 1
fi
# The TypeScript SDK's import graph has no circle, type-only imports
# included: madge (a devDependency, pinned, so npm ci brings it) walks it.
(cd clients/ts && npm run --silent cycles)
# The Markdown's relative links and anchors: README.md, docs/, the SDKs'
# READMEs (scripts/doclinks.sh).
scripts/doclinks.sh
# The Python SDK's type hints, through mypy --strict (Debian's package).
if ! command -v mypy >/dev/null || ! /usr/bin/python3 -c 'import httpx' 2>/dev/null; then
  . scripts/apt.sh
  apt_install mypy python3-httpx
fi
(cd clients/python && mypy)
