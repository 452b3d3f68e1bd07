#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The link check of make lint: fails on a relative link to a file that is
# not there, or to a heading (#anchor) that is not, in the Markdown a
# reader follows: README.md, docs/*.md and the SDKs' READMEs (a link to
# this repository on GitHub counts as relative); and every page of docs/
# is linked from the README.
#
# It is remark-validate-links, remark's own link checker, rather than a
# script of ours: anchors must be the slugs GitHub makes of headings
# (punctuation, duplicates, inline code), which it computes as GitHub
# does. It reads files only, never a URL, so it needs no network beyond
# the npm registry that npm ci installs it from (pinned in
# scripts/doclinks/package.json and its lock).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || { . scripts/apt.sh; apt_install nodejs npm; }
scripts/npm-ci.sh scripts/doclinks >/dev/null
mapfile -t files < <(git ls-files -co --exclude-standard README.md 'docs/*.md' 'clients/*/README.md')
scripts/doclinks/node_modules/.bin/remark --rc-path scripts/doclinks/.remarkrc.mjs \
  --frail --quiet --no-stdout --no-color "${files[@]}"

# Every page of docs/ is reachable from the README.
for page in docs/*.md; do
  grep -q "](${page})" README.md || { echo "README.md does not link ${page}" >&2; exit 1; }
done
