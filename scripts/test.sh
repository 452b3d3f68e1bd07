#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The test suite: real Redis servers (standalone and a 3+3 Cluster) and a
# NATS JetStream server are started by the tests themselves from
# redis-server and nats-server, installed here when missing, as are make,
# git, gcc (the race detector needs cgo) and curl. The TypeScript SDK's
# tests (clients/ts, npm test) and the Python SDK's (clients/python, pytest)
# run first, on Node, npm and Python packages from Debian's packages when
# they are missing, then the install steps of the three SDKs in
# docs/sdks.md (scripts/sdk-install-test.sh) and the release script's
# checks (scripts/release-test.sh). Extra arguments go to go test
# alone, e.g. scripts/test.sh -run Begin.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/apt.sh
ensure_tools

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  if ! command -v apt-get >/dev/null && docker info >/dev/null 2>&1; then
    # The tests start redis:7.0 containers through testcontainers-go; the
    # Sentinel and TLS tests, which need redis-server, are skipped.
    echo "redis-server not found: the tests use Docker containers instead; the Sentinel and TLS tests are skipped" >&2
  else
    apt_install redis-server
  fi
fi
export PATH="$PATH:/usr/sbin" # where Debian puts nats-server
if ! command -v nats-server >/dev/null; then
  apt_install nats-server
fi

# versitygw: the S3-compatible store the large-response tests
# (internal/blob, IDEMSVC_BLOB_URL) run against, built once with go install
# into a cache directory of its version (about 140 s of CPU); the tests
# find it through IDEMSVC_TEST_VERSITYGW.
ensure_versitygw
export IDEMSVC_TEST_VERSITYGW="$VERSITYGW_BIN"

# Chromium: the console's tests (internal/console) drive Debian's headless
# Chromium from Go (chromedp).
[ -x /usr/bin/chromium ] || apt_install chromium

# Node.js: idemproxy's tests put a Node upstream behind it. The TypeScript
# SDK: npm ci when its node_modules is missing or stale, then its build and
# node --test suite against a real idemsvc and Redis; arguments for go test
# (a -run filter, say) leave it out.
command -v node >/dev/null || apt_install nodejs
command -v npm >/dev/null || apt_install npm
if [ $# -eq 0 ]; then
  clients/ts/scripts/deps.sh
  (cd clients/ts && npm test)
fi

# The Python SDK (clients/python): pytest on Debian's Python 3 and packages
# (the asyncio client's httpx, and Flask, Django, FastAPI and uvicorn for the
# middleware and examples), against an idemsvc binary built for it, on its
# memory store and on a Redis it starts; arguments for go test leave it out.
if [ $# -eq 0 ]; then
  if ! /usr/bin/python3 -c 'import pytest, httpx, flask, fastapi, uvicorn, django, ensurepip, setuptools, wheel' 2>/dev/null || ! command -v mypy >/dev/null; then
    apt_install python3-pytest python3-httpx python3-flask python3-fastapi python3-uvicorn python3-django mypy \
      python3-venv python3-setuptools python3-wheel
  fi
  (cd clients/python && /usr/bin/python3 -m pytest -q -p no:cacheprovider)
  # The three SDKs installed into scratch projects as docs/sdks.md says,
  # and the release script's checks, in a scratch clone.
  scripts/sdk-install-test.sh
  scripts/release-test.sh
fi

# Both modules of the workspace (go.work): idemsvc and its Go client.
exec go test -race -count=1 "$@" ./... ./clients/go/...
