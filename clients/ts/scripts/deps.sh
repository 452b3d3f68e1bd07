#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the TypeScript SDK's dependencies with npm ci when node_modules
# is missing or was installed from another package-lock.json.
set -euo pipefail
exec "$(dirname "$0")/../../../scripts/npm-ci.sh" "$(dirname "$0")/.."
