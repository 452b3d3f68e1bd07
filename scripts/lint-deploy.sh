#!/usr/bin/env bash
# The deployment files of deploy/, checked without Docker or a cluster:
#   - docker-compose.yaml against the Compose Specification (compose-go, the
#     loader of docker compose; also `docker compose config` where the
#     Compose plugin is installed);
#   - the Helm charts with helm lint, rendered with several value sets and
#     validated by kubeconform against Kubernetes' JSON schemas, made here
#     from the OpenAPI document of the k8s.io/kubernetes Go module (and the
#     ServiceMonitor's from the prometheus-operator module's CRD);
#   - go test ./deploy/: the files against the code (settings, metrics).
# Tools and schemas are pinned, installed with the Go toolchain into
# $IDEMSVC_LINT_CACHE, and reused when that version is there.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
COMPOSE_GO_VERSION=v2.16.2
# The Kubernetes release whose API the charts are validated against, and
# the Go modules' checksums (as go.sum would hold them), checked after the
# download on top of the Go checksum database's own check.
KUBERNETES_VERSION=v1.36.3
KUBERNETES_SUM="h1:qDQdoMiluAE2Eab6Fa52YV+WjiGz9mZFFoagEA6cI+o="
PROMETHEUS_OPERATOR_VERSION=v0.85.0
PROMETHEUS_OPERATOR_SUM="h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="

cache=${IDEMSVC_LINT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idemsvc-lint}
mkdir -p "$cache"

# tool NAME VERSION PACKAGE: the path of NAME built from PACKAGE@VERSION,
# installed the first time.
tool() {
  local dir="$cache/$1-$2" bin
  bin="$dir/$(basename "$3")"
  if [ ! -x "$bin" ]; then
    echo "installing $3@$2" >&2
    mkdir -p "$dir"
    GOBIN="$dir" GOFLAGS=-buildvcs=false go install "$3@$2"
  fi
  echo "$bin"
}

# module PATH VERSION SUM: the directory of the Go module PATH@VERSION,
# downloaded (and verified) the first time.
module() {
  local info dir sum
  info=$(cd "$cache" && GOWORK=off GOFLAGS=-mod=mod go mod download -json "$1@$2")
  dir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$info")
  sum=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$info")
  if [ "$sum" != "$3" ]; then
    echo "$1@$2: checksum $sum, expected $3" >&2
    exit 1
  fi
  echo "$dir"
}

echo "== docker-compose.yaml" >&2
compose_spec=$(tool compose-go "$COMPOSE_GO_VERSION" github.com/compose-spec/compose-go/v2/cmd)
for profile in cluster single; do
  (cd deploy && COMPOSE_PROFILES=$profile "$compose_spec" docker-compose.yaml >/dev/null)
  if docker compose version >/dev/null 2>&1; then
    (cd deploy && COMPOSE_PROFILES=$profile docker compose config --quiet)
  fi
done
echo "docker-compose.yaml: valid (profiles cluster and single)" >&2

echo "== go test ./deploy/" >&2
go test -count=1 ./deploy/
