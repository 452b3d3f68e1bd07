#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
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
shopt -s inherit_errexit
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

echo "== docker-compose.yaml"
compose_spec=$(tool compose-go "$COMPOSE_GO_VERSION" github.com/compose-spec/compose-go/v2/cmd)
(cd examples/idemproxy-sidecar && "$compose_spec" docker-compose.yaml >/dev/null)
if docker compose version >/dev/null 2>&1; then
  (cd examples/idemproxy-sidecar && docker compose config --quiet)
fi
echo "examples/idemproxy-sidecar/docker-compose.yaml: valid"
for profile in cluster single; do
  (cd deploy && COMPOSE_PROFILES=$profile "$compose_spec" docker-compose.yaml >/dev/null)
  if docker compose version >/dev/null 2>&1; then
    (cd deploy && COMPOSE_PROFILES=$profile docker compose config --quiet)
  fi
done
echo "docker-compose.yaml: valid (profiles cluster and single)"

echo "== Kubernetes schemas"
# Made once per Kubernetes version and version of the generator.
generator=deploy/tools/kubeschemas/main.go
schemas="$cache/schemas-$KUBERNETES_VERSION-po-$PROMETHEUS_OPERATOR_VERSION-$(sha256sum "$generator" | cut -c1-12)"
if [ ! -d "$schemas" ]; then
  k8s=$(module k8s.io/kubernetes "$KUBERNETES_VERSION" "$KUBERNETES_SUM")
  po=$(module github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION" "$PROMETHEUS_OPERATOR_SUM")
  rm -rf "$schemas.tmp"
  go run ./deploy/tools/kubeschemas -out "$schemas.tmp" \
    -swagger "$k8s/api/openapi-spec/swagger.json" \
    -crd "$po/jsonnet/prometheus-operator/servicemonitors-crd.json"
  mv "$schemas.tmp" "$schemas"
fi

helm=$(tool helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm)
kubeconform=$(tool kubeconform "$KUBECONFORM_VERSION" github.com/yannh/kubeconform/cmd/kubeconform)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Helm's own folders, away from the user's.
export HELM_CACHE_HOME="$work/helm/cache" HELM_CONFIG_HOME="$work/helm/config" HELM_DATA_HOME="$work/helm/data"
kube_version=${KUBERNETES_VERSION#v}

# validate NAME: the rendered manifests on stdin against the schemas; a
# kind without a schema fails too.
validate() {
  "$kubeconform" -strict -summary -output text \
    -schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" - |
    sed "s|^|$1: |"
}

# lint NAME ARGS...: helm lint --strict, its output shown only when it has
# more to say than Helm's advice to add an icon.
lint() {
  local name=$1
  shift
  if ! "$helm" lint --strict --kube-version "$kube_version" "$@" >"$work/lint" 2>&1; then
    sed "s|^|$name: |" "$work/lint"
    exit 1
  fi
  grep -v 'icon is recommended\|values.yaml: file does not exist\|^==> Linting\|chart(s) linted\|^$' "$work/lint" |
    sed "s|^|$name: |" || true
  echo "$name: helm lint passed"
}

echo "== deploy/helm/idemsvc"
chart=deploy/helm/idemsvc
for values in "" "$chart"/ci/*-values.yaml; do
  name=${values:+$(basename "$values" -values.yaml)}
  name=${name:-defaults}
  lint "idemsvc ($name)" "$chart" ${values:+-f "$values"}
  "$helm" template idemsvc "$chart" --namespace idemsvc --kube-version "$kube_version" ${values:+-f "$values"} >"$work/rendered"
  validate "idemsvc ($name)" <"$work/rendered"
  # Numbers reach idemsvc as integers: it refuses 1.048576e+07.
  if grep -nE 'value: "?[0-9.]+e[+-]?[0-9]+"?$' "$work/rendered"; then
    echo "idemsvc ($name): a number rendered in exponent form, which idemsvc refuses" >&2
    exit 1
  fi
done
# Settings idemsvc would refuse at start are refused by the chart, each
# with an error that names what is wrong (SETTING|WORDS THE ERROR HOLDS).
refused=(
  "redis.clusterAddrs={redis-0:6379}|give exactly one of redis.url"
  "redis.url=,redis.sentinel.addrs={s:26379}|needs redis.sentinel.master"
  "tls.clientCA.enabled=true|tls.clientCA.enabled needs tls.enabled"
  "redis.tls.enabled=true|redis.tls.enabled is for Cluster and Sentinel"
  "tenants.create=true|tenants.create needs tenants.file"
  "env.IDEMSVC_LISTEN=:9090|env.IDEMSVC_LISTEN: the chart sets it"
  "redis.waitReplica=1|'waitReplica' not allowed"
  "logLevel=verbose|/logLevel"
)
for case in "${refused[@]}"; do
  bad=${case%%|*} want=${case#*|}
  if "$helm" template idemsvc "$chart" --kube-version "$kube_version" --set "$bad" >/dev/null 2>"$work/err"; then
    echo "$chart: --set $bad rendered, but should have been refused" >&2
    exit 1
  fi
  if ! grep -qF -- "$want" "$work/err"; then
    echo "$chart: --set $bad was refused, but not for what it gets wrong:" >&2
    cat "$work/err" >&2
    exit 1
  fi
done
echo "idemsvc: ${#refused[@]} invalid value sets refused, each for its fault"

echo "== deploy/helm/idemproxy-sidecar"
lint idemproxy-sidecar deploy/helm/idemproxy-sidecar
# Its example application, which includes it, rendered from a copy: the
# dependency build writes into the chart's folder.
cp -r deploy/helm/idemproxy-sidecar "$work/idemproxy-sidecar"
example="$work/idemproxy-sidecar/example"
"$helm" dependency build "$example" >/dev/null
lint "idemproxy-sidecar example" "$example"
"$helm" template payments "$example" --kube-version "$kube_version" | validate "idemproxy-sidecar example"
"$helm" template payments "$example" --kube-version "$kube_version" \
  --set idemproxy.idemsvcCASecret.name=idemsvc-ca | validate "idemproxy-sidecar example (private CA)"

# The plain YAML of its README, for teams without Helm, in a Pod.
{
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: payments}\nspec:\n  containers:\n'
  awk '/^## Without Helm/ {on=1} on && /^```$/ {exit} on && started {print "    " $0} on && /^```yaml$/ {started=1}' \
    deploy/helm/idemproxy-sidecar/README.md
} >"$work/snippet.yaml"
grep -q 'name: idemproxy' "$work/snippet.yaml"
validate "idemproxy-sidecar README snippet" <"$work/snippet.yaml"

# go test ./deploy/ (the files against the code) runs in make test.
