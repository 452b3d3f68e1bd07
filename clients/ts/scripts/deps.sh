#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the TypeScript SDK's dependencies with npm ci when node_modules
# is missing or was installed from another package-lock.json.
set -euo pipefail
cd "$(dirname "$0")/.."
lock=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat node_modules/.package-lock.sha256 2>/dev/null)" != "$lock" ]; then
  npm ci --no-audit --no-fund
  echo "$lock" > node_modules/.package-lock.sha256
fi
