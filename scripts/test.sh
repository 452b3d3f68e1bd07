#!/usr/bin/env bash
# The test suite: real Redis servers (standalone and a 3+3 Cluster) are
# started by the tests themselves from redis-server, installed here when
# missing. Extra arguments go to go test, e.g. scripts/test.sh -run Begin.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "redis-server not found: installing it from Debian's packages" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi

exec go test -race -count=1 "$@" ./...
