#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/release.sh X.Y.Z makes release X.Y.Z at HEAD: the tags vX.Y.Z
# (the service) and clients/go/vX.Y.Z (the Go SDK's module, which lives in
# clients/go), after checking that
#   - CHANGELOG.md has a section "## [X.Y.Z]";
#   - clients/ts/package.json's version is X.Y.Z, and go.mod requires the
#     Go SDK at vX.Y.Z (replaced by ./clients/go in this repository);
#   - the tree is clean (nothing modified, nothing untracked), and neither
#     tag exists;
#   - make test passes (RELEASE_SKIP_TESTS=1 skips it, for a rerun after a
#     green run at the same commit).
# It pushes and publishes nothing: it prints the commands that do.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 1 ]; then
  echo "usage: scripts/release.sh X.Y.Z" >&2
  exit 2
fi
version=${1#v}
if ! [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "release: $1 is not a version X.Y.Z" >&2
  exit 2
fi
tags=("v$version" "clients/go/v$version")

fail() {
  echo "release $version: $*" >&2
  exit 1
}

grep -qF "## [$version]" CHANGELOG.md ||
  fail "CHANGELOG.md has no section \"## [$version]\": move the Unreleased entries under it, with the date"
ts_version=$(node -p 'require("./clients/ts/package.json").version')
[ "$ts_version" = "$version" ] ||
  fail "clients/ts/package.json is at $ts_version: set \"version\": \"$version\" (and the tarball's name in the README)"
go_version=$(GOWORK=off go list -m -f '{{.Version}}' github.com/idemsvc/idemsvc/clients/go)
[ "$go_version" = "v$version" ] ||
  fail "go.mod requires github.com/idemsvc/idemsvc/clients/go $go_version: require and replace v$version"
[ -z "$(git status --porcelain)" ] || fail "the tree is not clean:
$(git status --short)"
for tag in "${tags[@]}"; do
  if git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
    fail "tag $tag exists"
  fi
done

if [ "${RELEASE_SKIP_TESTS:-}" != 1 ]; then
  make test
  [ -z "$(git status --porcelain)" ] || fail "make test left the tree changed:
$(git status --short)"
fi

for tag in "${tags[@]}"; do
  git tag -a "$tag" -m "idemsvc $version"
done
commit=$(git rev-parse --short HEAD)
cat <<EOT
Tagged $commit as ${tags[0]} and ${tags[1]}. To publish:
  git push origin ${tags[0]} ${tags[1]}
  (cd clients/ts && npm publish --provenance --access public)   # from CI; prepublishOnly builds and tests
  docker build --build-arg VERSION=${tags[0]} --build-arg REVISION=$(git rev-parse HEAD) -t idemsvc:$version .
EOT
