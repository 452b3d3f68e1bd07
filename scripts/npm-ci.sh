#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the npm packages of the folder given (clients/ts,
# scripts/doclinks) with npm ci, from its package-lock.json, when its
# node_modules is missing or was installed from another lock.
set -euo pipefail
cd "$1"
lock=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat node_modules/.package-lock.sha256 2>/dev/null)" != "$lock" ]; then
  npm ci --no-audit --no-fund
  echo "$lock" > node_modules/.package-lock.sha256
fi
