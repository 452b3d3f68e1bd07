#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/release.sh, tried in a scratch clone of HEAD (with this
# checkout's release.sh): it refuses a version the CHANGELOG has no section
# for, a version clients/ts/package.json does not say, a tree with an
# untracked file and a tag that exists, each naming what is wrong, and
# otherwise tags vX.Y.Z and clients/go/vX.Y.Z at HEAD. make test is
# skipped (RELEASE_SKIP_TESTS=1): this runs inside it. Run by
# scripts/test.sh (make test).
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
repo=$work/repo
git clone -q "$PWD" "$repo"
cp scripts/release.sh "$repo/scripts/release.sh"
git -C "$repo" -c user.name=release-test -c user.email=release-test@localhost commit -qam "release.sh under test" --allow-empty
version=$(node -p 'require("./clients/ts/package.json").version')

# refused VERSION WORDS: release.sh VERSION exits 1, saying WORDS, and
# makes no tag.
refused() {
  local out before
  before=$(git -C "$repo" tag -l)
  if out=$(cd "$repo" && RELEASE_SKIP_TESTS=1 scripts/release.sh "$1" 2>&1); then
    echo "release-test: release.sh $1 succeeded, but should have been refused for: $2" >&2
    exit 1
  fi
  if ! grep -qF -- "$2" <<<"$out"; then
    printf 'release-test: release.sh %s was refused, but not for: %s\n%s\n' "$1" "$2" "$out" >&2
    exit 1
  fi
  if [ "$(git -C "$repo" tag -l)" != "$before" ]; then
    echo "release-test: release.sh $1 was refused, but made tags: $(git -C "$repo" tag -l)" >&2
    exit 1
  fi
  echo "release.sh $1 refused: $2"
}

refused 98.76.54 'CHANGELOG.md has no section "## [98.76.54]"'
printf '\n## [98.76.54] - 2099-01-01\n' >>"$repo/CHANGELOG.md"
git -C "$repo" -c user.name=release-test -c user.email=release-test@localhost commit -qam "a section for 98.76.54"
refused 98.76.54 "clients/ts/package.json is at $version"
touch "$repo/untracked"
refused "$version" "the tree is not clean"
rm "$repo/untracked"

(cd "$repo" && RELEASE_SKIP_TESTS=1 scripts/release.sh "$version" >/dev/null)
head=$(git -C "$repo" rev-parse HEAD)
for tag in "v$version" "clients/go/v$version"; do
  if [ "$(git -C "$repo" rev-parse "$tag^{commit}" 2>/dev/null)" != "$head" ]; then
    echo "release-test: release.sh $version did not tag HEAD as $tag" >&2
    exit 1
  fi
done
echo "release.sh $version: tagged HEAD v$version and clients/go/v$version"
git -C "$repo" tag -d "clients/go/v$version" >/dev/null
refused "$version" "tag v$version exists"
